package trace_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

var otFloatDTypes = []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Float16}

func otGeluExact(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

func otGeluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func otSign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return x
}

func TestOpsUnary(t *testing.T) {
	r := otRand(t)
	ints := []ir.DType{ir.Int32, ir.Int64}
	cases := []struct {
		name   string
		f      func(*trace.Array) *trace.Array
		ref    func(float64) float64
		gen    otGen
		dtypes []ir.DType
	}{
		{"Neg", trace.Neg, func(x float64) float64 { return -x }, otNormal, append(ints, otFloatDTypes...)},
		{"Abs", trace.Abs, math.Abs, otNormal, append(ints, otFloatDTypes...)},
		{"Sign", trace.Sign, otSign, otInts(-2, 2), append(ints, otFloatDTypes...)},
		{"Exp", trace.Exp, math.Exp, otUniform(-5, 5), otFloatDTypes},
		{"Log", trace.Log, math.Log, otUniform(0.05, 20), otFloatDTypes},
		{"Log1p", trace.Log1p, math.Log1p, otUniform(-0.9, 5), otFloatDTypes},
		{"Expm1", trace.Expm1, math.Expm1, otUniform(-3, 3), otFloatDTypes},
		{"Sqrt", trace.Sqrt, math.Sqrt, otUniform(0, 20), otFloatDTypes},
		{"Rsqrt", trace.Rsqrt, func(x float64) float64 { return 1 / math.Sqrt(x) }, otUniform(0.05, 20), otFloatDTypes},
		{"Tanh", trace.Tanh, math.Tanh, otUniform(-4, 4), otFloatDTypes},
		{"Logistic", trace.Logistic, func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }, otUniform(-8, 8), otFloatDTypes},
		{"Sigmoid", trace.Sigmoid, func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }, otUniform(-8, 8), otFloatDTypes},
		{"Sin", trace.Sin, math.Sin, otUniform(-6, 6), otFloatDTypes},
		{"Cos", trace.Cos, math.Cos, otUniform(-6, 6), otFloatDTypes},
		{"Erf", trace.Erf, math.Erf, otUniform(-3, 3), otFloatDTypes},
		{"Floor", trace.Floor, math.Floor, otUniform(-10, 10), append(otFloatDTypes, ir.Int32)},
		{"Ceil", trace.Ceil, math.Ceil, otUniform(-10, 10), append(otFloatDTypes, ir.Int32)},
		{"Round", trace.Round, math.RoundToEven, func(r *rand.Rand) float64 { return float64(r.IntN(21)-10) / 2 }, append(otFloatDTypes, ir.Int64)},
		{"Square", trace.Square, func(x float64) float64 { return x * x }, otUniform(-10, 10), append(ints, otFloatDTypes...)},
		{"Reciprocal", trace.Reciprocal, func(x float64) float64 { return 1 / x }, otNonZero(0.1, 10), otFloatDTypes},
		{"Relu", trace.Relu, func(x float64) float64 { return math.Max(x, 0) }, otNormal, append(ints, otFloatDTypes...)},
		{"Softplus", trace.Softplus, func(x float64) float64 { return math.Max(x, 0) + math.Log1p(math.Exp(-math.Abs(x))) }, otUniform(-30, 30), otFloatDTypes},
		{"GeluExact", func(x *trace.Array) *trace.Array { return trace.Gelu(x, false) }, otGeluExact, otUniform(-5, 5), otFloatDTypes},
		{"GeluTanh", func(x *trace.Array) *trace.Array { return trace.Gelu(x, true) }, otGeluTanh, otUniform(-5, 5), otFloatDTypes},
	}
	for _, c := range cases {
		for _, dt := range c.dtypes {
			for _, s := range otShapes {
				x, xr := otMake(r, dt, c.gen, s...)
				tol := otTol(dt)
				if dt == ir.Float32 && (c.name == "GeluTanh" || c.name == "GeluExact" || c.name == "Softplus") {
					tol = 1e-5 // composites round at every step
				}
				if dt.Size() == 2 && (strings.HasPrefix(c.name, "Gelu") || c.name == "Softplus") {
					tol *= 3
				}
				otCheck(t, otName(c.name, dt, ir.Shape(s)), c.f(x), dt, otMap1(xr, c.ref), tol)
			}
		}
	}
}

