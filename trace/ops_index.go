package trace

import (
	"github.com/ferryml/ferry/ir"
)

// Index returns x[i]: the slice at index i of axis 0, with that axis removed.
// Negative i counts from the end.
func Index(x *Array, i int) *Array {
	needArrays("Index", x)
	if x.Rank() == 0 {
		panic(Errorf("Index", "cannot index a scalar %v", x.typ))
	}
	n := x.typ.Shape[0]
	if i < -n || i >= n {
		panic(Errorf("Index", "index %d out of range for axis 0 of %v", i, x.typ))
	}
	if i < 0 {
		i += n
	}
	st, lim := make([]int, x.Rank()), x.Shape()
	st[0], lim[0] = i, i+1
	s := Apply1(ir.Slice, ir.Attrs{"start": st, "limit": []int(lim), "strides": ones(x.Rank())}, x)
	return Apply1(ir.Reshape, ir.Attrs{"shape": []int(x.typ.Shape[1:].Clone())}, s)
}

// checkStarts checks the start indices of a dynamic slice: integer scalars, one
// per axis of x.
func checkStarts(op string, x *Array, starts []*Array) {
	if len(starts) != x.Rank() {
		panic(Errorf(op, "%d start indices for %v (rank %d)", len(starts), x.typ, x.Rank()))
	}
	for i, s := range starts {
		if s == nil {
			panic(Errorf(op, "start index %d is a nil array", i))
		}
		if s.Rank() != 0 || !s.typ.DType.IsInteger() {
			panic(Errorf(op, "start index %d must be an integer scalar, got %v (use ScalarAs(v, ir.Int32))", i, s.typ))
		}
	}
}

// DynamicSlice returns the block of x of the given sizes starting at the indices
// in starts (integer scalars, possibly traced), like lax.dynamic_slice. Starts
// are clamped so that the block lies inside x.
func DynamicSlice(x *Array, starts []*Array, sizes []int) *Array {
	needArrays("DynamicSlice", x)
	checkStarts("DynamicSlice", x, starts)
	if len(sizes) != x.Rank() {
		panic(Errorf("DynamicSlice", "%d sizes for %v (rank %d)", len(sizes), x.typ, x.Rank()))
	}
	for i, s := range sizes {
		if s < 0 || s > x.typ.Shape[i] {
			panic(Errorf("DynamicSlice", "size %d on axis %d out of range for %v", s, i, x.typ))
		}
	}
	args := append([]*Array{x}, starts...)
	return Apply1(ir.DynamicSlice, ir.Attrs{"sizes": append([]int{}, sizes...)}, args...)
}

// DynamicUpdateSlice returns x with the block at starts (integer scalars,
// possibly traced) replaced by update, like lax.dynamic_update_slice. Starts are
// clamped so that the block lies inside x. update must have x's rank and dtype (a
// weak scalar's dtype is converted).
func DynamicUpdateSlice(x, update *Array, starts []*Array) *Array {
	needArrays("DynamicUpdateSlice", x, update)
	checkStarts("DynamicUpdateSlice", x, starts)
	if update.Rank() != x.Rank() {
		panic(Errorf("DynamicUpdateSlice", "update %v must have the rank of %v", update.typ, x.typ))
	}
	for i, d := range update.typ.Shape {
		if d > x.typ.Shape[i] {
			panic(Errorf("DynamicUpdateSlice", "update %v is larger than %v on axis %d", update.typ, x.typ, i))
		}
	}
	update = sameDType("DynamicUpdateSlice", update, x)
	args := append([]*Array{x, update}, starts...)
	return Apply1(ir.DynamicUpdateSlice, nil, args...)
}

// sameDType returns u in x's dtype: converted if u is weak, else an error when
// the dtypes differ.
func sameDType(op string, u, x *Array) *Array {
	if u.typ.DType == x.typ.DType {
		return u
	}
	if !u.weak {
		panic(Errorf(op, "update %v must have the dtype of %v (Convert it)", u.typ, x.typ))
	}
	return convertTo(op, u, x.typ.DType)
}

