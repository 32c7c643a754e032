package runtime_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// refScanGrad is the gradient of sum(x_L), x_{l+1} = (x_l @ W1_l) @ W2_l, in
// float64: w1 is [L,d,h], w2 [L,h,d], x [d,d] (row-major).
func refScanGrad(x, w1, w2 []float32, L, d, h int) (g1, g2 []float64) {
	mm := func(a []float64, b []float32, boff, m, k, n int) []float64 {
		out := make([]float64, m*n)
		for i := 0; i < m; i++ {
			for p := 0; p < k; p++ {
				for j := 0; j < n; j++ {
					out[i*n+j] += a[i*k+p] * float64(b[boff+p*n+j])
				}
			}
		}
		return out
	}
	xs := make([][]float64, L+1)
	xs[0] = make([]float64, d*d)
	for i, v := range x {
		xs[0][i] = float64(v)
	}
	ys := make([][]float64, L)
	for l := 0; l < L; l++ {
		ys[l] = mm(xs[l], w1, l*d*h, d, d, h)
		xs[l+1] = mm(ys[l], w2, l*h*d, d, h, d)
	}
	g1, g2 = make([]float64, L*d*h), make([]float64, L*h*d)
	g := make([]float64, d*d)
	for i := range g {
		g[i] = 1
	}
	for l := L - 1; l >= 0; l-- {
		// dW2 = y^T g; gy = g W2^T; dW1 = x^T gy; g = gy W1^T.
		gy := make([]float64, d*h)
		for i := 0; i < d; i++ {
			for j := 0; j < h; j++ {
				var s float64
				for k := 0; k < d; k++ {
					s += g[i*d+k] * float64(w2[l*h*d+j*d+k])
				}
				gy[i*h+j] = s
			}
		}
		for j := 0; j < h; j++ {
			for k := 0; k < d; k++ {
				var s float64
				for i := 0; i < d; i++ {
					s += ys[l][i*h+j] * g[i*d+k]
				}
				g2[l*h*d+j*d+k] = s
			}
		}
		for p := 0; p < d; p++ {
			for j := 0; j < h; j++ {
				var s float64
				for i := 0; i < d; i++ {
					s += xs[l][i*d+p] * gy[i*h+j]
				}
				g1[l*d*h+p*h+j] = s
			}
		}
		ng := make([]float64, d*d)
		for i := 0; i < d; i++ {
			for p := 0; p < d; p++ {
				var s float64
				for j := 0; j < h; j++ {
					s += gy[i*h+j] * float64(w1[l*d*h+p*h+j])
				}
				ng[i*d+p] = s
			}
		}
		g = ng
	}
	return g1, g2
}

// The offloaded programs with asynchronous copies over a slow simulated host
// link, and with synchronous copies: the backward scans read the offloaded
// residuals (and, with parameter offload, the pinned_host weights) back in
// reverse order, double buffered; the gradients are bit-identical to the
// synchronous run's and match a float64 reference.
func TestOffloadAsyncCopies(t *testing.T) {
	const L, d, h = 4, 16, 32
	r := newRand(t)
	x, w1, w2 := randSlice(r, d*d), randSlice(r, L*d*h), randSlice(r, L*h*d)
	for i := range w1 {
		w1[i] /= 4
		w2[i] /= 6
	}
	ref1, ref2 := refScanGrad(x, w1, w2, L, d, h)
	for _, c := range offloadCases[1:] {
		var first [2][]float32
		for _, mode := range []struct{ async, gbps string }{{"0", ""}, {"1", "0.01"}, {"1", ""}, {"0", "0.05"}} {
			t.Setenv("FERRY_ASYNC_COPY", mode.async)
			t.Setenv("FERRY_HOST_COPY_GBPS", mode.gbps)
			wt := layerWeights{W1: rt.FromSlice(w1, L, d, h), W2: rt.FromSlice(w2, L, h, d)}
			if c.hostParams {
				wt = layerWeights{W1: trace.DevicePut(wt.W1, ir.PinnedHost), W2: trace.DevicePut(wt.W2, ir.PinnedHost)}
			}
			outs, err := rt.NewJitted(c.fn, rt.WithName(c.name)).Call(wt, rt.FromSlice(x, d, d))
			require.NoError(t, err, c.name)
			g := outs[0].(layerWeights)
			got := [2][]float32{g.W1.Float32s(), g.W2.Float32s()}
			if first[0] == nil {
				first = got
				for k, ref := range [][]float64{ref1, ref2} {
					for i := range ref {
						require.InDelta(t, ref[i], float64(got[k][i]), 1e-4*(1+math.Abs(ref[i])), "%s: grad %d[%d]", c.name, k+1, i)
					}
				}
				continue
			}
			require.Equal(t, first, got, "%s async=%q gbps=%q: bit-identical to the synchronous run", c.name, mode.async, mode.gbps)
		}
	}
}