func TestOpsNot(t *testing.T) {
	r := otRand(t)
	x, xr := otMake(r, ir.Bool, otInts(0, 1), 3, 4)
	otCheck(t, "Not/bool", trace.Not(x), ir.Bool, otMap1(xr, func(v float64) float64 { return 1 - v }), 0)
	y, yr := otMake(r, ir.Int32, otInts(-1000, 1000), 7)
	otCheck(t, "Not/i32", trace.Not(y), ir.Int32, otMap1(yr, func(v float64) float64 { return float64(^int32(v)) }), 0)
	u, ur := otMake(r, ir.Uint8, otInts(0, 255), 2, 2)
	otCheck(t, "Not/u8", trace.Not(u), ir.Uint8, otMap1(ur, func(v float64) float64 { return float64(^uint8(v)) }), 0)
	otExpectError(t, "Not", func() { trace.Not(otFrom(ir.Float32, []float64{1}, 1)) }, "bool or an integer dtype", "f32[1]")
}

// otBinaryShapes are operand shape pairs that broadcast.
var otBinaryShapes = [][2][]int{
	{{}, {}}, {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{3, 1}, {1, 4}}, {{}, {2, 2}}, {{5}, {}},
	{{2, 1, 3}, {4, 1}}, {{0, 3}, {3}}, {{0}, {1}}, {{1}, {}}, {{2, 0}, {2, 1}},
}

func TestOpsBinaryArithmetic(t *testing.T) {
	r := otRand(t)
	cases := []struct {
		name   string
		f      func(x, y *trace.Array) *trace.Array
		ref    func(x, y float64, dt ir.DType) float64
		gx, gy otGen
		dtypes []ir.DType
	}{
		{"Add", trace.Add, func(x, y float64, _ ir.DType) float64 { return x + y }, otNormal, otNormal, nil},
		{"Sub", trace.Sub, func(x, y float64, _ ir.DType) float64 { return x - y }, otNormal, otNormal, nil},
		{"Mul", trace.Mul, func(x, y float64, _ ir.DType) float64 { return x * y }, otNormal, otNormal, nil},
		{"Div", trace.Div, func(x, y float64, dt ir.DType) float64 {
			if dt.IsInteger() {
				return math.Trunc(x / y)
			}
			return x / y
		}, otUniform(-50, 50), otNonZero(0.5, 7), nil},
		{"Rem", trace.Rem, func(x, y float64, _ ir.DType) float64 { return math.Mod(x, y) }, otUniform(-50, 50), otNonZero(1, 7), nil},
		{"Maximum", trace.Maximum, func(x, y float64, _ ir.DType) float64 { return math.Max(x, y) }, otNormal, otNormal, nil},
		{"Minimum", trace.Minimum, func(x, y float64, _ ir.DType) float64 { return math.Min(x, y) }, otNormal, otNormal, nil},
		{"Pow", trace.Pow, func(x, y float64, _ ir.DType) float64 { return math.Pow(x, y) }, otUniform(0.1, 3), otUniform(-2, 2), otFloatDTypes},
	}
	for _, c := range cases {
		dts := c.dtypes
		if dts == nil {
			dts = []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Int32, ir.Int64, ir.Uint8}
		}
		for _, dt := range dts {
			for _, sp := range otBinaryShapes {
				gx, gy := c.gx, c.gy
				if dt.IsInteger() {
					gx, gy = otInts(-20, 20), otInts(-20, 20)
					if dt.IsUnsigned() {
						gx, gy = otInts(0, 15), otInts(0, 15)
					}
					if c.name == "Div" || c.name == "Rem" {
						gy = func(r *rand.Rand) float64 { return float64(1 + r.IntN(7)) }
					}
				}
				x, xr := otMake(r, dt, gx, sp[0]...)
				y, yr := otMake(r, dt, gy, sp[1]...)
				want := otMap2(xr, yr, func(a, b float64) float64 {
					v := c.ref(a, b, dt)
					if dt.IsUnsigned() { // wrap like the hardware
						v = float64(uint8(int64(v)))
					}
					return v
				})
				otCheck(t, otName(c.name, dt, ir.Shape(sp[0]), ir.Shape(sp[1])), c.f(x, y), dt, want, otTol(dt))
			}
		}
	}
}

