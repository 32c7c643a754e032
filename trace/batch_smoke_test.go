package trace_test

import (
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

func TestVmapSmoke(t *testing.T) {
	x := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	y := rt.FromSlice([]float32{10, 20, 30}, 3)
	f := trace.Vmap(func(a, b *trace.Array) *trace.Array { return trace.Add(trace.Exp(trace.Mul(a, trace.Scalar(0))), b) }, trace.InAxes(0, trace.NotMapped))
	got := f(x, y)
	require.Equal(t, []float32{11, 21, 31, 11, 21, 31}, got.Float32s())
	j := rt.Jit(f)
	require.Equal(t, []float32{11, 21, 31, 11, 21, 31}, j(x, y).Float32s())
	g := trace.Vmap(func(a *trace.Array) *trace.Array { return trace.Add(a, trace.AxisIndex("i")) }, trace.InAxes(1), trace.AxisName("i"))
	require.Equal(t, []float32{1, 4, 3, 6, 5, 8}, g(x).Float32s())
}
