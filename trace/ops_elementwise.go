package trace

import (
	"math"

	"github.com/ferryml/ferry/ir"
)

// checkKind panics unless x's dtype satisfies the dtype rule k.
func checkKind(op string, k ir.DTypeRule, x *Array) {
	if !k.OK(x.typ.DType) {
		hint := ""
		if k == ir.FloatDTypes && (x.typ.DType.IsInteger() || x.typ.DType == ir.Bool) {
			hint = " (Convert it to a float dtype first)"
		}
		panic(Errorf(op, "needs %v, got %v%s", k, x.typ, hint))
	}
}

// unary applies an elementwise unary op after checking its dtype rule (the
// op table's); the result is weak when x is.
func unary(op string, code ir.Code, x *Array) *Array {
	needArrays(op, x)
	checkKind(op, code.Info().DTypes, x)
	return markWeak(Apply1(code, nil, x), x.weak)
}

// DefaultFloat is the float dtype integer and bool arrays are promoted to by
// the ops that compute in floats only (Exp, Log, Sqrt, Tanh, Sin, Erf, Softmax,
// Mean, ...), as jax.numpy promotes them to its default float dtype:
// jnp.exp(int32) is float32.
const DefaultFloat = ir.Float32

// inexact returns x converted to DefaultFloat if it is an integer or bool
// array (jax.numpy's promote_args_inexact), else x. A weak x stays weak, as
// jnp.exp(2) is a weak float32.
func inexact(op string, x *Array) *Array {
	if x == nil || x.typ.DType.IsFloat() || !x.typ.DType.IsInteger() && x.typ.DType != ir.Bool {
		return x
	}
	return markWeak(convertTo(op, x, DefaultFloat), x.weak)
}

// transcendental is unary for the ops jax.numpy computes in floats only: an
// integer or bool x is promoted to DefaultFloat first.
func transcendental(op string, code ir.Code, x *Array) *Array {
	needArrays(op, x)
	return unary(op, code, inexact(op, x))
}

// Neg returns -x elementwise (wrapping for unsigned integers).
func Neg(x *Array) *Array { return unary("Neg", ir.Neg, x) }

// Abs returns |x| elementwise.
func Abs(x *Array) *Array { return unary("Abs", ir.Abs, x) }

// Sign returns -1, 0 or 1 by the sign of x (NaN stays NaN).
func Sign(x *Array) *Array { return unary("Sign", ir.Sign, x) }

// Exp returns e**x elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.exp promotes it.
func Exp(x *Array) *Array { return transcendental("Exp", ir.Exp, x) }

// Log returns the natural logarithm elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.log promotes it.
func Log(x *Array) *Array { return transcendental("Log", ir.Log, x) }

// Log1p returns log(1+x), accurate for small x. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.log1p promotes it.
func Log1p(x *Array) *Array { return transcendental("Log1p", ir.Log1p, x) }

// Expm1 returns e**x - 1, accurate for small x. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.expm1 promotes it.
func Expm1(x *Array) *Array { return transcendental("Expm1", ir.Expm1, x) }

// Sqrt returns the square root elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.sqrt promotes it.
func Sqrt(x *Array) *Array { return transcendental("Sqrt", ir.Sqrt, x) }

// Rsqrt returns 1/sqrt(x) elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.sqrt promotes it (lax.rsqrt refuses it).
func Rsqrt(x *Array) *Array { return transcendental("Rsqrt", ir.Rsqrt, x) }

// Tanh returns the hyperbolic tangent elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.tanh promotes it.
func Tanh(x *Array) *Array { return transcendental("Tanh", ir.Tanh, x) }

// Logistic returns 1/(1+e**-x) elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jax.scipy.special.expit promotes it.
func Logistic(x *Array) *Array { return transcendental("Logistic", ir.Logistic, x) }

// Sigmoid is Logistic.
func Sigmoid(x *Array) *Array { return transcendental("Sigmoid", ir.Logistic, x) }

// Sin returns the sine elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.sin promotes it.
func Sin(x *Array) *Array { return transcendental("Sin", ir.Sin, x) }

// Cos returns the cosine elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jnp.cos promotes it.
func Cos(x *Array) *Array { return transcendental("Cos", ir.Cos, x) }

// Erf returns the error function elementwise. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jax.scipy.special.erf promotes it.
func Erf(x *Array) *Array { return transcendental("Erf", ir.Erf, x) }

