package passes

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// dotLayout folds the transposes that feed dot_general into its dimension
// numbers, so that the product reads the operand where it lies instead of
// a transposed copy (the CPU executor's products read any layout in place;
// see internal/eval's dotGeneral). For each operand, repeatedly:
//
//   - transpose(x) → x, with the batch and contracting axes renamed through
//     the permutation, when the free axes stay in increasing order (they
//     give the result's layout, which must not change);
//   - reshape(transpose(x)) that only merges groups of consecutive axes of
//     the transpose → the transpose itself, each merged axis replaced by
//     its group: a merged contracting axis splits the other operand's
//     paired axis into the group's sizes (a reshape of that operand), a
//     merged free axis makes the product's result come out split (a
//     reshape of the result merges it back) — each only when that reshape
//     copies less than the transpose (the attention head merge: heads and
//     head dims become two contracting axes of the output projection,
//     whose weight matrix is reshaped to [heads, head dim, width]; in the
//     weight's gradient they are two free axes of a [width, heads, head
//     dim] result).
//
// The contracting index keeps its order (row-major over the contracting
// pairs, a merged axis becoming its group in order), and the result its
// layout, so the product computes the same sums in the same order: results
// are bit for bit those of the program before the pass.
// A reshape that splits free axes of a product's result (its only use) is
// folded the other way, into the operand the axes come from, when that
// operand is the smaller (see splitDotResult). Transposes and products
// left without users are removed by dce.
func dotLayout(st *State) error {
	return walkRegions(st.Func.Body, true, func(r *ir.Region) error {
		s := subst{}
		use, ret := users(r), returned(r)
		out := make([]*ir.Op, 0, len(r.Ops))
		for _, op := range r.Ops {
			s.apply(op)
			var nop *ir.Op
			var extra []*ir.Op
			switch op.Code {
			case ir.DotGeneral:
				nop, extra = foldDotLayout(st.Func, op)
			case ir.Reshape:
				if d := op.Args[0]; d.Op != nil && d.Op.Code == ir.DotGeneral && len(use[d]) == 1 && !ret[d] {
					nop, extra = splitDotResult(st.Func, d.Op, op)
				}
			}
			if nop != nil {
				out = append(out, extra...)
				out = append(out, nop)
				s[op.Result()] = nop.Result()
				continue
			}
			out = append(out, op)
		}
		r.Ops = out
		s.applyResults(r)
		return nil
	})
}

// dotSide is one operand of a dot_general and its batch and contracting
// axes.
type dotSide struct {
	v               *ir.Value
	batch, contract []int
}

// newDot makes the dot_general of the two sides, with attrs a (the original
// product's) and the sides' batch and contracting axes.
func newDot(f *ir.Func, a ir.Attrs, sides [2]dotSide) (*ir.Op, error) {
	attrs := ir.CloneAttrs(a)
	attrs["lhs_batch"], attrs["lhs_contract"] = sides[0].batch, sides[0].contract
	attrs["rhs_batch"], attrs["rhs_contract"] = sides[1].batch, sides[1].contract
	return f.NewOp(ir.DotGeneral, []*ir.Value{sides[0].v, sides[1].v}, attrs)
}

// free returns the side's free axes in increasing order.
func (d *dotSide) free() []int {
	var out []int
	for a := range d.v.Type.Rank() {
		if !slices.Contains(d.batch, a) && !slices.Contains(d.contract, a) {
			out = append(out, a)
		}
	}
	return out
}

