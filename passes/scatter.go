package passes

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// reduceScatter turns an all_reduce of whose sum each device reads only its
// own block into a reduce_scatter. The pattern is the one the partitioner
// leaves where a partial sum (a weight's gradient under FSDP, say) is
// combined whole and then resharded to its users' split layout:
//
//	%s = all_reduce(%x) {axis="a", size=n, reduction="sum"}
//	%t = transpose(%s) / convert(%s)          (any chain, each value used once)
//	%i = axis_index() {axis="a", size=n}
//	%o = mul(%i, k)                           (k = the block's size along d)
//	%r = dynamic_slice(%t, 0, ..., %o, ..., 0) {sizes: the whole of every dimension but d}
//
// which becomes
//
//	%u = transpose(%x)                        (the chain's transposes, composed; none if identity)
//	%b = reduce_scatter(%u) {axis="a", size=n, dimension=d, tiled}
//	%r = convert(%b)                          (the chain's converts, in order)
//
// Member i of the group keeps block i of dimension d, the block the slice
// took, so the result is the same sum; each device receives 1/n of the bytes
// an all_reduce gives it, and no device holds the whole reduced array. The
// transposes move before the collective (they commute with the sum exactly);
// the converts stay after it, so the sum is taken in the same dtype as
// before. Everything else is left alone: a max or min reduction, an
// all_reduce (or a value of the chain) with another use, a slice of another
// block than the device's own (another axis, another offset, another block
// size), a slice along two dimensions. The ops of the old chain become dead
// and dce removes them.
//
// The rewrite works in every region, scan bodies included (a layer scan's
// weight gradient resharded inside the body), and across a scan's
// boundary: where a body's ys result is such a chain and the stacked ys'
// only use slices the device's block of a dimension after the stacked
// one, the body reduce-scatters instead and the scan stacks the blocks.
func reduceScatter(s *State) error {
	u := countUses(s.Func.Body)
	stacked := map[*ir.Op]*ir.Value{}
	_ = walkRegions(s.Func.Body, false, func(r *ir.Region) error {
		for _, op := range r.Ops {
			if v := u.scatterYs(s.Func, op); v != nil {
				stacked[op] = v
			}
		}
		return nil
	})
	return rewriteOps(s.Func, func(f *ir.Func, op *ir.Op) ([]*ir.Value, []*ir.Op) {
		if v := stacked[op]; v != nil {
			return []*ir.Value{v}, nil
		}
		if op.Code != ir.DynamicSlice {
			return nil, nil
		}
		m := u.chain(op.Args[0], u.region[op])
		if m == nil || !m.slices(op, 0) {
			return nil, nil
		}
		v, ops := m.build(f, op.Result().Type, op.Loc)
		if v == nil {
			return nil, nil
		}
		return []*ir.Value{v}, ops
	})
}

// scatterYs rewrites the scan whose stacked ys op, a dynamic_slice, takes
// the device's block of, when the body's ys value is an all_reduce chain
// used only there: the body returns the reduce-scattered block instead and
// the scan's result becomes op's type. It returns the scan's result, which
// replaces op's, or nil (and changes nothing).
func (u *useCounts) scatterYs(f *ir.Func, op *ir.Op) *ir.Value {
	if op.Code != ir.DynamicSlice {
		return nil
	}
	ys := op.Args[0]
	scan := ys.Op
	if scan == nil || scan.Code != ir.Scan || ys.Index < scan.Attrs.Int("num_carry") || u.uses[ys] != 1 || u.region[scan] != u.region[op] {
		return nil
	}
	body := scan.Regions[0]
	m := u.chain(body.Results[ys.Index], body)
	if m == nil || !m.slices(op, 1) {
		return nil
	}
	m.dim--
	want := op.Result().Type
	v, ops := m.build(f, want.WithShape(want.Shape[1:].Clone()), op.Loc)
	if v == nil {
		return nil
	}
	body.Ops = append(body.Ops, ops...)
	body.Results[ys.Index] = v
	ys.Type = want
	return ys
}

// useCounts counts the uses of every value of a function (as an operand,
// or as a region's result) and records the region that holds each op.
type useCounts struct {
	uses   map[*ir.Value]int
	region map[*ir.Op]*ir.Region
}

// countUses counts the uses in r and every region nested in it.
func countUses(r *ir.Region) *useCounts {
	u := &useCounts{uses: map[*ir.Value]int{}, region: map[*ir.Op]*ir.Region{}}
	_ = walkRegions(r, true, func(r *ir.Region) error {
		for _, op := range r.Ops {
			u.region[op] = r
			for _, a := range op.Args {
				u.uses[a]++
			}
		}
		for _, v := range r.Results {
			u.uses[v]++
		}
		return nil
	})
	return u
}

