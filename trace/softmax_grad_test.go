package trace_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"strings"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestSoftmaxGradStopsMax: the gradient of Σ softmax(x)·w is p·(w − Σ p·w)
// (float64 reference), and, as in jax.nn.softmax, the max subtracted for
// stability is not differentiated: the traced gradient has no comparison
// against the max (the VJP of reduce_max).
func TestSoftmaxGradStopsMax(t *testing.T) {
	const rows, cols = 3, 5
	r := testseed.Rand(t, 7)
	xs, ws := make([]float64, rows*cols), make([]float64, rows*cols)
	x32, w32 := make([]float32, rows*cols), make([]float32, rows*cols)
	for i := range xs {
		x32[i], w32[i] = float32(r.NormFloat64()*3), float32(r.NormFloat64())
		xs[i], ws[i] = float64(x32[i]), float64(w32[i])
	}
	for _, c := range []struct {
		name string
		f    func(x, w *trace.Array) *trace.Array
		ref  func(p []float64, w []float64, j int) float64
	}{
		{"softmax", func(x, w *trace.Array) *trace.Array { return trace.Sum(trace.Mul(trace.Softmax(x, 1), w)) },
			func(p, w []float64, j int) float64 {
				var pw float64
				for k := range p {
					pw += p[k] * w[k]
				}
				return p[j] * (w[j] - pw)
			}},
		{"log_softmax", func(x, w *trace.Array) *trace.Array { return trace.Sum(trace.Mul(trace.LogSoftmax(x, 1), w)) },
			func(p, w []float64, j int) float64 {
				var sw float64
				for k := range w {
					sw += w[k]
				}
				return w[j] - p[j]*sw
			}},
	} {
		grad := func(x, w *trace.Array) *trace.Array {
			return trace.Grad(func(x *trace.Array) *trace.Array { return c.f(x, w) })(x)
		}
		x, w := rt.FromSlice(x32, rows, cols), rt.FromSlice(w32, rows, cols)
		low, err := rt.Lower(grad, x, w)
		if err != nil {
			t.Fatal(err)
		}
		if ir := low.IR(); strings.Contains(ir, " eq(") {
			t.Errorf("%s: the gradient differentiates the max:\n%s", c.name, ir)
		}
		got := rt.Jit(grad)(x, w).Float32s()
		for i := range rows {
			row := xs[i*cols : (i+1)*cols]
			m := math.Inf(-1)
			for _, v := range row {
				m = math.Max(m, v)
			}
			p := make([]float64, cols)
			var s float64
			for j, v := range row {
				p[j] = math.Exp(v - m)
				s += p[j]
			}
			for j := range p {
				p[j] /= s
			}
			for j := range cols {
				want := c.ref(p, ws[i*cols:(i+1)*cols], j)
				if g := float64(got[i*cols+j]); math.Abs(g-want) > 1e-5*(1+math.Abs(want)) {
					t.Errorf("%s: grad[%d,%d] = %g, want %g", c.name, i, j, g, want)
				}
			}
		}
	}
}
