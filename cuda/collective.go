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
	"github.com/ferryml/ferry/passes"
)

// Collectives on the device.
//
// A per-device program of a sharded computation (compiled with
// CompileOptions.BoundAxes naming its collective axes) runs its collective
// ops through the device communicators of ExecOptions.DeviceComms (NCCL,
// package cuda/nccl), one per axis string. A collective is a step of the
// plan like a kernel, on the collective stream of the device (the plan's
// collective queue): it is enqueued after the events of the steps its
// schedule waits for (its operand's producer, say), and the steps that read
// its result wait for its event, so it runs beside the kernels and the
// copies, in program order with the other collectives (the same on every
// rank), and the host does not wait for it. In a scan body (FSDP: a scan
// over the stacked layers) the schedule's prefetches issue the next
// iteration's all_gather of an xs slice during the running one, and its
// carried collectives (a layer's reduce_scatter into the stacked
// gradients) are waited for by the next iteration only before it
// overwrites their operand, and by the loop after its last iteration.
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
// The layout (counts, staging buffers, the transposes of the rank axis) is
// the plan's (passes.Collective). The staging buffers of every collective
// step share one device scratch allocation per execution, used on the
// collective stream only.
//
// Waiting. While an execution with device communicators waits for the
// compute stream (which waits for the collective stream's last steps) (at its end, for the predicate of a while or cond, before
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

// collStep is a collective op prepared at Compile: the plan's layout
// (passes.Collective) with its reduction and transpose kernels.
type collStep struct {
	*passes.Collective
	red collective.Op // all_reduce; Sum for reduce_scatter
	// pre transposes the operand into staging buffer 0 (reduce_scatter,
	// all_to_all) and post staging buffer 1 (all_to_all) or 0 (all_gather)
	// into the result; nil when the layout needs no transpose.
	pre, post *xpose
}

// xpose is a generated transpose kernel with its loaded entries.
type xpose struct {
	kernel *Kernel
	fns    []uintptr
}

var collReductions = map[string]collective.Op{"sum": collective.Sum, "max": collective.Max, "min": collective.Min}

// prepareCollective makes s, whose plan layout is pc, a collective step of
// e: the transposes of its layout generated and loaded.
func (b *Backend) prepareCollective(e *executable, s *step, pc *passes.Collective) error {
	op := s.op
	c := &collStep{Collective: pc, red: collReductions[pc.Reduction]}
	s.kind, s.coll = stepCollective, c
	if op.Code == ir.AxisIndex {
		return nil
	}
	for _, v := range []*ir.Value{op.Args[0], op.Results[0]} {
		if v.Type.Space != ir.Device {
			return fmt.Errorf("%s: operand or result in %v memory: NCCL collectives work on device memory", op.Describe(), v.Type.Space)
		}
	}
	var err error
	if t := pc.Pre; t != nil {
		if c.pre, err = b.transposer(pc.DType, t.Shape, t.Perm); err != nil {
			return fmt.Errorf("%s: %w", op.Describe(), err)
		}
	}
	if t := pc.Post; t != nil {
		if c.post, err = b.transposer(pc.DType, t.Shape, t.Perm); err != nil {
			return fmt.Errorf("%s: %w", op.Describe(), err)
		}
	}
	e.collScratch = max(e.collScratch, align256(pc.Stage[0])+align256(pc.Stage[1]))
	return nil
}

func align256(n int64) int64 { return (n + 255) &^ 255 }

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
	comm := x.comms[c.Axis]
	if comm == nil {
		return fmt.Errorf("%s: %w (the execution has no device communicator for axis %q: ExecOptions.DeviceComms)", op.Describe(), ir.UnboundAxisError(op), c.Axis)
	}
	rank, size := comm.Rank(), comm.Size()
	if size != c.Size {
		return fmt.Errorf("%s: axis %q has size %d in the program, but its communicator has %d ranks", op.Describe(), c.Axis, c.Size, size)
	}
	x.last[c.Axis] = op
	fail := func(err error) error {
		return fmt.Errorf("%s: rank %d of %d on axis %q: %w", op.Describe(), rank, size, c.Axis, err)
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
	if in.p < out.p+uintptr(outBytes) && out.p < in.p+uintptr(c.Bytes) && !(op.Code == ir.AllReduce && in.p == out.p) {
		return fmt.Errorf("%s: internal error: the buffer plan overlaps the collective's operand and result", op.Describe())
	}
	stage0, stage1 := x.collScratch, x.collScratch+uintptr(align256(c.Stage[0]))
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
		err = comm.AllReduce(send, out.p, c.Count, c.DType, c.red, stream)
	case ir.ReduceScatter:
		err = comm.ReduceScatter(send, out.p, c.Count/n, c.DType, c.red, stream)
	case ir.AllGather:
		if c.post == nil {
			err = comm.AllGather(send, out.p, int(c.Bytes), ir.Uint8, stream)
		} else if err = comm.AllGather(send, stage0, int(c.Bytes), ir.Uint8, stream); err == nil {
			err = c.post.launch(b, stage0, out.p, stream)
		}
	case ir.AllToAll:
		recv := out.p
		if c.post != nil {
			recv = stage1
		}
		blk := int(c.Bytes) / n
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
	rank, nb := comm.Rank(), int(c.Bytes)
	targeted := false
	var self bool
	err := grouped(comm, func() error {
		for _, p := range c.Pairs {
			switch {
			case p[0] == rank && p[1] == rank:
				self, targeted = true, true
			case p[0] == rank:
				if err := comm.Send(send, nb, ir.Uint8, p[1], stream); err != nil {
					return err
				}
			case p[1] == rank:
				targeted = true
				if err := comm.Recv(recv, nb, ir.Uint8, p[0], stream); err != nil {
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
		return x.b.copy(recv, false, send, false, c.Bytes, stream)
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
