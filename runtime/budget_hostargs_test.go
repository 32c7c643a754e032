package runtime_test

import (
	"errors"
	"math/rand/v2"
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
	d := newBudgetData(budgetModel{L: 8, B: 4, D: 32, H: 64}, rand.Uint64())
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