// roundOp rounds floats and returns integer arrays unchanged.
func roundOp(op string, code ir.Code, x *Array) *Array {
	needArrays(op, x)
	if x.typ.DType.IsInteger() {
		return x
	}
	return unary(op, code, x)
}

// Floor rounds toward -inf elementwise; integer arrays are returned unchanged.
func Floor(x *Array) *Array { return roundOp("Floor", ir.Floor, x) }

// Ceil rounds toward +inf elementwise; integer arrays are returned unchanged.
func Ceil(x *Array) *Array { return roundOp("Ceil", ir.Ceil, x) }

// Round rounds to the nearest integer, halves to even (like jnp.round);
// integer arrays are returned unchanged.
func Round(x *Array) *Array { return roundOp("Round", ir.Round, x) }

// Not returns the logical negation of a bool array, or the bitwise complement of
// an integer array.
func Not(x *Array) *Array { return unary("Not", ir.Not, x) }

// binary applies an elementwise binary op after dtype promotion and NumPy
// broadcasting, checking the op table's dtype rule.
func binary(op string, code ir.Code, x, y *Array) *Array {
	k := code.Info().DTypes
	if x != nil && y != nil && !x.weak && !y.weak && x.typ.DType == y.typ.DType && x.typ.Shape.Equal(y.typ.Shape) && k.OK(x.typ.DType) {
		// The common case: nothing to promote or broadcast.
		return Apply1(code, nil, x, y)
	}
	needArrays(op, x, y)
	shape := broadcastShape(op, x, y)
	args, dt, w := promote(op, x, y)
	if !k.OK(dt) {
		hint := ""
		if k == ir.FloatDTypes && (dt.IsInteger() || dt == ir.Bool) {
			hint = " (Convert them to a float dtype first)"
		}
		panic(Errorf(op, "needs %v, got %s%s", k, typeList([]*Array{x, y}), hint))
	}
	a, b := broadcastTo(args[0], shape), broadcastTo(args[1], shape)
	return markWeak(Apply1(code, nil, a, b), w)
}

// Add returns x + y elementwise, with NumPy broadcasting and JAX's dtype
// promotion (see ResultDType).
func Add(x, y *Array) *Array { return binary("Add", ir.Add, x, y) }

// Sub returns x - y elementwise (broadcasting and promoting as Add).
func Sub(x, y *Array) *Array { return binary("Sub", ir.Sub, x, y) }

// Mul returns x * y elementwise (broadcasting and promoting as Add).
func Mul(x, y *Array) *Array { return binary("Mul", ir.Mul, x, y) }

// Div returns x / y elementwise (broadcasting and promoting as Add). Integer
// division truncates toward zero, like lax.div; convert integers to a float
// dtype first for true division.
func Div(x, y *Array) *Array { return binary("Div", ir.Div, x, y) }

// Pow returns x**y elementwise for float operands (broadcasting and promoting as
// Add; Pow(intArray, Scalar(2)) computes in f32).
func Pow(x, y *Array) *Array { return binary("Pow", ir.Pow, x, y) }

// Maximum returns the elementwise maximum, propagating NaN (logical or for bool).
func Maximum(x, y *Array) *Array {
	if x != nil && y != nil && ResultDType(x, y) == ir.Bool {
		return binary("Maximum", ir.Or, x, y)
	}
	return binary("Maximum", ir.Max, x, y)
}

// Minimum returns the elementwise minimum, propagating NaN (logical and for bool).
func Minimum(x, y *Array) *Array {
	if x != nil && y != nil && ResultDType(x, y) == ir.Bool {
		return binary("Minimum", ir.And, x, y)
	}
	return binary("Minimum", ir.Min, x, y)
}

// Rem returns the remainder of x / y with the sign of x (C fmod, lax.rem).
func Rem(x, y *Array) *Array { return binary("Rem", ir.Rem, x, y) }

// And returns the logical (bool) or bitwise (integers) and of x and y.
func And(x, y *Array) *Array { return binary("And", ir.And, x, y) }

// Or returns the logical (bool) or bitwise (integers) or of x and y.
func Or(x, y *Array) *Array { return binary("Or", ir.Or, x, y) }

// Xor returns the logical (bool) or bitwise (integers) exclusive or of x and y.
func Xor(x, y *Array) *Array { return binary("Xor", ir.Xor, x, y) }