func TestOpsMaximumNaN(t *testing.T) {
	x := otFrom(ir.Float32, []float64{math.NaN(), 1, 2}, 3)
	y := otFrom(ir.Float32, []float64{0, math.NaN(), 1}, 3)
	otCheck(t, "Maximum", trace.Maximum(x, y), ir.Float32, otTensor{[]int{3}, []float64{math.NaN(), math.NaN(), 2}}, 0)
	otCheck(t, "Minimum", trace.Minimum(x, y), ir.Float32, otTensor{[]int{3}, []float64{math.NaN(), math.NaN(), 1}}, 0)
	b1 := otFrom(ir.Bool, []float64{0, 0, 1, 1}, 4)
	b2 := otFrom(ir.Bool, []float64{0, 1, 0, 1}, 4)
	otCheck(t, "Maximum/bool", trace.Maximum(b1, b2), ir.Bool, otTensor{[]int{4}, []float64{0, 1, 1, 1}}, 0)
	otCheck(t, "Minimum/bool", trace.Minimum(b1, b2), ir.Bool, otTensor{[]int{4}, []float64{0, 0, 0, 1}}, 0)
}

func TestOpsLogicalAndShifts(t *testing.T) {
	r := otRand(t)
	for _, sp := range otBinaryShapes {
		a, ar := otMake(r, ir.Bool, otInts(0, 1), sp[0]...)
		b, br := otMake(r, ir.Bool, otInts(0, 1), sp[1]...)
		name := func(op string) string { return otName(op, "bool", ir.Shape(sp[0]), ir.Shape(sp[1])) }
		otCheck(t, name("And"), trace.And(a, b), ir.Bool, otMap2(ar, br, func(x, y float64) float64 { return x * y }), 0)
		otCheck(t, name("Or"), trace.Or(a, b), ir.Bool, otMap2(ar, br, math.Max), 0)
		otCheck(t, name("Xor"), trace.Xor(a, b), ir.Bool, otMap2(ar, br, func(x, y float64) float64 { return math.Abs(x - y) }), 0)

		x, xr := otMake(r, ir.Int32, otInts(-5000, 5000), sp[0]...)
		y, yr := otMake(r, ir.Int32, otInts(-5000, 5000), sp[1]...)
		iname := func(op string) string { return otName(op, "i32", ir.Shape(sp[0]), ir.Shape(sp[1])) }
		otCheck(t, iname("And"), trace.And(x, y), ir.Int32, otMap2(xr, yr, func(p, q float64) float64 { return float64(int32(p) & int32(q)) }), 0)
		otCheck(t, iname("Or"), trace.Or(x, y), ir.Int32, otMap2(xr, yr, func(p, q float64) float64 { return float64(int32(p) | int32(q)) }), 0)
		otCheck(t, iname("Xor"), trace.Xor(x, y), ir.Int32, otMap2(xr, yr, func(p, q float64) float64 { return float64(int32(p) ^ int32(q)) }), 0)

		s, sr := otMake(r, ir.Int32, otInts(0, 12), sp[1]...)
		otCheck(t, iname("ShiftLeft"), trace.ShiftLeft(x, s), ir.Int32, otMap2(xr, sr, func(p, q float64) float64 { return float64(int32(p) << uint(q)) }), 0)
		otCheck(t, iname("ShiftRightArithmetic"), trace.ShiftRightArithmetic(x, s), ir.Int32, otMap2(xr, sr, func(p, q float64) float64 { return float64(int32(p) >> uint(q)) }), 0)
		otCheck(t, iname("ShiftRightLogical"), trace.ShiftRightLogical(x, s), ir.Int32, otMap2(xr, sr, func(p, q float64) float64 { return float64(int32(uint32(int32(p)) >> uint(q))) }), 0)
	}
	otExpectError(t, "And", func() { trace.And(otFrom(ir.Float32, []float64{1}, 1), otFrom(ir.Float32, []float64{1}, 1)) }, "bool or an integer dtype")
	otExpectError(t, "ShiftLeft", func() { trace.ShiftLeft(otFrom(ir.Bool, []float64{1}, 1), otFrom(ir.Bool, []float64{1}, 1)) }, "integer dtype")
}

