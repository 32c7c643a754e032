package blockrun_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ferryml/ferry/backend/blockrun"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// fake is a backend whose locations are ints and whose events are numbered
// from 1; it logs what the runner asks of it.
type fake struct {
	blockrun.Frame[int, int, *fake]
	log   *[]string
	made  *int // events made so far
	waits blockrun.Waits
	// fail makes the dispatch of step fail[0] fail in run fail[1] (0: the
	// first).
	fail [2]int
	runs int
	// subs counts the nested frames made.
	subs   int
	params map[int]int
}

func newFake(blk *passes.Block, waits blockrun.Waits) *fake {
	f := &fake{log: new([]string), made: new(int), waits: waits, fail: [2]int{-1, -1}, params: map[int]int{}}
	f.Init(blk, f, waits)
	return f
}

func (f *fake) logf(format string, args ...any) {
	*f.log = append(*f.log, fmt.Sprintf(format, args...))
}

func (f *fake) newEvent() int {
	*f.made++
	return *f.made
}

func (f *fake) Dispatch(i int, q passes.Queue, ev *int) error {
	if f.fail == [2]int{i, f.runs} {
		return errors.New("boom")
	}
	f.logf("%v: step %d", q, i)
	if f.waits == blockrun.HostWaits && q != passes.QueueCompute {
		*ev = f.newEvent()
	}
	return nil
}

func (f *fake) Wait(q passes.Queue, ev *int) error {
	f.logf("%v: wait e%d", q, *ev)
	if f.waits == blockrun.HostWaits {
		*ev = 0
	}
	return nil
}

func (f *fake) Record(q passes.Queue, ev *int) error {
	if f.waits == blockrun.HostWaits {
		return nil
	}
	if *ev == 0 {
		*ev = f.newEvent()
	}
	f.logf("%v: record e%d", q, *ev)
	return nil
}

func (f *fake) Prefetch(p *passes.Prefetch, q passes.Queue, next int, ev *int) (bool, error) {
	f.logf("%v: prefetch step %d from %d", q, p.Step, next)
	if f.waits == blockrun.HostWaits {
		*ev = f.newEvent()
	}
	return true, nil
}

func (f *fake) NewSub(i, k int) *fake {
	f.subs++
	s := newFake(f.Block().Steps[i].Loop.Blocks[k], f.waits)
	s.log, s.made = f.log, f.made
	return s
}

func (f *fake) Bind(j int, l int)         { f.params[j] = l }
func (f *fake) BindYs(int, int)           {}
func (f *fake) Result(j int) (int, error) { return f.params[0] + 1, nil }

// run runs f once, as loopexec runs an iteration of a scan body: the next
// slice is next (none when next < 0).
func (f *fake) run(next int) error {
	f.BindNext(1, next, next >= 0)
	defer func() { f.runs++ }()
	return f.Run()
}

// scanBody is a scan body of five steps:
//
//	0 to_device copy of xs parameter 1 (prefetched after step 1)
//	1 compute, reads 0
//	2 collective, reads 1 (carried: waited for before step 1)
//	3 compute
//	4 to_host copy, reads 3
//
// with the schedule the plan would give it.
func scanBody() *passes.Block {
	steps := make([]passes.Step, 5)
	for i := range steps {
		steps[i].Op = &ir.Op{Code: ir.Add}
	}
	return &passes.Block{Params: []int{0, 1}, Steps: steps, Schedule: passes.Schedule{
		Steps: []passes.StepSchedule{
			{Queue: passes.QueueToDevice, Record: true, Prefetched: true},
			{Queue: passes.QueueCompute, Wait: []int{0}, Record: true},
			{Queue: passes.QueueCollective, Wait: []int{1}, Record: true},
			{Queue: passes.QueueCompute, Record: true},
			{Queue: passes.QueueToHost, Wait: []int{3}, Record: true},
		},
		Final:         []int{4},
		Prefetch:      []passes.Prefetch{{Step: 0, Param: 1, After: 1, Wait: []int{1}}},
		Carried:       []passes.Carried{{Step: 2, Before: 1}},
		PrefetchAfter: [][]int{nil, {0}, nil, nil, nil},
		CarriedBefore: [][]int{nil, {2}, nil, nil, nil, nil},
	}}
}

