package cuda

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/backend/blockrun"
	"github.com/ferryml/ferry/backend/loopexec"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Control flow on the device.
//
// A scan, while or cond op is a step whose nested regions are compiled like
// the function body (compileRegion: kernels, cuBLASLt matmuls, copies, each
// region with its own buffer plan and schedule). At run time the step is a
// loop on the host, as XLA's GPU runtime runs its loops, that launches the
// nested region's steps once per iteration with that iteration's pointers:
// loopexec applies the plan's bindings (the carries; xs and ys slices at
// base + i·slice bytes, i counting down for a reverse scan; the results
// copied after each iteration, or computed in place, or first staged where
// another result's destination overlaps them). The predicate of a while or
// cond is copied into a small pinned host flag and read once the compute
// stream has drained.
//
// A nested region's temporaries live in the block of the enclosing arena
// that the plan reserves at SubOffset (allocated once per execution, with
// the body's arena); staging buffers are allocated on first use and freed
// when the execution ends.
//
// Streams. A frame runs its block through blockrun (the schedule's waits,
// prefetches and carried collectives) with CUDA's streams as the queues
// and CUDA events as the events: a step's stream waits for the events of
// the steps its schedule names (cuStreamWaitEvent), and the block ends with
// the compute stream waiting for the last steps of the others (the Final
// steps). Seen from the enclosing region a region op runs on the compute
// stream: before an iteration of a region that has steps on other streams,
// the copy and collective streams wait for the compute stream (an event
// recorded there). So each iteration starts after everything the previous
// one did (prefetches and carried collectives aside), and copies and
// collectives overlap compute inside an iteration (the host↔device copies
// of an offloaded scan body's xs and ys slices) and, prefetched or
// carried, across iterations.
//
// Sort (like a fused group the plan does not describe) has no device
// kernel: it stays a host step (run by eval after the
// streams drain), in a nested region too; HostSteps lists it.

// region is a compiled region: the function body or a nested region of a
// scan, while or cond step.
type region struct {
	r     *ir.Region
	blk   *passes.Block
	steps []step
	// sched is the block's schedule.
	sched *passes.Schedule
	// async is true when a step of the region (not of its nested regions)
	// runs on a copy or the collective stream.
	async bool
}

// compileRegion prepares a step for every step of blk (a block of the
// executable plan), recursively for the blocks of loops, and the stream
// plan of its region.
func (b *Backend) compileRegion(e *executable, blk *passes.Block) (*region, error) {
	r := blk.Region
	g := &region{r: r, blk: blk, steps: make([]step, len(r.Ops)), sched: &blk.Schedule}
	for i, op := range r.Ops {
		s, st := &g.steps[i], &blk.Steps[i]
		s.op = op
		var err error
		switch {
		case op.Code == ir.DevicePut:
			s.kind = stepCopy
		case op.Code == ir.Constant:
			s.kind = stepConst
			s.constant, err = b.fromLiteral(op.Attrs.Literal("value").Clone())
		case st.Loop != nil:
			s.kind, s.loop = stepLoop, st.Loop
			s.subs, err = blockrun.CompileBlocks(st, func(blk *passes.Block) (*region, error) { return b.compileRegion(e, blk) })
		case st.Kind == passes.StepCollective:
			err = b.prepareCollective(e, s, st.Collective)
		case st.Kind == passes.StepMatmul && b.prepareMatmul(blk, s, st, op, 0, 1, 0):
			// cuBLASLt.
		default:
			err = b.prepareKernel(blk, s, st)
		}
		if err != nil {
			return nil, err
		}
		if g.sched.Steps[i].Queue != passes.QueueCompute {
			g.async = true
		}
	}
	return g, nil
}

// hostSteps lists the steps of g and its nested regions that run on the
// host, each prefixed with path and the regions leading to it.
func (g *region) hostSteps(path string) []string {
	var out []string
	for _, s := range g.steps {
		if s.kind == stepHost {
			out = append(out, fmt.Sprintf("%s%v: %s", path, s.op.Code, s.why))
		}
		for k, sub := range s.subs {
			out = append(out, sub.hostSteps(fmt.Sprintf("%s%v %s / ", path, s.op.Code, loopexec.BlockName(s.op.Code, k)))...)
		}
	}
	return out
}

// loc is where a value's bytes are: device memory, or pinned host memory
// when host.
type loc struct {
	p    uintptr
	host bool
}

func (l loc) add(n int64) loc { return loc{l.p + uintptr(n), l.host} }

// execution is the state of one Execute.
type execution struct {
	e       *executable
	b       *Backend
	in      []*Buffer
	results []*Buffer
	// site is where the call donating arguments was made
	// (ExecOptions.DonationSite).
	site string
	// arenas and collMem are the execution's temporaries (freed by
	// release).
	arenas  [2]mem
	collMem mem
	// events are all the events made (destroyed by free); fork is the one
	// the copy streams wait for at the start of an iteration.
	events []uintptr
	fork   uintptr
	// flag is the pinned host bytes a predicate is read back into (0 until
	// the first while or cond needs it).
	flag uintptr
	// staging are the staging buffers of region results.
	staging []mem
	// Collectives: the device communicators by axis, the context bounding
	// the waits for them, the scratch of their staging buffers, the last
	// collective issued per axis (named by errors) and whether the
	// communicators were aborted.
	comms       map[string]backend.DeviceCommunicator
	ctx         context.Context
	collScratch uintptr
	last        map[string]*ir.Op
	aborted     bool
}

