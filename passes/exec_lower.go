package passes

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Lower makes the executable plan of p: it checks that the buffer plan covers
// every value a backend sees, that offsets fit the arenas and that aliases
// refer to donated parameters, gives every value a slot, and lowers every op
// to a step (fused groups to expression trees over views, loops to blocks
// and bindings). Lower is separate from Compile so that a program's memory
// analysis does not depend on it; backends call it once when they prepare a
// program, and FERRY_DUMP_IR writes its text form.
func Lower(p *Program) (*Exec, error) {
	if p == nil || p.Func == nil || p.Func.Body == nil || p.Plan == nil {
		return nil, fmt.Errorf("incomplete program")
	}
	f := p.Func
	if p.Plan.Region != nil && p.Plan.Region != f.Body {
		return nil, fmt.Errorf("the plan is not the body's")
	}
	l := &lowerer{donated: p.Donated}
	top, err := l.block(f.Body, p.Plan, true, -1)
	if err != nil {
		return nil, err
	}
	top.schedule(-1)
	// Every BufOutput/BufAlias slot must be the buffer of its result.
	for _, sl := range top.Slots {
		if k := sl.Buf.Kind; k == BufOutput || k == BufAlias {
			i := sl.Buf.Index
			if i < 0 || i >= len(f.Body.Results) || f.Body.Results[i] != sl.Value {
				return nil, fmt.Errorf("%v has the %v buffer of result %d, which is another value", sl.Value, k, i)
			}
		}
	}
	ex := &Exec{Top: top, Outputs: make([]Output, len(f.Body.Results))}
	for i, s := range top.Results {
		o := Output{Slot: s, Alias: -1}
		switch b := top.Slots[s].Buf; {
		case b.Kind == BufOutput && b.Index == i:
		case b.Kind == BufAlias && b.Index == i:
			o.Alias = b.Param
		default:
			o.Copy = true
		}
		ex.Outputs[i] = o
	}
	return ex, nil
}

// lowerer carries what every block of one lowering needs.
type lowerer struct {
	donated []bool
}

func (l *lowerer) isDonated(i int) bool { return i >= 0 && i < len(l.donated) && l.donated[i] }

// block lowers region r with plan. top says whether r is the function body
// (where outputs and aliases exist); ysFrom ≥ 0 marks a scan body whose
// results from ysFrom on are ys (where BufSlice values may exist).
func (l *lowerer) block(r *ir.Region, plan *RegionPlan, top bool, ysFrom int) (*Block, error) {
	if plan == nil {
		return nil, fmt.Errorf("region has no plan")
	}
	if plan.Region != nil && plan.Region != r {
		return nil, fmt.Errorf("plan belongs to another region")
	}
	b := &Block{Region: r, Plan: plan, SlotOf: map[*ir.Value]int{}}
	for i, p := range r.Params {
		if buf, ok := plan.Values[p]; ok && (buf.Kind != BufParam || buf.Index != i) {
			return nil, fmt.Errorf("parameter %d (%v) is planned as %v %d", i, p, buf.Kind, buf.Index)
		}
		s, err := l.slot(b, p, top, ysFrom)
		if err != nil {
			return nil, err
		}
		b.Params = append(b.Params, s)
	}
	for _, op := range r.Ops {
		st, err := l.step(b, op, top, ysFrom)
		if err != nil {
			return nil, err
		}
		b.Steps = append(b.Steps, st)
	}
	for i, v := range r.Results {
		s, ok := b.SlotOf[v]
		if !ok {
			return nil, fmt.Errorf("result %d (%v) is not defined", i, v)
		}
		b.Results = append(b.Results, s)
	}
	b.Derived = make([][]int, len(r.Params))
	for s, sl := range b.Slots {
		if sl.Buf.Kind == BufParam && sl.Value.Op != nil {
			b.Derived[sl.Buf.Index] = append(b.Derived[sl.Buf.Index], s)
		}
		if sl.Buf.Kind == BufSlice {
			b.YsSlots = append(b.YsSlots, YsSlot{Slot: s, Result: sl.Buf.Index})
		}
	}
	return b, nil
}

