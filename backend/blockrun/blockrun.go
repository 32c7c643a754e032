// Package blockrun runs one block of the executable plan (passes.Block:
// its steps and its asynchronous schedule, passes.Schedule) for a backend,
// generic over the backend's memory location L, its event E and its frame
// type F. Both backends run their blocks through it: the CPU over byte
// slices and the completions of its copy and collective workers, CUDA over
// device and pinned host pointers and CUDA events.
//
// A Frame is one activation of a block, reused by every run of it (every
// iteration of a loop). Run walks the steps in block order; for step i it
//
//   - takes over the step when the previous iteration already issued it (a
//     prefetch): its event stands for it, and the step is not run again;
//   - otherwise has the step's queue wait for the events of the steps the
//     schedule lists (StepSchedule.Wait) and for the previous iteration's
//     carried collectives waited for there (Schedule.CarriedBefore[i]),
//     dispatches the step and records its event when a later step, the end
//     of the block, a prefetch or the next iteration waits for it
//     (StepSchedule.Record);
//   - then issues the prefetches the schedule starts after it
//     (Schedule.PrefetchAfter[i]): the next iteration's copies and
//     all_gathers of xs slices, each after the readers of its destination,
//     with its event kept until the next iteration takes the step over.
//
// At the end of the block the compute queue waits for the carried
// collectives waited for there (CarriedBefore[len(steps)]), the
// iteration's carried collectives are handed to the next iteration (their
// events become the previous ones), and the compute queue waits for the
// block's other work: the Final steps (QueueWaits), or every event the
// block still holds (HostWaits). End, after a scan's last iteration (or a
// failed one), waits for the prefetches nobody took over and the carried
// collectives of the last iteration.
//
// The frame also keeps what a backend makes on first use per step: the
// frames of the nested blocks of a loop step (Sub, made by
// Backend.NewSub) and the staging buffers of its results (Staging); Loop
// runs a loop step through loopexec with them. The backend supplies what
// is its own (Backend): dispatching a step, waiting for and recording
// events on its queues, issuing a prefetch.
package blockrun

import (
	"fmt"

	"github.com/ferryml/ferry/backend/loopexec"
	"github.com/ferryml/ferry/passes"
)

// Waits says what a backend's waits are.
type Waits uint8

const (
	// QueueWaits: a wait orders a queue after an event and returns at
	// once (CUDA's cuStreamWaitEvent); an event stays valid after it. The
	// block ends with the compute queue waiting for the schedule's Final
	// steps, which the queues' order extends to every step.
	QueueWaits Waits = iota
	// HostWaits: a wait blocks until the event is complete, clears it and
	// returns the error of what it stands for (the CPU's copy and
	// collective workers). The block ends waiting for every event it holds,
	// so that every error is seen, and a failed run still waits for every
	// event it holds before it returns (the memory they write may be
	// released then).
	HostWaits
)

// Backend is what a backend does for the runner in one activation of a
// block: run a step, order and mark its queues. The queue is the step's
// in the schedule (StepSchedule.Queue).
type Backend[L any, E comparable, F any] interface {
	// Dispatch runs step i, or issues it on queue q. A backend whose
	// queues hand back the completion of what they run (HostWaits) sets
	// *ev to it.
	Dispatch(i int, q passes.Queue, ev *E) error
	// Wait makes queue q wait for *ev, never the zero E (see Waits).
	Wait(q passes.Queue, ev *E) error
	// Record marks *ev on queue q after a step or a prefetch that is
	// waited for; a backend that orders its queues with events makes *ev
	// on first use and records it (one whose events the dispatch made
	// does nothing).
	Record(q passes.Queue, ev *E) error
	// Prefetch issues prefetch p of a scan body on queue q: the next
	// iteration's step p.Step, reading next (the next slice of xs
	// parameter p.Param), after the readers of its destination (p.Wait:
	// Frame.Await orders them on a queue). It returns false when it does
	// not issue it (the next iteration then runs the step itself);
	// otherwise a backend with HostWaits sets *ev to its completion.
	Prefetch(p *passes.Prefetch, q passes.Queue, next L, ev *E) (bool, error)
	// NewSub makes the frame of nested block k of loop step i (Sub calls
	// it once per step and block).
	NewSub(i, k int) F
}

