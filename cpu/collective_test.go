package cpu

import (
	"context"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// psumProgram is a per-device program: the sum over the "x" group of
// exp(x), times x.
const psumProgram = `func @psum(%0: f32[64]) -> (f32[64]) {
  %1 = exp(%0) : f32[64]
  %2 = all_reduce(%1) {axis="x", reduction="sum", size=4} : f32[64] loc("step.go:2")
  %3 = mul(%2, %0) : f32[64]
  return %3
}`

// runOnDevices executes exe on devices 0..n-1 at once, device d with
// argument args[d] (placed with place(d)) and its communicator of "x".
func runOnDevices(t *testing.T, exe backend.Executable, args [][]float32, place func(d int) int) ([][]float32, []error) {
	n := len(args)
	world, err := collective.NewLocal(n)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	outs, errs := make([][]float32, n), make([]error, n)
	var wg sync.WaitGroup
	for d := range n {
		b, err := cpuBackend{}.FromLiteralOn(f32Literal(t, args[d]...), place(d))
		require.NoError(t, err)
		wg.Go(func() {
			res, err := exe.Execute([]trace.Buffer{b}, backend.ExecOptions{Device: d, Commit: true,
				Comms: map[string]collective.Communicator{"x": world[d]}, Context: ctx})
			if errs[d] = err; err != nil {
				return
			}
			l, err := res[0].Literal()
			if errs[d] = err; err == nil {
				outs[d] = append([]float32(nil), ir.View[float32](l)...)
			}
		})
	}
	wg.Wait()
	return outs, errs
}

// TestCollectivesOnDevices: a per-device program with a collective,
// compiled with CompileOptions.BoundAxes, runs on four CPU devices at once
// (one goroutine each, one Executable) and every device gets the sum over
// all of them; without BoundAxes it does not compile. A device whose
// execution fails before it runs (an argument on another device) aborts the
// communicators, so the others fail saying why instead of waiting.
func TestCollectivesOnDevices(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{Devices: 4})
	f, err := ir.Parse(psumProgram)
	require.NoError(t, err)
	_, err = cpuBackend{}.Compile(f, backend.CompileOptions{})
	require.ErrorContains(t, err, `unbound axis name "x"`)
	exe, err := cpuBackend{}.Compile(f, backend.CompileOptions{BoundAxes: []string{"x"}})
	require.NoError(t, err)

	rng := testseed.Rand(t, 12)
	args := make([][]float32, 4)
	for d := range args {
		for range 64 {
			args[d] = append(args[d], float32(rng.Float64()*2-1))
		}
	}
	for range 2 {
		outs, errs := runOnDevices(t, exe, args, func(d int) int { return d })
		for d := range args {
			require.NoError(t, errs[d], "device %d", d)
			for i := range 64 {
				var s float64
				for e := range args {
					s += math.Exp(float64(args[e][i]))
				}
				want := s * float64(args[d][i])
				require.InDelta(t, want, float64(outs[d][i]), 1e-5*(1+math.Abs(want)), "device %d element %d", d, i)
			}
		}
	}

	_, errs := runOnDevices(t, exe, args, func(d int) int { return d % 3 }) // device 3's argument is on cpu:0
	require.ErrorContains(t, errs[3], "is on cpu:0, but the call runs on cpu:3")
	for d := range 3 {
		require.ErrorIs(t, errs[d], collective.ErrAborted, "device %d", d)
		require.ErrorContains(t, errs[d], "is on cpu:0, but the call runs on cpu:3", "device %d", d)
	}
}
