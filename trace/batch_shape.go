package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Batching rules of the shape ops, reductions, dot_general and sort. Axes in
// an op's attributes are per-example; a rule rewrites them for the operand's
// batch dimension.

// batchAxis maps a per-example axis of an operand batched at d to the
// batched operand's axis.
func batchAxis(a, d int) int {
	if a >= d {
		return a + 1
	}
	return a
}

// batchAfterRemoving returns where batch dimension d ends up once the
// (batched-coordinate) axes are removed.
func batchAfterRemoving(d int, axes []int) int {
	n := d
	for _, a := range axes {
		if a < d {
			n--
		}
	}
	return n
}

func batchBroadcastInDim(c *batchCall) ([]*Array, []int) {
	x := c.front(0)
	shape := append([]int{c.size}, c.op.Attrs.Ints("shape")...)
	dims := append([]int{0}, shiftAxes(c.op.Attrs.Ints("dims"), 0)...)
	return c.apply(ir.Attrs{"shape": shape, "dims": dims}, x), []int{0}
}

func batchReshape(c *batchCall) ([]*Array, []int) {
	x := c.front(0)
	shape := append([]int{c.size}, c.op.Attrs.Ints("shape")...)
	return c.apply(ir.Attrs{"shape": shape}, x), []int{0}
}

func batchTranspose(c *batchCall) ([]*Array, []int) {
	x := c.front(0)
	perm := append([]int{0}, shiftAxes(c.op.Attrs.Ints("perm"), 0)...)
	return c.apply(ir.Attrs{"perm": perm}, x), []int{0}
}

func batchSlice(c *batchCall) ([]*Array, []int) {
	d := c.dims[0]
	a := c.op.Attrs
	start := slices.Insert(slices.Clone(a.Ints("start")), d, 0)
	limit := slices.Insert(slices.Clone(a.Ints("limit")), d, c.size)
	strides := slices.Insert(slices.Clone(a.Ints("strides")), d, 1)
	return c.apply(ir.Attrs{"start": start, "limit": limit, "strides": strides}, c.args[0]), []int{d}
}

func batchConcatenate(c *batchCall) ([]*Array, []int) {
	return c.apply(ir.Attrs{"axis": c.op.Attrs.Int("axis") + 1}, c.frontAll()...), []int{0}
}

// batchPad pads the batched operand with no padding on the batch axis. A
// batched padding value pads with zeros and then selects the value where
// the padding is, with a mask padded the same way.
func batchPad(c *batchCall) ([]*Array, []int) {
	a := c.op.Attrs
	x := c.front(0)
	lo := append([]int{0}, a.Ints("low")...)
	hi := append([]int{0}, a.Ints("high")...)
	in := append([]int{0}, a.Ints("interior")...)
	pad := func(x, v *Array) *Array {
		return c.apply(ir.Attrs{"low": lo, "high": hi, "interior": in}, x, v)[0]
	}
	if c.dims[1] < 0 {
		return []*Array{pad(x, c.args[1])}, []int{0}
	}
	zero := adScalar(0, x.DType())
	body := pad(x, zero)
	mask := pad(adFull(ir.Bool, x.typ.Shape, 1), adScalar(0, ir.Bool))
	v := adBroadcast(c.args[1], body.typ.Shape, []int{0})
	return []*Array{adSelect(mask, body, v)}, []int{0}
}

func batchReduce(c *batchCall) ([]*Array, []int) {
	d := c.dims[0]
	axes := shiftAxes(c.op.Attrs.Ints("axes"), d)
	return c.apply(ir.Attrs{"axes": axes}, c.args[0]), []int{batchAfterRemoving(d, axes)}
}

func batchArg(c *batchCall) ([]*Array, []int) {
	d := c.dims[0]
	axis := batchAxis(c.op.Attrs.Int("axis"), d)
	return c.apply(ir.Attrs{"axis": axis, "dtype": c.op.Attrs.DType("dtype")}, c.args[0]), []int{batchAfterRemoving(d, []int{axis})}
}

