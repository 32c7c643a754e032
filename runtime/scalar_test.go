package runtime_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestScalarIsWeak: rt.Scalar is weakly typed like trace.Scalar (a Python float
// in JAX), so it keeps an f32 or bf16 array's dtype, eagerly and jitted.
func TestScalarIsWeak(t *testing.T) {
	r := newRand(t)
	xs := randSlice(r, 7)
	x := rt.FromSlice(xs)
	s := rt.Scalar(0.5)
	require.True(t, s.IsWeak())
	require.Equal(t, 0, s.Rank())
	y := trace.Add(x, s)
	require.Equal(t, ir.Float32, y.DType())
	want := make([]float64, len(xs))
	for i, v := range xs {
		want[i] = float64(v) + 0.5
	}
	requireClose(t, want, y.Float32s(), 1e-7)
	f := rt.Jit(func(x, s *trace.Array) *trace.Array { return trace.Mul(x, s) })
	z := f(x, rt.Scalar(0.5))
	require.Equal(t, ir.Float32, z.DType())
	for i, v := range xs {
		want[i] = float64(v) * 0.5
	}
	requireClose(t, want, z.Float32s(), 1e-7)
	h := trace.Add(trace.Convert(x, ir.BFloat16), rt.Scalar(2))
	require.Equal(t, ir.BFloat16, h.DType())
	// With an f64 array the weak scalar is its exact float64 value.
	d := trace.Add(rt.FromSlice([]float64{1}), rt.Scalar(0.1))
	require.Equal(t, ir.Float64, d.DType())
	require.Equal(t, 1+0.1, d.Float64s()[0])
}

// TestFromScalarIsStrong: rt.FromScalar keeps its Go type's dtype and promotes.
func TestFromScalarIsStrong(t *testing.T) {
	x := rt.FromSlice([]float32{1, 2})
	s := rt.FromScalar(0.5) // float64: f64
	require.False(t, s.IsWeak())
	require.Equal(t, ir.Float64, s.DType())
	require.Equal(t, ir.Float64, trace.Add(x, s).DType())
	require.Equal(t, []float64{1.5, 2.5}, trace.Add(x, s).Float64s())
	i := rt.FromScalar(int32(7))
	require.Equal(t, ir.Int32, i.DType())
	require.Equal(t, int64(7), int64(i.Int32s()[0]))
	b := rt.FromScalar[int64](1 << 60) // exact, not through float64
	require.Equal(t, []int64{1 << 60}, b.Int64s())
	require.Equal(t, ir.Float32, rt.FromScalar(float32(0)).DType())
}
