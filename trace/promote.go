package trace

import (
	"math"
	"runtime"
	"strings"
	"sync"
	"weak"

	"github.com/ferryml/ferry/ir"
)

// PromoteDTypes returns the dtype two strongly typed operands of dtypes a and b
// are converted to before a binary op, following JAX's type promotion lattice
// (with 64-bit types enabled):
//
//   - equal dtypes stay as they are;
//   - bool yields to anything;
//   - among integers the wider wins (u8 < u32, u8 < i32 < i64), and a signed
//     integer with an unsigned one of equal or larger size gives the next signed
//     type that holds both (u32 with i32 → i64);
//   - any integer or bool with a float gives the float;
//   - among floats the wider wins, and f16 with bf16 gives f32.
func PromoteDTypes(a, b ir.DType) ir.DType {
	switch {
	case a == b:
		return a
	case a == ir.Bool:
		return b
	case b == ir.Bool:
		return a
	case a.IsFloat() && b.IsFloat():
		if a == ir.Float64 || b == ir.Float64 {
			return ir.Float64
		}
		if a == ir.Float32 || b == ir.Float32 {
			return ir.Float32
		}
		return ir.Float32 // f16 with bf16
	case a.IsFloat():
		return a
	case b.IsFloat():
		return b
	}
	// Both integers, different.
	if a.IsSigned() == b.IsSigned() {
		if a.Size() >= b.Size() {
			return a
		}
		return b
	}
	s, u := a, b
	if u.IsSigned() {
		s, u = u, s
	}
	if s.Size() > u.Size() {
		return s
	}
	return ir.Int64
}

// ResultDType returns the dtype an elementwise op on xs computes in, with JAX's
// rules for weakly typed scalars (see Scalar and ScalarInt): the strongly typed
// operands are promoted with PromoteDTypes and a weak scalar takes their dtype,
// except that a weak float with integer or bool operands gives f32 and a weak
// integer with bool operands gives i32. When every operand is weak, their dtypes
// are promoted among themselves.
func ResultDType(xs ...*Array) ir.DType {
	dt, _ := resultDType(xs)
	return dt
}

// resultDType returns the common dtype and whether the result is weak (every
// operand weak).
func resultDType(xs []*Array) (ir.DType, bool) {
	strong, weakDT := ir.InvalidDType, ir.InvalidDType
	for _, x := range xs {
		if x == nil {
			continue
		}
		if x.weak {
			if weakDT == ir.InvalidDType {
				weakDT = x.typ.DType
			} else {
				weakDT = PromoteDTypes(weakDT, x.typ.DType)
			}
			continue
		}
		if strong == ir.InvalidDType {
			strong = x.typ.DType
		} else {
			strong = PromoteDTypes(strong, x.typ.DType)
		}
	}
	switch {
	case strong == ir.InvalidDType:
		return weakDT, weakDT != ir.InvalidDType
	case weakDT == ir.InvalidDType || weakDT == ir.Bool || strong.IsFloat():
		return strong, false
	case weakDT.IsFloat(): // strong is an integer or bool
		return ir.Float32, false
	case strong == ir.Bool: // weak integer with bool
		return ir.Int32, false
	}
	return strong, false // weak integer with an integer
}

// promote converts xs to their common dtype (ResultDType). It returns the
// converted operands, the dtype, and whether the result of the op is weak.
func promote(op string, xs ...*Array) ([]*Array, ir.DType, bool) {
	needArrays(op, xs...)
	dt, weakRes := resultDType(xs)
	out := make([]*Array, len(xs))
	for i, x := range xs {
		out[i] = convertTo(op, x, dt)
	}
	return out, dt, weakRes
}

// convertTo converts x to dt for op. A concrete weak scalar is converted on the
// host (from its exact value when known); anything else through a convert op.
func convertTo(op string, x *Array, dt ir.DType) *Array {
	if x.typ.DType == dt {
		return x
	}
	if x.weak && x.tr == nil && x.buf != nil && x.typ.Rank() == 0 {
		v, ok := exactWeak(x)
		if !ok {
			v = x.mustLiteral(op).Float64At(0)
		}
		if dt.IsInteger() && x.typ.DType.IsInteger() {
			lo, hi := intRange(dt)
			if v < lo || v > hi {
				panic(Errorf(op, "weak integer scalar %v overflows %v", v, dt))
			}
		}
		return constArray(scalarLiteral(v, dt))
	}
	return Apply1(ir.Convert, ir.Attrs{"dtype": dt}, x)
}

