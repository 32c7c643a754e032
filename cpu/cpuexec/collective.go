package cpuexec

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Collectives.
//
// A program compiled with passes.Options.BoundAxes may hold collective ops
// (all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute,
// axis_index): it is one device's program of a sharded computation, run by
// every device of the mesh at the same time, each with its own arguments
// and communicators (Options.Comms). A collective step calls the
// communicator of its "axis" attribute on the calling goroutine, between
// the steps before and after it, never inside a parallel section, so that
// a device waiting for its peers holds no worker another device needs.
//
// The executor reads an operand's memory and writes the result's, which the
// buffer plan keeps apart (collectives are never in place); a result that
// overlaps its operand all the same is computed from a copy of the operand.
//
// Overlap with compute. With asynchronous collectives on (the default;
// FERRY_ASYNC_COLLECTIVES=0 turns them off) every collective of an
// execution runs on a collective worker of its own, one goroutine per
// execution (so per device), in program order: a collective step only
// queues its collective and the region runs on, like a copy step (copy.go).
// It is waited for before the first later step that reads its result or
// writes its operand or result, and at the end of the region at the latest.
// One worker per device keeps the order in which a device calls its
// communicators the program's, the same on every device, so collectives
// match across devices however the compute interleaves with them.
//
// Inside a scan body, an all_gather of an xs slice (FSDP: a layer's
// parameters, all-gathered inside the scan over the stacked layers) whose
// result has its bytes to itself for the whole iteration (the prefetch
// pass of package passes reserves them; the memory analysis counts them)
// is also prefetched: once iteration i's last reader of the gathered
// layer has run, the all_gather of iteration i+1's slice is queued into the
// same bytes and runs beside the rest of iteration i and the start of
// iteration i+1, whose all_gather step only waits for it. A collective
// whose result is a ys slice (the reduce_scatter of a layer's gradient into
// the stacked gradients) runs on beside the next iteration, which waits for
// it only before it overwrites the collective's operand. The plan's
// schedule (passes.Schedule) says which collectives are prefetched and
// carried, and what waits for what.
// Results are bit-identical either way. FERRY_COLLECTIVE_GBPS=g simulates
// an interconnect of g GB/s (each collective takes at least its bytes over
// that rate), so the overlap is observable where the collectives are
// memcpys between goroutines.

// Options configure one execution (ExecuteWith, ExecuteIntoWith).
type Options struct {
	// Comms holds the communicator of each collective axis of the program
	// (the op's "axis" attribute: a mesh axis name, or names joined by
	// commas for the group along several axes) for the device that runs
	// the execution. A collective op whose axis is missing fails with an
	// unbound axis error; one whose "size" is not its communicator's
	// Size() fails naming both. Nil for programs without collectives.
	//
	// An execution of a program with collectives that fails (in any step,
	// or before the first) calls Abort on every communicator of Comms, so
	// that the other devices' collectives return an error wrapping
	// collective.ErrAborted instead of waiting forever for this device.
	Comms map[string]collective.Communicator
	// Context bounds the waits for other devices in collectives; nil means
	// context.Background(). A collective whose context is done aborts its
	// communicator (see collective.Communicator).
	Context context.Context
}

// collEnv is what the collective steps of one execution use.
type collEnv struct {
	comms map[string]collective.Communicator
	ctx   context.Context
	async bool    // collectives run on the worker (FERRY_ASYNC_COLLECTIVES)
	gbps  float64 // simulated interconnect in GB/s (FERRY_COLLECTIVE_GBPS); 0: none
	// The collective worker, started by the first collective: jobs in
	// program order; exited is closed when it has run them all.
	jobs   chan collJob
	exited chan struct{}
}

// collJob is one collective queued on the worker.
type collJob struct {
	run func() error
	ev  *copyEvent
}

// start queues run on the execution's collective worker and returns its
// event (its error is run's).
func (e *collEnv) start(run func() error) *copyEvent {
	ev := &copyEvent{done: make(chan struct{})}
	if e.jobs == nil {
		e.jobs, e.exited = make(chan collJob, 64), make(chan struct{})
		go func(q chan collJob, exited chan struct{}) {
			defer close(exited)
			for j := range q {
				j.ev.err = j.run()
				close(j.ev.done)
			}
		}(e.jobs, e.exited)
	}
	e.jobs <- collJob{run: run, ev: ev}
	return ev
}

// stop ends the execution's collective worker once it has run every job
// queued; after a failed execution (err) it aborts the communicators first,
// so that queued collectives return instead of waiting for peers. No job
// writes the execution's memory once stop returns.
func (e *collEnv) stop(err error) {
	if e == nil || e.jobs == nil {
		return
	}
	if err != nil {
		abortComms(e.comms, err)
	}
	close(e.jobs)
	<-e.exited
	e.jobs, e.exited = nil, nil
}

// configFromEnv reads FERRY_ASYNC_COLLECTIVES and
// FERRY_COLLECTIVE_GBPS into e.
func (e *collEnv) configFromEnv() (err error) {
	if e.async, _, err = settings.AsyncCollectives.Lookup(); err != nil {
		return err
	}
	e.gbps, _, err = settings.CollectiveGBPS.Lookup()
	return err
}