// step lowers one op of block b.
func (l *lowerer) step(b *Block, op *ir.Op, top bool, ysFrom int) (Step, error) {
	st := Step{Op: op}
	for j, a := range op.Args {
		s, ok := b.SlotOf[a]
		if !ok {
			return st, fmt.Errorf("%s: operand %d (%v) is not defined before use", op.Describe(), j, a)
		}
		st.Args = append(st.Args, s)
	}
	for _, v := range op.Results {
		s, err := l.slot(b, v, top, ysFrom)
		if err != nil {
			return st, fmt.Errorf("%s: %w", op.Describe(), err)
		}
		st.Outs = append(st.Outs, s)
	}
	st.Kind = StepKindOf(op.Code)
	switch st.Kind {
	case StepCopy:
		st.From, st.To = op.Args[0].Type.Space, op.Results[0].Type.Space
		if len(op.Args) != 1 || len(op.Results) != 1 || st.From == st.To {
			st.Kind = StepOp // a device_put within one space is a plain op
		}
	case StepKernel:
		k, err := LowerKernel(op)
		if err != nil {
			return st, fmt.Errorf("%s: %w", op.Describe(), err)
		}
		st.Kernel = k
	case StepMatmul:
		st.Matmul = MatmulOf(op)
	case StepCollective:
		c, err := CollectiveOf(op)
		if err != nil {
			return st, err
		}
		st.Collective = c
	case StepOp:
		st.Kernel, _ = LowerOp(op)
	case StepLoop:
		lp, err := l.loop(b, op, &st)
		if err != nil {
			return st, fmt.Errorf("%s: %w", op.Describe(), err)
		}
		st.Loop = lp
	case 0:
		return st, fmt.Errorf("%s: no step for region op", op.Describe())
	}
	return st, nil
}

// StepKindOf is the kind of step an op of code c lowers to outside a fused
// group: StepCopy for device_put (a plain StepOp when both spaces are the
// same), StepCollective for collectives, StepKernel for fusion, StepMatmul
// for dot_general, StepLoop for scan, while and cond, StepOp for every other
// op without regions, and 0 for a region op no step runs.
func StepKindOf(c ir.Code) StepKind {
	switch {
	case c == ir.DevicePut:
		return StepCopy
	case c.IsCollective():
		return StepCollective
	case c == ir.Fusion:
		return StepKernel
	case c == ir.DotGeneral:
		return StepMatmul
	case c == ir.Scan, c == ir.While, c == ir.Cond:
		return StepLoop
	case c.Info().NumRegions > 0:
		return 0
	}
	return StepOp
}

// MatmulOf returns the layout of a dot_general op.
func MatmulOf(op *ir.Op) *Matmul {
	a := op.Attrs
	m := &Matmul{LhsBatch: a.Ints("lhs_batch"), RhsBatch: a.Ints("rhs_batch"),
		LhsContract: a.Ints("lhs_contract"), RhsContract: a.Ints("rhs_contract")}
	lhs, rhs := op.Args[0].Type.Shape, op.Args[1].Type.Shape
	lfree, rfree := FreeAxes(len(lhs), m.LhsBatch, m.LhsContract), FreeAxes(len(rhs), m.RhsBatch, m.RhsContract)
	m.Batch, m.K = extent(lhs, m.LhsBatch), extent(lhs, m.LhsContract)
	m.M, m.N = extent(lhs, lfree), extent(rhs, rfree)
	m.Lhs = matrixLayout(lhs, m.LhsBatch, lfree, m.LhsContract)
	m.Rhs = matrixLayout(rhs, m.RhsBatch, m.RhsContract, rfree)
	return m
}

// FreeAxes returns the axes of a rank-r operand of a product in neither
// its batch nor its contracting list, in order.
func FreeAxes(r int, batch, contract []int) []int {
	var out []int
	for d := range r {
		if !slices.Contains(batch, d) && !slices.Contains(contract, d) {
			out = append(out, d)
		}
	}
	return out
}

