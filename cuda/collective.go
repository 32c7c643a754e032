package cuda

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// Collectives on the device.
//
// A per-device program of a sharded computation (compiled with
// CompileOptions.BoundAxes naming its collective axes) runs its collective
// ops through the device communicators of ExecOptions.DeviceComms (NCCL,
// package cuda/nccl), one per axis string. A collective is a step of the
// plan like a kernel: it is enqueued on the compute stream (StreamOf), after
// the events its stream plan waits for and before the steps that read its
// result, so the device orders it with the kernels around it and the host
// does not wait for it.
//
// NCCL's collectives work on flat buffers: all-gather puts rank i's block at
// offset i·count, reduce-scatter gives rank i the i-th block of the flat
// send buffer, point-to-point calls move contiguous blocks. Where the op's
// dimension is not the leading one (more precisely: where the dimensions
// before it are not all 1), the step moves the rank axis with a generated
// transpose kernel on the same stream: all_gather gathers into a staging
// buffer laid out [ranks, operand...] and transposes the rank axis into
// place; reduce_scatter first transposes the blocks of its dimension to the
// front; all_to_all does both around grouped Send/Recv calls (one block to
// and from every rank). collective_permute is grouped Send/Recv (a pair
// whose source is its target is a device copy; a rank no pair targets gets
// zeros, cuMemsetD8Async); axis_index writes the rank's bytes with
// cuMemsetD8Async. Copies (gathers, all-to-all, permutes) move bytes
// (ncclUint8), so every element type works; reductions need the element
// type's NCCL type (no bool, int8 or int16).
//
// The staging buffers of every collective step share one device scratch
// allocation per execution, used on the compute stream only.
//
// Waiting. While an execution with device communicators waits for the
// compute stream (at its end, for the predicate of a while or cond, before
// a host step), it polls the stream (cuStreamQuery) and between polls each
// communicator's AsyncError and the context: an asynchronous error or a
// done context aborts every communicator of the execution
// (DeviceCommunicator.Abort, ncclCommAbort), so that the stream drains, and
// the execution fails with an error naming the axis, the rank and the last
// collective issued there. So does a wait longer than
// $FERRY_COLLECTIVE_TIMEOUT (collective.TimeoutEnv: a Go duration, default
// 5m, 0 or "off" for none), which is how a peer that hangs without an
// error (a process stopped, a network that drops nothing) ends. Any other failure of an execution with device
// communicators aborts them too, so that the other ranks' collectives fail
// instead of waiting for this one.

// DeviceCollectives reports true: the backend runs collectives through
// ExecOptions.DeviceComms (backend.DeviceCollectives), which the runtime
// makes with the DeviceCommMaker that package cuda/nccl registers for
// "cuda" (import it, for its side effect if nothing else, to run sharded
// programs with collectives on this backend).
func (b *Backend) DeviceCollectives() bool { return true }

// collStep is a collective op prepared at Compile.
type collStep struct {
	axis string
	size int
	red  collective.Op // all_reduce; Sum for reduce_scatter
	dt   ir.DType
	// count is the operand's elements, bytes its bytes.
	count int
	bytes int64
	// pre transposes the operand into staging buffer 0 (reduce_scatter,
	// all_to_all) and post staging buffer 1 (all_to_all) or 0 (all_gather)
	// into the result; nil when the layout needs no transpose.
	pre, post *xpose
	// stage0, stage1 are the bytes of the staging buffers (0: unused).
	stage0, stage1 int64
	pairs          []collective.Pair
}

// xpose is a generated transpose kernel with its loaded entries.
type xpose struct {
	kernel *Kernel
	fns    []uintptr
}

var collReductions = map[string]collective.Op{"sum": collective.Sum, "max": collective.Max, "min": collective.Min}