// foldDotLayout returns a dot_general equal to op reading through the
// transposes of its operands, and the ops (reshapes of an operand) that
// must precede it; nil when there is nothing to fold.
func foldDotLayout(f *ir.Func, op *ir.Op) (*ir.Op, []*ir.Op) {
	a := op.Attrs
	sides := [2]dotSide{
		{op.Args[0], slices.Clone(a.Ints("lhs_batch")), slices.Clone(a.Ints("lhs_contract"))},
		{op.Args[1], slices.Clone(a.Ints("rhs_batch")), slices.Clone(a.Ints("rhs_contract"))},
	}
	var extra []*ir.Op
	changed := false
	for progress := true; progress; {
		progress = false
		for i := range sides {
			me, other := &sides[i], &sides[1-i]
			if foldTranspose(me) {
				progress = true
				continue
			}
			if rs, ok := foldMerged(f, me, other, op.Result().Type.Size()); ok {
				if rs != nil {
					rs.Loc = op.Loc
					extra = append(extra, rs)
				}
				progress = true
			}
		}
		changed = changed || progress
	}
	if !changed {
		return nil, nil
	}
	nop, err := newDot(f, a, sides)
	if err != nil {
		return nil, nil
	}
	nop.Loc = op.Loc
	want := op.Result().Type
	if nop.Result().Type.Equal(want) {
		return nop, extra
	}
	// Merged free axes came apart: merge them back.
	rs, err := f.NewOp(ir.Reshape, []*ir.Value{nop.Result()}, ir.Attrs{"shape": []int(want.Shape.Clone())})
	if err != nil || !rs.Result().Type.Equal(want) {
		return nil, nil
	}
	rs.Loc = op.Loc
	return rs, append(extra, nop)
}

// foldTranspose replaces a transposed operand by the transpose's operand
// when the free axes keep their order.
func foldTranspose(d *dotSide) bool {
	p := d.v.Op
	if p == nil || p.Code != ir.Transpose {
		return false
	}
	perm := p.Attrs.Ints("perm")
	last := -1
	for _, ax := range d.free() {
		if perm[ax] < last {
			return false
		}
		last = perm[ax]
	}
	for i, ax := range d.batch {
		d.batch[i] = perm[ax]
	}
	for i, ax := range d.contract {
		d.contract[i] = perm[ax]
	}
	d.v = p.Args[0]
	return true
}

// foldMerged replaces an operand reshape(transpose(x)) whose reshape
// merges groups of consecutive axes (and keeps every other axis) by
// transpose(x), each merged axis replaced by its group. A merged
// contracting axis needs the other operand's paired axis split into the
// group's sizes, by a reshape of that operand, which foldMerged returns; a
// merged free axis makes the product's result come out with the group's
// axes, merged back by foldDotLayout. Either is done only when the reshape
// it costs (of the other operand, of the result, whose size is res) copies
// fewer elements than the transpose it saves; batch axes are never merged.
func foldMerged(f *ir.Func, me, other *dotSide, res int) (*ir.Op, bool) {
	p := me.v.Op
	if p == nil || p.Code != ir.Reshape {
		return nil, false
	}
	x := p.Args[0]
	if x.Op == nil || x.Op.Code != ir.Transpose {
		return nil, false
	}
	groups, ok := mergeGroups(x.Type.Shape, me.v.Type.Shape)
	if !ok {
		return nil, false
	}
	size := me.v.Type.Size()
	mergedContract := false
	for ax, g := range groups {
		if len(g) <= 1 {
			continue
		}
		switch {
		case slices.Contains(me.batch, ax):
			return nil, false
		case slices.Contains(me.contract, ax):
			if other.v.Type.Size() >= size {
				return nil, false
			}
			mergedContract = true
		default: // free
			if res >= size {
				return nil, false
			}
		}
	}
	var rs *ir.Op
	if mergedContract {
		// The other operand's axes after splitting: start[e] is where its
		// old axis e begins, split[e] the sizes it becomes.
		os := other.v.Type.Shape
		split := make([][]int, len(os))
		for e, n := range os {
			split[e] = []int{n}
		}
		for i, ax := range me.contract {
			if g := groups[ax]; len(g) > 1 {
				sz := make([]int, len(g))
				for j, xa := range g {
					sz[j] = x.Type.Shape[xa]
				}
				split[other.contract[i]] = sz
			}
		}
		start := make([]int, len(os))
		var shape []int
		for e := range os {
			start[e] = len(shape)
			shape = append(shape, split[e]...)
		}
		var err error
		rs, err = f.NewOp(ir.Reshape, []*ir.Value{other.v}, ir.Attrs{"shape": shape})
		if err != nil {
			return nil, false
		}
		var oc []int
		for i := range me.contract {
			for j := range split[other.contract[i]] {
				oc = append(oc, start[other.contract[i]]+j)
			}
		}
		for i, e := range other.batch {
			other.batch[i] = start[e]
		}
		other.v, other.contract = rs.Result(), oc
	}
	var mc []int
	for _, ax := range me.contract {
		mc = append(mc, groups[ax]...)
	}
	for i, ax := range me.batch {
		me.batch[i] = groups[ax][0]
	}
	me.v, me.contract = x, mc
	return rs, true
}