func TestOpsCompare(t *testing.T) {
	r := otRand(t)
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	cases := []struct {
		name string
		f    func(x, y *trace.Array) *trace.Array
		ref  func(x, y float64) bool
	}{
		{"Equal", trace.Equal, func(x, y float64) bool { return x == y }},
		{"NotEqual", trace.NotEqual, func(x, y float64) bool { return x != y }},
		{"Less", trace.Less, func(x, y float64) bool { return x < y }},
		{"LessEqual", trace.LessEqual, func(x, y float64) bool { return x <= y }},
		{"Greater", trace.Greater, func(x, y float64) bool { return x > y }},
		{"GreaterEqual", trace.GreaterEqual, func(x, y float64) bool { return x >= y }},
	}
	for _, c := range cases {
		for _, dt := range []ir.DType{ir.Float32, ir.Int32, ir.BFloat16, ir.Float64} {
			for _, sp := range otBinaryShapes {
				x, xr := otMake(r, dt, otInts(-2, 2), sp[0]...)
				y, yr := otMake(r, dt, otInts(-2, 2), sp[1]...)
				want := otMap2(xr, yr, func(a, b float64) float64 { return b2f(c.ref(a, b)) })
				otCheck(t, otName(c.name, dt, ir.Shape(sp[0]), ir.Shape(sp[1])), c.f(x, y), ir.Bool, want, 0)
			}
		}
		// Mixed dtypes compare after promotion: i32 2 == f32 2.
		x := otFrom(ir.Int32, []float64{1, 2, 3}, 3)
		y := otFrom(ir.Float32, []float64{2.5, 2, 1}, 3)
		want := otTensor{[]int{3}, []float64{b2f(c.ref(1, 2.5)), b2f(c.ref(2, 2)), b2f(c.ref(3, 1))}}
		otCheck(t, c.name+"/mixed", c.f(x, y), ir.Bool, want, 0)
	}
}

func TestOpsWhereClip(t *testing.T) {
	r := otRand(t)
	triples := [][3][]int{
		{{2, 3}, {2, 3}, {2, 3}}, {{2, 3}, {}, {3}}, {{3, 1}, {1, 4}, {}}, {{}, {2}, {2}}, {{0, 2}, {2}, {1}}, {{}, {}, {}},
	}
	for _, sh := range triples {
		p, pr := otMake(r, ir.Bool, otInts(0, 1), sh[0]...)
		a, ar := otMake(r, ir.Float32, otNormal, sh[1]...)
		b, br := otMake(r, ir.Int32, otInts(-9, 9), sh[2]...)
		s, _ := otBcastShape(sh[0], sh[1], sh[2])
		want := otNew(s...)
		for i := range want.data {
			idx := otUnravel(i, s)
			if pr.bcastAt(idx) != 0 {
				want.data[i] = ar.bcastAt(idx)
			} else {
				want.data[i] = br.bcastAt(idx)
			}
		}
		otCheck(t, otName("Where", ir.Shape(sh[0]), ir.Shape(sh[1]), ir.Shape(sh[2])), trace.Where(p, a, b), ir.Float32, want, 0)
	}
	otExpectError(t, "Where", func() { trace.Where(otFrom(ir.Float32, []float64{1}, 1), trace.Scalar(1), trace.Scalar(2)) }, "predicate must be bool")
	otExpectError(t, "Where", func() {
		trace.Where(otFrom(ir.Bool, []float64{1, 0}, 2), otFrom(ir.Float32, []float64{1, 2, 3}, 3), trace.Scalar(0))
	}, "bool[2] and f32[3] and f32[] do not broadcast")

	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16, ir.Int32} {
		x, xr := otMake(r, dt, otUniform(-5, 5), 4, 5)
		lo, lor := otMake(r, dt, otUniform(-3, -1), 5)
		got := trace.Clip(x, lo, trace.ScalarInt(2))
		want := otMap2(xr, lor, func(v, l float64) float64 { return math.Min(math.Max(v, l), 2) })
		otCheck(t, otName("Clip", dt), got, dt, want, 0)
		otCheck(t, otName("Clip/nil", dt), trace.Clip(x, nil, trace.ScalarInt(1)), dt, otMap1(xr, func(v float64) float64 { return math.Min(v, 1) }), 0)
	}
}