// ShiftLeft returns x << y for integer arrays.
func ShiftLeft(x, y *Array) *Array {
	return binary("ShiftLeft", ir.ShiftLeft, x, y)
}

// ShiftRightLogical returns x >> y for integer arrays, shifting in zeros.
func ShiftRightLogical(x, y *Array) *Array {
	return binary("ShiftRightLogical", ir.ShiftRightLogical, x, y)
}

// ShiftRightArithmetic returns x >> y for integer arrays, shifting in the sign bit.
func ShiftRightArithmetic(x, y *Array) *Array {
	return binary("ShiftRightArithmetic", ir.ShiftRightArithmetic, x, y)
}

// compare applies a comparison after promotion and broadcasting; the result is bool.
func compare(op string, code ir.Code, x, y *Array) *Array {
	return binary(op, code, x, y)
}

// Equal returns x == y elementwise as bool (broadcasting and promoting as Add).
func Equal(x, y *Array) *Array { return compare("Equal", ir.Eq, x, y) }

// NotEqual returns x != y elementwise as bool.
func NotEqual(x, y *Array) *Array { return compare("NotEqual", ir.Ne, x, y) }

// Less returns x < y elementwise as bool.
func Less(x, y *Array) *Array { return compare("Less", ir.Lt, x, y) }

// LessEqual returns x <= y elementwise as bool.
func LessEqual(x, y *Array) *Array { return compare("LessEqual", ir.Le, x, y) }

// Greater returns x > y elementwise as bool.
func Greater(x, y *Array) *Array { return compare("Greater", ir.Gt, x, y) }

// GreaterEqual returns x >= y elementwise as bool.
func GreaterEqual(x, y *Array) *Array { return compare("GreaterEqual", ir.Ge, x, y) }

// Where returns on[i] where pred[i] is true and off[i] elsewhere. pred must be
// bool; the three operands broadcast together and on and off are promoted to a
// common dtype.
func Where(pred, on, off *Array) *Array {
	needArrays("Where", pred, on, off)
	if pred.typ.DType != ir.Bool {
		panic(Errorf("Where", "predicate must be bool, got %v (compare it, e.g. NotEqual(p, Scalar(0)))", pred.typ))
	}
	shape := broadcastShape("Where", pred, on, off)
	args, _, w := promote("Where", on, off)
	p := broadcastTo(pred, shape)
	return markWeak(Apply1(ir.Select, nil, p, broadcastTo(args[0], shape), broadcastTo(args[1], shape)), w && len(shape) == 0)
}

// Clip limits x to [lo, hi] elementwise: Minimum(Maximum(x, lo), hi). A nil lo or
// hi leaves that side unbounded.
func Clip(x, lo, hi *Array) *Array {
	needArrays("Clip", x)
	if lo != nil {
		x = Maximum(x, lo)
	}
	if hi != nil {
		x = Minimum(x, hi)
	}
	return x
}

// Convert returns x converted to dtype dt: floats round to nearest even,
// float→integer truncates toward zero and saturates (NaN → 0), nonzero → true.
// Converting to x's own dtype returns x (made strong if it was weak). A weak
// concrete scalar converts from its exact value.
func Convert(x *Array, dt ir.DType) *Array {
	needArrays("Convert", x)
	checkDType("Convert", dt)
	if x.typ.DType == dt {
		if !x.weak {
			return x
		}
		return &Array{typ: x.typ, buf: x.buf, val: x.val, tr: x.tr}
	}
	return convertTo("Convert", x, dt)
}

// BitcastConvert reinterprets the bits of x as dtype dt of the same size (no bool).
func BitcastConvert(x *Array, dt ir.DType) *Array {
	needArrays("BitcastConvert", x)
	checkDType("BitcastConvert", dt)
	from := x.typ.DType
	if dt == ir.Bool || from == ir.Bool || dt.Size() != from.Size() {
		panic(Errorf("BitcastConvert", "cannot reinterpret %v as %v (element sizes must match, no bool)", x.typ, dt))
	}
	if dt == from {
		return x
	}
	return Apply1(ir.BitcastConvert, ir.Attrs{"dtype": dt}, x)
}

// scalarLike returns a strong scalar of x's dtype holding v.
func scalarLike(x *Array, v float64) *Array {
	return constArray(scalarLiteral(v, x.typ.DType))
}