// slot returns the slot of v in b, adding it (after checking its buffer)
// on first use.
func (l *lowerer) slot(b *Block, v *ir.Value, top bool, ysFrom int) (int, error) {
	if s, ok := b.SlotOf[v]; ok {
		return s, nil
	}
	buf, ok := b.Plan.Values[v]
	if !ok && v.Op == nil {
		// Parameters are where the caller says; a plan may omit them.
		buf, ok = Buffer{Kind: BufParam, Space: v.Type.Space, Index: v.Index, Size: v.Type.Bytes()}, true
	}
	if !ok {
		return 0, fmt.Errorf("%v (%v) has no buffer", v, v.Type)
	}
	size := v.Type.Bytes()
	if buf.Size != 0 && buf.Size < size {
		return 0, fmt.Errorf("%v (%v, %d bytes) has a %d-byte buffer", v, v.Type, size, buf.Size)
	}
	if buf.Space >= 2 {
		return 0, fmt.Errorf("%v: bad memory space %v", v, buf.Space)
	}
	if err := l.checkBuffer(b, v, buf, size, top, ysFrom); err != nil {
		return 0, err
	}
	b.Slots = append(b.Slots, Slot{Value: v, Buf: buf, Bytes: size})
	b.SlotOf[v] = len(b.Slots) - 1
	return len(b.Slots) - 1, nil
}

// checkBuffer checks the buffer of v (size bytes) in block b.
func (l *lowerer) checkBuffer(b *Block, v *ir.Value, buf Buffer, size int64, top bool, ysFrom int) error {
	r, plan := b.Region, b.Plan
	switch buf.Kind {
	case BufParam:
		if buf.Index < 0 || buf.Index >= len(r.Params) {
			return fmt.Errorf("%v: parameter buffer %d out of range", v, buf.Index)
		}
		if v.Op == nil && r.Params[buf.Index] != v {
			return fmt.Errorf("parameter %v has the buffer of parameter %d", v, buf.Index)
		}
		if v.Op != nil && top && !l.isDonated(buf.Index) {
			return fmt.Errorf("%v is planned into parameter %d, which is not donated", v, buf.Index)
		}
		if r.Params[buf.Index].Type.Bytes() < size {
			return fmt.Errorf("%v (%d bytes) does not fit parameter %d", v, size, buf.Index)
		}
	case BufTemp:
		if buf.Offset < 0 || buf.Offset+size > plan.Arena[buf.Space] {
			return fmt.Errorf("%v: [%d, %d) is outside the %d-byte %v arena", v, buf.Offset, buf.Offset+size, plan.Arena[buf.Space], buf.Space)
		}
	case BufSlice:
		if ysFrom < 0 || buf.Index < ysFrom || buf.Index >= len(r.Results) || r.Results[buf.Index] != v || v.Op == nil {
			return fmt.Errorf("%v: ys slice of result %d is not a y of this scan body", v, buf.Index)
		}
		for j, w := range r.Results {
			if w == v && j != buf.Index {
				return fmt.Errorf("%v: ys slice of result %d is also result %d", v, buf.Index, j)
			}
		}
	case BufOutput:
		if !top {
			return fmt.Errorf("%v: output buffer inside a nested region", v)
		}
		if buf.Index < 0 || buf.Index >= len(r.Results) {
			return fmt.Errorf("%v: output %d out of range", v, buf.Index)
		}
	case BufAlias:
		if !top {
			return fmt.Errorf("%v: alias buffer inside a nested region", v)
		}
		if !l.isDonated(buf.Param) || buf.Param >= len(r.Params) {
			return fmt.Errorf("%v aliases parameter %d, which is not donated", v, buf.Param)
		}
		if r.Params[buf.Param].Type.Bytes() < size {
			return fmt.Errorf("%v (%d bytes) does not fit donated parameter %d", v, size, buf.Param)
		}
	default:
		return fmt.Errorf("%v: unknown buffer kind %v", v, buf.Kind)
	}
	return nil
}

