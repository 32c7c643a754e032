package runtime_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Optimizer-state offload in miniature: the state lives in pinned_host, the step
// moves it to device, and the new state is written back to host through the
// output memory spaces.
func TestOutSpacesWriteStateBackToHost(t *testing.T) {
	r := newRand(t)
	n := 256
	ws, ms, gs := randSlice(r, n), randSlice(r, n), randSlice(r, n)
	w := rt.FromSlice(ws, n)
	m := trace.DevicePut(rt.FromSlice(ms, n), ir.PinnedHost)
	g := rt.FromSlice(gs, n)
	require.Equal(t, ir.PinnedHost, m.Space())

	step := rt.NewJitted(func(w, m, g *trace.Array) (*trace.Array, *trace.Array) {
		md := trace.DevicePut(m, ir.Device)
		m2 := trace.Add(trace.Mul(trace.Scalar(0.9), md), g)
		return trace.Sub(w, trace.Mul(trace.Scalar(0.1), m2)), m2
	}, rt.OutSpace(1, ir.PinnedHost))
	w2, m2 := step.Fn()(w, m, g)
	require.Equal(t, ir.Device, w2.Space())
	require.Equal(t, ir.PinnedHost, m2.Space())
	for i := range ws {
		mm := 0.9*float64(ms[i]) + float64(gs[i])
		require.InDelta(t, mm, float64(m2.Float32s()[i]), 1e-5)
		require.InDelta(t, float64(ws[i])-0.1*mm, float64(w2.Float32s()[i]), 1e-5)
	}

	low, err := step.Lower(w, m, g)
	require.NoError(t, err)
	c, err := low.Compile()
	require.NoError(t, err)
	a := c.MemoryAnalysis()
	require.Equal(t, int64(n*4), a.HostArgumentBytes, "the state argument is counted on the host")
	require.Equal(t, int64(n*4), a.HostOutputBytes, "the new state is a host output")
	require.Equal(t, int64(2*n*4), a.ArgumentBytes)
	require.Equal(t, int64(n*4), a.OutputBytes)

	// A second call with the returned state (a host array) hits the cache.
	step.Fn()(w2, m2, g)
	require.Equal(t, int64(1), step.Stats().Hits)

	_, err = rt.NewJitted(func(x *trace.Array) *trace.Array { return x }, rt.OutSpace(3, ir.PinnedHost)).Call(w)
	require.ErrorContains(t, err, "OutSpaces names result 3")
}