// An offloaded scan carry lives in pinned_host: in the optimized program of
// activation_offload, the forward scan's stacked residual of its carry (the
// layer input x, tagged and offloaded by the policy) is a pinned_host ys
// result filled by a device_put of the carry parameter, and the reverse scan
// reads it as a pinned_host xs and moves each slice to device.
func TestOffloadCarryResidualInPinnedHost(t *testing.T) {
	const L, d, h = 3, 8, 16
	r := newRand(t)
	w := layerWeights{W1: rt.FromSlice(randSlice(r, L*d*h), L, d, h), W2: rt.FromSlice(randSlice(r, L*h*d), L, h, d)}
	x := rt.FromSlice(randSlice(r, d*d), d, d)
	low, err := rt.NewJitted(scanGradOf(activationOffloadLayer)).Lower(w, x)
	require.NoError(t, err)
	comp, err := low.Compile()
	require.NoError(t, err)
	f := comp.Program().Func
	var fwd, bwd *ir.Op
	for _, op := range f.Body.Ops {
		if op.Code == ir.Scan && !op.Attrs.Bool("reverse") {
			fwd = op
		}
		if op.Code == ir.Scan && op.Attrs.Bool("reverse") {
			bwd = op
		}
	}
	require.NotNil(t, fwd, comp.OptimizedIR())
	require.NotNil(t, bwd, comp.OptimizedIR())
	body := fwd.Regions[0]
	nk := fwd.Attrs.Int("num_carry")
	require.Equal(t, 1, nk)
	carry := body.Params[fwd.Attrs.Int("num_consts")]
	var stacked *ir.Value
	for j := nk; j < len(body.Results); j++ {
		y := body.Results[j]
		if y.Op != nil && y.Op.Code == ir.DevicePut && y.Op.Args[0] == carry {
			require.Equal(t, ir.PinnedHost, y.Type.Space, "the carry's residual slice is written to pinned_host")
			stacked = fwd.Results[j]
		}
	}
	require.NotNil(t, stacked, "the forward scan stacks its carry as a residual:\n%s", comp.OptimizedIR())
	require.Equal(t, ir.PinnedHost, stacked.Type.Space)
	require.Equal(t, ir.Shape{L, d, d}, stacked.Type.Shape)
	require.Positive(t, comp.MemoryAnalysis().HostTempBytes)
	k := -1
	for i, a := range bwd.Args {
		if a == stacked {
			k = i
		}
	}
	require.GreaterOrEqual(t, k, bwd.Attrs.Int("num_consts")+bwd.Attrs.Int("num_carry"), "the reverse scan reads it as an xs")
	p := bwd.Regions[0].Params[k]
	require.Equal(t, ir.PinnedHost, p.Type.Space)
	moved := false
	for _, op := range bwd.Regions[0].Ops {
		if op.Code == ir.DevicePut && op.Args[0] == p && op.Result().Type.Space == ir.Device {
			moved = true
		}
	}
	require.True(t, moved, "each slice is moved back to device before use")
}