// ownBlock is a matched all_reduce and chain of ops after it.
type ownBlock struct {
	ar       *ir.Op     // the all_reduce
	perm     []int      // the chain's value dimension i is all_reduce dimension perm[i]
	converts []ir.DType // the chain's converts, first applied first
	dim      int        // the dimension of the chain's value that is scattered
}

// chain matches v, a value of region reg: a sum all_reduce followed by
// transposes and converts, each value used once and defined in reg; or nil.
func (u *useCounts) chain(v *ir.Value, reg *ir.Region) *ownBlock {
	m := &ownBlock{perm: make([]int, v.Type.Rank())}
	for i := range m.perm {
		m.perm[i] = i
	}
	for m.ar == nil {
		d := v.Op
		if d == nil || u.uses[v] != 1 || u.region[d] != reg || len(d.Results) != 1 {
			return nil
		}
		switch d.Code {
		case ir.Transpose:
			p := d.Attrs.Ints("perm")
			for i := range m.perm {
				m.perm[i] = p[m.perm[i]]
			}
		case ir.Convert:
			m.converts = append(m.converts, d.Attrs.DType("dtype"))
		case ir.AllReduce:
			if d.Attrs.String("reduction") != "sum" {
				return nil
			}
			m.ar = d
		default:
			return nil
		}
		v = d.Args[0]
	}
	slices.Reverse(m.converts)
	return m
}

// slices reports whether op, a dynamic_slice, takes the device's own block
// along the all_reduce's group of one dimension (at or after lead) of its
// operand and the whole of every other dimension; it sets m.dim to it.
func (m *ownBlock) slices(op *ir.Op, lead int) bool {
	shape, sizes := op.Args[0].Type.Shape, op.Attrs.Ints("sizes")
	n := m.ar.Attrs.Int("size")
	dim := -1
	for d := range shape {
		if sizes[d] == shape[d] {
			continue // a whole dimension: its start is clamped to 0
		}
		if dim >= 0 || d < lead {
			return false
		}
		dim = d
	}
	if dim < 0 || n < 2 || sizes[dim]*n != shape[dim] || !m.ownStart(op.Args[1+dim], sizes[dim]) {
		return false
	}
	m.dim = dim
	return true
}

// ownStart reports whether start is the device's rank along the
// all_reduce's group times k.
func (m *ownBlock) ownStart(start *ir.Value, k int) bool {
	isIndex := func(v *ir.Value) bool {
		o := v.Op
		return o != nil && o.Code == ir.AxisIndex && o.Attrs.String("axis") == m.ar.Attrs.String("axis") &&
			o.Attrs.Int("size") == m.ar.Attrs.Int("size")
	}
	isConst := func(v *ir.Value, want int) bool {
		l, ok := splat(v)
		return ok && l.Type.DType.IsInteger() && l.Float64At(0) == float64(want)
	}
	if k == 1 && isIndex(start) {
		return true
	}
	o := start.Op
	if o == nil || o.Code != ir.Mul {
		return false
	}
	a, b := o.Args[0], o.Args[1]
	return isIndex(a) && isConst(b, k) || isIndex(b) && isConst(a, k)
}

// build returns the reduce_scatter of the all_reduce's operand along m.dim
// (after the chain's transposes, composed, and before its converts) and
// its ops; nil unless its type is want.
func (m *ownBlock) build(f *ir.Func, want ir.Type, loc string) (*ir.Value, []*ir.Op) {
	var ops []*ir.Op
	add := func(code ir.Code, x *ir.Value, attrs ir.Attrs, loc string) *ir.Value {
		if x == nil {
			return nil
		}
		o, err := f.NewOp(code, []*ir.Value{x}, attrs)
		if err != nil {
			return nil
		}
		o.Loc = loc
		ops = append(ops, o)
		return o.Result()
	}
	x := m.ar.Args[0]
	if !identityPerm(m.perm) {
		x = add(ir.Transpose, x, ir.Attrs{"perm": slices.Clone(m.perm)}, loc)
	}
	a := m.ar.Attrs
	x = add(ir.ReduceScatter, x, ir.Attrs{"axis": a.String("axis"), "size": a.Int("size"), "dimension": m.dim, "tiled": true}, m.ar.Loc)
	for _, dt := range m.converts {
		x = add(ir.Convert, x, ir.Attrs{"dtype": dt}, loc)
	}
	if x == nil || !x.Type.Equal(want) {
		return nil, nil
	}
	return x, ops
}