func TestOpsIsNaNIsFinite(t *testing.T) {
	vals := []float64{0, math.NaN(), math.Inf(1), math.Inf(-1), -3.5, 1e30}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Float16} {
		x := otFrom(dt, vals, 2, 3)
		nan, fin := otNew(2, 3), otNew(2, 3)
		for i, v := range vals {
			v = otRound(v, dt)
			if math.IsNaN(v) {
				nan.data[i] = 1
			}
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				fin.data[i] = 1
			}
		}
		otCheck(t, otName("IsNaN", dt), trace.IsNaN(x), ir.Bool, nan, 0)
		otCheck(t, otName("IsFinite", dt), trace.IsFinite(x), ir.Bool, fin, 0)
	}
	i := otFrom(ir.Int32, []float64{1, 2}, 2)
	otCheck(t, "IsNaN/i32", trace.IsNaN(i), ir.Bool, otTensor{[]int{2}, []float64{0, 0}}, 0)
	otCheck(t, "IsFinite/i32", trace.IsFinite(i), ir.Bool, otTensor{[]int{2}, []float64{1, 1}}, 0)
}

func TestOpsConvert(t *testing.T) {
	r := otRand(t)
	special := []float64{0, -0.5, 2.5, 3.7, -3.7, 1e10, -1e10, math.NaN(), 255.9, 300}
	for _, from := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Int32, ir.Bool, ir.Uint8} {
		for _, to := range ir.AllDTypes {
			var x *trace.Array
			var xr otTensor
			if from.IsFloat() {
				x = otFrom(from, special, len(special))
				xr = otTensor{[]int{len(special)}, make([]float64, len(special))}
				for i, v := range special {
					xr.data[i] = otRound(v, from)
				}
			} else {
				x, xr = otMake(r, from, otInts(-300, 300), 3, 4)
			}
			got := trace.Convert(x, to)
			want := xr
			if from.IsInteger() && to.IsInteger() {
				want = otMap1(xr, func(v float64) float64 { return otWrap(int64(v), to) })
			}
			otCheck(t, otName("Convert", from, to), got, to, want, 0)
		}
	}
	// Float→integer truncates toward zero and saturates, NaN → 0.
	x := otFrom(ir.Float32, []float64{-3.7, 3.7, 1e10, -1e10, math.NaN()}, 5)
	otCheck(t, "Convert/saturate", trace.Convert(x, ir.Int32), ir.Int32, otTensor{[]int{5}, []float64{-3, 3, math.MaxInt32, math.MinInt32, 0}}, 0)
	// Same dtype is the identity.
	if trace.Convert(x, ir.Float32) != x {
		t.Errorf("Convert to the same dtype should return its operand")
	}
}

// otWrap converts an integer to integer dtype dt modulo its width, as
// integer-to-integer conversion does.
func otWrap(v int64, dt ir.DType) float64 {
	switch dt {
	case ir.Uint8:
		return float64(uint8(v))
	case ir.Uint32:
		return float64(uint32(v))
	case ir.Int32:
		return float64(int32(v))
	}
	return float64(v)
}

func TestOpsBitcastConvert(t *testing.T) {
	r := otRand(t)
	x, xr := otMake(r, ir.Float32, otNormal, 2, 3)
	want := otMap1(xr, func(v float64) float64 { return float64(int32(math.Float32bits(float32(v)))) })
	otCheck(t, "Bitcast/f32→i32", trace.BitcastConvert(x, ir.Int32), ir.Int32, want, 0)
	back := trace.BitcastConvert(trace.BitcastConvert(x, ir.Uint32), ir.Float32)
	otCheck(t, "Bitcast/roundtrip", back, ir.Float32, xr, 0)
	d, dr := otMake(r, ir.Float64, otNormal, 4)
	otCheck(t, "Bitcast/f64→i64", trace.BitcastConvert(d, ir.Int64), ir.Int64,
		otMap1(dr, func(v float64) float64 { return float64(int64(math.Float64bits(v))) }), 0)
	otExpectError(t, "BitcastConvert", func() { trace.BitcastConvert(x, ir.Float64) }, "cannot reinterpret f32[2,3] as f64")
}

