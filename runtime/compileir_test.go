package runtime_test

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestCompileIR runs a function written as IR: one device, then sharded
// over a 2×4 mesh with a partial sum combined across devices, each against
// float64 arithmetic written here.
func TestCompileIR(t *testing.T) {
	withDevices(t, 8)
	rng := testseed.Rand(t, 3)
	f, err := ir.Parse(`func @f(%0: f32[8,4], %1: f32[4]) -> (f32[8,4], f32[4]) {
  %2 = broadcast_in_dim(%1) {dims=[1], shape=[8,4]} : f32[8,4]
  %3 = mul(%0, %2) : f32[8,4]
  %4 = tanh(%3) : f32[8,4]
  %5 = reduce_sum(%0) {axes=[0]} : f32[4]
  return %4, %5
}`)
	require.NoError(t, err)
	x, xv := randArray(rng, 8, 4)
	w, wv := randArray(rng, 4)
	var live []*trace.Array // deleted before withDevices puts the device count back
	t.Cleanup(func() {
		for _, a := range append(live, x, w) {
			a.Delete()
		}
	})
	check := func(t *testing.T, outs []any) {
		t.Helper()
		require.Len(t, outs, 2)
		live = append(live, outs[0].(*trace.Array), outs[1].(*trace.Array))
		got := outs[0].(*trace.Array).Float64s()
		sums := outs[1].(*trace.Array).Float64s()
		for i := range 8 {
			for j := range 4 {
				require.InDelta(t, math.Tanh(xv[4*i+j]*wv[j]), got[4*i+j], 1e-6)
			}
		}
		for j := range 4 {
			s := 0.0
			for i := range 8 {
				s += xv[4*i+j]
			}
			require.InDelta(t, s, sums[j], 1e-5)
		}
	}
	t.Run("one device", func(t *testing.T) {
		c, err := rt.CompileIR(f)
		require.NoError(t, err)
		outs, err := c.Call(x, w)
		require.NoError(t, err)
		check(t, outs)
	})
	t.Run("sharded", func(t *testing.T) {
		s := mustSharding(t, []int{2, 4}, []string{"x", "y"}, ir.P("x", "y"))
		g := ir.Clone(f)
		g.Body.Params[0].Type = g.Body.Params[0].Type.WithSharding(s)
		c, err := rt.CompileIR(g)
		require.NoError(t, err)
		require.Contains(t, c.OptimizedIR(), "all_reduce", "the sum over the split rows is partial on each device")
		xs, err := rt.DevicePut(x, s)
		require.NoError(t, err)
		live = append(live, xs)
		outs, err := c.Call(xs, w)
		require.NoError(t, err)
		require.NotNil(t, outs[0].(*trace.Array).Type().Sharding)
		check(t, outs)
		// An argument not laid out as its parameter is an error naming it.
		_, err = c.Call(x, w)
		require.ErrorContains(t, err, "argument leaf 0 is f32[8,4], compiled for f32[8,4]{sharding<")
	})
}

func TestCompileIRErrors(t *testing.T) {
	_, err := rt.CompileIR(nil)
	require.ErrorContains(t, err, "rt.CompileIR: verify: nil function")
	f := ir.NewFunc("g")
	p := f.Body.AddParam(ir.Type{DType: ir.Float32, Shape: ir.Shape{2}})
	f.Body.Results = []*ir.Value{p, nil}
	_, err = rt.CompileIR(f)
	require.ErrorContains(t, err, "rt.CompileIR: verify @g")
}

// ExampleCompileIR runs a function written as IR text, its parameter split
// over two devices.
func ExampleCompileIR() {
	if err := rt.SetCPUDeviceCount(2); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})
	f, err := ir.Parse(`func @scale(%0: f32[4]{sharding<mesh[x=2], [x]>}) -> (f32[4]) {
  %1 = add(%0, %0) : f32[4]
  return %1
}`)
	if err != nil {
		panic(err)
	}
	c, err := rt.CompileIR(f)
	if err != nil {
		panic(err)
	}
	x, err := rt.DevicePut(rt.FromSlice([]float32{1, 2, 3, 4}, 4), f.Body.Params[0].Type.Sharding)
	if err != nil {
		panic(err)
	}
	outs, err := c.Call(x)
	if err != nil {
		panic(err)
	}
	y := outs[0].(*trace.Array)
	fmt.Println(y.Type(), y.Float32s())
	shards, err := rt.Shards(y)
	if err != nil {
		panic(err)
	}
	for _, s := range shards {
		fmt.Println(s.Device, s.Array.Float32s())
	}
	// Output:
	// f32[4]{sharding<mesh[x=2], [x]>} [2 4 6 8]
	// cpu:0(cpu) [2 4]
	// cpu:1(cpu) [6 8]
}