// frame is one activation of a region: where its parameters, arena and
// (scan body) ys slices are, and (blockrun.Frame) its events and nested
// frames, made on first use and reused by every iteration. It is the
// region's blockrun.Backend and, nested, a loopexec.Block.
type frame struct {
	blockrun.Frame[loc, uintptr, *frame]
	x      *execution
	g      *region
	params []loc
	arena  [2]loc
	// slices[j] is the running iteration's slice of the ys of scan body
	// result j (nil outside scan bodies).
	slices []loc
}

func (x *execution) newFrame(g *region) *frame {
	f := &frame{x: x, g: g, params: make([]loc, len(g.r.Params))}
	f.Init(g.blk, f, blockrun.QueueWaits)
	return f
}

// NewSub makes the frame of nested region k of step i of f, in f's arena
// (blockrun.Backend).
func (f *frame) NewSub(i, k int) *frame {
	st := &f.g.steps[i]
	s := f.x.newFrame(st.subs[k])
	for sp := range s.arena {
		s.arena[sp] = f.arena[sp].add(st.loop.SubOffset[sp])
		s.arena[sp].host = ir.MemorySpace(sp) != ir.Device
	}
	if st.op.Code == ir.Scan {
		s.slices = make([]loc, len(s.g.r.Results))
	}
	return s
}

// slot returns where slot s of f's block lives (the plan checked every
// buffer against the block: passes.Lower).
func (x *execution) slot(f *frame, s int) (loc, error) {
	buf := f.g.blk.Slots[s].Buf
	switch buf.Kind {
	case passes.BufParam:
		return f.params[buf.Index], nil
	case passes.BufTemp:
		return f.arena[buf.Space].add(buf.Offset), nil
	case passes.BufSlice:
		return f.slices[buf.Index], nil
	}
	return x.output(f.g.blk.Slots[s].Value, buf)
}

// output returns result buffer buf.Index, allocating it (BufOutput) or
// taking over the donated argument's memory (BufAlias) on first use.
func (x *execution) output(v *ir.Value, buf passes.Buffer) (loc, error) {
	if r := x.results[buf.Index]; r != nil {
		return loc{r.m.ptr, r.m.host}, nil
	}
	if buf.Kind == passes.BufAlias {
		a := x.in[buf.Param]
		if err := a.st.Donate(a.t, x.site); err != nil { // its memory now belongs to the result
			return loc{}, fmt.Errorf("cuda: donated argument %d: %w", buf.Param, err)
		}
		x.results[buf.Index] = x.b.newBuffer(v.Type, a.m)
		return loc{a.m.ptr, a.m.host}, nil
	}
	m, err := x.b.allocate(v.Type.Bytes(), v.Type.Space, fmt.Sprintf("output %d%s", buf.Index, x.e.suffix))
	if err != nil {
		return loc{}, err
	}
	x.results[buf.Index] = x.b.newBuffer(v.Type, m)
	return loc{m.ptr, m.host}, nil
}

