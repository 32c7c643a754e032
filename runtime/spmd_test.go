package runtime_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// withDevices gives the CPU backend n virtual devices for the test.
func withDevices(t *testing.T, n int) {
	t.Helper()
	before := len(rt.Devices())
	require.NoError(t, rt.SetCPUDeviceCount(n))
	t.Cleanup(func() { _ = rt.SetCPUDeviceCount(before) })
}

func mustSharding(t *testing.T, shape []int, names []string, spec ir.PartitionSpec) *ir.NamedSharding {
	t.Helper()
	m, err := ir.NewMesh(shape, names)
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(m, spec)
	require.NoError(t, err)
	return s
}

func randArray(rng *rand.Rand, shape ...int) (*trace.Array, []float64) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float64, n)
	f := make([]float32, n)
	for i := range v {
		f[i] = float32(rng.NormFloat64())
		v[i] = float64(f[i])
	}
	return trace.Const(f, shape...), v
}

// TestShardedJitElementwise runs an elementwise function on a sharded
// argument: no communication, each device computes its block.
func TestShardedJitElementwise(t *testing.T) {
	withDevices(t, 8)
	rng := testseed.Rand(t, 1)
	x, xv := randArray(rng, 16, 8)
	s := mustSharding(t, []int{2, 4}, []string{"x", "y"}, ir.P("x", "y"))
	xs, err := rt.DevicePut(x, s)
	require.NoError(t, err)
	f := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Tanh(trace.Mul(a, a)) })
	y := f(xs)
	require.True(t, y.Type().Sharding.EquivalentTo(s, 2), "result sharding %v", y.Type())
	got := y.Float64s()
	for i := range xv {
		require.InDelta(t, math.Tanh(xv[i]*xv[i]), got[i], 1e-6)
	}
	shards, err := rt.Shards(y)
	require.NoError(t, err)
	require.Len(t, shards, 8)
	require.Equal(t, ir.Shape{8, 2}, shards[0].Array.Shape())
}