// With queue waits (CUDA's streams), three iterations of the scan body:
// each step's queue waits for the events its schedule lists, the
// prefetched copy is issued after step 1 and taken over by the next
// iteration (its events swapped), the carried collective is waited for
// before step 1 of the next iteration and by End, and each iteration ends
// with the compute queue waiting for the Final step.
func TestQueueWaits(t *testing.T) {
	f := newFake(scanBody(), blockrun.QueueWaits)
	for it, next := range []int{10, 20, -1} {
		require.NoError(t, f.run(next), "iteration %d", it)
	}
	require.NoError(t, f.End(false))
	want := []string{
		// Iteration 0: every step runs.
		"to_device: step 0", "to_device: record e1",
		"compute: wait e1", "compute: step 1", "compute: record e2",
		"to_device: prefetch step 0 from 10", "to_device: record e3",
		"collective: wait e2", "collective: step 2", "collective: record e4",
		"compute: step 3", "compute: record e5",
		"to_host: wait e5", "to_host: step 4", "to_host: record e6",
		"compute: wait e6",
		// Iteration 1: step 0 is the prefetch (e3); step 1 waits for the
		// carried collective (e4); the collective records a new event.
		"compute: wait e3", "compute: wait e4", "compute: step 1", "compute: record e2",
		"to_device: prefetch step 0 from 20", "to_device: record e1",
		"collective: wait e2", "collective: step 2", "collective: record e7",
		"compute: step 3", "compute: record e5",
		"to_host: wait e5", "to_host: step 4", "to_host: record e6",
		"compute: wait e6",
		// Iteration 2, the last: no prefetch.
		"compute: wait e1", "compute: wait e7", "compute: step 1", "compute: record e2",
		"collective: wait e2", "collective: step 2", "collective: record e4",
		"compute: step 3", "compute: record e5",
		"to_host: wait e5", "to_host: step 4", "to_host: record e6",
		"compute: wait e6",
		// End: the last carried collective.
		"compute: wait e4",
	}
	require.Equal(t, want, *f.log)
}

// With host waits (the CPU's workers), the events are the dispatches' and
// a wait consumes one; each iteration ends waiting for every event it
// holds, and the carried collective's event moves to the next iteration.
func TestHostWaits(t *testing.T) {
	f := newFake(scanBody(), blockrun.HostWaits)
	for it, next := range []int{10, -1} {
		require.NoError(t, f.run(next), "iteration %d", it)
	}
	require.NoError(t, f.End(false))
	want := []string{
		"to_device: step 0",
		"compute: wait e1", "compute: step 1",
		"to_device: prefetch step 0 from 10", // e2
		"collective: step 2",                 // e3, carried
		"compute: step 3",
		"to_host: step 4", // e4
		"compute: wait e4",
		// Iteration 1: the prefetch, then the carried collective.
		"compute: wait e2", "compute: wait e3", "compute: step 1",
		"collective: step 2", // e5
		"compute: step 3",
		"to_host: step 4", // e6
		"compute: wait e6",
		"compute: wait e5", // End
	}
	require.Equal(t, want, *f.log)
}

// A run that fails with host waits still waits for every event it holds
// before it returns, and End waits for the prefetch nobody took over and
// the carried collective of the iteration before.
func TestHostWaitsFailure(t *testing.T) {
	f := newFake(scanBody(), blockrun.HostWaits)
	f.fail = [2]int{4, 1} // step 4 of iteration 1
	require.NoError(t, f.run(10))
	require.ErrorContains(t, f.run(20), "boom")
	require.NoError(t, f.End(true))
	want := []string{
		"to_device: step 0",
		"compute: wait e1", "compute: step 1",
		"to_device: prefetch step 0 from 10", // e2
		"collective: step 2",                 // e3, carried
		"compute: step 3",
		"to_host: step 4", // e4
		"compute: wait e4",
		"compute: wait e2", "compute: wait e3", "compute: step 1",
		"to_device: prefetch step 0 from 20", // e5
		"collective: step 2",                 // e6
		"compute: step 3",
		"compute: wait e6", // the failed run settles
		"compute: wait e5", // End: the prefetch
	}
	require.Equal(t, want, *f.log)
}

