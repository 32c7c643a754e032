package trace_test

import (
	"math"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The float-only ops take integer and bool arrays as jax.numpy does: promoted
// to the default float dtype (f32) first, jnp.exp(int32) being float32. Each
// is checked against the float64 function of the exact integer values,
// eagerly and under rt.Jit, for every integer dtype and bool.
func TestOpsPromoteIntegersToFloat(t *testing.T) {
	r := otRand(t)
	gelu := func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }
	geluTanh := func(v float64) float64 {
		return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	}
	ops := []struct {
		name string
		fn   func(*trace.Array) *trace.Array
		ref  func(float64) float64
		lo   int // smallest input (the domain of Log, Sqrt, Rsqrt)
	}{
		{"Exp", trace.Exp, math.Exp, -9},
		{"Log", trace.Log, math.Log, 1},
		{"Log1p", trace.Log1p, math.Log1p, 0},
		{"Expm1", trace.Expm1, math.Expm1, -9},
		{"Sqrt", trace.Sqrt, math.Sqrt, 0},
		{"Rsqrt", trace.Rsqrt, func(v float64) float64 { return 1 / math.Sqrt(v) }, 1},
		{"Tanh", trace.Tanh, math.Tanh, -9},
		{"Logistic", trace.Logistic, func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }, -9},
		{"Sigmoid", trace.Sigmoid, func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }, -9},
		{"Sin", trace.Sin, math.Sin, -9},
		{"Cos", trace.Cos, math.Cos, -9},
		{"Erf", trace.Erf, math.Erf, -9},
		{"Softplus", trace.Softplus, func(v float64) float64 { return math.Log1p(math.Exp(v)) }, -9},
		{"Gelu", func(x *trace.Array) *trace.Array { return trace.Gelu(x, false) }, gelu, -9},
		{"GeluTanh", func(x *trace.Array) *trace.Array { return trace.Gelu(x, true) }, geluTanh, -9},
	}
	for _, dt := range []ir.DType{ir.Int32, ir.Int64, ir.Uint8, ir.Uint32, ir.Bool} {
		for _, op := range ops {
			lo, hi := op.lo, 9
			if dt == ir.Uint8 || dt == ir.Uint32 {
				lo = max(lo, 0)
			}
			if dt == ir.Bool {
				lo, hi = max(lo, 0), 1
			}
			x, xr := otMake(r, dt, otInts(lo, hi), 2, 5)
			want := otMap1(xr, op.ref)
			name := otName(op.name, dt)
			otCheck(t, name, op.fn(x), trace.DefaultFloat, want, 4*otTol(trace.DefaultFloat))
			jitted := rt.Jit(op.fn)(x)
			otCheck(t, name+"/jit", jitted, trace.DefaultFloat, want, 4*otTol(trace.DefaultFloat))
		}
	}
	// A weak integer scalar (a Python int in JAX) gives a weak f32: jnp.exp(2)
	// is a weak float32, so it takes the dtype of a bf16 array it meets.
	e := trace.Exp(trace.ScalarInt(2))
	if e.DType() != ir.Float32 || !e.IsWeak() || math.Abs(e.Item()-math.Exp(2)) > 1e-5 {
		t.Errorf("Exp(ScalarInt(2)) = %v (weak %v), want weak f32 %v", e, e.IsWeak(), math.Exp(2))
	}
	if got := trace.Add(otFrom(ir.BFloat16, []float64{1}, 1), e).DType(); got != ir.BFloat16 {
		t.Errorf("bf16 + Exp(ScalarInt(2)) is %v, want bf16", got)
	}
	// Float inputs keep their dtype; ops that are not float-only keep rejecting
	// integers.
	if got := trace.Exp(otFrom(ir.BFloat16, []float64{1}, 1)).DType(); got != ir.BFloat16 {
		t.Errorf("Exp(bf16) is %v, want bf16", got)
	}
	i := otFrom(ir.Int32, []float64{1, 2}, 2)
	otExpectError(t, "Pow", func() { trace.Pow(i, i) }, "float dtype")
	otExpectError(t, "Reciprocal", func() { trace.Reciprocal(i) }, "float dtype")
	// Integer inputs get no gradient, but a float path through a promoted
	// integer differentiates: d/dw Σ w·exp(k) at integer k is exp(k).
	k := rt.FromSlice([]int32{1, 2, 3})
	g := trace.Grad(func(w *trace.Array) *trace.Array {
		return trace.Sum(trace.Mul(w, trace.Exp(k)))
	})(rt.FromSlice([]float32{1, 1, 1}))
	otCheck(t, "Grad through Exp(i32)", g, ir.Float32, otTensor{[]int{3}, []float64{math.Exp(1), math.Exp(2), math.Exp(3)}}, 4*otTol(ir.Float32))
}
