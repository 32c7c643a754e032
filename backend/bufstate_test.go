package backend

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// stateBuf is a backend's buffer over a BufferState: it counts the times
// the state tells it to free its memory.
type stateBuf struct {
	st    BufferState
	t     ir.Type
	frees atomic.Int32
}

func (b *stateBuf) Delete() {
	if b.st.Delete() {
		b.frees.Add(1)
	}
}

func (b *stateBuf) Unhold(donate bool) {
	if b.st.Unhold(donate) {
		b.frees.Add(1)
	}
}

func (b *stateBuf) Hold(donate bool, where string) error { return b.st.Hold(b.t, donate, where, nil) }

func (b *stateBuf) wantFrees(t *testing.T, n int32, when string) {
	t.Helper()
	if got := b.frees.Load(); got != n {
		t.Fatalf("%s: freed %d times, want %d", when, got, n)
	}
}

// Delete frees at once, or at the end of the last usage hold, and names
// the line of the backend's Delete call; a donation hold settles a Delete
// made while it is held.
func TestBufferStateLife(t *testing.T) {
	typ := ir.TypeOf(ir.Float32, 3)
	b := &stateBuf{t: typ}
	b.Delete()
	b.Delete()
	b.wantFrees(t, 1, "deleted twice")
	err := b.st.Usable(typ, true)
	if !errors.Is(err, ErrDeleted) || errors.Is(err, ErrDonated) || !strings.Contains(err.Error(), "bufstate_test.go") {
		t.Fatalf("reading a deleted buffer: %v; want ErrDeleted naming this file", err)
	}

	b = &stateBuf{t: typ}
	if err := b.Hold(false, ""); err != nil {
		t.Fatal(err)
	}
	b.Delete()
	b.wantFrees(t, 0, "deleted while held")
	if err := b.st.Usable(typ, true); err != nil {
		t.Fatalf("the holder cannot read a buffer deleted while held: %v", err)
	}
	if err := b.st.Usable(typ, false); !errors.Is(err, ErrDeleted) {
		t.Fatalf("reading a deleted buffer without a hold: %v", err)
	}
	b.Unhold(false)
	b.wantFrees(t, 1, "the hold ended")

	for _, taken := range []bool{false, true} {
		b = &stateBuf{t: typ}
		if err := b.Hold(true, "step.go:7"); err != nil {
			t.Fatal(err)
		}
		if err := b.Hold(false, ""); !errors.Is(err, ErrDonated) || !strings.Contains(err.Error(), "step.go:7") {
			t.Fatalf("holding a buffer being donated: %v", err)
		}
		b.Delete()
		if taken {
			if err := b.st.Donate(typ, "step.go:7"); err != nil {
				t.Fatal(err)
			}
		}
		b.Unhold(true)
		if taken {
			b.wantFrees(t, 0, "donated")
			if err := b.st.Usable(typ, false); !errors.Is(err, ErrDonated) || errors.Is(err, ErrDeleted) || !strings.Contains(err.Error(), "step.go:7") {
				t.Fatalf("reading a donated buffer: %v", err)
			}
		} else {
			b.wantFrees(t, 1, "the donating call let go")
		}
	}

	b = &stateBuf{t: typ}
	if err := b.Hold(false, ""); err != nil {
		t.Fatal(err)
	}
	if err := b.st.Donate(typ, ""); err == nil {
		t.Fatal("a buffer read by a running call was donated")
	}
	b.Unhold(false)
	want := errors.New("no memory")
	b.st.Fail(want)
	if err := b.Hold(false, ""); err != want {
		t.Fatalf("holding a failed buffer: %v, want %v", err, want)
	}
}

// Readers, a donation and a Delete race: the memory is freed exactly once,
// or handed over by the donation and never freed.
func TestBufferStateFreesOnce(t *testing.T) {
	rng := testseed.Rand(t, 1)
	typ := ir.TypeOf(ir.Int32, 1)
	for range 200 {
		b := &stateBuf{t: typ}
		readers := 1 + rng.IntN(6)
		donate := rng.IntN(2) == 0
		var donated atomic.Bool
		var wg sync.WaitGroup
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if b.Hold(false, "") == nil {
					b.Unhold(false)
				}
			}()
		}
		if donate {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if b.Hold(true, "step.go:1") == nil {
					donated.Store(b.st.Donate(typ, "step.go:1") == nil)
					b.Unhold(true)
				}
			}()
		}
		b.Delete()
		wg.Wait()
		want := int32(1)
		if donated.Load() {
			want = 0
		}
		b.wantFrees(t, want, "after the race")
	}
}