// Square returns x*x elementwise.
func Square(x *Array) *Array {
	needArrays("Square", x)
	checkKind("Square", ir.NumericDTypes, x)
	return markWeak(Apply1(ir.Mul, nil, x, x), x.weak)
}

// Reciprocal returns 1/x elementwise for a float array.
func Reciprocal(x *Array) *Array {
	needArrays("Reciprocal", x)
	checkKind("Reciprocal", ir.FloatDTypes, x)
	return markWeak(Apply1(ir.Div, nil, FullLike(x, 1), x), x.weak)
}

// Relu returns max(x, 0) elementwise (NaN propagates). Its derivative is 1
// where x > 0 and 0 elsewhere, 0 at x = 0 included, as jax.nn.relu defines it
// (Maximum's derivative at a tie is 1/2 for each side).
//
// The forward pass is one max (one instruction of a fused chain); the
// backward pass is select(y > 0, g, 0) over the output y, which the
// gradient of a following matrix product keeps anyway, so Relu saves no
// array of its own and its gradient fuses as a compare joined to a select.
func Relu(x *Array) *Array {
	needArrays("Relu", x)
	checkKind("Relu", ir.NumericDTypes, x)
	if !adFloat(x.DType()) {
		return Maximum(x, scalarLike(x, 0))
	}
	return reluVJP(x)[0]
}

// reluVJP is Relu of a float array with its derivative, 0 at 0.
var reluVJP = CustomVJP(
	func(x []*Array) (outs, residuals []*Array) {
		y := markWeak(Maximum(x[0], scalarLike(x[0], 0)), x[0].weak && x[0].Rank() == 0)
		return []*Array{y}, []*Array{y}
	},
	func(res, cts []*Array) []*Array {
		y, g := res[0], cts[0]
		// y > 0 is false at 0 and for NaN: those get a zero cotangent.
		return []*Array{Where(Greater(y, scalarLike(y, 0)), g, ZerosLike(g))}
	})

// Gelu returns the Gaussian error linear unit elementwise (of DefaultFloat,
// f32, for an integer or bool x, as jax.nn.gelu promotes it): with approximate,
// the tanh form 0.5x(1+tanh(√(2/π)(x+0.044715x³))), computed as the equal
// x·logistic(2√(2/π)(x+0.044715x³)), otherwise the exact form 0.5x(1+erf(x/√2)).
// (jax.nn.gelu's approximate defaults to true.)
func Gelu(x *Array, approximate bool) *Array {
	needArrays("Gelu", x)
	x = inexact("Gelu", x)
	checkKind("Gelu", ir.FloatDTypes, x)
	if approximate {
		return geluTanhVJP(x)[0]
	}
	return geluErfVJP(x)[0]
}

// Gelu's gradient saves only its input: the backward pass recomputes the
// derivative elementwise (fused with the cotangent product) instead of keeping
// every intermediate of the forward formula alive, as XLA's fused kernels do.
var (
	geluTanhVJP = geluWithVJP(true)
	geluErfVJP  = geluWithVJP(false)
)

func geluWithVJP(approximate bool) func(args ...*Array) []*Array {
	return CustomVJP(func(args []*Array) (outs, residuals []*Array) {
		return []*Array{geluValue(args[0], approximate)}, []*Array{args[0]}
	}, func(residuals, cts []*Array) []*Array {
		return []*Array{Mul(cts[0], geluDerivative(residuals[0], approximate))}
	})
}

func geluValue(x *Array, approximate bool) *Array {
	half := scalarLike(x, 0.5)
	one := scalarLike(x, 1)
	if approximate {
		// 0.5·(1 + tanh(u)) = logistic(2u): the same function with one
		// cheaper transcendental and three fewer ops, and no cancellation in
		// 1 + tanh(u) for large negative x. 2u = x·(a + b·x²) with the
		// constants folded: four ops where the textbook form takes five.
		a := 2 * math.Sqrt(2/math.Pi)
		u2 := Mul(x, Add(scalarLike(x, a), Mul(scalarLike(x, a*0.044715), Mul(x, x))))
		return Mul(x, Logistic(u2))
	}
	inner := Erf(Mul(x, scalarLike(x, 1/math.Sqrt2)))
	return Mul(Mul(half, x), Add(one, inner))
}

