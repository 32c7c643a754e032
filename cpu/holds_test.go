package cpu

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// A Delete while a usage hold is held makes the array unusable at once and
// frees its memory when the last hold ends.
func TestDeleteWhileHeld(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	b, err := newBuffer(f32Literal(t, 1, 2, 3))
	require.NoError(t, err)
	require.NoError(t, b.Hold(false, ""))
	require.NoError(t, b.Hold(false, ""))
	require.NoError(t, b.Delete())
	_, err = b.Literal()
	require.ErrorIs(t, err, backend.ErrDeleted)
	require.ErrorContains(t, err, "holds_test.go")
	require.ErrorIs(t, b.Hold(false, ""), backend.ErrDeleted)
	l, err := b.heldLiteral() // the running execution still reads it
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2, 3}, ir.View[float32](l))
	require.Equal(t, int64(64), deviceInUse())
	b.Unhold(false)
	require.Equal(t, int64(64), deviceInUse())
	b.Unhold(false)
	require.Zero(t, deviceInUse())
	_, err = b.heldLiteral()
	require.ErrorIs(t, err, backend.ErrDeleted)
	require.NoError(t, b.Delete()) // a no-op now
	require.Zero(t, deviceInUse())
}

// A donation hold waits for the usage holds to end, and while it is taken
// or awaited the buffer cannot be held by another call.
func TestDonationHoldWaitsForReaders(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	b, err := newBuffer(f32Literal(t, 1, 2))
	require.NoError(t, err)
	require.NoError(t, b.Hold(false, ""))
	waiting := make(chan struct{})
	SetHoldHookForTest(t, func(e HoldEvent) {
		if e == HoldEventWait {
			close(waiting)
		}
	})
	got := make(chan error)
	go func() { got <- b.Hold(true, "train.go:3") }()
	<-waiting
	err = b.Hold(false, "")
	require.ErrorIs(t, err, backend.ErrDonated)
	require.ErrorContains(t, err, "being donated to a running call at train.go:3")
	require.ErrorContains(t, b.Hold(true, "other.go:1"), "train.go:3")
	b.Unhold(false) // the reader is done: the donation goes on
	require.NoError(t, <-got)
	require.Contains(t, trace.FromBuffer(b).String(), "being donated")
	// The call takes the memory.
	b.markDonated("train.go:3")
	b.Unhold(true)
	require.Zero(t, deviceInUse())
	_, err = b.Literal()
	require.ErrorIs(t, err, backend.ErrDonated)
	require.ErrorContains(t, err, "donated at train.go:3")
}

// A Delete while a donating call holds the buffer is that call's to settle:
// if the call takes the memory nothing more happens, if it fails the buffer
// is deleted when the call lets go of it.
func TestDeleteWhileDonating(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	for _, taken := range []bool{false, true} {
		b, err := newBuffer(f32Literal(t, 1, 2))
		require.NoError(t, err)
		require.NoError(t, b.Hold(true, "step.go:9"))
		require.NoError(t, b.Delete())
		l, err := b.Literal() // the donating call still reads it
		require.NoError(t, err)
		require.Equal(t, []float32{1, 2}, ir.View[float32](l))
		if taken {
			b.markDonated("step.go:9")
		}
		b.Unhold(true)
		require.Zero(t, deviceInUse())
		_, err = b.Literal()
		if taken {
			require.ErrorIs(t, err, backend.ErrDonated, "taken")
		} else {
			require.ErrorIs(t, err, backend.ErrDeleted, "not taken")
			require.ErrorContains(t, err, "holds_test.go")
		}
	}
	// A donation whose call fails, with no Delete, leaves the buffer usable.
	b, err := newBuffer(f32Literal(t, 5))
	require.NoError(t, err)
	require.NoError(t, b.Hold(true, "step.go:9"))
	b.Unhold(true)
	require.NoError(t, b.Hold(false, ""))
	b.Unhold(false)
	l, err := b.Literal()
	require.NoError(t, err)
	require.Equal(t, []float32{5}, ir.View[float32](l))
}

// A donation awaited while the buffer is deleted fails when the readers
// are done, and the memory is freed then.
func TestDeleteWhileDonationWaits(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	b, err := newBuffer(f32Literal(t, 1, 2))
	require.NoError(t, err)
	require.NoError(t, b.Hold(false, ""))
	waiting := make(chan struct{})
	SetHoldHookForTest(t, func(e HoldEvent) {
		if e == HoldEventWait {
			close(waiting)
		}
	})
	got := make(chan error)
	go func() { got <- b.Hold(true, "train.go:3") }()
	<-waiting
	require.NoError(t, b.Delete())
	require.Equal(t, int64(64), deviceInUse())
	b.Unhold(false)
	require.ErrorIs(t, <-got, backend.ErrDeleted)
	require.Zero(t, deviceInUse())
}

// backend.HoldArgs refuses a buffer donated and passed again, and takes
// nothing when one argument cannot be held.
func TestHoldArgs(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	x, err := newBuffer(f32Literal(t, 1))
	require.NoError(t, err)
	y, err := newBuffer(f32Literal(t, 2))
	require.NoError(t, err)
	err = backend.HoldArgs([]trace.Buffer{x, y, x}, []bool{true}, "f.go:1")
	require.ErrorContains(t, err, "argument 0 (f32[1]) is donated and also passed as argument 2")
	require.NoError(t, y.Delete())
	err = backend.HoldArgs([]trace.Buffer{x, y}, []bool{true}, "f.go:1")
	require.ErrorIs(t, err, backend.ErrDeleted)
	require.ErrorContains(t, err, "argument 1:")
	// x is not left held: it can be donated and deleted at once.
	require.NoError(t, x.Hold(true, "g.go:2"))
	x.Unhold(true)
	require.NoError(t, x.Delete())
	require.Zero(t, deviceInUse())
}

// Many goroutines hold, read and delete buffers at once (for the race
// detector): every read made under a hold sees the buffer's values.
func TestHoldsConcurrent(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	const n = 8
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := range 50 {
				v := float32(g*1000 + i)
				b, err := newBuffer(f32Literal(t, v, v, v, v))
				if err != nil {
					t.Error(err)
					return
				}
				var inner sync.WaitGroup
				for range 3 {
					inner.Go(func() {
						if err := b.Hold(false, ""); err != nil {
							return // deleted first
						}
						defer b.Unhold(false)
						l, err := b.heldLiteral()
						if err != nil {
							t.Error(err)
							return
						}
						for _, x := range ir.View[float32](l) {
							if x != v {
								t.Errorf("read %g, want %g", x, v)
							}
						}
					})
				}
				_ = b.Delete()
				_, _ = newBuffer(f32Literal(t, -1, -1, -1, -1))
				inner.Wait()
			}
		})
	}
	wg.Wait()
}
