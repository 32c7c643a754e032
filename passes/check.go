package passes

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// CheckPlan checks that a program's buffer plan is valid:
//
//   - every region that needs a plan has one (the body, and every region of
//     every scan, while and cond op, recursively; fusion regions none), and
//     every parameter and op result in it has a buffer of its exact byte size
//     and memory space; no other value has one;
//   - parameters are BufParam with their own index; BufOutput and BufAlias
//     appear only at the top level, for the first result position returning
//     the value; every result position that returns an op result for the
//     first time has one;
//   - an alias names a donated parameter of the same size and space, each
//     parameter at most once, and the parameter is dead when the result is
//     written (or read element for element by the op writing it);
//   - a BufSlice is a scan body's y result, defined by an op of the body,
//     returned only at its Index (≥ num_carry), of the size and space of one
//     slice of the op's ys result;
//   - temps and nested-arena blocks lie inside the arena of their space, at
//     aligned offsets, and two of them live at the same time never share a
//     byte — except a result written in place over an operand that dies at
//     its op (same offset and size; see Options.FusionInPlace for which ops);
//   - nested arenas fit in their parent's block, and analysis figures match.
func CheckPlan(p *Program) error {
	if p == nil || p.Plan == nil || p.Func == nil {
		return fmt.Errorf("check plan: no plan")
	}
	if p.Plan.Region != p.Func.Body {
		return fmt.Errorf("check plan: the top plan is not for the function body")
	}
	if err := checkRegionPlan(p.Plan, true, p.Donated, nil, "body"); err != nil {
		return fmt.Errorf("check plan: %w", err)
	}
	if p.Analysis != (MemoryAnalysis{}) && p.Analysis != Analyze(p.Plan) {
		return fmt.Errorf("check plan: analysis %+v does not match the plan (%+v)", p.Analysis, Analyze(p.Plan))
	}
	return nil
}

// checkRegionPlan checks one region's plan; encl is the region op whose
// region it is (nil for the function body).
func checkRegionPlan(rp *RegionPlan, top bool, donated []bool, encl *ir.Op, where string) error {
	if rp.Region == nil {
		return fmt.Errorf("%s: plan without a region", where)
	}
	c := &planChecker{rp: rp, r: rp.Region, top: top, donated: donated, encl: encl, where: where}
	c.liveness()
	if err := c.checkBuffers(); err != nil {
		return err
	}
	if err := c.checkResults(); err != nil {
		return err
	}
	if err := c.collectBlocks(); err != nil {
		return err
	}
	return c.checkBlocks()
}

// planChecker is the state of checkRegionPlan: an independent liveness of
// the region and the arena blocks its plan places.
type planChecker struct {
	rp      *RegionPlan
	r       *ir.Region
	top     bool
	donated []bool
	encl    *ir.Op
	where   string
	// def and last are each value's definition and last use positions.
	def, last map[*ir.Value]int
	// first is the first result position returning a value, returned how
	// many positions return it.
	first, returned map[*ir.Value]int
	// blocks are the temps and nested arenas placed in the arenas.
	blocks []planBlock
}

// planBlock is a temp or the nested arenas of a region op in one arena.
type planBlock struct {
	v          *ir.Value
	op         *ir.Op
	space      ir.MemorySpace
	off, size  int64
	start, end int
}

// label names b in errors.
func (b planBlock) label() string {
	if b.v != nil {
		return b.v.String()
	}
	return "the nested arenas of " + opLabel(b.op)
}

// overwrittenBy reports whether y's op writes y in place over b where b dies.
func (b planBlock) overwrittenBy(y planBlock) bool {
	return b.v != nil && y.v != nil && b.off == y.off && b.size == y.size && b.end == y.start &&
		y.v.Op != nil && hasArg(y.v.Op, b.v) && inPlace(y.v.Op, b.v, y.v, true)
}

// liveness fills def, last, first and returned.
func (c *planChecker) liveness() {
	r := c.r
	c.def, c.last = map[*ir.Value]int{}, map[*ir.Value]int{}
	for _, v := range r.Params {
		c.def[v], c.last[v] = -1, -1
	}
	for k, op := range r.Ops {
		for _, a := range op.Args {
			if k > c.last[a] {
				c.last[a] = k
			}
		}
		for _, v := range op.Results {
			c.def[v], c.last[v] = k, k
		}
	}
	for _, v := range r.Results {
		c.last[v] = len(r.Ops)
	}
	c.first, c.returned = map[*ir.Value]int{}, map[*ir.Value]int{}
	for j, v := range r.Results {
		if _, ok := c.first[v]; !ok {
			c.first[v] = j
		}
		c.returned[v]++
	}
}

