package runtime

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// NewArray copies data into a new concrete array of the given shape; with no
// shape, a 1-D array of len(data) elements. It returns an error if the shape does
// not hold len(data) elements. Use FromScalar (or the weakly typed Scalar) for
// rank-0 arrays.
func NewArray[T ir.Native](data []T, shape ...int) (*trace.Array, error) {
	if shape == nil {
		shape = []int{len(data)}
	}
	return newArray(data, ir.Shape(shape))
}

func newArray[T ir.Native](data []T, shape ir.Shape) (*trace.Array, error) {
	if err := ir.CheckShape(shape, ir.DTypeOf[T]()); err != nil {
		return nil, err
	}
	l, err := ir.LiteralOf(shape, data)
	if err != nil {
		return nil, err
	}
	b, err := DefaultBackend().FromLiteral(l)
	if err != nil {
		return nil, err
	}
	return trace.FromBuffer(b), nil
}

// FromSlice is NewArray that panics with a *trace.Error naming the caller's line
// on a bad shape: rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3).
func FromSlice[T ir.Native](data []T, shape ...int) *trace.Array {
	a, err := NewArray(data, shape...)
	if err != nil {
		panic(trace.Errorf("FromSlice", "%v", err))
	}
	return a
}

// Scalar returns a weakly typed scalar holding v, the same as trace.Scalar: like
// a Python float in JAX it takes the dtype of the array it meets, so
// trace.Add(x, rt.Scalar(0.5)) stays f32 for an f32 x (and bf16 for bf16). Use
// FromScalar for a scalar of a fixed dtype.
func Scalar(v float64) *trace.Array { return trace.Scalar(v) }

// FromScalar returns a strongly typed rank-0 concrete array holding v exactly,
// of v's Go type's dtype, as FromSlice does for slices (jnp.int32(0),
// np.float32(1)): rt.FromScalar(int32(0)) is an i32 step counter,
// rt.FromScalar(float32(1)) an f32 parameter. Like any f64 array,
// rt.FromScalar(0.5) promotes an f32 array it meets to f64: use Scalar for a
// constant that takes the dtype of the array it meets, and trace.ScalarAs
// for a scalar of a dtype given as a value.
func FromScalar[T ir.Native](v T) *trace.Array {
	a, err := newArray([]T{v}, ir.Shape{})
	if err != nil {
		panic(trace.Errorf("FromScalar", "%v", err))
	}
	return a
}

// ScalarOf is FromScalar.
//
// Deprecated: use FromScalar (the dtype of v's Go type), or trace.ScalarAs
// for a dtype given as a value.
func ScalarOf[T ir.Native](v T) *trace.Array { return FromScalar(v) }

// FromLiteral copies a host literal into a new concrete array.
func FromLiteral(l *ir.Literal) (*trace.Array, error) {
	if err := ir.CheckShape(l.Type.Shape, l.Type.DType); err != nil {
		return nil, err
	}
	b, err := DefaultBackend().FromLiteral(l)
	if err != nil {
		return nil, err
	}
	return trace.FromBuffer(b), nil
}
