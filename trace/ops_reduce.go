package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Reductions take the axes to reduce as trailing arguments: none means every axis
// (a scalar result), negative axes count from the end, and each axis may appear
// once. The reduced axes are removed from the shape; to keep them as size-1
// dimensions (NumPy's keepdims=True), pass the result through KeepDims:
//
//	s := KeepDims(Sum(x, -1), x.Shape(), -1) // x: [B,N] → s: [B,1]

// reduceAxes normalises the axes of a reduction (none → all), sorted.
func reduceAxes(op string, x *Array, axes []int) []int {
	r := x.Rank()
	if len(axes) == 0 {
		out := make([]int, r)
		for i := range out {
			out[i] = i
		}
		return out
	}
	out := make([]int, len(axes))
	seen := make([]bool, r)
	for i, a := range axes {
		n := normAxis(op, x, a)
		if seen[n] {
			panic(Errorf(op, "axis %d repeated in axes %v", a, axes))
		}
		seen[n] = true
		out[i] = n
	}
	slices.Sort(out)
	return out
}

// reduceRaw applies a reduce op over already normalised axes.
func reduceRaw(code ir.Code, x *Array, axes []int) *Array {
	if len(axes) == 0 {
		return x
	}
	return Apply1(code, ir.Attrs{"axes": slices.Clone(axes)}, x)
}

// keepDims reshapes y, the reduction of an array of shape over (normalised)
// axes, to shape with the reduced axes of size 1.
func keepDims(y *Array, shape ir.Shape, axes []int) *Array {
	s := shape.Clone()
	for _, a := range axes {
		s[a] = 1
	}
	if y.typ.Shape.Equal(s) {
		return y
	}
	return Apply1(ir.Reshape, ir.Attrs{"shape": []int(s)}, y)
}

// KeepDims reshapes y, the result of reducing an array of the given shape over
// axes (none = all, negative counts from the end), back to that array's rank with
// size-1 dimensions where the axes were, like NumPy's keepdims=True.
func KeepDims(y *Array, shape ir.Shape, axes ...int) *Array {
	needArrays("KeepDims", y)
	probe := &Array{typ: ir.Type{DType: y.typ.DType, Shape: shape}}
	ax := reduceAxes("KeepDims", probe, axes)
	if want := ir.RemoveAxes(shape, ax); !want.Equal(y.typ.Shape) {
		panic(Errorf("KeepDims", "%v is not the reduction of shape %v over axes %v (want shape %v)", y.typ, shape, axes, want))
	}
	return keepDims(y, shape, ax)
}

// checkNonEmpty panics when a max/min-like reduction meets an empty axis.
func checkNonEmpty(op string, x *Array, axes []int) {
	for _, a := range axes {
		if x.typ.Shape[a] == 0 {
			panic(Errorf(op, "axis %d of %v is empty: the reduction has no identity", a, x.typ))
		}
	}
}

// Sum returns the sum of x over axes (none = all). Bool arrays are counted in
// i32; other dtypes sum in their own dtype.
func Sum(x *Array, axes ...int) *Array {
	needArrays("Sum", x)
	ax := reduceAxes("Sum", x, axes)
	if x.typ.DType == ir.Bool {
		x = Apply1(ir.Convert, ir.Attrs{"dtype": ir.Int32}, x)
	}
	return markWeak(reduceRaw(ir.ReduceSum, x, ax), x.weak)
}

// Prod returns the product of x over axes (none = all); bool arrays multiply in
// i32.
func Prod(x *Array, axes ...int) *Array {
	needArrays("Prod", x)
	ax := reduceAxes("Prod", x, axes)
	if x.typ.DType == ir.Bool {
		x = Apply1(ir.Convert, ir.Attrs{"dtype": ir.Int32}, x)
	}
	return markWeak(reduceRaw(ir.ReduceProd, x, ax), x.weak)
}

// maxMin reduces with code; bool reduces as u8 and converts back.
func maxMin(op string, code ir.Code, x *Array, axes []int) *Array {
	needArrays(op, x)
	ax := reduceAxes(op, x, axes)
	checkNonEmpty(op, x, ax)
	if x.typ.DType == ir.Bool {
		u := reduceRaw(code, Apply1(ir.Convert, ir.Attrs{"dtype": ir.Uint8}, x), ax)
		return Apply1(ir.Convert, ir.Attrs{"dtype": ir.Bool}, u)
	}
	return markWeak(reduceRaw(code, x, ax), x.weak)
}

// Max returns the maximum of x over axes (none = all); NaN propagates. Reducing
// an empty axis is an error.
func Max(x *Array, axes ...int) *Array { return maxMin("Max", ir.ReduceMax, x, axes) }

// Min returns the minimum of x over axes (none = all); NaN propagates. Reducing
// an empty axis is an error.
func Min(x *Array, axes ...int) *Array { return maxMin("Min", ir.ReduceMin, x, axes) }

// toBool returns x != 0 as bool (x itself if bool).
func toBool(x *Array) *Array {
	if x.typ.DType == ir.Bool {
		return x
	}
	return Apply1(ir.Ne, nil, x, Full(x.typ.Shape, 0, x.typ.DType))
}

