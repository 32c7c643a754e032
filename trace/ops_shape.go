package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// normAxis returns axis of x in [0, rank), counting negative axes from the end,
// or panics naming op.
func normAxis(op string, x *Array, axis int) int {
	r := x.Rank()
	if axis < -r || axis >= r {
		panic(Errorf(op, "axis %d out of range for %v (rank %d)", axis, x.typ, r))
	}
	if axis < 0 {
		axis += r
	}
	return axis
}

// Reshape returns x with a new shape of the same size. One dimension may be -1:
// it is inferred from the others.
func Reshape(x *Array, shape ...int) *Array {
	needArrays("Reshape", x)
	s := make(ir.Shape, len(shape))
	infer, known := -1, 1
	for i, d := range shape {
		switch {
		case d == -1:
			if infer >= 0 {
				panic(Errorf("Reshape", "shape %v has more than one -1", ir.Shape(shape)))
			}
			infer = i
		case d < 0:
			panic(Errorf("Reshape", "shape %v has a negative dimension", ir.Shape(shape)))
		default:
			known *= d
		}
		s[i] = d
	}
	if infer >= 0 {
		s[infer] = 1 // the product of the others must not overflow
	}
	checkShape("Reshape", s, x.typ.DType)
	n := x.Size()
	if infer >= 0 {
		if known == 0 || n%known != 0 {
			panic(Errorf("Reshape", "cannot reshape %v (%d elements) to %v", x.typ, n, ir.Shape(shape)))
		}
		s[infer] = n / known
	} else if s.Size() != n {
		panic(Errorf("Reshape", "cannot reshape %v (%d elements) to %v (%d elements)", x.typ, n, s, s.Size()))
	}
	if s.Equal(x.typ.Shape) {
		return x
	}
	return markWeak(Apply1(ir.Reshape, ir.Attrs{"shape": []int(s)}, x), x.weak && len(s) == 0)
}

// Ravel returns x flattened to one dimension, row-major.
func Ravel(x *Array) *Array {
	needArrays("Ravel", x)
	return Reshape(x, x.Size())
}

// Transpose permutes the axes of x: result axis i is x's axis perm[i] (negative
// entries count from the end). With no perm the axes are reversed.
func Transpose(x *Array, perm ...int) *Array {
	needArrays("Transpose", x)
	r := x.Rank()
	p := make([]int, r)
	if len(perm) == 0 {
		for i := range p {
			p[i] = r - 1 - i
		}
	} else {
		if len(perm) != r {
			panic(Errorf("Transpose", "permutation %v has %d entries for %v (rank %d)", perm, len(perm), x.typ, r))
		}
		for i, a := range perm {
			if a < -r || a >= r {
				panic(Errorf("Transpose", "permutation %v: axis %d out of range for %v", perm, a, x.typ))
			}
			if a < 0 {
				a += r
			}
			p[i] = a
		}
		if !ir.IsPermutation(p, r) {
			panic(Errorf("Transpose", "%v is not a permutation of the %d axes of %v", perm, r, x.typ))
		}
	}
	identity := true
	for i, a := range p {
		identity = identity && a == i
	}
	if identity {
		return x
	}
	return Apply1(ir.Transpose, ir.Attrs{"perm": p}, x)
}

// ExpandDims inserts a size-1 axis at position axis of the result (in
// [-(rank+1), rank]; -1 appends).
func ExpandDims(x *Array, axis int) *Array {
	needArrays("ExpandDims", x)
	r := x.Rank()
	if axis < -(r+1) || axis > r {
		panic(Errorf("ExpandDims", "axis %d out of range for %v (valid: %d to %d)", axis, x.typ, -(r + 1), r))
	}
	if axis < 0 {
		axis += r + 1
	}
	s := slices.Insert(x.Shape(), axis, 1)
	return Apply1(ir.Reshape, ir.Attrs{"shape": []int(s)}, x)
}

// Squeeze removes size-1 axes: the given ones (an error if one is not of size 1),
// or every size-1 axis when none is given.
func Squeeze(x *Array, axes ...int) *Array {
	needArrays("Squeeze", x)
	var drop []int
	if len(axes) == 0 {
		for i, d := range x.typ.Shape {
			if d == 1 {
				drop = append(drop, i)
			}
		}
	} else {
		drop = reduceAxes("Squeeze", x, axes)
		for _, a := range drop {
			if x.typ.Shape[a] != 1 {
				panic(Errorf("Squeeze", "axis %d of %v has size %d, not 1", a, x.typ, x.typ.Shape[a]))
			}
		}
	}
	if len(drop) == 0 {
		return x
	}
	return Apply1(ir.Reshape, ir.Attrs{"shape": []int(ir.RemoveAxes(x.typ.Shape, drop))}, x)
}

