package cpuexec

import (
	"fmt"

	"github.com/ferryml/ferry/backend/loopexec"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// stepKind says how a step runs.
type stepKind uint8

const (
	stepOp     stepKind = iota // eval.EvalOpInto
	stepFusion                 // a fused block program
	stepScan
	stepWhile
	stepCond
	stepCopy       // a device_put between memory spaces (copy.go)
	stepCollective // a collective op over the execution's communicators (collective.go)
	stepMatmul     // a product rendered onto cpu/gemm (matmul.go)
)

// step is one op of a region, rendered from a step of the plan.
type step struct {
	op     *ir.Op
	kind   stepKind
	args   []int        // slots of the operands
	outs   []int        // slots of the results
	kernel *eval.Kernel // stepOp
	mm     *matmulStep  // stepMatmul
	fused  *fusedKernel
	coll   *collStep    // stepCollective
	loop   *passes.Loop // scan, while, cond: the bindings
	plan   *passes.Step // scan, while, cond: the plan's step
	subs   []*region    // nested regions (scan: body; while: cond, body; cond: true, false)
	// dir is the direction of a stepCopy.
	dir copyDir
}

// region is a block of the plan rendered for the CPU: the plan's slots and
// the steps in execution order.
type region struct {
	r       *ir.Region
	plan    *passes.RegionPlan
	slots   []passes.Slot
	params  []int           // slot of each parameter
	derived [][]int         // per parameter: other slots that live in its memory
	results []int           // slot of each region result
	slices  []passes.YsSlot // scan body: values planned in ys slices
	steps   []step
	// sched is the block's asynchronous schedule: the copy and collective
	// steps each step waits for, the prefetches and carried collectives of
	// a scan body; isCarried marks the carried collectives.
	sched     *passes.Schedule
	isCarried []bool
}

// compileRegion renders block b of the plan: a kernel per op step, block
// programs per fused group, nested regions per loop.
func compileRegion(b *passes.Block) (*region, error) {
	g := &region{r: b.Region, plan: b.Plan, slots: b.Slots, params: b.Params, derived: b.Derived,
		results: b.Results, slices: b.YsSlots, sched: &b.Schedule}
	for i := range b.Steps {
		st, err := compileStep(&b.Steps[i])
		if err != nil {
			return nil, err
		}
		g.steps = append(g.steps, st)
	}
	g.isCarried = make([]bool, len(g.steps))
	for _, c := range g.sched.Carried {
		g.isCarried[c.Step] = true
	}
	return g, nil
}

// compileStep renders one step of the plan.
func compileStep(ps *passes.Step) (step, error) {
	op := ps.Op
	st := step{op: op, args: ps.Args, outs: ps.Outs}
	switch ps.Kind {
	case passes.StepCopy:
		st.kind, st.dir = stepCopy, toDevice
		if ps.To == ir.PinnedHost {
			st.dir = toHost
		}
	case passes.StepCollective:
		st.kind = stepCollective
		st.coll = prepareCollective(ps.Collective)
	case passes.StepKernel:
		st.kind = stepFusion
		k, err := compileFusion(ps.Kernel)
		if err != nil {
			return st, fmt.Errorf("%s: %w", op.Describe(), err)
		}
		st.fused = k
	case passes.StepLoop:
		st.kind = map[ir.Code]stepKind{ir.Scan: stepScan, ir.While: stepWhile, ir.Cond: stepCond}[op.Code]
		st.loop, st.plan = ps.Loop, ps
		for k, blk := range ps.Loop.Blocks {
			sub, err := compileRegion(blk)
			if err != nil {
				return st, fmt.Errorf("%s, region %d: %w", op.Describe(), k, err)
			}
			st.subs = append(st.subs, sub)
		}
	case passes.StepMatmul:
		st.kind = stepMatmul
		mm, err := compileMatmul(op, ps.Matmul)
		if err != nil {
			return st, err
		}
		st.mm = mm
	default: // StepOp: eval's kernel of the op
		k, err := eval.Prepare(op)
		if err != nil {
			return st, err
		}
		st.kernel = k
	}
	return st, nil
}

// frame is one activation of a region: a literal view per slot, the operand
// and result lists of every step, and nested frames made on first use.
type frame struct {
	g     *region
	cfg   *copyConfig
	env   *collEnv // the execution's communicators (nil without collectives)
	arena [2][]byte
	lits  []ir.Literal
	args  [][]*ir.Literal
	outs  [][]*ir.Literal
	subs  [][]*frame   // per step, per nested region (made on first use)
	stage [][][]byte   // per step: staging copies of region results (made on first use)
	ev    []*copyEvent // per copy step: its copy, until waited for
	pre   []*copyEvent // per copy step: its copy started by the previous iteration
	prev  []*copyEvent // per carried collective step: the previous iteration's
	next  [][]byte     // scan body: per xs parameter, the next iteration's slice
}

// newFrame makes the views of g's temporaries in arena (the region's own
// arena per space); parameters, outputs and aliases are set by the caller.
func newFrame(g *region, arena [2][]byte, cfg *copyConfig, env *collEnv) *frame {
	// The per-step slices share backing arrays (full slice expressions keep
	// them apart): a frame is made per execution unless one is reused
	// (Executable.getFrame), so allocations count.
	n := len(g.steps)
	f := &frame{g: g, lits: make([]ir.Literal, len(g.slots))}
	events := make([]*copyEvent, 3*n)
	f.ev, f.pre, f.prev = events[:n:n], events[n:2*n:2*n], events[2*n:]
	f.next = make([][]byte, len(g.params))
	for s, sl := range g.slots {
		f.lits[s].Type = sl.Value.Type
	}
	lists := make([][]*ir.Literal, 2*n)
	f.args, f.outs = lists[:n:n], lists[n:]
	total := 0
	for _, st := range g.steps {
		total += len(st.args) + len(st.outs)
	}
	ptrs := make([]*ir.Literal, total)
	take := func(m int) []*ir.Literal {
		p := ptrs[:m:m]
		ptrs = ptrs[m:]
		return p
	}
	for i, st := range g.steps {
		f.args[i] = take(len(st.args))
		for j, s := range st.args {
			f.args[i][j] = &f.lits[s]
		}
		f.outs[i] = take(len(st.outs))
		for j, s := range st.outs {
			f.outs[i][j] = &f.lits[s]
		}
	}
	f.bind(arena, cfg, env)
	return f
}

// bind points f (and the nested frames made so far) at new arenas: the
// temporaries become views into arena, every other slot is unset until the
// caller sets parameters, outputs and aliases.
func (f *frame) bind(arena [2][]byte, cfg *copyConfig, env *collEnv) {
	f.arena, f.cfg, f.env = arena, cfg, env
	for s, sl := range f.g.slots {
		f.lits[s].Data = nil
		if sl.Buf.Kind == passes.BufTemp {
			f.lits[s].Data = arena[sl.Buf.Space][sl.Buf.Offset : sl.Buf.Offset+sl.Bytes : sl.Buf.Offset+sl.Bytes]
		}
	}
	clear(f.next)
	for i, subs := range f.subs {
		for k, sub := range subs {
			if sub != nil {
				sub.bind(f.subArena(i, k), cfg, env)
			}
		}
	}
}

// unbind drops f's views (recursively), so that a frame kept for reuse
// holds no memory of the arrays of the execution that used it.
func (f *frame) unbind() {
	f.arena, f.cfg, f.env = [2][]byte{}, nil, nil
	for s := range f.lits {
		f.lits[s].Data = nil
	}
	clear(f.next)
	for _, subs := range f.subs {
		for _, sub := range subs {
			if sub != nil {
				sub.unbind()
			}
		}
	}
}

// setParam points parameter i (and values planned into its memory) at data.
func (f *frame) setParam(i int, data []byte) {
	f.lits[f.g.params[i]].Data = data
	for _, s := range f.g.derived[i] {
		f.lits[s].Data = data[:f.g.slots[s].Bytes:f.g.slots[s].Bytes]
	}
}

// refresh re-derives the views of values planned into parameter memory.
func (f *frame) refresh() {
	for i := range f.g.params {
		f.setParam(i, f.lits[f.g.params[i]].Data)
	}
}

// sub returns the frame of nested region k of step i, making it on first use.
func (f *frame) sub(i, k int) *frame {
	if f.subs == nil {
		f.subs = make([][]*frame, len(f.g.steps))
	}
	if f.subs[i] == nil {
		f.subs[i] = make([]*frame, len(f.g.steps[i].subs))
	}
	if f.subs[i][k] == nil {
		f.subs[i][k] = newFrame(f.g.steps[i].subs[k], f.subArena(i, k), f.cfg, f.env)
	}
	return f.subs[i][k]
}

// subArena is the arena of nested region k of step i inside f's.
func (f *frame) subArena(i, k int) [2][]byte {
	st := &f.g.steps[i]
	var arena [2][]byte
	for sp := range arena {
		off := st.loop.SubOffset[sp]
		arena[sp] = f.arena[sp][off : off+st.subs[k].plan.Arena[sp]]
	}
	return arena
}

// run executes the steps of the region. Every copy it starts is complete
// when it returns (prefetches of the next iteration aside).
func (f *frame) run() error {
	defer f.waitAll()
	for i := range f.g.steps {
		st := &f.g.steps[i]
		if err := f.waitCopies(f.g.sched.Steps[i].Wait); err != nil {
			return err
		}
		if err := f.waitPrev(f.g.sched.CarriedBefore[i]); err != nil {
			return err
		}
		var err error
		switch st.kind {
		case stepCopy:
			f.runCopy(i)
		case stepCollective:
			err = f.runCollective(i)
		case stepOp:
			err = st.kernel.Into(f.args[i], f.outs[i])
		case stepMatmul:
			err = st.mm.run(f.args[i], f.outs[i])
		case stepFusion:
			err = st.fused.run(f.args[i], f.outs[i])
			if err != nil {
				err = fmt.Errorf("%s: %w", st.op.Describe(), err)
			}
		case stepScan, stepWhile, stepCond:
			err = f.runLoop(i)
		}
		if err != nil {
			return err
		}
		if len(f.g.sched.PrefetchAfter[i]) > 0 {
			if err := f.startPrefetches(i); err != nil {
				return err
			}
		}
	}
	if err := f.waitEnd(); err != nil {
		return err
	}
	if err := f.waitPrev(f.g.sched.CarriedBefore[len(f.g.steps)]); err != nil {
		return err
	}
	f.carry()
	return nil
}

// result returns the memory of result j of the region.
func (f *frame) result(j int) []byte { return f.lits[f.g.results[j]].Data }

// runLoop runs loop step i (scan, while or cond) through loopexec, which
// applies the plan's bindings; loopBlock and loopMem are how it reaches the
// nested frames and the bytes.
func (f *frame) runLoop(i int) error {
	st := &f.g.steps[i]
	args, outs := make([][]byte, len(st.args)), make([][]byte, len(st.outs))
	for k, l := range f.args[i] {
		args[k] = l.Data
	}
	for k, l := range f.outs[i] {
		outs[k] = l.Data
	}
	err := loopexec.Run(st.plan, loopMem{f, i}, args, outs, func(k int) loopexec.Block[[]byte] { return loopBlock{f.sub(i, k)} })
	if err != nil {
		return fmt.Errorf("%s: %w", st.op.Describe(), err)
	}
	return nil
}

// loopBlock is a nested frame as loopexec runs it.
type loopBlock struct{ f *frame }

func (b loopBlock) Bind(j int, l []byte) { b.f.setParam(j, l) }

// BindNext keeps the next slice only where the prefetches it feeds run
// (asynchronous copies or collectives).
func (b loopBlock) BindNext(j int, l []byte, ok bool) {
	b.f.next[j] = nil
	if ok && (b.f.cfg.async || b.f.env != nil && b.f.env.async) {
		b.f.next[j] = l
	}
}

// BindYs points the values planned in the ys slice of result j at l: they
// are computed there (their copy after the run is then skipped).
func (b loopBlock) BindYs(j int, l []byte) {
	for _, ys := range b.f.g.slices {
		if ys.Result == j {
			size := b.f.g.slots[ys.Slot].Bytes
			b.f.lits[ys.Slot].Data = l[:size:size]
		}
	}
}

func (b loopBlock) Run() error                   { return b.f.run() }
func (b loopBlock) Result(j int) ([]byte, error) { return b.f.result(j), nil }

// End waits for the prefetches nobody took over and the carried
// collectives of the last iteration.
func (b loopBlock) End(bool) error {
	b.f.drainPrefetches()
	return b.f.drainPrev()
}

// loopMem is the memory of loop step i of f as loopexec addresses it.
type loopMem struct {
	f *frame
	i int
}

func (m loopMem) Slice(l []byte, off, n int64) []byte { return l[off : off+n : off+n] }

func (m loopMem) Copy(dst, src []byte, n int64) error {
	copyMem(dst[:n], src[:n])
	return nil
}

// Stage copies src into the step's staging buffer of result j (made on
// first use, reused by every run).
func (m loopMem) Stage(j int, src []byte, n int64) ([]byte, error) {
	f := m.f
	if f.stage == nil {
		f.stage = make([][][]byte, len(f.g.steps))
	}
	if f.stage[m.i] == nil {
		f.stage[m.i] = make([][]byte, len(f.g.steps[m.i].loop.Results))
	}
	if int64(cap(f.stage[m.i][j])) < n {
		f.stage[m.i][j] = make([]byte, n)
	}
	s := f.stage[m.i][j][:n]
	copy(s, src[:n])
	return s, nil
}

func (m loopMem) Predicate(l []byte) (bool, error) { return len(l) > 0 && l[0] != 0, nil }

// copyMem copies src to dst unless they are the same memory.
func copyMem(dst, src []byte) {
	if len(dst) > 0 && len(src) > 0 && &dst[0] == &src[0] {
		return
	}
	copy(dst, src)
}
