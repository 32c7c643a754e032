package trace

import (
	"sync"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// TestGoroutineKeys: tracers are per goroutine — one goroutine's active
// tracer is invisible to others, eagerly running goroutines see none — and
// gkey tells live goroutines apart and is stable on one goroutine.
func TestGoroutineKeys(t *testing.T) {
	tr := NewFuncTracer("g")
	tr.Push()
	defer tr.Pop()
	if current() != tr {
		t.Fatal("current() is not the pushed tracer")
	}
	k := gkey()
	const n = 8
	keys := make([]uintptr, n)
	seen := make([]*Tracer, n)
	var start, wg sync.WaitGroup
	start.Add(1)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			keys[i], seen[i] = gkey(), current()
			if gkey() != keys[i] {
				t.Errorf("goroutine %d: gkey changed", i)
			}
			inner := NewFuncTracer("inner")
			inner.Push()
			if current() != inner || inner.Level() != 1 {
				t.Errorf("goroutine %d: its own tracer is not current at level 1", i)
			}
			start.Wait()
			inner.Pop()
		}()
	}
	start.Done()
	wg.Wait()
	for i, kk := range keys {
		if kk == k || seen[i] != nil {
			t.Errorf("goroutine %d: key %x (main %x), saw tracer %v", i, kk, k, seen[i])
		}
		for j := range i {
			if keys[j] == kk {
				t.Errorf("goroutines %d and %d, alive at once, share key %x", i, j, kk)
			}
		}
	}
}

// TestStaleTracerStack: a stack left under this goroutine's key by another
// goroutine (one that exited without popping, whose g this goroutine now
// runs on) is dropped at the next Push instead of being inherited.
func TestStaleTracerStack(t *testing.T) {
	stale := NewFuncTracer("stale")
	stale.active.Store(true)
	activeTracers.Add(1)
	stacksMu.Lock()
	stacks[gkey()] = &tracerStack{goid: goid() + 1, ts: []*Tracer{stale}}
	stacksMu.Unlock()
	tr := NewFuncTracer("fresh")
	tr.Push()
	if current() != tr || tr.Level() != 1 || stale.active.Load() {
		t.Errorf("after Push: current %v level %d, stale active %v; want the fresh tracer at level 1 and the stale one inactive",
			current() == tr, tr.Level(), stale.active.Load())
	}
	x := tr.Param(ir.TypeOf(ir.Float32, 2))
	if x.Tracer() != tr {
		t.Error("param not of the fresh tracer")
	}
	tr.Pop()
	if current() != nil || activeTracers.Load() != 0 {
		t.Errorf("after Pop: current %v, %d active tracers; want none", current(), activeTracers.Load())
	}
}
