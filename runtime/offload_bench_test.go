package runtime_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// BenchmarkOffloadScanOverlap measures jit(grad(loss)) of REFERENCES.md §1
// with activation and parameter offload (examples/offload's
// activation_param_offload: L = 10 layers, w1, w2 in pinned_host, each scan
// step copying its slices to device with trace.DevicePut, the layer inputs
// offloaded to pinned_host and read back in reverse) over a simulated host
// link (FERRY_HOST_COPY_GBPS) whose speed is calibrated so that the program's
// host→device copies take as long as its compute. With asynchronous copies
// the copies the prefetch pass could reserve a buffer for (both weights in
// the forward scan, w1 and the residual in the backward one) are double
// buffered and overlap compute; with FERRY_ASYNC_COPY=0 every copy adds to
// the compute.
//
// Metrics: compute-ms (no link delay), copy-ms (host→device bytes over the
// link), ms, and the time over max(compute, copy) and over their sum.
func BenchmarkOffloadScanOverlap(b *testing.B) {
	const L, D, H = 10, 256, 1024
	r := rand.New(rand.NewPCG(1, 2))
	randn := func(scale float64, shape ...int) *trace.Array {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * scale)
		}
		return rt.FromSlice(v, shape...)
	}
	x := randn(1, D, D)
	w := layerWeights{W1: trace.DevicePut(randn(1/16.0, L, D, H), ir.PinnedHost), W2: trace.DevicePut(randn(1/32.0, L, H, D), ir.PinnedHost)}
	fn := rt.NewJitted(scanGradOf(paramOffloadLayer))
	run := func() time.Duration {
		start := time.Now()
		outs, err := fn.Call(w, x)
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		g := outs[0].(layerWeights)
		_, _ = g.W1.Delete(), g.W2.Delete()
		return d
	}
	// Calibrate: the compute time with no link delay.
	b.Setenv("FERRY_HOST_COPY_GBPS", "")
	b.Setenv("FERRY_ASYNC_COPY", "1")
	run()
	compute := time.Duration(1 << 62)
	for range 5 {
		compute = min(compute, run())
	}
	// Host→device bytes: both weights twice (forward, backward) and the
	// residuals once.
	h2d := float64(L * (2*2*D*H + D*D) * 4)
	gbps := h2d / float64(compute.Nanoseconds()) // bytes per ns = GB/s
	copyTime := time.Duration(h2d / gbps)
	for _, c := range []struct{ name, async string }{{"async", "1"}, {"sync", "0"}} {
		b.Run(c.name, func(b *testing.B) {
			b.Setenv("FERRY_HOST_COPY_GBPS", fmt.Sprint(gbps))
			b.Setenv("FERRY_ASYNC_COPY", c.async)
			run()
			b.ResetTimer()
			var total time.Duration
			for range b.N {
				total += run()
			}
			t := float64(total.Nanoseconds()) / float64(b.N)
			b.ReportMetric(float64(compute.Nanoseconds())/1e6, "compute-ms")
			b.ReportMetric(float64(copyTime.Nanoseconds())/1e6, "copy-ms")
			b.ReportMetric(t/1e6, "ms")
			b.ReportMetric(t/float64(max(compute, copyTime).Nanoseconds()), "x-max")
			b.ReportMetric(t/float64((compute+copyTime).Nanoseconds()), "x-sum")
		})
	}
}
