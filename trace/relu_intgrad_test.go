package trace_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Relu's derivative is jax.nn.relu's: 1 where x > 0, else 0, 0 at x = 0
// included (its custom_jvp: select(x > 0, g, 0)); the values are max(x, 0)
// with NaN passing through.
func TestReluDerivativeAtZero(t *testing.T) {
	r := testseed.Rand(t, 1)
	xs := []float32{0, float32(math.Copysign(0, -1)), -1, 2.5, float32(math.Inf(1)), float32(math.Inf(-1))}
	for range 10 {
		v := float32(r.NormFloat64())
		if r.IntN(3) == 0 {
			v = 0
		}
		xs = append(xs, v)
	}
	want := func(x float32) (val, grad float32) {
		if x > 0 {
			return x, 1
		}
		return 0, 0
	}
	x := rt.FromSlice(xs, len(xs))
	g := trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Relu(x)) })(x).Float32s()
	y := trace.Relu(x).Float32s()
	_, tan := trace.JVP(func(p []*trace.Array) []*trace.Array { return []*trace.Array{trace.Relu(p[0])} },
		[]*trace.Array{x}, []*trace.Array{trace.OnesLike(x)})
	jv := tan[0].Float32s()
	jit := rt.Jit(trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Relu(x)) }))(x).Float32s()
	for i, xv := range xs {
		wv, wg := want(xv)
		require.Equal(t, wv, y[i], "relu(%g)", xv)
		require.Equal(t, wg, g[i], "relu'(%g) by Grad", xv)
		require.Equal(t, wg, jv[i], "relu'(%g) by JVP", xv)
		require.Equal(t, wg, jit[i], "relu'(%g) by Grad under Jit", xv)
	}
	nan := trace.Relu(rt.FromSlice([]float32{float32(math.NaN())}, 1)).Float32s()[0]
	require.True(t, math.IsNaN(float64(nan)), "relu(NaN) = %g", nan)
	require.Equal(t, []int32{0, 0, 3}, trace.Relu(rt.FromSlice([]int32{-2, 0, 3}, 3)).Int32s())
}

// The gradient with respect to an integer or bool parameter is refused,
// as jax.grad refuses it, naming the parameter and its type.
func TestGradOfIntegerParamRefused(t *testing.T) {
	catch := func(f func()) (msg string) {
		defer func() {
			if r := recover(); r != nil {
				e, ok := r.(*trace.Error)
				require.True(t, ok, "panicked with %T", r)
				msg = e.Error()
			}
		}()
		f()
		return ""
	}
	n := rt.FromSlice([]int32{1, 2, 3}, 3)
	msg := catch(func() {
		trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Convert(x, ir.Float32)) })(n)
	})
	require.Contains(t, msg, "grad requires float inputs, but the argument is i32[3]")
	require.Contains(t, msg, "relu_intgrad_test.go")

	type params struct{ W, Step *trace.Array }
	p := params{W: rt.FromSlice([]float32{1, 2}, 2), Step: rt.FromScalar(int32(4))}
	msg = catch(func() {
		trace.Grad(func(p params) *trace.Array { return trace.Sum(trace.Mul(p.W, p.W)) })(p)
	})
	require.Contains(t, msg, "the argument Step is i32[]")

	gn := trace.GradN(func(w, k *trace.Array) *trace.Array { return trace.Sum(trace.Mul(w, trace.Convert(k, ir.Float32))) }, 1).(func(w, k *trace.Array) *trace.Array)
	msg = catch(func() { gn(p.W, rt.FromSlice([]int32{3, 4}, 2)) })
	require.Contains(t, msg, "argument 1 is i32[2]")
	// With respect to the float argument only, it is fine.
	g0 := trace.GradN(func(w, k *trace.Array) *trace.Array { return trace.Sum(trace.Mul(w, trace.Convert(k, ir.Float32))) }, 0).(func(w, k *trace.Array) *trace.Array)
	require.Equal(t, []float32{3, 4}, g0(p.W, rt.FromSlice([]int32{3, 4}, 2)).Float32s())
}
