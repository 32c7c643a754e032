package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// VJP rules of the shape ops.

// vjpBroadcastInDim sums the cotangent over the dimensions the broadcast added
// and over the size-1 operand dimensions it expanded.
func vjpBroadcastInDim(c *vjpCall) []*Array {
	x := c.args[0]
	in := x.typ.Shape
	shape, dims := c.op.Attrs.Ints("shape"), c.op.Attrs.Ints("dims")
	mapped := map[int]bool{}
	for _, d := range dims {
		mapped[d] = true
	}
	var sum []int
	for j := range shape {
		if !mapped[j] {
			sum = append(sum, j)
		}
	}
	for i, d := range dims {
		if in[i] == 1 && shape[d] != 1 {
			sum = append(sum, d)
		}
	}
	slices.Sort(sum)
	return []*Array{adReshape(adReduceSum(c.ct, sum), in)}
}

func vjpReshape(c *vjpCall) []*Array {
	return []*Array{adReshape(c.ct, c.args[0].typ.Shape)}
}

func vjpTranspose(c *vjpCall) []*Array {
	return []*Array{adTranspose(c.ct, adInversePerm(c.op.Attrs.Ints("perm")))}
}

// vjpSlice pads the cotangent back to the operand's shape, with interior
// padding for strides.
func vjpSlice(c *vjpCall) []*Array {
	in := c.args[0].typ.Shape
	out := c.ct.typ.Shape
	start, strides := c.op.Attrs.Ints("start"), c.op.Attrs.Ints("strides")
	lo, hi, interior := make([]int, len(in)), make([]int, len(in)), make([]int, len(in))
	for i := range in {
		lo[i] = start[i]
		interior[i] = strides[i] - 1
		core := 0
		if out[i] > 0 {
			core = out[i] + (out[i]-1)*interior[i]
		}
		hi[i] = in[i] - lo[i] - core
	}
	return []*Array{adPad(c.ct, lo, hi, interior)}
}

func adPad(x *Array, lo, hi, interior []int) *Array {
	zero := adScalar(0, x.DType())
	return Apply1(ir.Pad, ir.Attrs{"low": lo, "high": hi, "interior": interior}, x, zero)
}

func adSlice(x *Array, start, limit, strides []int) *Array {
	if slices.Equal(start, make([]int, len(start))) && slices.Equal(limit, []int(x.typ.Shape)) {
		unit := true
		for _, s := range strides {
			unit = unit && s == 1
		}
		if unit {
			return x
		}
	}
	return Apply1(ir.Slice, ir.Attrs{"start": start, "limit": limit, "strides": strides}, x)
}

// vjpDynamicSlice writes the cotangent into zeros at the same (clamped) start.
func vjpDynamicSlice(c *vjpCall) []*Array {
	x := c.args[0]
	z := adFull(x.DType(), x.typ.Shape, 0)
	args := append([]*Array{z, c.ct}, c.args[1:]...)
	out := make([]*Array, len(c.args))
	out[0] = Apply1(ir.DynamicUpdateSlice, nil, args...)
	return out
}

// vjpDynamicUpdateSlice: the operand gets the cotangent with the window zeroed,
// the update gets the window of the cotangent.
func vjpDynamicUpdateSlice(c *vjpCall) []*Array {
	u := c.args[1]
	starts := c.args[2:]
	out := make([]*Array, len(c.args))
	if c.act[0] {
		z := adFull(u.DType(), u.typ.Shape, 0)
		out[0] = Apply1(ir.DynamicUpdateSlice, nil, append([]*Array{c.ct, z}, starts...)...)
	}
	if c.act[1] {
		out[1] = Apply1(ir.DynamicSlice, ir.Attrs{"sizes": []int(u.typ.Shape.Clone())}, append([]*Array{c.ct}, starts...)...)
	}
	return out
}