// loopBlock is a block whose step 0 is a scan of length 3 over a body of
// one compute step, with a staged carry.
func loopBlock() *passes.Block {
	body := &passes.Block{Params: []int{0}, Slots: []passes.Slot{{Bytes: 1}}, Results: []int{0},
		Steps:    []passes.Step{{Op: &ir.Op{Code: ir.Add}}},
		Schedule: passes.Schedule{Steps: []passes.StepSchedule{{}}, PrefetchAfter: make([][]int, 1), CarriedBefore: make([][]int, 2)}}
	op := &ir.Op{Code: ir.Scan, Results: []*ir.Value{{Type: ir.TypeOf(ir.Uint8)}}}
	lp := &passes.Loop{Code: ir.Scan, Length: 3, Carry: 1, Blocks: []*passes.Block{body},
		Params: []passes.ParamBind{{Kind: passes.BindOut, Out: 0}}, Results: []passes.ResultBind{{Out: 0, Stage: true}}}
	return &passes.Block{Steps: []passes.Step{{Kind: passes.StepLoop, Op: op, Loop: lp}},
		Schedule: passes.Schedule{Steps: []passes.StepSchedule{{}}, PrefetchAfter: make([][]int, 1), CarriedBefore: make([][]int, 2)}}
}

// intMem is int locations for loopexec: a copy logs, staging adds 100.
type intMem struct{ f *fake }

func (m intMem) Slice(l int, off, _ int64) int { return l + int(off) }
func (m intMem) Copy(dst, src int, _ int64) error {
	m.f.logf("copy %d to %d", src, dst)
	return nil
}
func (m intMem) Stage(j int, src int, _ int64) (int, error) {
	s := m.f.Staging(0, j)
	if *s == 0 {
		*s = 100 + j
		m.f.logf("stage %d made", j)
	}
	return *s, nil
}
func (m intMem) Predicate(int) (bool, error) { return true, nil }

// Loop runs a loop step through loopexec on a nested frame made once, and
// staging buffers made once, however often the step runs.
func TestLoopSubsAndStaging(t *testing.T) {
	f := newFake(loopBlock(), blockrun.QueueWaits)
	for range 2 {
		require.NoError(t, f.Loop(0, intMem{f}, nil, []int{7}))
	}
	require.Equal(t, 1, f.subs)
	require.Same(t, f.Sub(0, 0), f.Sub(0, 0))
	var seen []int
	f.EachSub(func(i, k int, sub *fake) {
		seen = append(seen, i, k)
		require.Equal(t, 7, sub.params[0])
	})
	require.Equal(t, []int{0, 0}, seen)
	// Per iteration: the body's step, its result (8) staged, the staged
	// copy into the carry.
	iteration := []string{"compute: step 0", "copy 100 to 7"}
	want := []string{"compute: step 0", "stage 0 made", "copy 100 to 7"}
	for range 5 {
		want = append(want, iteration...)
	}
	require.Equal(t, want, *f.log)
}

// CompileBlocks compiles the blocks in order and names a failed one.
func TestCompileBlocks(t *testing.T) {
	cond, body := &passes.Block{}, &passes.Block{}
	st := &passes.Step{Op: &ir.Op{Code: ir.While, Loc: "f.go:3"}, Loop: &passes.Loop{Code: ir.While, Blocks: []*passes.Block{cond, body}}}
	got, err := blockrun.CompileBlocks(st, func(b *passes.Block) (string, error) {
		if b == cond {
			return "c", nil
		}
		return "b", nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"c", "b"}, got)
	_, err = blockrun.CompileBlocks(st, func(b *passes.Block) (string, error) {
		if b == body {
			return "", errors.New("boom")
		}
		return "c", nil
	})
	require.EqualError(t, err, "while (f.go:3) body: boom")
}