// prepareCollective makes s a collective step of e.
func (b *Backend) prepareCollective(e *executable, s *step) error {
	op := s.op
	a := op.Attrs
	c := &collStep{axis: a.String("axis"), size: a.Int("size")}
	if c.axis == "" || c.size < 1 {
		return fmt.Errorf("%s: collective with axis %q of size %d", op.Describe(), c.axis, c.size)
	}
	s.kind, s.coll = stepCollective, c
	if op.Code == ir.AxisIndex {
		return nil
	}
	if len(op.Args) != 1 || len(op.Results) != 1 {
		return fmt.Errorf("%s: a collective takes one operand and has one result", op.Describe())
	}
	x := op.Args[0].Type
	for _, v := range []*ir.Value{op.Args[0], op.Results[0]} {
		if v.Type.Space != ir.Device {
			return fmt.Errorf("%s: operand or result in %v memory: NCCL collectives work on device memory", op.Describe(), v.Type.Space)
		}
	}
	c.dt, c.count, c.bytes = x.DType, x.Shape.Size(), x.Bytes()
	n := c.size
	shape := []int(x.Shape)
	var err error
	switch op.Code {
	case ir.AllReduce:
		r, ok := collReductions[a.String("reduction")]
		if !ok {
			return fmt.Errorf("%s: unknown reduction %q", op.Describe(), a.String("reduction"))
		}
		c.red = r
	case ir.AllGather:
		d := a.Int("dimension")
		if ir.Shape(shape[:min(d, len(shape))]).Size() > 1 {
			// Gather [n, shape...] into staging 0, move the rank axis to d:
			// stacked, that is the result; tiled, the result's dimension d
			// is n·shape[d], rank-major, the same bytes.
			c.stage0 = int64(n) * c.bytes
			if c.post, err = b.transposer(x.DType, append([]int{n}, shape...), moveAxis(len(shape)+1, 0, d)); err != nil {
				return fmt.Errorf("%s: %w", op.Describe(), err)
			}
		}
	case ir.ReduceScatter:
		d := a.Int("dimension")
		c.red = collective.Sum
		if d < 0 || d >= len(shape) || shape[d]%n != 0 {
			return fmt.Errorf("%s: dimension %d of %v is not divisible by the axis size %d", op.Describe(), d, x, n)
		}
		if ir.Shape(shape[:d]).Size() > 1 {
			// View dimension d as [n, shape[d]/n] and move the n to the front.
			view := append(append(append([]int{}, shape[:d]...), n, shape[d]/n), shape[d+1:]...)
			c.stage0 = c.bytes
			if c.pre, err = b.transposer(x.DType, view, moveAxis(len(view), d, 0)); err != nil {
				return fmt.Errorf("%s: %w", op.Describe(), err)
			}
		}
	case ir.AllToAll:
		sd, cd := a.Int("split_dimension"), a.Int("concat_dimension")
		if sd < 0 || sd >= len(shape) || cd < 0 || cd >= len(shape) || shape[sd]%n != 0 {
			return fmt.Errorf("%s: split_dimension %d or concat_dimension %d does not fit %v and axis size %d", op.Describe(), sd, cd, x, n)
		}
		blk := append([]int{}, shape...)
		blk[sd] /= n
		if ir.Shape(shape[:sd]).Size() > 1 {
			view := append(append(append([]int{}, shape[:sd]...), n, shape[sd]/n), shape[sd+1:]...)
			c.stage0 = c.bytes
			if c.pre, err = b.transposer(x.DType, view, moveAxis(len(view), sd, 0)); err != nil {
				return fmt.Errorf("%s: %w", op.Describe(), err)
			}
		}
		if ir.Shape(blk[:cd]).Size() > 1 {
			// Received blocks are [n, blk...]; the result is blk with
			// dimension cd multiplied by n, source-rank-major.
			c.stage1 = c.bytes
			if c.post, err = b.transposer(x.DType, append([]int{n}, blk...), moveAxis(len(blk)+1, 0, cd)); err != nil {
				return fmt.Errorf("%s: %w", op.Describe(), err)
			}
		}
	case ir.CollectivePermute:
		p := a.Ints("pairs")
		for i := 0; i+1 < len(p); i += 2 {
			c.pairs = append(c.pairs, collective.Pair{Source: p[i], Target: p[i+1]})
		}
	default:
		return fmt.Errorf("%s: the CUDA backend has no executor for this collective", op.Describe())
	}
	e.collScratch = max(e.collScratch, align256(c.stage0)+align256(c.stage1))
	return nil
}

func align256(n int64) int64 { return (n + 255) &^ 255 }

// moveAxis returns the perm (result dim i = operand dim perm[i]) of a
// transpose of rank dims that moves operand dimension from to result
// position to, keeping the others in order.
func moveAxis(rank, from, to int) []int {
	rest := make([]int, 0, rank)
	for i := range rank {
		if i != from {
			rest = append(rest, i)
		}
	}
	perm := append(append(append([]int{}, rest[:to]...), from), rest[to:]...)
	return perm
}