func batchSort(c *batchCall) ([]*Array, []int) {
	a := c.op.Attrs
	outs := c.apply(ir.Attrs{"dimension": a.Int("dimension") + 1, "num_keys": a.Int("num_keys")}, c.frontAll()...)
	return outs, dimsAll(len(outs), 0)
}

// batchDotGeneral: batched on both sides, the batch axis becomes a new
// leading batch dimension of the dot (one batched dot_general); batched on one
// side, it is a free dimension of that side, so the result has it where that
// side's free dimensions go.
func batchDotGeneral(c *batchCall) ([]*Array, []int) {
	a := c.op.Attrs
	lb, rb, lc, rc := a.Ints("lhs_batch"), a.Ints("rhs_batch"), a.Ints("lhs_contract"), a.Ints("rhs_contract")
	dl, dr := c.dims[0], c.dims[1]
	attrs := func(lb, rb, lc, rc []int) ir.Attrs {
		return ir.Attrs{"lhs_batch": lb, "rhs_batch": rb, "lhs_contract": lc, "rhs_contract": rc}
	}
	switch {
	case dl >= 0 && dr >= 0:
		out := c.apply(attrs(append([]int{dl}, shiftAxes(lb, dl)...), append([]int{dr}, shiftAxes(rb, dr)...),
			shiftAxes(lc, dl), shiftAxes(rc, dr)), c.args[0], c.args[1])
		return out, []int{0}
	case dl >= 0:
		lb2, lc2 := shiftAxes(lb, dl), shiftAxes(lc, dl)
		// The result's lhs free dims come in increasing axis order.
		pos := len(lb)
		for i := 0; i < dl; i++ {
			if !slices.Contains(lb2, i) && !slices.Contains(lc2, i) {
				pos++
			}
		}
		return c.apply(attrs(lb2, rb, lc2, rc), c.args[0], c.args[1]), []int{pos}
	case len(lb)+len(lc) == c.args[0].Rank() || len(rb)+len(rc)+1 < c.args[1].Rank():
		// lhs has no free dims (its result part is empty), or rhs has
		// free dims besides the batch: the batch dim lands among rhs's.
		rb2, rc2 := shiftAxes(rb, dr), shiftAxes(rc, dr)
		lfree := c.args[0].Rank() - len(lb) - len(lc)
		pos := len(lb) + lfree
		for i := 0; i < dr; i++ {
			if !slices.Contains(rb2, i) && !slices.Contains(rc2, i) {
				pos++
			}
		}
		return c.apply(attrs(lb, rb2, lc, rc2), c.args[0], c.args[1]), []int{pos}
	default:
		// Only rhs is batched and the batch is its only free dim (a matrix
		// times a batch of vectors): with the operands swapped the batch
		// comes first among the free dims, before lhs's, so the result
		// needs no transpose to put it in front.
		out := c.apply(attrs(shiftAxes(rb, dr), lb, shiftAxes(rc, dr), lc), c.args[1], c.args[0])
		return out, []int{len(lb)}
	}
}

func init() {
	batchRules[ir.BroadcastInDim] = batchBroadcastInDim
	batchRules[ir.Reshape] = batchReshape
	batchRules[ir.Transpose] = batchTranspose
	batchRules[ir.Slice] = batchSlice
	batchRules[ir.Concatenate] = batchConcatenate
	batchRules[ir.Pad] = batchPad
	batchRules[ir.ReduceSum] = batchReduce
	batchRules[ir.ReduceMax] = batchReduce
	batchRules[ir.ReduceMin] = batchReduce
	batchRules[ir.ReduceProd] = batchReduce
	batchRules[ir.ArgMax] = batchArg
	batchRules[ir.ArgMin] = batchArg
	batchRules[ir.Sort] = batchSort
	batchRules[ir.DotGeneral] = batchDotGeneral
}
