package runtime_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The programs of REFERENCES.md §1, as examples/offload builds them.
var (
	offloadPolicy = trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost)

	activationOffloadLayer = trace.Remat(func(x *trace.Array, w layerWeights) *trace.Array {
		x = trace.CheckpointName(x, "x")
		return trace.MatMul(trace.MatMul(x, w.W1), w.W2)
	}, offloadPolicy)

	paramOffloadLayer = trace.Remat(func(x *trace.Array, w layerWeights) *trace.Array {
		w = layerWeights{W1: trace.DevicePut(w.W1, ir.Device), W2: trace.DevicePut(w.W2, ir.Device)}
		x = trace.CheckpointName(x, "x")
		return trace.MatMul(trace.MatMul(x, w.W1), w.W2)
	}, offloadPolicy)
)

func scanGradOf(layer func(*trace.Array, layerWeights) *trace.Array) func(layerWeights, *trace.Array) layerWeights {
	return func(w layerWeights, x *trace.Array) layerWeights {
		return trace.Grad(func(w layerWeights) *trace.Array {
			final, _ := trace.ScanTree(func(x *trace.Array, w layerWeights) (*trace.Array, struct{}) {
				return layer(x, w), struct{}{}
			}, x, w)
			return trace.Sum(final)
		})(w)
	}
}

type offloadCase struct {
	name       string
	fn         func(layerWeights, *trace.Array) layerWeights
	hostParams bool
	// Goals: exact argument, host argument and output bytes; temp and total
	// no larger than XLA's.
	arg, hostArg, out, temp, total float64 // MiB
}

var offloadCases = []offloadCase{
	{name: "baseline", fn: scanGrad, arg: 20.25, out: 20, temp: 17.25, total: 57.50},
	{name: "activation_offload", fn: scanGradOf(activationOffloadLayer), arg: 20.25, out: 20, temp: 6.50, total: 46.75},
	{name: "activation_param_offload", fn: scanGradOf(paramOffloadLayer), hostParams: true, arg: 0.25, hostArg: 20, out: 20, temp: 4.75, total: 25.00},
}

type offloadData struct{ x, w1, w2 []float32 }

func (d offloadData) args(host bool) (layerWeights, *trace.Array) {
	x := rt.FromSlice(d.x, 256, 256)
	w := layerWeights{W1: rt.FromSlice(d.w1, 10, 256, 1024), W2: rt.FromSlice(d.w2, 10, 1024, 256)}
	if host {
		h := layerWeights{W1: trace.DevicePut(w.W1, ir.PinnedHost), W2: trace.DevicePut(w.W2, ir.PinnedHost)}
		_ = w.W1.Delete()
		_ = w.W2.Delete()
		w = h
	}
	return w, x
}

func compileCase(t *testing.T, c offloadCase, d offloadData) *rt.Compiled {
	t.Helper()
	w, x := d.args(c.hostParams)
	low, err := rt.NewJitted(c.fn, rt.WithName(c.name)).Lower(w, x)
	require.NoError(t, err)
	comp, err := low.Compile()
	require.NoError(t, err)
	return comp
}

// The goals of remat and host offload: the memory analysis of the
// three programs, their measured device peak, their gradients against the
// baseline's, and out-of-memory at the offloaded programs' totals for the
// baseline only.
func TestOffloadGoals(t *testing.T) {
	if testing.Short() {
		t.Skip("full-size model")
	}
	const mib = 1 << 20
	r := newRand(t)
	d := offloadData{x: randSlice(r, 256*256), w1: randSlice(r, 10*256*1024), w2: randSlice(r, 10*1024*256)}
	for i := range d.w1 {
		d.w1[i] /= 16 // keep the activations of 10 layers in a sensible range
		d.w2[i] /= 32
	}
	comps := map[string]*rt.Compiled{}
	var ref [2][]float32
	for _, c := range offloadCases {
		comp := compileCase(t, c, d)
		comps[c.name] = comp
		m := comp.MemoryAnalysis()
		t.Logf("%s: %v", c.name, m)
		require.Equal(t, int64(c.arg*mib), m.ArgumentBytes, c.name)
		require.Equal(t, int64(c.hostArg*mib), m.HostArgumentBytes, c.name)
		require.Equal(t, int64(c.out*mib), m.OutputBytes, c.name)
		require.Zero(t, m.HostOutputBytes, c.name)
		require.Zero(t, m.AliasBytes, c.name)
		require.LessOrEqual(t, m.TempBytes, int64(c.temp*mib), "%s: XLA's temp", c.name)
		require.LessOrEqual(t, m.TotalBytes(), int64(c.total*mib), "%s: XLA's total", c.name)
		if c.name != "baseline" {
			require.Positive(t, m.HostTempBytes, "%s: the stacked residuals are in pinned_host", c.name)
			require.Less(t, m.TempBytes, comps["baseline"].MemoryAnalysis().TempBytes, c.name)
		}

		w, x := d.args(c.hostParams)
		collectGarbage()
		rt.ResetPeakMemory()
		outs, err := comp.Call(w, x)
		require.NoError(t, err)
		peak := rt.MemoryStats(ir.Device).PeakBytesInUse
		require.LessOrEqual(t, peak, m.TotalBytes(), "%s: measured peak", c.name)
		g := outs[0].(layerWeights)
		require.Equal(t, ir.Device, g.W1.Space(), "gradients are on device")
		require.Equal(t, ir.Device, g.W2.Space())
		got := [2][]float32{g.W1.Float32s(), g.W2.Float32s()}
		if ref[0] == nil {
			ref = got
		} else {
			maxDiff := 0.0
			for k := range got {
				for i := range got[k] {
					maxDiff = math.Max(maxDiff, math.Abs(float64(got[k][i]-ref[k][i])))
				}
			}
			require.LessOrEqual(t, maxDiff, 1e-5, "%s: gradients against the baseline's", c.name)
		}
		for _, a := range []*trace.Array{g.W1, g.W2, w.W1, w.W2, x} {
			_ = a.Delete()
		}
	}

	// With FERRY_DEVICE_MEMORY at an offloaded program's total, that program
	// runs and the baseline fails with the out-of-memory error.
	for _, c := range offloadCases[1:] {
		total := comps[c.name].MemoryAnalysis().TotalBytes()
		t.Run(fmt.Sprintf("capacity=%s", c.name), func(t *testing.T) {
			t.Setenv("FERRY_DEVICE_MEMORY", fmt.Sprint(total))
			t.Setenv("FERRY_ALLOCATOR", "platform")
			cfg, err := rt.MemoryConfigFromEnv()
			require.NoError(t, err)
			rt.SetMemoryForTest(t, cfg)

			w, x := d.args(c.hostParams)
			outs, err := comps[c.name].Call(w, x)
			require.NoError(t, err, "the offloaded program fits")
			g := outs[0].(layerWeights)
			for _, a := range []*trace.Array{g.W1, g.W2, w.W1, w.W2, x} {
				_ = a.Delete()
			}

			w, x = d.args(false)
			_, err = comps["baseline"].Call(w, x)
			var oom *rt.OutOfMemoryError
			require.True(t, errors.As(err, &oom), "the baseline must not fit: error %v", err)
			require.Equal(t, ir.Device, oom.Space)
			for _, a := range []*trace.Array{w.W1, w.W2, x} {
				_ = a.Delete()
			}
		})
	}
}
