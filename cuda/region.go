package cuda

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/backend/loopexec"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Control flow on the device.
//
// A scan, while or cond op is a step whose nested regions are compiled like
// the function body (compileRegion: kernels, cuBLASLt matmuls, copies, each
// region with its own buffer plan and stream plan). At run time the step is
// a loop on the host, as XLA's GPU runtime runs its loops, that launches
// the nested region's steps once per iteration with that iteration's
// pointers:
//
//   - scan: the carry results are initialised from the carry operands, then
//     each iteration runs the body with the consts, the carry results and
//     slice i of every xs (base + i·slice bytes; i counts down for a reverse
//     scan) as its parameters; a y planned in place (passes.BufSlice) is
//     computed straight into slice i of its ys; afterwards the body's
//     results are copied into the carry results and the ys slices (a copy
//     of a buffer onto itself is skipped; a source that another result's
//     destination overlaps is first copied to a staging buffer);
//   - while: the condition region runs, its boolean is copied into a small
//     pinned host flag and read once the compute stream has drained, and
//     while it is true the body runs and its results become the state;
//   - cond: the predicate is read back the same way and the chosen branch
//     runs, its results copied into the op's.
//
// A nested region's temporaries live in the block of the enclosing arena
// that the plan reserves at SubOffset (allocated once per execution, with
// the body's arena); staging buffers are allocated on first use and freed
// when the execution ends.
//
// Streams. Within one iteration the block's schedule (passes.Schedule)
// orders its steps (copies between memory spaces on the copy streams,
// collectives on the collective stream, the rest on compute) like the
// function body's: a step's stream waits for the events of the steps its
// schedule names. Seen from the enclosing region a region op runs on the
// compute stream: before an iteration of a region that has steps on other
// streams, the copy and collective streams wait for the compute stream (an
// event recorded there), and every iteration ends with the compute stream
// waiting for the region's last steps on the others (the schedule's Final
// steps). So each iteration starts after everything the previous one did
// (prefetches and carried collectives below aside), and copies and
// collectives overlap compute inside an iteration (the host↔device copies
// of an offloaded scan body's xs and ys slices). Across iterations, a scan
// body's copies and all_gathers of xs slices into buffers of their own are
// double buffered (the schedule's prefetches): iteration i issues the one
// of slice i+1 after the step the schedule names, once the events of the
// readers of the buffer are recorded, so that it overlaps the rest of
// iteration i; and its carried collectives are not waited for at its end:
// iteration i+1 waits for them (their events kept in frame.prev) before
// the step the schedule names, and the scan after its last iteration.
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
			err = b.compileLoop(e, s, st.Loop)
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

// regionName names region k of a region op.
func regionName(c ir.Code, k int) string {
	switch c {
	case ir.While:
		return [...]string{"cond", "body"}[min(k, 1)]
	case ir.Cond:
		return [...]string{"true branch", "false branch"}[min(k, 1)]
	}
	return "body"
}