// geluDerivative is d gelu/dx: for the tanh form
// 0.5(1+t) + 0.5x(1−t²)·c(1+3·0.044715x²) with t = tanh(c(x+0.044715x³)),
// c = √(2/π); for the erf form 0.5(1+erf(x/√2)) + x·exp(−x²/2)/√(2π).
func geluDerivative(x *Array, approximate bool) *Array {
	half := scalarLike(x, 0.5)
	one := scalarLike(x, 1)
	x2 := Mul(x, x)
	if approximate {
		c := scalarLike(x, math.Sqrt(2/math.Pi))
		k := scalarLike(x, 0.044715)
		t := Tanh(Mul(c, Add(x, Mul(k, Mul(x2, x)))))
		du := Mul(c, Add(one, Mul(scalarLike(x, 3*0.044715), x2)))
		return Add(Mul(half, Add(one, t)), Mul(Mul(Mul(half, x), Sub(one, Mul(t, t))), du))
	}
	cdf := Mul(half, Add(one, Erf(Mul(x, scalarLike(x, 1/math.Sqrt2)))))
	pdf := Mul(scalarLike(x, 1/math.Sqrt(2*math.Pi)), Exp(Mul(scalarLike(x, -0.5), x2)))
	return Add(cdf, Mul(x, pdf))
}

// Softplus returns log(1+e**x) elementwise, computed stably as
// max(x,0) + log1p(e**-|x|) (of DefaultFloat, f32, for an integer or bool x,
// as jax.nn.softplus promotes it).
func Softplus(x *Array) *Array {
	needArrays("Softplus", x)
	x = inexact("Softplus", x)
	checkKind("Softplus", ir.FloatDTypes, x)
	return Add(Maximum(x, scalarLike(x, 0)), Log1p(Exp(Neg(Abs(x)))))
}

// IsNaN reports elementwise whether x is NaN (always false for integers and bool).
func IsNaN(x *Array) *Array {
	needArrays("IsNaN", x)
	if !x.typ.DType.IsFloat() {
		return Full(x.typ.Shape, 0, ir.Bool)
	}
	return Apply1(ir.Ne, nil, x, x)
}

// IsFinite reports elementwise whether x is neither infinite nor NaN (always true
// for integers and bool).
func IsFinite(x *Array) *Array {
	needArrays("IsFinite", x)
	if !x.typ.DType.IsFloat() {
		return Full(x.typ.Shape, 1, ir.Bool)
	}
	return Less(Abs(x), scalarLike(x, math.Inf(1)))
}

// stableMax returns the maximum of x over axes, kept as size-1 dims, with
// non-finite maxima replaced by 0 (so that rows of -inf do not become NaN).
// The shift cancels out of the softmax, so its gradient is stopped, as
// jax.nn.softmax does: the backward pass does not differentiate the max.
func stableMax(x *Array, axes []int) *Array {
	m := reduceRaw(ir.ReduceMax, x, axes)
	m = keepDims(m, x.typ.Shape, axes)
	return StopGradient(Where(IsFinite(m), m, ZerosLike(m)))
}

// LogSoftmax returns x - log(sum(exp(x), axis)) along axis, computed stably by
// subtracting the maximum first. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jax.nn.log_softmax promotes it.
func LogSoftmax(x *Array, axis int) *Array {
	needArrays("LogSoftmax", x)
	x = inexact("LogSoftmax", x)
	checkKind("LogSoftmax", ir.FloatDTypes, x)
	axes := []int{normAxis("LogSoftmax", x, axis)}
	shifted := Sub(x, stableMax(x, axes))
	lse := keepDims(reduceRaw(ir.ReduceSum, Exp(shifted), axes), x.typ.Shape, axes)
	return Sub(shifted, Log(lse))
}

// Softmax returns exp(x) / sum(exp(x), axis) along axis, computed stably by
// subtracting the maximum first. An integer or bool x is promoted to
// DefaultFloat (f32) first, as jax.nn.softmax promotes it.
func Softmax(x *Array, axis int) *Array {
	needArrays("Softmax", x)
	x = inexact("Softmax", x)
	checkKind("Softmax", ir.FloatDTypes, x)
	axes := []int{normAxis("Softmax", x, axis)}
	e := Exp(Sub(x, stableMax(x, axes)))
	s := keepDims(reduceRaw(ir.ReduceSum, e, axes), x.typ.Shape, axes)
	return Div(e, s)
}
