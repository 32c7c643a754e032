package cpuexec

import (
	"bytes"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// poisonAlloc hands out fresh memory filled with garbage and overwrites it
// with 0xff (NaN in every float type) when it is released, so that a frame
// still pointing at an earlier execution's arena computes wrong results.
type poisonAlloc struct{}

func (poisonAlloc) Alloc(space ir.MemorySpace, size int64, what string) ([]byte, func(), error) {
	mem := alignedBytes(int(size) + 8)[:size]
	for i := range mem {
		mem[i] = byte(i*13 + 5)
	}
	return mem, func() {
		for i := range mem {
			mem[i] = 0xff
		}
	}, nil
}

// frameReuseFuncs are programs whose executions reuse frames: a fused group
// with temporaries, a scan (a nested frame) and a while holding a cond
// (nested frames two deep).
func frameReuseFuncs(t *testing.T) []*ir.Func {
	return []*ir.Func{loopGroup(t, ir.Float32, 20, 30), scanFunc(t, 5, false, true), scanFunc(t, 3, true, false), whileCondFunc(t)}
}

// frameReuseArgs are fresh random arguments for fn (a loop bound from 0 to
// 6 for the while program).
func frameReuseArgs(r *rand.Rand, fn *ir.Func) []*ir.Literal {
	args := randArgs(r, fn)
	if fn.Name == "while" {
		args[0] = ir.Scalar(int32(r.IntN(7)))
		args[2] = ir.Scalar(int32(0))
	}
	return args
}

// TestFrameReuse runs each Executable many times, one after another and
// from several goroutines at once, on fresh arguments every time, with
// memory that is poisoned when released: frames kept from earlier
// executions must be rebound to the new arenas, parameters and results
// (run it with -race too).
func TestFrameReuse(t *testing.T) {
	for _, fn := range frameReuseFuncs(t) {
		e, err := New(naivePlan(fn, planOpts{}))
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		seed := testseed.Uint64(t)
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), seed))
				for it := range 6 {
					args := frameReuseArgs(r, fn)
					want, err := eval.Run(fn, cloneAll(args))
					if err != nil {
						errs <- err
						return
					}
					got, rels, err := e.Execute(args, poisonAlloc{})
					if err != nil {
						errs <- err
						return
					}
					for i := range want {
						if !bytes.Equal(got[i].Data, want[i].Data) {
							errs <- fmt.Errorf("%s, goroutine %d, execution %d: result %d differs:\n got %v\nwant %v", fn.Name, g, it, i, head(got[i]), head(want[i]))
							return
						}
					}
					for _, rel := range rels {
						rel()
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

// TestFrameReuseAllocations checks that a repeated execution of a program
// without nested regions makes no frame: Execute allocates its results and
// their slices, ExecuteInto only the results' literals.
func TestFrameReuseAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop frames at random")
	}
	fn := loopGroup(t, ir.Float32, 20, 30)
	e, err := New(naivePlan(fn, planOpts{}))
	require.NoError(t, err)
	args := randArgs(newRand(), fn)
	a := &reuseAlloc{}
	run := func() {
		_, rels, err := e.Execute(args, a)
		require.NoError(t, err)
		for _, rel := range rels {
			rel()
		}
	}
	run()
	n := len(fn.Body.Results)
	require.LessOrEqual(t, testing.AllocsPerRun(100, run), float64(2+n))
	outs, rels := make([]*ir.Literal, e.NumResults()), make([]func(), e.NumResults())
	into := func() { require.NoError(t, e.ExecuteInto(args, a, outs, rels)) }
	require.LessOrEqual(t, testing.AllocsPerRun(100, into), float64(n))
	want, err := eval.Run(fn, args)
	require.NoError(t, err)
	for i := range want {
		require.Equal(t, want[i].Data, outs[i].Data, "result %d", i)
	}
	require.ErrorContains(t, e.ExecuteInto(args, a, outs[:n-1], rels), "room for")
}

// TestExecuteIntoProvidedLiterals checks that ExecuteInto writes results
// into literals the caller provides (keeping the pointers, overwriting a
// stale type) and then allocates nothing, and that results still match
// the reference evaluator.
func TestExecuteIntoProvidedLiterals(t *testing.T) {
	fn := loopGroup(t, ir.Float32, 20, 30)
	e, err := New(naivePlan(fn, planOpts{}))
	require.NoError(t, err)
	r := newRand()
	n := e.NumResults()
	outs, rels := make([]*ir.Literal, n), make([]func(), n)
	given := make([]*ir.Literal, n)
	for i := range given {
		given[i] = &ir.Literal{Type: ir.TypeOf(ir.Int32, 7)} // stale: overwritten
		outs[i] = given[i]
	}
	a := &reuseAlloc{}
	for range 3 {
		args := randArgs(r, fn)
		require.NoError(t, e.ExecuteInto(args, a, outs, rels))
		want, err := eval.Run(fn, args)
		require.NoError(t, err)
		for i := range want {
			require.Same(t, given[i], outs[i], "result %d written in place", i)
			require.True(t, want[i].Type.Equal(outs[i].Type), "result %d: %v, want %v", i, outs[i].Type, want[i].Type)
			require.Equal(t, want[i].Data, outs[i].Data, "result %d", i)
		}
	}
	if !raceEnabled {
		args := randArgs(r, fn)
		into := func() { require.NoError(t, e.ExecuteInto(args, a, outs, rels)) }
		require.Zero(t, testing.AllocsPerRun(100, into))
	}
}
