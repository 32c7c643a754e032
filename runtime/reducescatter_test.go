package runtime_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestShardedFSDPGradientsReduceScattered: an FSDP step's gradients on four
// virtual CPU devices. The stacked layer weights W (L×D×D) and the head V
// (D×E) are split by rows, the batch x too; each layer of the scan gathers
// its weights, and the gradients, constrained to the weights' layout, are
// partial sums over the batch that the per-device program reduce-scatters
// (in the scan body for W, outside it for V) with no all_reduce left. The
// gradients equal the one-device run's and a float64 reference.
func TestShardedFSDPGradientsReduceScattered(t *testing.T) {
	withDevices(t, 4)
	rng := testseed.Rand(t, 91)
	const L, B, D, E = 2, 8, 8, 4
	w, wv := randArray(rng, L, D, D)
	v, vv := randArray(rng, D, E)
	x, xv := randArray(rng, B, D)
	rows3 := mustSharding(t, []int{4}, []string{"x"}, ir.P("", "x", ""))
	rows := mustSharding(t, []int{4}, []string{"x"}, ir.P("x", ""))
	whole := mustSharding(t, []int{4}, []string{"x"}, ir.P())
	loss := func(p []*trace.Array, x *trace.Array) *trace.Array {
		h, _ := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			wl := trace.WithShardingConstraint(xs[0], whole)
			h := trace.Tanh(trace.Dot(c[0], wl))
			if s := c[0].Type().Sharding; s != nil { // the carry keeps the batch's layout
				h = trace.WithShardingConstraint(h, s)
			}
			return []*trace.Array{h}, nil
		}, []*trace.Array{x}, []*trace.Array{p[0]})
		out := trace.Dot(h[0], trace.WithShardingConstraint(p[1], whole))
		return trace.Sum(trace.Mul(out, out))
	}
	grad := trace.GradFirst(loss)
	step := func(w, v, x *trace.Array) (*trace.Array, *trace.Array) {
		g := grad([]*trace.Array{w, v}, x)
		return trace.WithShardingConstraint(g[0], rows3), trace.WithShardingConstraint(g[1], rows)
	}

	one := rt.Jit(step)
	g1w, g1v := one(w, v, x)

	ws, err := rt.DevicePut(w, rows3)
	require.NoError(t, err)
	vs, err := rt.DevicePut(v, rows)
	require.NoError(t, err)
	xs, err := rt.DevicePut(x, rows)
	require.NoError(t, err)
	l, err := rt.NewJitted(step).Lower(ws, vs, xs)
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	prog := c.OptimizedIR()
	require.Equal(t, 0, strings.Count(prog, "all_reduce("), "no gradient all-reduced:\n%s", prog)
	require.GreaterOrEqual(t, strings.Count(prog, "reduce_scatter("), 2, "W's and V's gradients reduce-scattered:\n%s", prog)
	outs, err := c.Call(ws, vs, xs)
	require.NoError(t, err)
	gw, gv := outs[0].(*trace.Array), outs[1].(*trace.Array)
	require.True(t, gw.Type().Sharding.EquivalentTo(rows3, 3), "W's gradient %v", gw.Type())

	refW, refV := fsdpGradRef(wv, vv, xv, L, B, D, E)
	for _, c := range []struct {
		name      string
		got, one  []float64
		reference []float64
	}{{"W", gw.Float64s(), g1w.Float64s(), refW}, {"V", gv.Float64s(), g1v.Float64s(), refV}} {
		require.Len(t, c.got, len(c.reference))
		for i, r := range c.reference {
			tol := 1e-4 * (1 + math.Abs(r))
			require.InDelta(t, c.one[i], c.got[i], tol, "%s[%d]: four devices against one", c.name, i)
			require.InDelta(t, r, c.got[i], tol, "%s[%d]: four devices against float64", c.name, i)
		}
	}
}

// fsdpGradRef is the gradient of Σ (tanh(…tanh(x·W₀)…·W_{L-1})·V)² with
// respect to W and V, in float64, by the chain rule written out.
func fsdpGradRef(w, v, x []float64, L, B, D, E int) (gw, gv []float64) {
	matmul := func(a, b []float64, n, k, m int, ta, tb bool) []float64 {
		out := make([]float64, n*m)
		for i := range n {
			for j := range m {
				s := 0.0
				for p := range k {
					av, bv := a[i*k+p], b[p*m+j]
					if ta {
						av = a[p*n+i]
					}
					if tb {
						bv = b[j*k+p]
					}
					s += av * bv
				}
				out[i*m+j] = s
			}
		}
		return out
	}
	hs := [][]float64{x}
	for l := range L {
		z := matmul(hs[l], w[l*D*D:(l+1)*D*D], B, D, D, false, false)
		for i := range z {
			z[i] = math.Tanh(z[i])
		}
		hs = append(hs, z)
	}
	out := matmul(hs[L], v, B, D, E, false, false)
	dout := make([]float64, len(out))
	for i := range out {
		dout[i] = 2 * out[i]
	}
	gv = matmul(hs[L], dout, D, B, E, true, false)
	dh := matmul(dout, v, B, E, D, false, true)
	gw = make([]float64, L*D*D)
	for l := L - 1; l >= 0; l-- {
		dz := make([]float64, len(dh))
		for i := range dh {
			dz[i] = dh[i] * (1 - hs[l+1][i]*hs[l+1][i])
		}
		copy(gw[l*D*D:], matmul(hs[l], dz, D, B, D, true, false))
		dh = matmul(dz, w[l*D*D:(l+1)*D*D], B, D, D, false, true)
	}
	return gw, gv
}
