package cpuexec

import (
	"fmt"

	"github.com/ferryml/ferry/backend/blockrun"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// stepKind says how a step runs.
type stepKind uint8

const (
	stepOp         stepKind = iota // eval.EvalOpInto
	stepFusion                     // a fused block program
	stepLoop                       // scan, while, cond: nested regions run through loopexec
	stepCopy                       // a device_put between memory spaces (copy.go)
	stepCollective                 // a collective op over the execution's communicators (collective.go)
	stepMatmul                     // a product rendered onto cpu/gemm (matmul.go)
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
	coll   *collStep // stepCollective
	subs   []*region // nested regions (scan: body; while: cond, body; cond: true, false)
	// dir is the direction of a stepCopy.
	dir copyDir
}

// region is a block of the plan rendered for the CPU: the plan's slots and
// the steps in execution order.
type region struct {
	blk     *passes.Block
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
	// a scan body.
	sched *passes.Schedule
}

// compileRegion renders block b of the plan: a kernel per op step, block
// programs per fused group, nested regions per loop.
func compileRegion(b *passes.Block) (*region, error) {
	g := &region{blk: b, r: b.Region, plan: b.Plan, slots: b.Slots, params: b.Params, derived: b.Derived,
		results: b.Results, slices: b.YsSlots, sched: &b.Schedule}
	for i := range b.Steps {
		st, err := compileStep(&b.Steps[i])
		if err != nil {
			return nil, err
		}
		g.steps = append(g.steps, st)
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
		st.kind = stepLoop
		subs, err := blockrun.CompileBlocks(ps, compileRegion)
		if err != nil {
			return st, err
		}
		st.subs = subs
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
// and result lists of every step, and (blockrun.Frame) the events of its
// copies and collectives and its nested frames, made on first use. It is
// the region's blockrun.Backend and, nested, a loopexec.Block.
type frame struct {
	blockrun.Frame[[]byte, *copyEvent, *frame]
	g     *region
	cfg   *copyConfig
	env   *collEnv // the execution's communicators (nil without collectives)
	arena [2][]byte
	lits  []ir.Literal
	args  [][]*ir.Literal
	outs  [][]*ir.Literal
}

// newFrame makes the views of g's temporaries in arena (the region's own
// arena per space); parameters, outputs and aliases are set by the caller.
func newFrame(g *region, arena [2][]byte, cfg *copyConfig, env *collEnv) *frame {
	// The per-step slices share backing arrays (full slice expressions keep
	// them apart): a frame is made per execution unless one is reused
	// (Executable.getFrame), so allocations count.
	n := len(g.steps)
	f := &frame{g: g, lits: make([]ir.Literal, len(g.slots))}
	f.Init(g.blk, f, blockrun.HostWaits)
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
	f.EachSub(func(i, k int, sub *frame) { sub.bind(f.subArena(i, k), cfg, env) })
}

// unbind drops f's views (recursively), so that a frame kept for reuse
// holds no memory of the arrays of the execution that used it.
func (f *frame) unbind() {
	f.arena, f.cfg, f.env = [2][]byte{}, nil, nil
	for s := range f.lits {
		f.lits[s].Data = nil
	}
	f.EachSub(func(_, _ int, sub *frame) { sub.unbind() })
}

// Bind points parameter i (and values planned into its memory) at data
// (loopexec.Block).
func (f *frame) Bind(i int, data []byte) {
	f.lits[f.g.params[i]].Data = data
	for _, s := range f.g.derived[i] {
		f.lits[s].Data = data[:f.g.slots[s].Bytes:f.g.slots[s].Bytes]
	}
}

// refresh re-derives the views of values planned into parameter memory.
func (f *frame) refresh() {
	for i := range f.g.params {
		f.Bind(i, f.lits[f.g.params[i]].Data)
	}
}

// NewSub makes the frame of nested region k of step i (blockrun.Backend).
func (f *frame) NewSub(i, k int) *frame {
	return newFrame(f.g.steps[i].subs[k], f.subArena(i, k), f.cfg, f.env)
}

// subArena is the arena of nested region k of step i inside f's.
func (f *frame) subArena(i, k int) [2][]byte {
	st := &f.g.steps[i]
	var arena [2][]byte
	for sp := range arena {
		off := f.g.blk.Steps[i].Loop.SubOffset[sp]
		arena[sp] = f.arena[sp][off : off+st.subs[k].plan.Arena[sp]]
	}
	return arena
}

// Dispatch runs step i (blockrun.Backend): a copy or collective is
// started on its worker when they run asynchronously, its completion left
// in *ev.
func (f *frame) Dispatch(i int, _ passes.Queue, ev **copyEvent) error {
	st := &f.g.steps[i]
	switch st.kind {
	case stepCopy:
		f.runCopy(i, ev)
	case stepCollective:
		return f.runCollective(i, ev)
	case stepOp:
		return st.kernel.Into(f.args[i], f.outs[i])
	case stepMatmul:
		return st.mm.run(f.args[i], f.outs[i])
	case stepFusion:
		if err := st.fused.run(f.args[i], f.outs[i]); err != nil {
			return fmt.Errorf("%s: %w", st.op.Describe(), err)
		}
	case stepLoop:
		return f.runLoop(i)
	}
	return nil
}

// Wait waits for the copy or collective *ev, clears it and returns its
// error (blockrun.HostWaits).
func (f *frame) Wait(_ passes.Queue, ev **copyEvent) error { return waitClear(ev) }

// Record does nothing: a copy's or collective's event is made when it
// starts (blockrun.Backend).
func (f *frame) Record(passes.Queue, **copyEvent) error { return nil }

// runLoop runs loop step i (scan, while or cond) through loopexec, which
// applies the plan's bindings; the nested frames are the loopexec.Blocks
// and loopMem reaches the bytes.
func (f *frame) runLoop(i int) error {
	st := &f.g.steps[i]
	args, outs := make([][]byte, len(st.args)), make([][]byte, len(st.outs))
	for k, l := range f.args[i] {
		args[k] = l.Data
	}
	for k, l := range f.outs[i] {
		outs[k] = l.Data
	}
	if err := f.Loop(i, loopMem{f, i}, args, outs); err != nil {
		return fmt.Errorf("%s: %w", st.op.Describe(), err)
	}
	return nil
}

// BindYs points the values planned in the ys slice of result j at l: they
// are computed there (their copy after the run is then skipped).
func (f *frame) BindYs(j int, l []byte) {
	for _, ys := range f.g.slices {
		if ys.Result == j {
			size := f.g.slots[ys.Slot].Bytes
			f.lits[ys.Slot].Data = l[:size:size]
		}
	}
}

// Result returns the memory of result j of the region (loopexec.Block).
func (f *frame) Result(j int) ([]byte, error) { return f.lits[f.g.results[j]].Data, nil }

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
	s := m.f.Staging(m.i, j)
	if int64(cap(*s)) < n {
		*s = make([]byte, n)
	}
	copy((*s)[:n], src[:n])
	return (*s)[:n], nil
}

func (m loopMem) Predicate(l []byte) (bool, error) { return len(l) > 0 && l[0] != 0, nil }

// copyMem copies src to dst unless they are the same memory.
func copyMem(dst, src []byte) {
	if len(dst) > 0 && len(src) > 0 && &dst[0] == &src[0] {
		return
	}
	copy(dst, src)
}