// loop lowers a scan, while or cond op whose operand and result slots st
// holds: its nested blocks and bindings.
func (l *lowerer) loop(b *Block, op *ir.Op, st *Step) (*Loop, error) {
	plan := b.Plan
	subs := plan.Sub[op]
	if len(subs) != len(op.Regions) {
		return nil, fmt.Errorf("%d nested plans for %d regions", len(subs), len(op.Regions))
	}
	lp := &Loop{Code: op.Code, SubOffset: plan.SubOffset[op]}
	ysFrom := -1
	switch op.Code {
	case ir.Scan:
		lp.Consts, lp.Carry = op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
		lp.Length, lp.Reverse = op.Attrs.Int("length"), op.Attrs.Bool("reverse")
		ysFrom = lp.Carry
	case ir.While:
		lp.Consts = op.Attrs.Int("num_consts")
		lp.Carry = len(op.Results)
	}
	for k, sr := range op.Regions {
		for sp := range 2 {
			if lp.SubOffset[sp] < 0 || lp.SubOffset[sp]+subs[k].Arena[sp] > plan.Arena[sp] {
				return nil, fmt.Errorf("nested arena [%d, %d) is outside the %d-byte %v arena",
					lp.SubOffset[sp], lp.SubOffset[sp]+subs[k].Arena[sp], plan.Arena[sp], ir.MemorySpace(sp))
			}
		}
		sub, err := l.block(sr, subs[k], false, ysFrom)
		if err != nil {
			return nil, fmt.Errorf("region %d: %w", k, err)
		}
		xs := -1
		if op.Code == ir.Scan {
			xs = lp.Consts + lp.Carry
		}
		sub.schedule(xs)
		lp.Blocks = append(lp.Blocks, sub)
	}
	if err := lp.bind(b, op, st); err != nil {
		return nil, err
	}
	return lp, nil
}

// bind plans the loop's Init, Params and Results and checks that the nested
// regions match the op.
func (lp *Loop) bind(b *Block, op *ir.Op, st *Step) error {
	nc, nk := lp.Consts, lp.Carry
	switch op.Code {
	case ir.Scan:
		body := lp.Blocks[0].Region
		if len(body.Params) != len(op.Args) || len(body.Results) != len(op.Results) || nc+nk > len(op.Args) {
			return fmt.Errorf("scan body does not match the op")
		}
	case ir.While:
		if len(lp.Blocks) != 2 || len(lp.Blocks[0].Region.Results) != 1 || len(lp.Blocks[1].Region.Results) != len(op.Results) ||
			len(op.Args) != nc+len(op.Results) {
			return fmt.Errorf("while regions do not match the op")
		}
	case ir.Cond:
		for _, s := range lp.Blocks {
			if len(s.Region.Results) != len(op.Results) || len(s.Region.Params) != len(op.Args)-1 {
				return fmt.Errorf("cond branch does not match the op")
			}
		}
	}
	for j := 0; j < nk; j++ {
		lp.Init = append(lp.Init, Move{Arg: nc + j, Out: j})
	}
	if op.Code == ir.Cond {
		for j := 1; j < len(op.Args); j++ {
			lp.Params = append(lp.Params, ParamBind{Kind: BindArg, Arg: j, Out: -1})
		}
	} else {
		for j := range op.Args {
			switch {
			case j < nc:
				lp.Params = append(lp.Params, ParamBind{Kind: BindArg, Arg: j, Out: -1})
			case j < nc+nk:
				lp.Params = append(lp.Params, ParamBind{Kind: BindOut, Arg: -1, Out: j - nc})
			default:
				stride := int64(0)
				if lp.Length > 0 {
					stride = b.Slots[st.Args[j]].Bytes / int64(lp.Length)
				}
				lp.Params = append(lp.Params, ParamBind{Kind: BindSlice, Arg: j, Out: -1, Stride: stride})
			}
		}
	}
	prod := lp.Blocks[len(lp.Blocks)-1] // scan: body; while: body; cond: false branch
	for j := range op.Results {
		rb := ResultBind{Out: j}
		if op.Code == ir.Scan && j >= nk && lp.Length > 0 {
			rb.Stride = b.Slots[st.Outs[j]].Bytes / int64(lp.Length)
		}
		if op.Code != ir.Cond {
			rb.InPlace, rb.Stage = lp.resultPlace(prod, j)
		}
		lp.Results = append(lp.Results, rb)
	}
	return nil
}

// resultPlace reports whether result j of block blk is computed in its own
// destination, and whether its memory is another result's destination.
func (lp *Loop) resultPlace(blk *Block, j int) (inPlace, stage bool) {
	buf := blk.Slots[blk.Results[j]].Buf
	switch buf.Kind {
	case BufSlice:
		return buf.Index == j, false
	case BufParam:
		if p := lp.Params[buf.Index]; p.Kind == BindOut {
			return p.Out == j, p.Out != j
		}
	}
	return false, false
}
