package runtime_test

import (
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A scanned model whose stacked weights are most of its memory: under a
// budget below what the weights (and their gradients) need on device, the
// planner places the weight arguments in pinned_host, from where the
// planned scans stream them in one layer at a time. The caller passes them
// on device; the gradients are unchanged.
func TestMemoryBudgetPlacesScannedWeightsInHost(t *testing.T) {
	d := newBudgetData(budgetModel{L: 8, B: 4, D: 32, H: 64}, testseed.Uint64(t))
	wBytes := d.w.W1.Type().Bytes() + d.w.W2.Type().Bytes()
	base, err := compileBudget(t, d, budgetLayer)
	require.NoError(t, err)
	baseline := base.MemoryAnalysis().TotalBytes()

	// With the budget of the baseline nothing moves.
	c, err := compileBudget(t, d, budgetLayer, rt.MemoryBudget(baseline))
	require.NoError(t, err)
	require.Empty(t, c.MemoryPlan().HostArguments())

	// The smallest budget: the weights in pinned_host.
	_, err = compileBudget(t, d, budgetLayer, rt.MemoryBudget(1))
	var be *rt.MemoryBudgetError
	require.True(t, errors.As(err, &be), "%v", err)
	// The weights and their gradients on device alone exceed it.
	require.Less(t, be.Minimum, 2*wBytes)

	j := rt.NewJitted(budgetGrad(budgetLayer), rt.MemoryBudget(be.Minimum))
	l, err := j.Lower(d.w, d.xa)
	require.NoError(t, err)
	c, err = l.Compile()
	require.NoError(t, err)
	p := c.MemoryPlan()
	t.Log(p)
	require.Equal(t, []int{0, 1}, p.HostArguments(), "w1 and w2 go to pinned_host")
	require.Contains(t, p.String(), passes.ActionHostArgument)
	ma := c.MemoryAnalysis()
	require.LessOrEqual(t, ma.TotalBytes(), be.Minimum)
	require.Equal(t, wBytes, ma.HostArgumentBytes)
	require.Equal(t, d.xa.Type().Bytes(), ma.ArgumentBytes, "only x is a device argument")

	for call := range 2 {
		// The measured device peak of the call: what it allocates on
		// device, plus its device argument.
		collectGarbage()
		before := rt.MemoryStats(ir.Device).BytesInUse
		rt.ResetPeakMemory()
		out, err := c.Call(d.w, d.xa)
		require.NoError(t, err, "call %d", call)
		g := out[0].(budgetW)
		peak := rt.MemoryStats(ir.Device).PeakBytesInUse - before + ma.ArgumentBytes
		require.LessOrEqual(t, peak, be.Minimum, "call %d: measured device peak", call)
		d.check(t, g)
		// The results are where the plan (no result placed) says: on device.
		require.Equal(t, ir.Device, g.W1.Space())
		require.Equal(t, ir.Device, g.W2.Space())
		// The caller's weights stay on device, usable.
		require.Equal(t, ir.Device, d.w.W1.Space())
		require.Len(t, d.w.W1.Float32s(), d.m.L*d.m.D*d.m.H)
	}

	// The jitted function: weights passed on device or already in
	// pinned_host run the one program.
	out, err := j.Call(d.w, d.xa)
	require.NoError(t, err)
	d.check(t, out[0].(budgetW))
	hw := budgetW{W1: trace.DevicePut(d.w.W1, ir.PinnedHost), W2: trace.DevicePut(d.w.W2, ir.PinnedHost)}
	out, err = j.Call(hw, d.xa)
	require.NoError(t, err)
	d.check(t, out[0].(budgetW))
	require.Equal(t, int64(1), j.Stats().Misses, "one compile for both placements")
}

// adamStep is a training step of the scanned model with Adam-like moments
// passed in and returned (donated): w -= lr·m'/(√v'+ε), m' = b1·m + (1−b1)·g,
// v' = b2·v + (1−b2)·g².
func adamStep(w, m, v budgetW, x *trace.Array) (budgetW, budgetW, budgetW) {
	g := budgetGrad(budgetLayer)(w, x)
	upd := func(w, m, v, g *trace.Array) (*trace.Array, *trace.Array, *trace.Array) {
		m2 := trace.Add(trace.Mul(trace.Scalar(0.9), m), trace.Mul(trace.Scalar(0.1), g))
		v2 := trace.Add(trace.Mul(trace.Scalar(0.999), v), trace.Mul(trace.Scalar(0.001), trace.Square(g)))
		w2 := trace.Sub(w, trace.Mul(trace.Scalar(0.01), trace.Div(m2, trace.Add(trace.Sqrt(v2), trace.Scalar(1e-8)))))
		return w2, m2, v2
	}
	w1, m1, v1 := upd(w.W1, m.W1, v.W1, g.W1)
	w2, m2, v2 := upd(w.W2, m.W2, v.W2, g.W2)
	return budgetW{w1, w2}, budgetW{m1, m2}, budgetW{v1, v2}
}

// adamRef is adamStep in float64 with the gradients gw of w.
func adamRef(w, m, v, gw []float64) (w2, m2, v2 []float64) {
	w2, m2, v2 = make([]float64, len(w)), make([]float64, len(w)), make([]float64, len(w))
	for i := range w {
		m2[i] = 0.9*m[i] + 0.1*gw[i]
		v2[i] = 0.999*v[i] + 0.001*gw[i]*gw[i]
		w2[i] = w[i] - 0.01*m2[i]/(math.Sqrt(v2[i])+1e-8)
	}
	return
}

func requireNear64(t *testing.T, want []float64, got []float32, what string) {
	t.Helper()
	require.Len(t, got, len(want))
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	for i, w := range want {
		require.InDelta(t, w, float64(got[i]), 1e-4*scale+1e-5, "%s[%d]", what, i)
	}
}

// Optimizer state passed in and returned: under a budget the step does not
// fit with the moments on device, the planner places them in pinned_host;
// the step copies them in where the update reads them and writes the new
// moments to pinned_host, where the next step takes them from.
func TestMemoryBudgetPlacesOptimizerStateInHost(t *testing.T) {
	d := newBudgetData(budgetModel{L: 4, B: 4, D: 32, H: 64}, testseed.Uint64(t))
	r := testseed.Rand(t, 9)
	moment := func(n int, scale float64) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = float64(float32(math.Abs(r.NormFloat64()) * scale))
		}
		return s
	}
	f32 := func(v []float64) []float32 {
		o := make([]float32, len(v))
		for i, x := range v {
			o[i] = float32(x)
		}
		return o
	}
	n1, n2 := len(d.w1), len(d.w2)
	m1, m2, v1, v2 := moment(n1, 0.1), moment(n2, 0.1), moment(n1, 0.01), moment(n2, 0.01)
	mk := func(s []float64, like *trace.Array) *trace.Array {
		return rt.FromSlice(f32(s), []int(like.Shape())...)
	}
	state := func() (budgetW, budgetW) {
		return budgetW{mk(m1, d.w.W1), mk(m2, d.w.W2)}, budgetW{mk(v1, d.w.W1), mk(v2, d.w.W2)}
	}
	m, v := state()
	mvBytes := 2 * (d.w.W1.Type().Bytes() + d.w.W2.Type().Bytes())

	_, err := rt.NewJitted(adamStep, rt.Donate(0, 1, 2), rt.MemoryBudget(1)).Lower(d.w, m, v, d.xa)
	var be *rt.MemoryBudgetError
	require.True(t, errors.As(err, &be), "%v", err)
	j := rt.NewJitted(adamStep, rt.Donate(0, 1, 2), rt.MemoryBudget(be.Minimum))
	l, err := j.Lower(d.w, m, v, d.xa)
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	p := c.MemoryPlan()
	t.Log(p)
	// Moments go to pinned_host (as many as the budget needs: at the
	// minimum, with all of them there, some may not change the peak), the
	// weights stay.
	host := p.HostArguments()
	require.NotEmpty(t, host)
	for _, i := range host {
		require.Contains(t, []int{2, 3, 4, 5}, i, "the plan's host arguments: %v", host)
	}
	require.Contains(t, p.String(), passes.ActionHostState)
	ma := c.MemoryAnalysis()
	require.LessOrEqual(t, ma.TotalBytes(), be.Minimum)
	mvBytes = mvBytes / 4 * int64(len(host)) // the four moments have the same size
	require.Equal(t, mvBytes, ma.HostArgumentBytes)
	require.Equal(t, mvBytes, ma.HostOutputBytes)

	// Two steps, each against float64 references; the second takes the
	// first's results (the moments already in pinned_host).
	w := d.w
	for step := range 2 {
		collectGarbage()
		before := rt.MemoryStats(ir.Device).BytesInUse
		rt.ResetPeakMemory()
		out, err := j.Call(w, m, v, d.xa)
		require.NoError(t, err, "step %d", step)
		w2, mo, vo := out[0].(budgetW), out[1].(budgetW), out[2].(budgetW)
		_ = w2.W1.Float32s()
		peak := rt.MemoryStats(ir.Device).PeakBytesInUse - before + ma.ArgumentBytes
		require.LessOrEqual(t, peak, be.Minimum, "step %d: measured device peak", step)
		for k, a := range []*trace.Array{mo.W1, mo.W2, vo.W1, vo.W2} {
			want := ir.Device
			if slices.Contains(host, 2+k) {
				want = ir.PinnedHost
			}
			require.Equal(t, want, a.Space(), "step %d: the new moment %d", step, k)
		}
		require.Equal(t, ir.Device, w2.W1.Space())
		require.Equal(t, ir.Device, w2.W2.Space())
		ww1, wm1, wv1 := adamRef(d.w1, m1, v1, d.gw1)
		ww2, wm2, wv2 := adamRef(d.w2, m2, v2, d.gw2)
		requireNear64(t, ww1, w2.W1.Float32s(), "w1")
		requireNear64(t, ww2, w2.W2.Float32s(), "w2")
		requireNear64(t, wm1, mo.W1.Float32s(), "m1")
		requireNear64(t, wm2, mo.W2.Float32s(), "m2")
		requireNear64(t, wv1, vo.W1.Float32s(), "v1")
		requireNear64(t, wv2, vo.W2.Float32s(), "v2")
		// The next step's inputs, as the program returned them; the
		// references restart from their f32 values.
		w, m, v = w2, mo, vo
		d.w1, d.w2 = f64s(w.W1.Float32s()), f64s(w.W2.Float32s())
		m1, m2, v1, v2 = f64s(m.W1.Float32s()), f64s(m.W2.Float32s()), f64s(v.W1.Float32s()), f64s(v.W2.Float32s())
		d.reference()
	}
	require.Equal(t, int64(1), j.Stats().Misses, "the returned moments in pinned_host run the same program")
}