// splitDotResult returns a dot_general equal to rs, a reshape of the
// product d (its only use) that splits free axes of the result, computed
// straight in the split shape: each split free axis is split in the
// operand it comes from, by a reshape of that operand (returned as the
// ops to insert first), when that operand is smaller than the result (the
// attention head split of the q, k and v projections: the weight matrix
// is reshaped to [width, heads, head dim] instead of the activations).
// The sums and their order are unchanged.
func splitDotResult(f *ir.Func, d, rs *ir.Op) (*ir.Op, []*ir.Op) {
	res := d.Result().Type
	groups, ok := mergeGroups(rs.Result().Type.Shape, res.Shape)
	if !ok {
		return nil, nil
	}
	a := d.Attrs
	sides := [2]dotSide{
		{d.Args[0], slices.Clone(a.Ints("lhs_batch")), slices.Clone(a.Ints("lhs_contract"))},
		{d.Args[1], slices.Clone(a.Ints("rhs_batch")), slices.Clone(a.Ints("rhs_contract"))},
	}
	nb := len(sides[0].batch)
	free := [2][]int{sides[0].free(), sides[1].free()}
	// split[s][e]: the sizes operand s's axis e becomes.
	var split [2][][]int
	for s := range sides {
		for _, n := range sides[s].v.Type.Shape {
			split[s] = append(split[s], []int{n})
		}
	}
	didSplit := false
	for ax, g := range groups {
		if len(g) <= 1 {
			continue
		}
		s, i := 0, ax-nb
		if i >= len(free[0]) {
			s, i = 1, i-len(free[0])
		}
		if ax < nb || sides[s].v.Type.Size() >= res.Size() {
			return nil, nil
		}
		sz := make([]int, len(g))
		for j, ra := range g {
			sz[j] = rs.Result().Type.Shape[ra]
		}
		split[s][free[s][i]] = sz
		didSplit = true
	}
	if !didSplit {
		return nil, nil
	}
	var extra []*ir.Op
	for s := range sides {
		start := make([]int, len(split[s]))
		var shape []int
		for e, sz := range split[s] {
			start[e] = len(shape)
			shape = append(shape, sz...)
		}
		if len(shape) == len(split[s]) {
			continue // nothing split on this side
		}
		op, err := f.NewOp(ir.Reshape, []*ir.Value{sides[s].v}, ir.Attrs{"shape": shape})
		if err != nil {
			return nil, nil
		}
		op.Loc = rs.Loc
		extra = append(extra, op)
		for i, e := range sides[s].batch {
			sides[s].batch[i] = start[e]
		}
		for i, e := range sides[s].contract {
			sides[s].contract[i] = start[e]
		}
		sides[s].v = op.Result()
	}
	nop, err := newDot(f, a, sides)
	if err != nil || !nop.Result().Type.Equal(rs.Result().Type) {
		return nil, nil
	}
	nop.Loc = d.Loc
	return nop, extra
}

// mergeGroups returns, for each axis of to, the consecutive axes of from
// that a row-major reshape from → to merges into it, when the reshape only
// merges (no axis of from is split); shapes with unit axes are left alone.
func mergeGroups(from, to ir.Shape) ([][]int, bool) {
	if slices.Contains(from, 1) || slices.Contains(to, 1) {
		return nil, false
	}
	groups := make([][]int, len(to))
	j := 0
	for a, n := range to {
		prod := 1
		for prod < n && j < len(from) {
			prod *= from[j]
			groups[a] = append(groups[a], j)
			j++
		}
		if prod != n {
			return nil, false
		}
	}
	return groups, j == len(from)
}
