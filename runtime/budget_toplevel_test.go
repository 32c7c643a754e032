package runtime_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// topModel is a scanned stack fed by a wide input activation: tanh(e),
// e an m×h input (embeddings), projected to the stack's width by out.
type topModel struct {
	L      budgetW
	E, Out *trace.Array
}

func topGrad(w topModel) topModel {
	return trace.Grad(func(w topModel) *trace.Array {
		y, _ := trace.ScanTree(func(x *trace.Array, w budgetW) (*trace.Array, struct{}) {
			return budgetLayer(x, w), struct{}{}
		}, trace.MatMul(trace.Tanh(w.E), w.Out), w.L)
		return trace.Sum(y)
	})(w)
}

// The top level's residual (tanh(e), read before the forward scan and after
// the backward scan) is planned with the scans': at the smallest budget the
// plan offloads or recomputes it, the measured device peak stays within the
// budget, and the gradients are the unconstrained run's.
func TestMemoryBudgetPlansTheTopLevel(t *testing.T) {
	r := testseed.Rand(t, 11)
	d := newBudgetData(budgetModel{L: 4, B: 32, D: 16, H: 32}, testseed.Uint64(t))
	h := 256 * (1 + r.IntN(3))
	rnd := func(n int, s float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64()) * s
		}
		return v
	}
	w := topModel{L: d.w, E: rt.FromSlice(rnd(32*h, 1), 32, h), Out: rt.FromSlice(rnd(h*16, 0.05), h, 16)}
	rates := []rt.Option{rt.BudgetRates(1e11, 2e9, 5e9), rt.BudgetCopiesOverlap(false)}

	want, err := rt.NewJitted(topGrad).Call(w)
	require.NoError(t, err)
	_, err = rt.NewJitted(topGrad, append(rates, rt.MemoryBudget(1))...).Lower(w)
	var be *rt.MemoryBudgetError
	require.ErrorAs(t, err, &be)

	j := rt.NewJitted(topGrad, append(rates, rt.MemoryBudget(be.Minimum))...)
	l, err := j.Lower(w)
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	p := c.MemoryPlan()
	t.Log(p)
	action := ""
	for _, v := range p.Values {
		if v.Op == "tanh" && v.Iterations == 1 {
			action = v.Action
		}
	}
	require.Contains(t, []string{"offload", "recompute"}, action, "the top level's tanh")
	ma := c.MemoryAnalysis()
	require.LessOrEqual(t, ma.TotalBytes(), be.Minimum)

	collectGarbage()
	before := rt.MemoryStats(ir.Device).BytesInUse
	rt.ResetPeakMemory()
	got, err := j.Call(w)
	require.NoError(t, err)
	g, wg := got[0].(topModel), want[0].(topModel)
	_ = g.E.Float32s()
	peak := rt.MemoryStats(ir.Device).PeakBytesInUse - before + ma.ArgumentBytes
	require.LessOrEqual(t, peak, be.Minimum, "measured device peak")
	for i, pair := range [][2]*trace.Array{{g.L.W1, wg.L.W1}, {g.L.W2, wg.L.W2}, {g.E, wg.E}, {g.Out, wg.Out}} {
		require.Equal(t, pair[1].Float32s(), pair[0].Float32s(), "gradient %d", i)
	}
}