func otSoftmaxRef(x otTensor, axis int, logOut bool) otTensor {
	out := otNew(x.shape...)
	for i := range x.data {
		idx := otUnravel(i, x.shape)
		m := math.Inf(-1)
		for k := 0; k < x.shape[axis]; k++ {
			idx[axis] = k
			m = math.Max(m, x.at(idx...))
		}
		if math.IsInf(m, 0) {
			m = 0
		}
		s := 0.0
		for k := 0; k < x.shape[axis]; k++ {
			idx[axis] = k
			s += math.Exp(x.at(idx...) - m)
		}
		v := x.data[i]
		if logOut {
			out.data[i] = v - m - math.Log(s)
		} else {
			out.data[i] = math.Exp(v-m) / s
		}
	}
	return out
}

func TestOpsSoftmax(t *testing.T) {
	r := otRand(t)
	shapes := [][]int{{5}, {3, 4}, {2, 3, 5}, {2, 1}, {0, 3}}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16} {
		for _, s := range shapes {
			for _, axis := range []int{-1, 0} {
				x, xr := otMake(r, dt, otUniform(-20, 20), s...)
				ax := (axis + len(s)) % len(s)
				tol := 3 * otTol(dt)
				if dt == ir.Float32 {
					tol = 2e-5 // log(sum) adds a few roundings; values up to 40 in magnitude
				}
				otCheck(t, otName("Softmax", dt, ir.Shape(s), axis), trace.Softmax(x, axis), dt, otSoftmaxRef(xr, ax, false), tol)
				otCheck(t, otName("LogSoftmax", dt, ir.Shape(s), axis), trace.LogSoftmax(x, axis), dt, otSoftmaxRef(xr, ax, true), tol)
			}
		}
	}
	// Large logits do not overflow and -inf entries get probability 0.
	x := otFrom(ir.Float32, []float64{1000, 1001, math.Inf(-1), 0, math.Inf(-1), math.Inf(-1)}, 2, 3)
	xr := otTensor{[]int{2, 3}, []float64{1000, 1001, math.Inf(-1), 0, math.Inf(-1), math.Inf(-1)}}
	otCheck(t, "Softmax/extreme", trace.Softmax(x, 1), ir.Float32, otSoftmaxRef(xr, 1, false), 1e-6)
	otCheck(t, "LogSoftmax/extreme", trace.LogSoftmax(x, 1), ir.Float32, otSoftmaxRef(xr, 1, true), 1e-6)
	otExpectError(t, "Softmax", func() { trace.Softmax(x, 2) }, "axis 2 out of range for f32[2,3]")
	// An integer array is promoted to f32 first, as jax.nn.softmax does.
	xi := otTensor{[]int{2, 3}, []float64{1, 2, 3, -4, 0, 4}}
	otCheck(t, "Softmax/i32", trace.Softmax(otFrom(ir.Int32, xi.data, 2, 3), 1), ir.Float32, otSoftmaxRef(xi, 1, false), 1e-6)
	otCheck(t, "LogSoftmax/i32", trace.LogSoftmax(otFrom(ir.Int32, xi.data, 2, 3), 1), ir.Float32, otSoftmaxRef(xi, 1, true), 1e-6)
}