// checkBuffers checks that exactly the region's values have buffers, of
// their size and space, and that parameters are BufParam.
func (c *planChecker) checkBuffers() error {
	rp, where := c.rp, c.where
	if len(rp.Values) != len(c.def) {
		return fmt.Errorf("%s: %d buffers for %d values", where, len(rp.Values), len(c.def))
	}
	for v := range c.def {
		b, ok := rp.Values[v]
		if !ok {
			return fmt.Errorf("%s: %v has no buffer", where, v)
		}
		if b.Size != bytesOf(v) || b.Space != v.Type.Space {
			return fmt.Errorf("%s: %v %v has buffer %s, want %d B in %v", where, v, v.Type, bufString(b), bytesOf(v), v.Type.Space)
		}
	}
	for i, v := range c.r.Params {
		if b := rp.Values[v]; b.Kind != BufParam || b.Index != i {
			return fmt.Errorf("%s: parameter %d %v has buffer %s", where, i, v, bufString(b))
		}
	}
	return nil
}

// checkResults checks the buffer kind of every op result: outputs,
// aliases, ys slices and temps.
func (c *planChecker) checkResults() error {
	aliased := map[int]bool{}
	for k, op := range c.r.Ops {
		for _, v := range op.Results {
			if err := c.checkResult(k, op, v, aliased); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkResult checks the buffer of v, a result of op k; aliased holds the
// parameters aliased so far.
func (c *planChecker) checkResult(k int, op *ir.Op, v *ir.Value, aliased map[int]bool) error {
	where := c.where
	b := c.rp.Values[v]
	switch b.Kind {
	case BufOutput, BufAlias:
		if !c.top {
			return fmt.Errorf("%s: %v is an output in a nested region", where, v)
		}
		j, ok := c.first[v]
		if !ok || j != b.Index {
			return fmt.Errorf("%s: %v has %s, but is first returned at %d (returned: %t)", where, v, bufString(b), j, ok)
		}
		if b.Kind == BufAlias {
			return c.checkAlias(k, op, v, b, aliased)
		}
	case BufSlice:
		return c.checkSlice(v, b)
	case BufTemp:
		if c.top {
			if _, ok := c.first[v]; ok {
				return fmt.Errorf("%s: result %v is a temp", where, v)
			}
		}
	default:
		return fmt.Errorf("%s: op result %v has buffer %s", where, v, bufString(b))
	}
	return nil
}

// checkAlias checks that v, a result of op k with buffer b, aliases a
// donated parameter of its size and space, not aliased before and dead
// when v is written.
func (c *planChecker) checkAlias(k int, op *ir.Op, v *ir.Value, b Buffer, aliased map[int]bool) error {
	where := c.where
	i := b.Param
	if i < 0 || i >= len(c.r.Params) || i >= len(c.donated) || !c.donated[i] {
		return fmt.Errorf("%s: %v aliases parameter %d, which is not donated", where, v, i)
	}
	pv := c.r.Params[i]
	if aliased[i] {
		return fmt.Errorf("%s: parameter %d is aliased twice", where, i)
	}
	aliased[i] = true
	if bytesOf(pv) != b.Size || pv.Type.Space != b.Space {
		return fmt.Errorf("%s: %v aliases parameter %d of another size or space", where, v, i)
	}
	if c.last[pv] > k || c.last[pv] == k && !inPlace(op, pv, v, true) {
		return fmt.Errorf("%s: %v aliases parameter %d, which is read later (at op %d)", where, v, i, c.last[pv])
	}
	return nil
}

// checkSlice checks that v, with buffer b, is a scan body's y returned
// only at its index, and that b is one slice of the scan's ys.
func (c *planChecker) checkSlice(v *ir.Value, b Buffer) error {
	where, encl := c.where, c.encl
	if encl == nil || encl.Code != ir.Scan {
		return fmt.Errorf("%s: %v is a ys slice outside a scan body", where, v)
	}
	j := b.Index
	if j < encl.Attrs.Int("num_carry") || j >= len(c.r.Results) || j >= len(encl.Results) || c.r.Results[j] != v || c.returned[v] != 1 {
		return fmt.Errorf("%s: %v has %s, but is not the only y returned there", where, v, bufString(b))
	}
	if ys := encl.Results[j].Type; ys.Space != b.Space || ys.Bytes() != b.Size*int64(encl.Attrs.Int("length")) {
		return fmt.Errorf("%s: %v has %s, which is not a slice of ys %v", where, v, bufString(b), ys)
	}
	return nil
}

// collectBlocks lists the temps and nested arenas, checking the nested
// plans (recursively) on the way.
func (c *planChecker) collectBlocks() error {
	rp, r, where := c.rp, c.r, c.where
	for k, op := range r.Ops {
		for _, v := range op.Results {
			if b := rp.Values[v]; b.Kind == BufTemp {
				c.blocks = append(c.blocks, planBlock{v: v, space: b.Space, off: b.Offset, size: b.Size, start: k, end: c.last[v]})
			}
		}
		if op.Code == ir.Fusion || len(op.Regions) == 0 {
			if _, ok := rp.Sub[op]; ok {
				return fmt.Errorf("%s: %v op has nested plans", where, op.Code)
			}
			continue
		}
		if err := c.checkNested(k, op); err != nil {
			return err
		}
	}
	if len(rp.Sub) != countRegionOps(r) {
		return fmt.Errorf("%s: %d nested plan entries for %d region ops", where, len(rp.Sub), countRegionOps(r))
	}
	return nil
}

// checkNested adds the nested arenas of op k, a region op, as blocks and
// checks its nested plans.
func (c *planChecker) checkNested(k int, op *ir.Op) error {
	where := c.where
	subs, ok := c.rp.Sub[op]
	if !ok || len(subs) != len(op.Regions) {
		return fmt.Errorf("%s: %v op has %d nested plans for %d regions", where, op.Code, len(subs), len(op.Regions))
	}
	off := c.rp.SubOffset[op]
	for _, s := range ir.AllSpaces {
		var size int64
		for i, sp := range subs {
			if sp == nil || sp.Region != op.Regions[i] {
				return fmt.Errorf("%s: %v op: nested plan %d is not for its region %d", where, op.Code, i, i)
			}
			size = max(size, sp.Arena[s])
		}
		if size > 0 {
			c.blocks = append(c.blocks, planBlock{op: op, space: s, off: off[s], size: size, start: k, end: k})
		}
	}
	for i, sp := range subs {
		if err := checkRegionPlan(sp, false, nil, op, fmt.Sprintf("%s / %v %s region %d", where, op.Code, valueList(op.Results), i)); err != nil {
			return err
		}
	}
	return nil
}

// checkBlocks checks that every block lies aligned inside its arena and
// that no two blocks live at the same time share a byte, unless one is
// written in place over the other.
func (c *planChecker) checkBlocks() error {
	rp, where, blocks := c.rp, c.where, c.blocks
	for _, b := range blocks {
		if b.off < 0 || b.size > 0 && b.off%Alignment != 0 || b.off+b.size > rp.Arena[b.space] {
			return fmt.Errorf("%s: %s at %d+%d is misaligned or outside the %v arena of %d B", where, b.label(), b.off, b.size, b.space, rp.Arena[b.space])
		}
	}
	for i := range blocks {
		for j := i + 1; j < len(blocks); j++ {
			a, b := blocks[i], blocks[j]
			if a.space != b.space || a.size == 0 || b.size == 0 || a.end < b.start || b.end < a.start ||
				a.off+a.size <= b.off || b.off+b.size <= a.off {
				continue
			}
			// In place: b's op overwrites a where a dies (or the reverse).
			if a.overwrittenBy(b) || b.overwrittenBy(a) {
				continue
			}
			return fmt.Errorf("%s: %s (ops %d to %d) and %s (ops %d to %d) are live together and share bytes (%v @%d+%d and @%d+%d)",
				where, a.label(), a.start, a.end, b.label(), b.start, b.end, a.space, a.off, a.size, b.off, b.size)
		}
	}
	return nil
}

func hasArg(op *ir.Op, v *ir.Value) bool {
	for _, a := range op.Args {
		if a == v {
			return true
		}
	}
	return false
}

func countRegionOps(r *ir.Region) int {
	n := 0
	for _, op := range r.Ops {
		if op.Code != ir.Fusion && len(op.Regions) > 0 {
			n++
		}
	}
	return n
}