// collStep is a collective step prepared at New: its axis and how it maps
// onto the Communicator's calls (the plan's layout, passes.Collective).
type collStep struct {
	axis  string
	size  int
	red   collective.Op // all_reduce; Sum for reduce_scatter
	shape []int         // send's shape as the communicator sees it
	dim   int           // gather, scatter and split dimension
	dim2  int           // all_to_all's concat dimension
	pairs []collective.Pair
}

var reductions = map[string]collective.Op{"sum": collective.Sum, "max": collective.Max, "min": collective.Min}

// prepareCollective maps the plan's layout of a collective step onto the
// Communicator's arguments.
func prepareCollective(c *passes.Collective) *collStep {
	cs := &collStep{axis: c.Axis, size: c.Size, red: reductions[c.Reduction], shape: c.Shape, dim: c.Dim, dim2: c.Dim2}
	for _, p := range c.Pairs {
		cs.pairs = append(cs.pairs, collective.Pair{Source: p[0], Target: p[1]})
	}
	return cs
}

// runCollective runs collective step i with the execution's communicator of
// its axis: it queues it on the collective worker (asynchronous
// collectives; its completion in *ev), or runs it.
func (f *frame) runCollective(i int, ev **copyEvent) error {
	st := &f.g.steps[i]
	comm, err := f.communicator(i)
	if err != nil {
		return err
	}
	out := f.outs[i][0].Data
	if st.op.Code == ir.AxisIndex {
		binary.LittleEndian.PutUint32(out, uint32(int32(comm.Rank())))
		return nil
	}
	in := f.args[i][0].Data
	if f.env.async {
		ctx, gbps := f.env.ctx, f.env.gbps
		*ev = f.env.start(func() error { return collect(ctx, st, comm, in, out, gbps) })
		return nil
	}
	return collect(f.env.ctx, st, comm, in, out, f.env.gbps)
}

// communicator returns the execution's communicator of collective step i,
// checked against the step.
func (f *frame) communicator(i int) (collective.Communicator, error) {
	st := &f.g.steps[i]
	c, op := st.coll, st.op
	var comm collective.Communicator
	if f.env != nil {
		comm = f.env.comms[c.axis]
	}
	if comm == nil {
		return nil, fmt.Errorf("%s: %w (the execution has no communicator for axis %q)", op.Describe(), ir.UnboundAxisError(op), c.axis)
	}
	if n := comm.Size(); n != c.size {
		return nil, fmt.Errorf("%s: axis %q has size %d in the program, but its communicator has %d ranks", op.Describe(), c.axis, c.size, n)
	}
	return comm, nil
}

// startGather queues, on the collective worker, all_gather step i of a scan
// body on in (the next iteration's slice) into the step's result.
func (f *frame) startGather(i int, in []byte) (*copyEvent, error) {
	st := &f.g.steps[i]
	comm, err := f.communicator(i)
	if err != nil {
		return nil, err
	}
	ctx, out, gbps := f.env.ctx, f.outs[i][0].Data, f.env.gbps
	return f.env.start(func() error { return collect(ctx, st, comm, in, out, gbps) }), nil
}

// collect runs the collective of step st on comm from in into out. With a
// simulated interconnect of gbps GB/s it takes at least the larger of its
// operand and result over that rate (it sleeps for the rest), so that the
// overlap of collectives with compute is observable on a CPU.
func collect(ctx context.Context, st *step, comm collective.Communicator, in, out []byte, gbps float64) error {
	if gbps > 0 {
		start := time.Now()
		defer func() {
			want := time.Duration(float64(max(len(in), len(out))) / gbps)
			if rest := want - time.Since(start); rest > 0 {
				time.Sleep(rest)
			}
		}()
	}
	c, op := st.coll, st.op
	dt := op.Args[0].Type.DType
	if eval.Overlaps(in, out) && !(op.Code == ir.AllReduce && len(in) == len(out) && &in[0] == &out[0]) {
		in = append([]byte(nil), in...) // never planned so: stay correct anyway
	}
	var err error
	switch op.Code {
	case ir.AllReduce:
		err = comm.AllReduce(ctx, c.red, dt, in, out)
	case ir.AllGather:
		err = comm.AllGather(ctx, dt, c.shape, c.dim, in, out)
	case ir.ReduceScatter:
		err = comm.ReduceScatter(ctx, c.red, dt, c.shape, c.dim, in, out)
	case ir.AllToAll:
		err = comm.AllToAll(ctx, dt, c.shape, c.dim, c.dim2, in, out)
	case ir.CollectivePermute:
		err = comm.CollectivePermute(ctx, dt, c.pairs, in, out)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op.Describe(), err)
	}
	return nil
}

// abortComms aborts every communicator of opts with err (see Options.Comms).
func abortComms(comms map[string]collective.Communicator, err error) {
	for _, c := range comms {
		if c != nil {
			c.Abort(err)
		}
	}
}