// compileLoop compiles the nested blocks of a scan, while or cond step.
func (b *Backend) compileLoop(e *executable, s *step, lp *passes.Loop) error {
	for k, blk := range lp.Blocks {
		g, err := b.compileRegion(e, blk)
		if err != nil {
			return fmt.Errorf("%v %s: %w", lp.Code, regionName(lp.Code, k), err)
		}
		s.subs = append(s.subs, g)
	}
	s.loop = lp
	s.kind = map[ir.Code]stepKind{ir.Scan: stepScan, ir.While: stepWhile, ir.Cond: stepCond}[lp.Code]
	return nil
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
			out = append(out, sub.hostSteps(fmt.Sprintf("%s%v %s / ", path, s.op.Code, regionName(s.op.Code, k)))...)
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
// (scan body) ys slices are, its events, and its nested frames, made on
// first use and reused by every iteration.
type frame struct {
	g      *region
	top    bool
	params []loc
	arena  [2]loc
	// slices[j] is the running iteration's slice of the ys of scan body
	// result j (nil outside scan bodies).
	slices []loc
	events []uintptr
	subs   [][]*frame
	// stage[i][k] is the staging buffer of result k of region op step i.
	stage [][]mem
	// Prefetches (scan bodies): next[j] is the next iteration's slice of xs
	// parameter j (hasNext: there is one); issued[k] says that step k (a
	// copy or all_gather) of the next iteration was issued by this one, with its event in
	// pre[k] (run swaps it into events[k]).
	next    []loc
	hasNext bool
	issued  []bool
	pre     []uintptr
	// prev[k] is the event of carried collective step k of the previous
	// iteration (scan bodies with carried collectives; 0: none yet).
	prev []uintptr
}

func (x *execution) newFrame(g *region) *frame {
	return &frame{g: g, params: make([]loc, len(g.r.Params)), events: make([]uintptr, len(g.steps))}
}

// sub returns the frame of nested region k of step i of f.
func (x *execution) sub(f *frame, i, k int) *frame {
	if f.subs == nil {
		f.subs = make([][]*frame, len(f.g.steps))
	}
	st := &f.g.steps[i]
	if f.subs[i] == nil {
		f.subs[i] = make([]*frame, len(st.subs))
	}
	if f.subs[i][k] == nil {
		s := x.newFrame(st.subs[k])
		for sp := range s.arena {
			s.arena[sp] = f.arena[sp].add(st.loop.SubOffset[sp])
			s.arena[sp].host = ir.MemorySpace(sp) != ir.Device
		}
		if st.op.Code == ir.Scan {
			s.slices = make([]loc, len(s.g.r.Results))
			if len(s.g.sched.Prefetch) > 0 {
				s.next = make([]loc, len(s.params))
				s.issued, s.pre = make([]bool, len(s.g.steps)), make([]uintptr, len(s.g.steps))
			}
			if len(s.g.sched.Carried) > 0 {
				s.prev = make([]uintptr, len(s.g.steps))
			}
		}
		f.subs[i][k] = s
	}
	return f.subs[i][k]
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

// operands returns the locations of the operands and results of step i of f.
func (x *execution) operands(f *frame, i int) (args, outs []loc, err error) {
	st := &f.g.blk.Steps[i]
	if args, err = x.slots(f, st.Args); err != nil {
		return nil, nil, err
	}
	if outs, err = x.slots(f, st.Outs); err != nil {
		return nil, nil, err
	}
	return args, outs, nil
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

// run issues the steps of f's region on their streams, each after the
// events its schedule says, and ends with the compute stream waiting for
// the region's last copies.
func (x *execution) run(f *frame) error {
	b := x.b
	g := f.g
	for i := range g.steps {
		s := &g.steps[i]
		p := &g.sched.Steps[i]
		stream := b.streams[streamOf(p.Queue)]
		if f.issued != nil && f.issued[i] {
			// The previous iteration issued this step: its event stands
			// for it.
			f.issued[i] = false
			f.events[i], f.pre[i] = f.pre[i], f.events[i]
			continue
		}
		if err := x.waitEvents(f, p.Wait, stream); err != nil {
			return err
		}
		if err := x.waitCarried(f, i, stream); err != nil {
			return err
		}
		args, outs, err := x.operands(f, i)
		switch {
		case err != nil:
		case s.kind == stepScan, s.kind == stepWhile, s.kind == stepCond:
			err = x.loop(f, i, args, outs)
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
		if p.Record {
			if err := x.record(&f.events[i], stream); err != nil {
				return err
			}
		}
		if len(g.sched.PrefetchAfter[i]) > 0 && f.hasNext {
			if err := x.prefetch(f, i); err != nil {
				return fmt.Errorf("prefetch after %v step %d: %w", s.op.Code, i, err)
			}
		}
	}
	if err := x.waitCarried(f, len(g.steps), b.streams[Compute]); err != nil {
		return err
	}
	if err := x.waitEvents(f, g.sched.Final, b.streams[Compute]); err != nil {
		return err
	}
	// This iteration's carried collectives run on; the next waits for them.
	for _, c := range g.sched.Carried {
		f.events[c.Step], f.prev[c.Step] = f.prev[c.Step], f.events[c.Step]
	}
	return nil
}

// waitCarried makes stream wait, before step i of scan body frame f (i =
// len(steps): its end), for the previous iteration's carried collectives
// the schedule waits for there.
func (x *execution) waitCarried(f *frame, i int, stream uintptr) error {
	for _, k := range f.g.sched.CarriedBefore[i] {
		if f.prev[k] != 0 {
			if err := x.b.d.Check("cuStreamWaitEvent", stream, f.prev[k], 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// drainCarried makes the compute stream wait for the carried collectives of
// the last iteration of scan body frame f.
func (x *execution) drainCarried(f *frame) error {
	for _, k := range f.prev {
		if k != 0 {
			if err := x.b.d.Check("cuStreamWaitEvent", x.b.streams[Compute], k, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitEvents makes stream wait for the events of steps ss of f.
func (x *execution) waitEvents(f *frame, ss []int, stream uintptr) error {
	for _, j := range ss {
		if err := x.b.d.Check("cuStreamWaitEvent", stream, f.events[j], 0); err != nil {
			return err
		}
	}
	return nil
}

// record records event *ev (made on first use) on stream.
func (x *execution) record(ev *uintptr, stream uintptr) error {
	if *ev == 0 {
		var err error
		if *ev, err = x.event(); err != nil {
			return err
		}
	}
	return x.b.d.Check("cuEventRecord", *ev, stream)
}

// prefetch issues, after step i of scan body frame f, the next iteration's
// copies and all_gathers that the schedule starts there, each on its
// step's stream after the events of the readers of its destination.
func (x *execution) prefetch(f *frame, i int) error {
	for _, pi := range f.g.sched.PrefetchAfter[i] {
		pf := &f.g.sched.Prefetch[pi]
		k := pf.Step
		stream := x.b.streams[streamOf(f.g.sched.Steps[k].Queue)]
		if err := x.waitEvents(f, pf.Wait, stream); err != nil {
			return err
		}
		st := &f.g.blk.Steps[k]
		dst, err := x.slot(f, st.Outs[0])
		if err != nil {
			return err
		}
		src := f.next[pf.Param]
		if f.g.steps[k].kind == stepCollective {
			err = x.collective(f, k, []loc{src}, []loc{dst}, stream)
		} else {
			err = x.b.copy(dst.p, dst.host, src.p, src.host, f.g.blk.Slots[st.Outs[0]].Bytes, stream)
		}
		if err != nil {
			return err
		}
		if err := x.record(&f.pre[k], stream); err != nil {
			return err
		}
		f.issued[k] = true
	}
	return nil
}

// runIteration runs one iteration of a nested region: when the region has
// steps on other streams, the copy and collective streams first wait for
// everything issued on the compute stream so far.
func (x *execution) runIteration(f *frame) error {
	if f.g.async {
		b := x.b
		if x.fork == 0 {
			var err error
			if x.fork, err = x.event(); err != nil {
				return err
			}
		}
		if err := b.d.Check("cuEventRecord", x.fork, b.streams[Compute]); err != nil {
			return err
		}
		for _, s := range []Stream{H2D, D2H, Coll} {
			if err := b.d.Check("cuStreamWaitEvent", b.streams[s], x.fork, 0); err != nil {
				return err
			}
		}
	}
	return x.run(f)
}

// loop runs loop step i of f (see the file's comment), whose operands and
// results are at args and outs, through loopexec, which applies the plan's
// bindings; loopBlock and loopMem are how it reaches the nested frames and
// the device.
func (x *execution) loop(f *frame, i int, args, outs []loc) error {
	return loopexec.Run(&f.g.blk.Steps[i], loopMem{x, f, i}, args, outs, func(k int) loopexec.Block[loc] {
		return loopBlock{x, x.sub(f, i, k)}
	})
}

// loopBlock is a nested frame as loopexec runs it.
type loopBlock struct {
	x *execution
	f *frame
}

func (b loopBlock) Bind(j int, l loc) { b.f.params[j] = l }

// BindNext keeps the next slice in a scan body with prefetches.
func (b loopBlock) BindNext(j int, l loc, ok bool) {
	if b.f.next != nil {
		b.f.next[j], b.f.hasNext = l, ok
	}
}

func (b loopBlock) BindYs(j int, l loc) {
	if b.f.slices != nil {
		b.f.slices[j] = l
	}
}

func (b loopBlock) Run() error { return b.x.runIteration(b.f) }

func (b loopBlock) Result(j int) (loc, error) { return b.x.slot(b.f, b.f.g.blk.Results[j]) }

// End has the compute stream wait for the last iteration's carried
// collectives (prefetches are all taken over: none is issued in the last
// iteration).
func (b loopBlock) End(bool) error { return b.x.drainCarried(b.f) }

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
	f, x := m.f, m.x
	if f.stage == nil {
		f.stage = make([][]mem, len(f.g.steps))
	}
	if f.stage[m.i] == nil {
		f.stage[m.i] = make([]mem, len(f.g.steps[m.i].op.Results))
	}
	if f.stage[m.i][j].ptr == 0 {
		st, err := x.b.allocate(n, ir.Device, "staging"+x.e.suffix)
		if err != nil {
			return loc{}, fmt.Errorf("staging a region result: %w", err)
		}
		x.staging = append(x.staging, st)
		f.stage[m.i][j] = st
	}
	dst := loc{f.stage[m.i][j].ptr, false}
	return dst, x.copyLoc(dst, src, n)
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