// slots returns the locations of slots ss of f.
func (x *execution) slots(f *frame, ss []int) ([]loc, error) {
	out := make([]loc, len(ss))
	for i, s := range ss {
		var err error
		if out[i], err = x.slot(f, s); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// event returns a new event (CU_EVENT_DISABLE_TIMING: ordering only),
// destroyed when the execution ends.
func (x *execution) event() (uintptr, error) {
	var ev uintptr
	if err := x.b.d.Check("cuEventCreate", uintptr(unsafe.Pointer(&ev)), 2); err != nil {
		return 0, err
	}
	x.events = append(x.events, ev)
	return ev, nil
}

// free destroys the execution's events and frees its staging buffers and
// flag (after the streams have drained).
func (x *execution) free() {
	for _, ev := range x.events {
		_ = x.b.d.Check("cuEventDestroy", ev)
	}
	for _, m := range x.staging {
		_ = x.b.release(m)
	}
	if x.flag != 0 {
		_ = x.b.d.Check("cuMemFreeHost", x.flag)
	}
}

// Dispatch issues step i of f on the stream of queue q (blockrun.Backend).
func (f *frame) Dispatch(i int, q passes.Queue, _ *uintptr) error {
	x, s, st := f.x, &f.g.steps[i], &f.g.blk.Steps[i]
	stream := x.b.streams[streamOf(q)]
	args, err := x.slots(f, st.Args)
	var outs []loc
	if err == nil {
		outs, err = x.slots(f, st.Outs)
	}
	switch {
	case err != nil:
	case s.kind == stepLoop:
		err = f.Loop(i, loopMem{x, f, i}, args, outs)
	case s.kind == stepCollective:
		err = x.collective(f, i, args, outs, stream)
	case s.kind == stepHost:
		// Drain the streams first, watching the collectives.
		if err = x.waitAll(); err == nil {
			err = x.e.run(x.b, s, stream, args, outs)
		}
	default:
		err = x.e.run(x.b, s, stream, args, outs)
	}
	if err != nil {
		return fmt.Errorf("%v step %d: %w", s.op.Code, i, err)
	}
	return nil
}

// Wait makes the stream of queue q wait for event *ev (blockrun.Backend).
func (f *frame) Wait(q passes.Queue, ev *uintptr) error {
	return f.x.b.d.Check("cuStreamWaitEvent", f.x.b.streams[streamOf(q)], *ev, 0)
}

// Record records event *ev (made on first use) on the stream of queue q
// (blockrun.Backend).
func (f *frame) Record(q passes.Queue, ev *uintptr) error {
	if *ev == 0 {
		var err error
		if *ev, err = f.x.event(); err != nil {
			return err
		}
	}
	return f.x.b.d.Check("cuEventRecord", *ev, f.x.b.streams[streamOf(q)])
}

// Prefetch issues the next iteration's copy or all_gather p of scan body
// frame f from next on the stream of queue q, after the events of the
// readers of its destination (blockrun.Backend).
func (f *frame) Prefetch(p *passes.Prefetch, q passes.Queue, next loc, _ *uintptr) (bool, error) {
	x, k := f.x, p.Step
	stream := x.b.streams[streamOf(q)]
	err := f.Await(q, p.Wait)
	st := &f.g.blk.Steps[k]
	var dst loc
	if err == nil {
		dst, err = x.slot(f, st.Outs[0])
	}
	switch {
	case err != nil:
	case f.g.steps[k].kind == stepCollective:
		err = x.collective(f, k, []loc{next}, []loc{dst}, stream)
	default:
		err = x.b.copy(dst.p, dst.host, next.p, next.host, f.g.blk.Slots[st.Outs[0]].Bytes, stream)
	}
	if err != nil {
		return false, fmt.Errorf("prefetch after %v step %d: %w", f.g.steps[p.After].op.Code, p.After, err)
	}
	return true, nil
}

// Run runs one iteration of a nested region (loopexec.Block): when the
// region has steps on other streams, the copy and collective streams first
// wait for everything issued on the compute stream so far.
func (f *frame) Run() error {
	if f.g.async {
		if err := f.Record(passes.QueueCompute, &f.x.fork); err != nil {
			return err
		}
		for _, q := range []passes.Queue{passes.QueueToDevice, passes.QueueToHost, passes.QueueCollective} {
			if err := f.Wait(q, &f.x.fork); err != nil {
				return err
			}
		}
	}
	return f.Frame.Run()
}

// Bind points parameter j at l (loopexec.Block).
func (f *frame) Bind(j int, l loc) { f.params[j] = l }

// BindYs points the ys slice of scan body result j at l (loopexec.Block).
func (f *frame) BindYs(j int, l loc) {
	if f.slices != nil {
		f.slices[j] = l
	}
}

// Result returns where result j of the region is (loopexec.Block).
func (f *frame) Result(j int) (loc, error) { return f.x.slot(f, f.g.blk.Results[j]) }

// loopMem is the memory of loop step i of f as loopexec addresses it.
type loopMem struct {
	x *execution
	f *frame
	i int
}

func (m loopMem) Slice(l loc, off, _ int64) loc    { return l.add(off) }
func (m loopMem) Copy(dst, src loc, n int64) error { return m.x.copyLoc(dst, src, n) }
func (m loopMem) Predicate(l loc) (bool, error)    { return m.x.predicate(l) }

// Stage copies src into the device staging buffer of result j of the step
// (allocated on first use, freed when the execution ends), on the compute
// stream.
func (m loopMem) Stage(j int, src loc, n int64) (loc, error) {
	x, dst := m.x, m.f.Staging(m.i, j)
	if dst.p == 0 {
		st, err := x.b.allocate(n, ir.Device, "staging"+x.e.suffix)
		if err != nil {
			return loc{}, fmt.Errorf("staging a region result: %w", err)
		}
		x.staging = append(x.staging, st)
		*dst = loc{st.ptr, false}
	}
	return *dst, x.copyLoc(*dst, src, n)
}

// predicate reads the boolean at l once the compute stream has computed it.
func (x *execution) predicate(l loc) (bool, error) {
	b := x.b
	if x.flag == 0 {
		p, err := b.d.HostAlloc(8)
		if err != nil {
			return false, err
		}
		x.flag = p
	}
	compute := b.streams[Compute]
	if err := b.copy(x.flag, true, l.p, l.host, 1, compute); err != nil {
		return false, err
	}
	if err := x.waitStream(compute); err != nil {
		return false, err
	}
	return hostBytes(x.flag, 1)[0] != 0, nil
}

// copyLoc copies n bytes from src to dst on the compute stream, unless they
// are the same bytes.
func (x *execution) copyLoc(dst, src loc, n int64) error {
	if dst == src {
		return nil
	}
	return x.b.copy(dst.p, dst.host, src.p, src.host, n, x.b.streams[Compute])
}
