package trace

import (
	"github.com/ferryml/ferry/ir"
)

// Scalar returns a weakly typed f32 scalar holding v, the counterpart of a Python
// float in JAX: in a binary op it takes the other operand's dtype (Add(x, Scalar(2))
// stays bf16 for a bf16 x, and meets an f64 x as the exact float64 v). It is always
// a concrete array; used inside a traced function it becomes a constant.
func Scalar(v float64) *Array {
	a := FromLiteral(scalarLiteral(v, ir.Float32))
	a.weak = true
	rememberExact(a, v)
	return a
}

// ScalarInt returns a weakly typed i32 scalar holding v, the counterpart of a
// Python int in JAX: it takes the dtype of the other operand of a binary op (an
// error if v does not fit an integer dtype it meets).
func ScalarInt(v int) *Array {
	if v < -1<<31 || v > 1<<31-1 {
		panic(Errorf("ScalarInt", "%d does not fit in i32", v))
	}
	a := FromLiteral(scalarLiteral(float64(v), ir.Int32))
	a.weak = true
	rememberExact(a, float64(v))
	return a
}

// ScalarAs returns a strongly typed scalar of dtype dt holding v (converted as
// the convert op does: rounded for floats, truncated and saturated for
// integers, nonzero is true for bool), like jnp.asarray(v, dtype=dt):
// trace.ScalarAs(0.5, ir.BFloat16), trace.ScalarAs(3, ir.Int32). It is a
// concrete array. Use Scalar for a weakly typed scalar that takes the dtype
// of the array it meets, and rt.FromScalar for a scalar of a Go value's
// dtype.
func ScalarAs(v float64, dt ir.DType) *Array {
	checkDType("ScalarAs", dt)
	return FromLiteral(scalarLiteral(v, dt))
}

// ScalarOf is ScalarAs.
//
// Deprecated: use ScalarAs (the dtype as a value) or rt.FromScalar (the
// dtype of a Go value's type).
func ScalarOf(v float64, dt ir.DType) *Array {
	checkDType("ScalarOf", dt)
	return FromLiteral(scalarLiteral(v, dt))
}

// Const returns a concrete array holding a copy of data with the given shape; with
// no shape, a 1-D array of len(data) elements. Use it for small constants: inside
// a traced function a non-scalar Const is captured as an argument of the function.
func Const[T ir.Native](data []T, shape ...int) *Array {
	if shape == nil {
		shape = []int{len(data)}
	}
	l, err := ir.LiteralOf(ir.Shape(shape), data)
	if err != nil {
		panic(Errorf("Const", "%v", err))
	}
	return FromLiteral(l)
}

func checkDType(op string, dt ir.DType) {
	if !dt.Valid() {
		panic(Errorf(op, "invalid dtype %v", dt))
	}
}

// checkShape panics with *Error if no array of shape and dtype dt can
// exist: a negative dimension, or more elements or bytes than an int holds.
func checkShape(op string, shape ir.Shape, dt ir.DType) {
	if err := ir.CheckShape(shape, dt); err != nil {
		panic(Errorf(op, "%v", err))
	}
}

// Full returns an array of the given shape and dtype with every element v. It is
// a scalar constant broadcast to the shape, so no large constant is ever built:
// inside a traced function both are recorded ops.
func Full(shape ir.Shape, v float64, dt ir.DType) *Array {
	checkDType("Full", dt)
	checkShape("Full", shape, dt)
	c := Apply1(ir.Constant, ir.Attrs{"value": scalarLiteral(v, dt)})
	if len(shape) == 0 {
		return c
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape.Clone()), "dims": []int{}}, c)
}

// Zeros returns an array of zeros (false for bool); see Full.
func Zeros(shape ir.Shape, dt ir.DType) *Array { return Full(shape, 0, dt) }

// Ones returns an array of ones (true for bool); see Full.
func Ones(shape ir.Shape, dt ir.DType) *Array { return Full(shape, 1, dt) }

// FullLike returns an array of x's shape and dtype with every element v.
func FullLike(x *Array, v float64) *Array {
	needArrays("FullLike", x)
	return Full(x.typ.Shape, v, x.typ.DType)
}

// ZerosLike returns zeros of x's shape and dtype.
func ZerosLike(x *Array) *Array {
	needArrays("ZerosLike", x)
	return Full(x.typ.Shape, 0, x.typ.DType)
}

// OnesLike returns ones of x's shape and dtype.
func OnesLike(x *Array) *Array {
	needArrays("OnesLike", x)
	return Full(x.typ.Shape, 1, x.typ.DType)
}

// Iota returns an array of the given numeric dtype and shape whose elements are
// their index along dimension dim (negative counts from the end).
func Iota(dt ir.DType, shape ir.Shape, dim int) *Array {
	checkDType("Iota", dt)
	checkShape("Iota", shape, dt)
	if dt == ir.Bool {
		panic(Errorf("Iota", "dtype must be numeric, got bool"))
	}
	r := len(shape)
	if dim < -r || dim >= r {
		panic(Errorf("Iota", "dim %d out of range for shape %v (rank %d)", dim, shape, r))
	}
	if dim < 0 {
		dim += r
	}
	return Apply1(ir.Iota, ir.Attrs{"dtype": dt, "shape": []int(shape.Clone()), "dim": dim})
}

// Arange returns the 1-D array [0, 1, ..., n-1] of dtype dt.
func Arange(n int, dt ir.DType) *Array {
	if n < 0 {
		panic(Errorf("Arange", "negative length %d", n))
	}
	checkDType("Arange", dt)
	if dt == ir.Bool {
		panic(Errorf("Arange", "dtype must be numeric, got bool"))
	}
	return Apply1(ir.Iota, ir.Attrs{"dtype": dt, "shape": []int{n}, "dim": 0})
}

// Eye returns the n×n identity matrix of dtype dt (true on the diagonal for bool).
func Eye(n int, dt ir.DType) *Array {
	if n < 0 {
		panic(Errorf("Eye", "negative size %d", n))
	}
	checkDType("Eye", dt)
	s := []int{n, n}
	rows := Apply1(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": s, "dim": 0})
	cols := Apply1(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": s, "dim": 1})
	m := Apply1(ir.Eq, nil, rows, cols)
	if dt == ir.Bool {
		return m
	}
	return Apply1(ir.Convert, ir.Attrs{"dtype": dt}, m)
}