// Any reports whether any element of x over axes (none = all) is true (nonzero);
// false over an empty axis.
func Any(x *Array, axes ...int) *Array {
	needArrays("Any", x)
	ax := reduceAxes("Any", x, axes)
	u := Apply1(ir.Convert, ir.Attrs{"dtype": ir.Uint8}, toBool(x))
	return Apply1(ir.Convert, ir.Attrs{"dtype": ir.Bool}, reduceRaw(ir.ReduceMax, u, ax))
}

// All reports whether every element of x over axes (none = all) is true
// (nonzero); true over an empty axis.
func All(x *Array, axes ...int) *Array {
	needArrays("All", x)
	ax := reduceAxes("All", x, axes)
	u := Apply1(ir.Convert, ir.Attrs{"dtype": ir.Uint8}, toBool(x))
	return Apply1(ir.Convert, ir.Attrs{"dtype": ir.Bool}, reduceRaw(ir.ReduceMin, u, ax))
}

// count returns the number of elements of x the axes span.
func count(x *Array, axes []int) int {
	n := 1
	for _, a := range axes {
		n *= x.typ.Shape[a]
	}
	return n
}

// upcast returns x in f32 if it is f16 or bf16 (for accurate accumulation), and
// the dtype to convert results back to.
func upcast(x *Array) (*Array, ir.DType) {
	dt := x.typ.DType
	if dt == ir.Float16 || dt == ir.BFloat16 {
		return Apply1(ir.Convert, ir.Attrs{"dtype": ir.Float32}, x), dt
	}
	return x, dt
}

func downcast(x *Array, dt ir.DType) *Array {
	if x.typ.DType == dt {
		return x
	}
	return Apply1(ir.Convert, ir.Attrs{"dtype": dt}, x)
}

func mean(x *Array, ax []int) *Array {
	s := reduceRaw(ir.ReduceSum, x, ax)
	return Div(s, scalarLike(s, float64(count(x, ax))))
}

// Mean returns the arithmetic mean of an array over axes (none = all); f16
// and bf16 accumulate in f32. The mean over an empty axis is NaN. An integer or
// bool array is promoted to DefaultFloat (f32) first, as jnp.mean promotes it.
func Mean(x *Array, axes ...int) *Array {
	needArrays("Mean", x)
	x = inexact("Mean", x)
	checkKind("Mean", ir.FloatDTypes, x)
	ax := reduceAxes("Mean", x, axes)
	xf, dt := upcast(x)
	return markWeak(downcast(mean(xf, ax), dt), x.weak)
}

// Var returns the population variance (ddof 0, like jnp.var) of an array
// over axes (none = all); an integer or bool array is promoted to
// DefaultFloat (f32) first, as jnp.var promotes it.
func Var(x *Array, axes ...int) *Array {
	needArrays("Var", x)
	x = inexact("Var", x)
	checkKind("Var", ir.FloatDTypes, x)
	ax := reduceAxes("Var", x, axes)
	xf, dt := upcast(x)
	d := Sub(xf, keepDims(mean(xf, ax), xf.typ.Shape, ax))
	return downcast(mean(Mul(d, d), ax), dt)
}

// Std returns the population standard deviation, Sqrt(Var(x, axes...)) (f32
// for an integer or bool array).
func Std(x *Array, axes ...int) *Array {
	needArrays("Std", x)
	x = inexact("Std", x)
	checkKind("Std", ir.FloatDTypes, x)
	ax := reduceAxes("Std", x, axes)
	xf, dt := upcast(x)
	d := Sub(xf, keepDims(mean(xf, ax), xf.typ.Shape, ax))
	return downcast(Sqrt(mean(Mul(d, d), ax)), dt)
}

// LogSumExp returns log(sum(exp(x))) over axes (none = all), computed stably
// by factoring out the maximum; -inf over an empty axis. An integer or bool
// array is promoted to DefaultFloat (f32) first, as jax.nn.logsumexp
// promotes it.
func LogSumExp(x *Array, axes ...int) *Array {
	needArrays("LogSumExp", x)
	x = inexact("LogSumExp", x)
	checkKind("LogSumExp", ir.FloatDTypes, x)
	ax := reduceAxes("LogSumExp", x, axes)
	m := stableMax(x, ax)
	s := reduceRaw(ir.ReduceSum, Exp(Sub(x, m)), ax)
	mr := Apply1(ir.Reshape, ir.Attrs{"shape": []int(s.typ.Shape.Clone())}, m)
	return Add(Log(s), mr)
}

func argOp(op string, code ir.Code, x *Array, axis int) *Array {
	needArrays(op, x)
	if x.Rank() == 0 {
		panic(Errorf(op, "needs an array of rank ≥ 1, got %v", x.typ))
	}
	a := normAxis(op, x, axis)
	checkNonEmpty(op, x, []int{a})
	if x.typ.DType == ir.Bool {
		x = Apply1(ir.Convert, ir.Attrs{"dtype": ir.Uint8}, x)
	}
	return Apply1(code, ir.Attrs{"axis": a, "dtype": ir.Int32}, x)
}

// ArgMax returns the i32 index of the first maximum of x along axis (NaN counts
// as the maximum). An empty axis is an error.
func ArgMax(x *Array, axis int) *Array { return argOp("ArgMax", ir.ArgMax, x, axis) }

// ArgMin returns the i32 index of the first minimum of x along axis (NaN counts
// as the minimum). An empty axis is an error.
func ArgMin(x *Array, axis int) *Array { return argOp("ArgMin", ir.ArgMin, x, axis) }