// Frame is one activation of a block: its events and the state it keeps
// between the runs of the block. A backend's frame embeds it and calls
// Init; F is the backend's frame type.
type Frame[L any, E comparable, F interface {
	comparable
	loopexec.Block[L]
}] struct {
	blk   *passes.Block
	be    Backend[L, E, F]
	waits Waits
	// events[i] is the event of step i (the zero E: none).
	events []E
	// Prefetches (scan bodies): next[j] is the next iteration's slice of
	// xs parameter j (hasNext: there is one); issued[k] says that step k of
	// the next iteration was issued by this one, its event in pre[k] (Run
	// swaps it into events[k]).
	next    []L
	hasNext bool
	issued  []bool
	pre     []E
	// prev[k] is the event of carried collective step k of the previous
	// iteration (scan bodies with carried collectives).
	prev []E
	// subs[i][k] is the frame of nested block k of step i; stage[i][j] the
	// staging buffer of result j of loop step i (made on first use).
	subs  [][]F
	stage [][]L
}

// Init makes f the activation of block blk, run by be, whose waits are
// waits.
func (f *Frame[L, E, F]) Init(blk *passes.Block, be Backend[L, E, F], waits Waits) {
	n := len(blk.Steps)
	sc := &blk.Schedule
	f.blk, f.be, f.waits = blk, be, waits
	f.events = make([]E, n)
	if len(sc.Prefetch) > 0 {
		f.next, f.issued, f.pre = make([]L, len(blk.Params)), make([]bool, n), make([]E, n)
	}
	if len(sc.Carried) > 0 {
		f.prev = make([]E, n)
	}
}

// Block is the block f runs.
func (f *Frame[L, E, F]) Block() *passes.Block { return f.blk }

// Event is the event of step i (the zero E until the step records one).
func (f *Frame[L, E, F]) Event(i int) *E { return &f.events[i] }

// Await makes queue q wait for the events of steps ss, stopping at the
// first error.
func (f *Frame[L, E, F]) Await(q passes.Queue, ss []int) error { return f.awaitIn(q, f.events, ss) }