// wrapIndices maps negative signed indices i to i+n, like NumPy.
func wrapIndices(idx *Array, n int) *Array {
	if !idx.typ.DType.IsSigned() {
		return idx
	}
	zero := Full(idx.typ.Shape, 0, idx.typ.DType)
	neg := Apply1(ir.Lt, nil, idx, zero)
	shifted := Apply1(ir.Add, nil, idx, Full(idx.typ.Shape, float64(n), idx.typ.DType))
	return Apply1(ir.Select, nil, neg, shifted, idx)
}

func checkIndices(op string, idx *Array) {
	if !idx.typ.DType.IsInteger() {
		panic(Errorf(op, "indices must be integers, got %v", idx.typ))
	}
}

// Take gathers slices of x along axis at indices (an integer array of any shape),
// like jnp.take: the result shape is x.shape[:axis] + indices.shape +
// x.shape[axis+1:]. Negative indices count from the end; out-of-range indices are
// clamped into range.
func Take(x, indices *Array, axis int) *Array {
	needArrays("Take", x, indices)
	if x.Rank() == 0 {
		panic(Errorf("Take", "cannot take from a scalar %v", x.typ))
	}
	a := normAxis("Take", x, axis)
	checkIndices("Take", indices)
	idx := wrapIndices(indices, x.typ.Shape[a])
	return Apply1(ir.Gather, ir.Attrs{"axis": a}, x, idx)
}

// ScatterAdd returns x with updates added at indices along axis, the transpose of
// Take (like x.at[..., indices, ...].add(updates) in JAX): updates broadcast to
// x.shape[:axis] + indices.shape + x.shape[axis+1:], repeated indices accumulate,
// negative indices count from the end and out-of-range ones are dropped. updates
// must have x's dtype (a weak scalar is converted).
func ScatterAdd(x, indices, updates *Array, axis int) *Array {
	needArrays("ScatterAdd", x, indices, updates)
	if x.Rank() == 0 {
		panic(Errorf("ScatterAdd", "cannot scatter into a scalar %v", x.typ))
	}
	a := normAxis("ScatterAdd", x, axis)
	checkIndices("ScatterAdd", indices)
	want := ir.GatherShape(x.typ.Shape, indices.typ.Shape, a)
	if updates.Rank() > len(want) {
		panic(Errorf("ScatterAdd", "updates %v do not broadcast to %v", updates.typ, want))
	}
	for i, d := range updates.typ.Shape {
		if t := want[len(want)-updates.Rank()+i]; d != 1 && d != t {
			panic(Errorf("ScatterAdd", "updates %v do not broadcast to %v", updates.typ, want))
		}
	}
	u := broadcastTo(sameDType("ScatterAdd", updates, x), want)
	idx := wrapIndices(indices, x.typ.Shape[a])
	return Apply1(ir.ScatterAdd, ir.Attrs{"axis": a}, x, idx, u)
}

// OneHot returns the one-hot encoding of integer indices as an array of shape
// indices.shape + [n] and dtype dt: 1 at position indices[...], 0 elsewhere (all
// zeros for an index outside [0, n)).
func OneHot(indices *Array, n int, dt ir.DType) *Array {
	needArrays("OneHot", indices)
	checkIndices("OneHot", indices)
	checkDType("OneHot", dt)
	if n < 0 {
		panic(Errorf("OneHot", "negative depth %d", n))
	}
	r := indices.Rank()
	shape := append(indices.Shape(), n)
	dims := make([]int, r)
	for i := range dims {
		dims[i] = i
	}
	b := Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape.Clone()), "dims": dims}, indices)
	io := Apply1(ir.Iota, ir.Attrs{"dtype": indices.typ.DType, "shape": []int(shape.Clone()), "dim": r})
	m := Apply1(ir.Eq, nil, b, io)
	if dt == ir.Bool {
		return m
	}
	return Apply1(ir.Convert, ir.Attrs{"dtype": dt}, m)
}