// transposer generates and loads the kernel of a transpose of an array of
// dt and shape by perm.
func (b *Backend) transposer(dt ir.DType, shape, perm []int) (*xpose, error) {
	f := ir.NewFunc("collective_layout")
	p := f.Body.AddParam(ir.TypeOf(dt, shape...))
	op, err := f.Body.AddOp(ir.Transpose, []*ir.Value{p}, ir.Attrs{"perm": perm})
	if err != nil {
		return nil, fmt.Errorf("cuda: layout transpose of %v by %v: %w", p.Type, perm, err)
	}
	k, err := GenerateOp(op)
	if err != nil {
		return nil, fmt.Errorf("cuda: layout transpose of %v: %w", p.Type, err)
	}
	fns, err := b.module(k)
	if err != nil {
		return nil, err
	}
	return &xpose{kernel: k, fns: fns}, nil
}

// launch runs the transpose from src to dst on stream.
func (t *xpose) launch(b *Backend, src, dst, stream uintptr) error {
	args := []uintptr{src, dst, 0}
	for i, en := range t.kernel.Entries {
		if en.N == 0 {
			continue
		}
		args[2] = uintptr(en.N)
		if err := b.d.Launch(t.fns[i], ConfigFor(en, b.sms), stream, args); err != nil {
			return fmt.Errorf("%w (kernel %s)", err, en.Name)
		}
	}
	return nil
}

