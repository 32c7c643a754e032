package trace_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// geluRef is gelu in float64, written independently of trace.
func geluRef(x float64, approximate bool) float64 {
	if approximate {
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	}
	return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
}

// Gelu's custom VJP (only the input is saved) against central differences, at
// first and second order, eagerly and under rt.Jit.
func TestGeluGradientFiniteDifferences(t *testing.T) {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	xs := make([]float64, 64)
	for i := range xs {
		xs[i] = r.NormFloat64() * 2
	}
	const h = 1e-5
	for _, approximate := range []bool{true, false} {
		grad := func(x *trace.Array) *trace.Array {
			return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Gelu(x, approximate)) })(x)
		}
		second := func(x *trace.Array) *trace.Array {
			return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(grad(x)) })(x)
		}
		x := rt.FromSlice(xs, len(xs))
		for _, g := range []*trace.Array{grad(x), rt.Jit(grad)(x)} {
			got := g.Float64s()
			for i, v := range xs {
				want := (geluRef(v+h, approximate) - geluRef(v-h, approximate)) / (2 * h)
				require.InDelta(t, want, got[i], 1e-6, "approximate=%v x=%v", approximate, v)
			}
		}
		got2 := second(x).Float64s()
		for i, v := range xs {
			want := (geluRef(v+h, approximate) - 2*geluRef(v, approximate) + geluRef(v-h, approximate)) / (h * h)
			require.InDelta(t, want, got2[i], 1e-3, "second derivative, approximate=%v x=%v", approximate, v)
		}
	}
}