func intRange(dt ir.DType) (float64, float64) {
	switch dt {
	case ir.Uint8:
		return 0, math.MaxUint8
	case ir.Uint32:
		return 0, math.MaxUint32
	case ir.Int32:
		return math.MinInt32, math.MaxInt32
	}
	return math.MinInt64, math.MaxInt64
}

// scalarLiteral returns a rank-0 literal of dtype dt holding v (converted as the
// convert op does).
func scalarLiteral(v float64, dt ir.DType) *ir.Literal {
	l := ir.NewLiteral(ir.Type{DType: dt, Shape: ir.Shape{}})
	l.SetFloat64At(0, v)
	return l
}

// constArray returns an array holding l: a constant op recorded into the
// current trace, or a concrete array when nothing is being traced.
func constArray(l *ir.Literal) *Array {
	if current() != nil {
		return Apply1(ir.Constant, ir.Attrs{"value": l})
	}
	return FromLiteral(l)
}

// weakExact remembers the float64 value weak scalars were made from, so that a
// weak f32 scalar such as Scalar(0.1) meets an f64 array as 0.1, not as the
// nearest float32. Entries go away with their arrays.
var weakExact sync.Map // weak.Pointer[Array] → float64

func rememberExact(a *Array, v float64) {
	wp := weak.Make(a)
	weakExact.Store(wp, v)
	runtime.AddCleanup(a, func(wp weak.Pointer[Array]) { weakExact.Delete(wp) }, wp)
}

func exactWeak(a *Array) (float64, bool) {
	v, ok := weakExact.Load(weak.Make(a))
	if !ok {
		return 0, false
	}
	return v.(float64), true
}

// markWeak sets the weak flag of a fresh op result.
func markWeak(a *Array, w bool) *Array {
	if w {
		a.weak = true
	}
	return a
}

// needArrays panics with a clear error when an operand is nil.
func needArrays(op string, xs ...*Array) {
	for i, x := range xs {
		if x == nil {
			if len(xs) == 1 {
				panic(Errorf(op, "nil array"))
			}
			panic(Errorf(op, "operand %d is a nil array", i))
		}
	}
}

// typeList formats the operands' types as "f32[2,3] and f32[4]".
func typeList(xs []*Array) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = x.typ.String()
	}
	return strings.Join(s, " and ")
}

// broadcastShape returns the NumPy broadcast of the operands' shapes, or panics
// with an error naming op and the operand types.
func broadcastShape(op string, xs ...*Array) ir.Shape {
	shapes := make([]ir.Shape, len(xs))
	for i, x := range xs {
		shapes[i] = x.typ.Shape
	}
	out, ok := broadcastShapes(shapes...)
	if !ok {
		panic(Errorf(op, "shapes %s do not broadcast", typeList(xs)))
	}
	return out
}

// broadcastShapes returns the NumPy broadcast of shapes, and false if they do
// not broadcast.
func broadcastShapes(shapes ...ir.Shape) (ir.Shape, bool) {
	r := 0
	for _, s := range shapes {
		r = max(r, len(s))
	}
	out := make(ir.Shape, r)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := r - len(s)
		for i, d := range s {
			o := &out[off+i]
			switch {
			case d == *o || d == 1:
			case *o == 1:
				*o = d
			default:
				return nil, false
			}
		}
	}
	return out, true
}

// broadcastTo broadcasts x to shape (already checked compatible, right-aligned).
func broadcastTo(x *Array, shape ir.Shape) *Array {
	if x.typ.Shape.Equal(shape) {
		return x
	}
	r := x.Rank()
	dims := make([]int, r)
	for i := range dims {
		dims[i] = len(shape) - r + i
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape.Clone()), "dims": dims}, x)
}
