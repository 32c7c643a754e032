package callers

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"runtime"
	"sync"
	"testing"
)

func reference(skip int) []uintptr {
	var buf [MaxDepth]uintptr
	n := runtime.Callers(skip+1, buf[:])
	return buf[:n]
}

// both records the stack of its caller both ways; the results must agree.
//
//go:noinline
func both(skip int) (got, want []uintptr) {
	return Record(skip + 2).PCs, reference(skip + 2)
}

// inlinable is small enough to be inlined into its callers.
func inlinable(skip int) (got, want []uintptr) { return both(skip) }

//go:noinline
func viaA(skip int) (got, want []uintptr) { return inlinable(skip) }

//go:noinline
func viaB(skip int) (got, want []uintptr) { return inlinable(skip) }

type recorder interface {
	rec(skip int) ([]uintptr, []uintptr)
}
type r1 struct{}
type r2 struct{}

func (r1) rec(skip int) ([]uintptr, []uintptr) { return both(skip) }
func (r2) rec(skip int) ([]uintptr, []uintptr) { return both(skip) }

//go:noinline
func indirect(r recorder, skip int) ([]uintptr, []uintptr) { return r.rec(skip) }

//go:noinline
func recurse(depth, skip int) ([]uintptr, []uintptr) {
	if depth == 0 {
		return viaA(skip)
	}
	return recurse(depth-1, skip)
}

func check(t *testing.T, what string, got, want []uintptr) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d PCs, runtime.Callers gives %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: PC %d is %#x, runtime.Callers gives %#x", what, i, got[i], want[i])
		}
	}
}

// TestRecordMatchesCallers checks Record against runtime.Callers on call paths
// that share return addresses (an interface call site reaching two methods,
// one inlined helper reached from two functions, recursion deeper than
// MaxDepth), repeated so that the cached results are used.
func TestRecordMatchesCallers(t *testing.T) {
	r := testseed.Rand(t, 2)
	for i := 0; i < 300; i++ {
		skip := r.IntN(3)
		switch r.IntN(5) {
		case 0:
			g, w := viaA(skip)
			check(t, "viaA", g, w)
		case 1:
			g, w := viaB(skip)
			check(t, "viaB", g, w)
		case 2:
			g, w := indirect(r1{}, skip)
			check(t, "r1", g, w)
		case 3:
			g, w := indirect(r2{}, skip)
			check(t, "r2", g, w)
		case 4:
			d := r.IntN(2 * MaxDepth)
			g, w := recurse(d, skip)
			check(t, "recurse", g, w)
		}
	}
}

// TestRecordConcurrent records from several goroutines at once (run with -race).
func TestRecordConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for k := 0; k < 4; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				g, w := recurse(i%40, 0)
				if len(g) != len(w) {
					t.Errorf("%d PCs, runtime.Callers gives %d", len(g), len(w))
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestLocationMemoised(t *testing.T) {
	s := Record(1)
	calls := 0
	f := func(pcs []uintptr) (string, int) { calls++; return "x.go", len(pcs) }
	for i := 0; i < 3; i++ {
		if file, line := s.Location(f); file != "x.go" || line != len(s.PCs) {
			t.Fatalf("Location = %s:%d", file, line)
		}
	}
	if calls != 1 {
		t.Fatalf("f called %d times, want 1", calls)
	}
	if file, line := (*Stack)(nil).Location(f); file != "?" || line != 0 {
		t.Fatalf("nil Location = %s:%d", file, line)
	}
}

func BenchmarkRecord(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		Record(1)
	}
}

func BenchmarkCallers(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		reference(1)
	}
}