// awaitIn makes queue q wait for the events evs[j] of steps ss that are
// set, stopping at the first error.
func (f *Frame[L, E, F]) awaitIn(q passes.Queue, evs []E, ss []int) error {
	var zero E
	for _, j := range ss {
		if evs[j] != zero {
			if err := f.be.Wait(q, &evs[j]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Run runs the block once (see the package comment). When it returns the
// compute queue follows every step it issued (HostWaits: every such step
// is complete), but the carried collectives and the prefetches of the next
// iteration.
func (f *Frame[L, E, F]) Run() error {
	if f.waits == HostWaits {
		defer f.settle() // a failed run, or a panic recovered above
	}
	sc := &f.blk.Schedule
	for i := range sc.Steps {
		if len(f.issued) > 0 && f.issued[i] {
			// The previous iteration issued this step: its event stands
			// for it.
			f.issued[i] = false
			f.events[i], f.pre[i] = f.pre[i], f.events[i]
		} else if err := f.step(i, &sc.Steps[i]); err != nil {
			return err
		}
		if f.hasNext && len(sc.PrefetchAfter[i]) > 0 {
			if err := f.prefetch(i); err != nil {
				return err
			}
		}
	}
	n := len(sc.Steps)
	if err := f.awaitCarried(passes.QueueCompute, sc.CarriedBefore[n]); err != nil {
		return err
	}
	// This iteration's carried collectives run on; the next waits for them.
	for _, c := range sc.Carried {
		f.events[c.Step], f.prev[c.Step] = f.prev[c.Step], f.events[c.Step]
	}
	if f.waits == QueueWaits {
		return f.Await(passes.QueueCompute, sc.Final)
	}
	return f.drain(f.events)
}

// step waits for what step i waits for, dispatches it and records its
// event.
func (f *Frame[L, E, F]) step(i int, p *passes.StepSchedule) error {
	if err := f.Await(p.Queue, p.Wait); err != nil {
		return err
	}
	if err := f.awaitCarried(p.Queue, f.blk.Schedule.CarriedBefore[i]); err != nil {
		return err
	}
	if err := f.be.Dispatch(i, p.Queue, &f.events[i]); err != nil {
		return err
	}
	if p.Record {
		return f.be.Record(p.Queue, &f.events[i])
	}
	return nil
}

// awaitCarried makes queue q wait for the previous iteration's carried
// collectives ks.
func (f *Frame[L, E, F]) awaitCarried(q passes.Queue, ks []int) error {
	return f.awaitIn(q, f.prev, ks)
}

// prefetch issues the prefetches the schedule starts after step i.
func (f *Frame[L, E, F]) prefetch(i int) error {
	sc := &f.blk.Schedule
	for _, pi := range sc.PrefetchAfter[i] {
		p := &sc.Prefetch[pi]
		q := sc.Steps[p.Step].Queue
		ok, err := f.be.Prefetch(p, q, f.next[p.Param], &f.pre[p.Step])
		if err != nil {
			return err
		}
		if ok {
			if err := f.be.Record(q, &f.pre[p.Step]); err != nil {
				return err
			}
			f.issued[p.Step] = true
		}
	}
	return nil
}

// drain has the compute queue wait for every event of evs, and returns
// the first error.
func (f *Frame[L, E, F]) drain(evs []E) error {
	var zero E
	var first error
	for k := range evs {
		if evs[k] != zero {
			if err := f.be.Wait(passes.QueueCompute, &evs[k]); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// settle waits for every event f holds (HostWaits), errors aside.
func (f *Frame[L, E, F]) settle() { _ = f.drain(f.events) }

// BindNext keeps the next iteration's slice of xs parameter j for the
// prefetches of a scan body (loopexec.Block).
func (f *Frame[L, E, F]) BindNext(j int, l L, ok bool) {
	if f.next == nil {
		return
	}
	var zero L
	if !ok {
		l = zero // hold no memory past the scan
	}
	f.next[j], f.hasNext = l, ok
}

// End waits, once a scan is over (loopexec.Block), for the prefetches
// nobody took over (after a failed iteration) and the carried collectives
// of the last iteration, and returns the first error of the latter.
func (f *Frame[L, E, F]) End(bool) error {
	for k, ok := range f.issued {
		if ok {
			f.issued[k] = false
			_ = f.drain(f.pre[k : k+1])
		}
	}
	return f.drain(f.prev)
}

// Sub returns the frame of nested block k of loop step i, made by the
// backend on first use.
func (f *Frame[L, E, F]) Sub(i, k int) F {
	if f.subs == nil {
		f.subs = make([][]F, len(f.blk.Steps))
	}
	if f.subs[i] == nil {
		f.subs[i] = make([]F, len(f.blk.Steps[i].Loop.Blocks))
	}
	var zero F
	if f.subs[i][k] == zero {
		f.subs[i][k] = f.be.NewSub(i, k)
	}
	return f.subs[i][k]
}

// EachSub calls fn with every nested frame made so far, and the step and
// block it runs.
func (f *Frame[L, E, F]) EachSub(fn func(i, k int, sub F)) {
	var zero F
	for i, subs := range f.subs {
		for k, sub := range subs {
			if sub != zero {
				fn(i, k, sub)
			}
		}
	}
}

// Staging returns the staging buffer of result j of loop step i, the zero
// L until the backend makes it (loopexec.Memory's Stage).
func (f *Frame[L, E, F]) Staging(i, j int) *L {
	if f.stage == nil {
		f.stage = make([][]L, len(f.blk.Steps))
	}
	if f.stage[i] == nil {
		f.stage[i] = make([]L, len(f.blk.Steps[i].Loop.Results))
	}
	return &f.stage[i][j]
}

// Loop runs loop step i (a scan, while or cond) through loopexec over
// mem, with its operands at args and results at outs, on the nested
// frames of f.
func (f *Frame[L, E, F]) Loop(i int, mem loopexec.Memory[L], args, outs []L) error {
	return loopexec.Run(&f.blk.Steps[i], mem, args, outs, func(k int) loopexec.Block[L] { return f.Sub(i, k) })
}

// CompileBlocks compiles the nested blocks of loop step st, in order, with
// compile; an error names the op and the block ("while (f.go:12) cond:
// ...").
func CompileBlocks[R any](st *passes.Step, compile func(*passes.Block) (R, error)) ([]R, error) {
	out := make([]R, 0, len(st.Loop.Blocks))
	for k, blk := range st.Loop.Blocks {
		r, err := compile(blk)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", st.Op.Describe(), loopexec.BlockName(st.Loop.Code, k), err)
		}
		out = append(out, r)
	}
	return out, nil
}