func TestOpsElementwiseErrors(t *testing.T) {
	a := otFrom(ir.Float32, make([]float64, 6), 2, 3)
	b := otFrom(ir.Float32, make([]float64, 4), 4)
	i := otFrom(ir.Int32, make([]float64, 4), 4)
	err, line := otCatchLine(func() { trace.Add(a, b) })
	if err == nil {
		t.Fatal("Add of f32[2,3] and f32[4]: no error")
	}
	want := fmt.Sprintf("ops_elementwise_test.go:%d: Add: shapes f32[2,3] and f32[4] do not broadcast", line)
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want it to contain %q", err.Error(), want)
	}
	if err.Line != line || !strings.HasSuffix(err.File, "ops_elementwise_test.go") {
		t.Errorf("error at %s:%d, want ops_elementwise_test.go:%d", err.File, err.Line, line)
	}
	// Errors inside composites still point at the user's line.
	err, line = otCatchLine(func() { trace.Softmax(a, 5) })
	if err == nil || err.Line != line {
		t.Errorf("Softmax error %v, want line %d", err, line)
	}
	otExpectError(t, "Reciprocal", func() { trace.Reciprocal(i) }, "needs a float dtype, got i32[4]", "Convert")
	otExpectError(t, "Pow", func() { trace.Pow(i, i) }, "float dtype")
	otExpectError(t, "Add", func() { trace.Add(otFrom(ir.Bool, []float64{1}, 1), otFrom(ir.Bool, []float64{1}, 1)) }, "numeric dtype")
	otExpectError(t, "Mul", func() { trace.Mul(a, nil) }, "nil array")
	otExpectError(t, "Neg", func() { trace.Neg(nil) }, "nil array")
}

// TestOpsElementwiseTraced checks that the ops record into a tracer and that a
// jitted composite gives the eager result.
func TestOpsElementwiseTraced(t *testing.T) {
	f32 := func(dims ...int) ir.Type { return ir.TypeOf(ir.Float32, dims...) }
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Add(trace.Exp(a[0]), a[1])
	}, f32(2, 3), f32(3))
	codes := otCodes(ops)
	if codes[ir.Exp] != 1 || codes[ir.Add] != 1 || codes[ir.BroadcastInDim] != 1 {
		t.Errorf("Add(Exp(x), y) recorded %v", codes)
	}
	if !out.IsTraced() || !out.Type().Equal(f32(2, 3)) {
		t.Errorf("result %v, want a traced f32[2,3]", out)
	}
	for _, op := range ops {
		if !strings.Contains(op.Loc, "ops_elementwise_test.go:") {
			t.Errorf("op %v has location %q, want this test file", op.Code, op.Loc)
		}
	}

	ops, out = otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Mul(a[0], trace.Scalar(2)) // weak: stays bf16, a scalar constant
	}, ir.TypeOf(ir.BFloat16, 4))
	codes = otCodes(ops)
	if out.DType() != ir.BFloat16 || codes[ir.Convert] != 0 || codes[ir.Constant] != 1 {
		t.Errorf("Mul(bf16, Scalar(2)) recorded %v with result %v", codes, out.Type())
	}
	for _, op := range ops {
		if op.Code == ir.Constant && op.Attrs.Literal("value").Type.Rank() != 0 {
			t.Errorf("constant of type %v, want a scalar", op.Attrs.Literal("value").Type)
		}
	}

	ops, _ = otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Softmax(a[0], -1)
	}, f32(4, 8))
	codes = otCodes(ops)
	for _, c := range []ir.Code{ir.ReduceMax, ir.ReduceSum, ir.Exp, ir.Div, ir.Sub} {
		if codes[c] == 0 {
			t.Errorf("Softmax did not record %v: %v", c, codes)
		}
	}

	ops, out = otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Gelu(trace.Where(trace.Greater(a[0], a[1]), a[0], a[1]), true)
	}, f32(3, 1), f32(4))
	if codes := otCodes(ops); codes[ir.Select] != 1 || codes[ir.Logistic] != 1 || !out.Type().Equal(f32(3, 4)) {
		t.Errorf("Gelu(Where(...)) recorded %v with result %v", codes, out.Type())
	}
}

func TestOpsJitMatchesEager(t *testing.T) {
	r := otRand(t)
	x, _ := otMake(r, ir.Float32, otNormal, 3, 5)
	y, _ := otMake(r, ir.Float32, otNormal, 5)
	f := func(x, y *trace.Array) *trace.Array {
		h := trace.Add(trace.Mul(x, trace.Scalar(0.5)), y)
		h = trace.Where(trace.Greater(h, trace.Scalar(0)), h, trace.Mul(h, trace.Scalar(0.1)))
		return trace.Sum(trace.Softmax(trace.Gelu(h, false), -1), 0)
	}
	eager := f(x, y)
	jitted := rt.Jit(f)(x, y)
	otCheck(t, "jit", jitted, ir.Float32, otTensor{[]int{5}, eager.Float64s()}, 1e-6)
}