// collective issues collective step i of f, whose operands and results are
// at args and outs, on stream.
func (x *execution) collective(f *frame, i int, args, outs []loc, stream uintptr) error {
	s := &f.g.steps[i]
	c, op := s.coll, s.op
	comm := x.comms[c.axis]
	if comm == nil {
		return fmt.Errorf("%s: %w (the execution has no device communicator for axis %q: ExecOptions.DeviceComms)", op.Describe(), ir.UnboundAxisError(op), c.axis)
	}
	rank, size := comm.Rank(), comm.Size()
	if size != c.size {
		return fmt.Errorf("%s: axis %q has size %d in the program, but its communicator has %d ranks", op.Describe(), c.axis, c.size, size)
	}
	x.last[c.axis] = op
	fail := func(err error) error {
		return fmt.Errorf("%s: rank %d of %d on axis %q: %w", op.Describe(), rank, size, c.axis, err)
	}
	b := x.b
	out := outs[0]
	if op.Code == ir.AxisIndex {
		for k := range 4 { // the int32's little-endian bytes
			if err := b.d.Check("cuMemsetD8Async", out.p+uintptr(k), uintptr(byte(rank>>(8*k))), 1, stream); err != nil {
				return fail(err)
			}
		}
		return nil
	}
	in := args[0]
	outBytes := op.Results[0].Type.Bytes()
	if in.p < out.p+uintptr(outBytes) && out.p < in.p+uintptr(c.bytes) && !(op.Code == ir.AllReduce && in.p == out.p) {
		return fmt.Errorf("%s: internal error: the buffer plan overlaps the collective's operand and result", op.Describe())
	}
	stage0, stage1 := x.collScratch, x.collScratch+uintptr(align256(c.stage0))
	send := in.p
	var err error
	if c.pre != nil {
		if err := c.pre.launch(b, in.p, stage0, stream); err != nil {
			return fail(err)
		}
		send = stage0
	}
	n := size
	switch op.Code {
	case ir.AllReduce:
		err = comm.AllReduce(send, out.p, c.count, c.dt, c.red, stream)
	case ir.ReduceScatter:
		err = comm.ReduceScatter(send, out.p, c.count/n, c.dt, c.red, stream)
	case ir.AllGather:
		if c.post == nil {
			err = comm.AllGather(send, out.p, int(c.bytes), ir.Uint8, stream)
		} else if err = comm.AllGather(send, stage0, int(c.bytes), ir.Uint8, stream); err == nil {
			err = c.post.launch(b, stage0, out.p, stream)
		}
	case ir.AllToAll:
		recv := out.p
		if c.post != nil {
			recv = stage1
		}
		blk := int(c.bytes) / n
		err = grouped(comm, func() error {
			for j := range n {
				if err := comm.Send(send+uintptr(j*blk), blk, ir.Uint8, j, stream); err != nil {
					return err
				}
				if err := comm.Recv(recv+uintptr(j*blk), blk, ir.Uint8, j, stream); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil && c.post != nil {
			err = c.post.launch(b, stage1, out.p, stream)
		}
	case ir.CollectivePermute:
		err = x.permute(comm, c, send, out.p, stream)
	}
	if err != nil {
		return fail(err)
	}
	return nil
}

// permute issues a collective_permute: grouped Send/Recv for the pairs
// between different ranks, a device copy for a rank's pair with itself,
// zeros for a rank no pair targets.
func (x *execution) permute(comm backend.DeviceCommunicator, c *collStep, send, recv, stream uintptr) error {
	rank, nb := comm.Rank(), int(c.bytes)
	targeted := false
	var self bool
	err := grouped(comm, func() error {
		for _, p := range c.pairs {
			switch {
			case p.Source == rank && p.Target == rank:
				self, targeted = true, true
			case p.Source == rank:
				if err := comm.Send(send, nb, ir.Uint8, p.Target, stream); err != nil {
					return err
				}
			case p.Target == rank:
				targeted = true
				if err := comm.Recv(recv, nb, ir.Uint8, p.Source, stream); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case self:
		return x.b.copy(recv, false, send, false, c.bytes, stream)
	case !targeted && nb > 0:
		return x.b.d.Check("cuMemsetD8Async", recv, 0, uintptr(nb), stream)
	}
	return nil
}

// grouped runs calls between comm.GroupStart and GroupEnd (GroupEnd runs
// even when a call fails, so the group is not left open).
func grouped(comm backend.DeviceCommunicator, calls func() error) error {
	if err := comm.GroupStart(); err != nil {
		return err
	}
	err := calls()
	return errors.Join(err, comm.GroupEnd())
}

// ErrCollectiveTimeout is wrapped by the error of an execution whose wait
// for its collectives exceeded $FERRY_COLLECTIVE_TIMEOUT.
var ErrCollectiveTimeout = errors.New("cuda: collectives timed out")

// streamNotReady is CUDA_ERROR_NOT_READY, cuStreamQuery's answer while work
// is pending.
const streamNotReady = 600

// waitStream waits until stream has drained. Without device communicators
// it is cuStreamSynchronize; with them it polls the stream, the
// communicators' asynchronous errors and the context (see the comment at
// the top of this file).
func (x *execution) waitStream(stream uintptr) error {
	b := x.b
	if len(x.comms) == 0 {
		return b.d.Check("cuStreamSynchronize", stream)
	}
	limit, err := collective.TimeoutFromEnv()
	if err != nil {
		err = fmt.Errorf("cuda: %w", err)
		x.abort(err)
		return err
	}
	start := time.Now()
	pause := 20 * time.Microsecond
	for {
		r, err := b.d.Call("cuStreamQuery", stream)
		if err != nil {
			return err
		}
		switch r {
		case 0:
			return nil
		case streamNotReady:
		default:
			return b.d.Check("cuStreamQuery", stream)
		}
		for _, ax := range sortedAxes(x.comms) {
			comm := x.comms[ax]
			if err := comm.AsyncError(); err != nil {
				err = fmt.Errorf("cuda: the collectives on axis %q failed on rank %d of %d%s: %w", ax, comm.Rank(), comm.Size(), x.lastIssued(ax), err)
				x.abort(err)
				return err
			}
		}
		if err := x.ctx.Err(); err != nil {
			err = fmt.Errorf("cuda: waiting for the collectives%s: %w; the communicators were aborted", x.lastIssuedAll(), err)
			x.abort(err)
			return err
		}
		if limit > 0 && time.Since(start) > limit {
			err := fmt.Errorf("%w: waited %v ($%s) for the collectives%s; the communicators were aborted", ErrCollectiveTimeout, limit, collective.TimeoutEnv, x.lastIssuedAll())
			x.abort(err)
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

// waitAll waits for every stream of the backend (waitStream on each).
func (x *execution) waitAll() error {
	for _, s := range x.b.streams {
		if err := x.waitStream(s); err != nil {
			return err
		}
	}
	return nil
}

// lastIssued names the last collective issued on axis ax.
func (x *execution) lastIssued(ax string) string {
	if op := x.last[ax]; op != nil {
		return " (last issued: " + op.Describe() + ")"
	}
	return ""
}

// lastIssuedAll names the last collective issued on each axis.
func (x *execution) lastIssuedAll() string {
	var s string
	for _, ax := range sortedAxes(x.comms) {
		if op := x.last[ax]; op != nil {
			s += fmt.Sprintf(" of axis %q (rank %d, last issued: %s)", ax, x.comms[ax].Rank(), op.Describe())
		}
	}
	return s
}

// abort aborts every device communicator of the execution, once.
func (x *execution) abort(error) {
	if x.aborted {
		return
	}
	x.aborted = true
	for _, ax := range sortedAxes(x.comms) {
		_ = x.comms[ax].Abort()
	}
}

// sortedAxes returns the axes of comms in order (a stable order for
// errors and aborts).
func sortedAxes(comms map[string]backend.DeviceCommunicator) []string {
	out := make([]string, 0, len(comms))
	for ax := range comms {
		out = append(out, ax)
	}
	slices.Sort(out)
	return out
}

// execContext returns ctx, or context.Background() when nil.
func execContext(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}