// BroadcastTo broadcasts x to shape with NumPy's rules: shapes are aligned at
// their last axes, and each axis of x must be 1 or equal to the target's.
func BroadcastTo(x *Array, shape ...int) *Array {
	needArrays("BroadcastTo", x)
	s := ir.Shape(shape).Clone()
	checkShape("BroadcastTo", s, x.typ.DType)
	r := x.Rank()
	if r > len(s) {
		panic(Errorf("BroadcastTo", "cannot broadcast %v to the lower rank shape %v", x.typ, s))
	}
	for i, d := range x.typ.Shape {
		if t := s[len(s)-r+i]; d != 1 && d != t {
			panic(Errorf("BroadcastTo", "cannot broadcast %v to shape %v (axis %d: %d vs %d)", x.typ, s, i, d, t))
		}
	}
	return broadcastTo(x, s)
}

// BroadcastInDim broadcasts x to shape, with axis i of x becoming axis dims[i] of
// the result (dims increasing; x's axis must be 1 or the target's size), like
// lax.broadcast_in_dim.
func BroadcastInDim(x *Array, shape ir.Shape, dims []int) *Array {
	needArrays("BroadcastInDim", x)
	checkShape("BroadcastInDim", shape, x.typ.DType)
	if len(dims) != x.Rank() {
		panic(Errorf("BroadcastInDim", "%d dims for %v (rank %d)", len(dims), x.typ, x.Rank()))
	}
	prev := -1
	for i, d := range dims {
		if d < 0 || d >= len(shape) || d <= prev {
			panic(Errorf("BroadcastInDim", "dims %v must be increasing and within the rank %d of shape %v", dims, len(shape), shape))
		}
		prev = d
		if x.typ.Shape[i] != 1 && x.typ.Shape[i] != shape[d] {
			panic(Errorf("BroadcastInDim", "axis %d of %v (size %d) cannot broadcast to size %d", i, x.typ, x.typ.Shape[i], shape[d]))
		}
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape.Clone()), "dims": slices.Clone(dims)}, x)
}

// Slice returns the elements of x from start (inclusive) to limit (exclusive)
// with the given strides on every axis, like lax.slice. strides may be nil (all
// 1).
func Slice(x *Array, start, limit, strides []int) *Array {
	needArrays("Slice", x)
	r := x.Rank()
	if strides == nil {
		strides = make([]int, r)
		for i := range strides {
			strides[i] = 1
		}
	}
	if len(start) != r || len(limit) != r || len(strides) != r {
		panic(Errorf("Slice", "start %v, limit %v and strides %v need %d entries each for %v", start, limit, strides, r, x.typ))
	}
	for i, n := range x.typ.Shape {
		if strides[i] < 1 || start[i] < 0 || limit[i] > n || start[i] > limit[i] {
			panic(Errorf("Slice", "bad range [%d:%d:%d] on axis %d of %v", start[i], limit[i], strides[i], i, x.typ))
		}
	}
	return Apply1(ir.Slice, ir.Attrs{"start": slices.Clone(start), "limit": slices.Clone(limit), "strides": slices.Clone(strides)}, x)
}

// SliceAxis returns x[start:end] along axis with Python's rules: negative start
// and end count from the end, and both are clamped to the axis.
func SliceAxis(x *Array, axis, start, end int) *Array {
	needArrays("SliceAxis", x)
	a := normAxis("SliceAxis", x, axis)
	n := x.typ.Shape[a]
	clamp := func(i int) int {
		if i < 0 {
			i += n
		}
		return min(max(i, 0), n)
	}
	s, e := clamp(start), clamp(end)
	e = max(e, s)
	st, lim := make([]int, x.Rank()), x.Shape()
	st[a], lim[a] = s, e
	return Apply1(ir.Slice, ir.Attrs{"start": st, "limit": []int(lim), "strides": ones(x.Rank())}, x)
}