func vjpConcatenate(c *vjpCall) []*Array {
	axis := c.op.Attrs.Int("axis")
	shape := c.ct.typ.Shape
	out := make([]*Array, len(c.args))
	off := 0
	for i, a := range c.args {
		n := a.typ.Shape[axis]
		if c.act[i] {
			start := make([]int, len(shape))
			limit := []int(shape.Clone())
			strides := make([]int, len(shape))
			for d := range strides {
				strides[d] = 1
			}
			start[axis], limit[axis] = off, off+n
			out[i] = adSlice(c.ct, start, limit, strides)
		}
		off += n
	}
	return out
}

// vjpPad slices the operand's elements out of the cotangent (after undoing
// negative low/high padding, which crops); the padding value gets the sum of
// the cotangent over the padded positions.
func vjpPad(c *vjpCall) []*Array {
	x := c.args[0]
	in := x.typ.Shape
	lo, hi, interior := c.op.Attrs.Ints("low"), c.op.Attrs.Ints("high"), c.op.Attrs.Ints("interior")
	r := len(in)
	g := c.ct
	unLo, unHi := make([]int, r), make([]int, r)
	neg := false
	for i := 0; i < r; i++ {
		if lo[i] < 0 {
			unLo[i], neg = -lo[i], true
		}
		if hi[i] < 0 {
			unHi[i], neg = -hi[i], true
		}
	}
	if neg {
		g = adPad(g, unLo, unHi, make([]int, r))
	}
	start, limit, strides := make([]int, r), make([]int, r), make([]int, r)
	for i := 0; i < r; i++ {
		start[i] = max(lo[i], 0)
		strides[i] = interior[i] + 1
		limit[i] = start[i]
		if in[i] > 0 {
			limit[i] = start[i] + (in[i]-1)*strides[i] + 1
		}
	}
	gx := adSlice(g, start, limit, strides)
	out := []*Array{gx, nil}
	if c.act[1] {
		all := make([]int, c.ct.Rank())
		for i := range all {
			all[i] = i
		}
		allX := make([]int, r)
		for i := range allX {
			allX[i] = i
		}
		out[1] = adSub(adReduceSum(c.ct, all), adReduceSum(gx, allX))
	}
	return out
}

// vjpGather scatter-adds the cotangent into zeros at the (clamped) indices.
func vjpGather(c *vjpCall) []*Array {
	x, idx := c.args[0], c.args[1]
	axis := c.op.Attrs.Int("axis")
	n := x.typ.Shape[axis]
	if n > 0 {
		idx = adClampIndices(idx, n)
	}
	z := adFull(x.DType(), x.typ.Shape, 0)
	return []*Array{Apply1(ir.ScatterAdd, ir.Attrs{"axis": axis}, z, idx, c.ct), nil}
}

// adClampIndices clamps integer indices into [0, n-1] as gather does.
func adClampIndices(idx *Array, n int) *Array {
	dt := idx.DType()
	lo := adFull(dt, idx.typ.Shape, 0)
	hi := adFull(dt, idx.typ.Shape, float64(n-1))
	return adBin(ir.Min, adBin(ir.Max, idx, lo), hi)
}

// vjpScatterAdd: the operand's cotangent passes through; the updates get the
// cotangent gathered at their indices, zero for dropped (out-of-range) ones.
func vjpScatterAdd(c *vjpCall) []*Array {
	x, idx, u := c.args[0], c.args[1], c.args[2]
	axis := c.op.Attrs.Int("axis")
	out := []*Array{c.ct, nil, nil}
	if c.act[2] {
		n := x.typ.Shape[axis]
		g := Apply1(ir.Gather, ir.Attrs{"axis": axis}, c.ct, idx)
		dt := idx.DType()
		in := adBin(ir.And,
			adBin(ir.Ge, idx, adFull(dt, idx.typ.Shape, 0)),
			adBin(ir.Lt, idx, adFull(dt, idx.typ.Shape, float64(n))))
		dims := make([]int, idx.Rank())
		for i := range dims {
			dims[i] = axis + i
		}
		mask := adBroadcast(in, u.typ.Shape, dims)
		out[2] = adSelect(mask, g, adFull(u.DType(), u.typ.Shape, 0))
	}
	return out
}