func ones(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// Concatenate joins xs along axis (negative counts from the end). The operands
// must have the same rank and equal sizes off the axis; their dtypes are promoted
// to a common one.
func Concatenate(axis int, xs ...*Array) *Array {
	if len(xs) == 0 {
		panic(Errorf("Concatenate", "no operands"))
	}
	needArrays("Concatenate", xs...)
	x0 := xs[0]
	if x0.Rank() == 0 {
		panic(Errorf("Concatenate", "cannot concatenate scalars (%v); use Stack", x0.typ))
	}
	a := normAxis("Concatenate", x0, axis)
	for i, x := range xs[1:] {
		ok := x.Rank() == x0.Rank()
		for d := 0; ok && d < x0.Rank(); d++ {
			ok = d == a || x.typ.Shape[d] == x0.typ.Shape[d]
		}
		if !ok {
			panic(Errorf("Concatenate", "operand %d is %v, which does not match %v off axis %d", i+1, x.typ, x0.typ, a))
		}
	}
	args, _, _ := promote("Concatenate", xs...)
	if len(args) == 1 {
		return args[0]
	}
	return Apply1(ir.Concatenate, ir.Attrs{"axis": a}, args...)
}

// Stack joins arrays of identical shape along a new axis (in [-(rank+1), rank]);
// dtypes are promoted to a common one.
func Stack(axis int, xs ...*Array) *Array {
	if len(xs) == 0 {
		panic(Errorf("Stack", "no operands"))
	}
	needArrays("Stack", xs...)
	for i, x := range xs[1:] {
		if !x.typ.Shape.Equal(xs[0].typ.Shape) {
			panic(Errorf("Stack", "operand %d is %v, but operand 0 is %v: shapes must be equal", i+1, x.typ, xs[0].typ))
		}
	}
	r := xs[0].Rank()
	if axis < -(r+1) || axis > r {
		panic(Errorf("Stack", "axis %d out of range for operands %v (valid: %d to %d)", axis, xs[0].typ, -(r + 1), r))
	}
	if axis < 0 {
		axis += r + 1
	}
	args, _, _ := promote("Stack", xs...)
	ex := make([]*Array, len(args))
	for i, x := range args {
		ex[i] = ExpandDims(x, axis)
	}
	if len(ex) == 1 {
		return ex[0]
	}
	return Apply1(ir.Concatenate, ir.Attrs{"axis": axis}, ex...)
}

// Split cuts x along axis into pieces of the given sizes, which must add up to
// the axis' size.
func Split(x *Array, axis int, sizes ...int) []*Array {
	needArrays("Split", x)
	a := normAxis("Split", x, axis)
	total := 0
	for _, s := range sizes {
		if s < 0 {
			panic(Errorf("Split", "negative size in %v", sizes))
		}
		total += s
	}
	if total != x.typ.Shape[a] {
		panic(Errorf("Split", "sizes %v add up to %d, but axis %d of %v has size %d", sizes, total, a, x.typ, x.typ.Shape[a]))
	}
	out := make([]*Array, len(sizes))
	off := 0
	for i, s := range sizes {
		st, lim := make([]int, x.Rank()), x.Shape()
		st[a], lim[a] = off, off+s
		out[i] = Apply1(ir.Slice, ir.Attrs{"start": st, "limit": []int(lim), "strides": ones(x.Rank())}, x)
		off += s
	}
	return out
}

// Pad pads x with the scalar padValue (converted to x's dtype): low[i] and high[i]
// elements before and after axis i (negative values crop), and interior[i]
// between neighbouring elements, like lax.pad. interior may be nil (no interior
// padding).
func Pad(x, padValue *Array, low, high, interior []int) *Array {
	needArrays("Pad", x, padValue)
	r := x.Rank()
	if interior == nil {
		interior = make([]int, r)
	}
	if padValue.Rank() != 0 {
		panic(Errorf("Pad", "padding value must be a scalar, got %v", padValue.typ))
	}
	if len(low) != r || len(high) != r || len(interior) != r {
		panic(Errorf("Pad", "low %v, high %v and interior %v need %d entries each for %v", low, high, interior, r, x.typ))
	}
	for i, n := range x.typ.Shape {
		if interior[i] < 0 {
			panic(Errorf("Pad", "negative interior padding %d on axis %d", interior[i], i))
		}
		core := n
		if n > 0 {
			core += (n - 1) * interior[i]
		}
		if low[i]+core+high[i] < 0 {
			panic(Errorf("Pad", "axis %d of %v would have negative size %d", i, x.typ, low[i]+core+high[i]))
		}
	}
	pv := convertTo("Pad", padValue, x.typ.DType)
	return Apply1(ir.Pad, ir.Attrs{"low": slices.Clone(low), "high": slices.Clone(high), "interior": slices.Clone(interior)}, x, pv)
}
