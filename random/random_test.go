package random_test

import (
	"hash/adler32"
	"math"
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// jaxKey is the key of jax's testRandomDistributionValues cases:
// PRNGKey(adler32(name + "threefry2x32")).
func jaxKey(name string) *trace.Array {
	return random.NewKey(uint64(adler32.Checksum([]byte(name + "threefry2x32"))))
}

// Known outputs of jax.random (non-partitionable threefry, x64 off unless
// noted), from JAX's tests/random_test.py.
func TestMatchesJAX(t *testing.T) {
	defer random.SetPartitionable(random.SetPartitionable(false))
	k0 := random.NewKey(0)
	require.Equal(t, []uint32{2285895361, 1501764800, 1518642379, 4090693311, 433833334, 4221794875, 839183663, 3740430601},
		random.Split(k0, 4).Uint32s())
	require.Equal(t, []uint32{2285895361, 433833334}, random.FoldIn(k0, 4).Uint32s())
	require.Equal(t, []uint32{0, 1701}, random.NewKey(1701).Uint32s())
	require.Equal(t, []uint32{0xffffffff, 0xfffffffd}, random.NewKey(math.MaxUint64-2).Uint32s())
	// An odd count: JAX pads the counters with one zero.
	require.Equal(t, []uint32{56197195, 4200222568, 961309823}, random.Bits(random.NewKey(1701), 3).Uint32s())
	require.Equal(t, []uint32{1978747883, 4134381225, 3628107870, 689687174, 2788938207}, random.Bits(jaxKey("bits"), 5).Uint32s())

	near := func(want []float64, got *trace.Array, tol float64) {
		t.Helper()
		g := got.Float32s()
		require.Len(t, g, len(want))
		for i := range want {
			require.InDelta(t, want[i], float64(g[i]), tol, "element %d of %v", i, g)
		}
	}
	sh := ir.Shape{5}
	near([]float64{0.298671, 0.073213, 0.873356, 0.260549, 0.412797}, random.Uniform(jaxKey("uniform"), ir.Float32, sh, 0, 1), 2e-6)
	near([]float64{-1.173234, -1.511662, 0.070593, -0.099764, 1.052845}, random.Normal(jaxKey("normal"), ir.Float32, sh), 2e-6)
	near([]float64{0.582807, 1.709771, 0.159513, 0.861376, 0.36148}, random.TruncatedNormal(jaxKey("truncated_normal"), ir.Float32, sh, 0, 2), 2e-5)
	near([]float64{2.06701, 0.911726, 0.145736, 0.185427, -0.00711}, random.Gumbel(jaxKey("gumbel"), ir.Float32, sh), 2e-5)
	require.Equal(t, []bool{false, true, true, true, false}, random.Bernoulli(jaxKey("bernoulli"), 0.5, sh).Bools())

	// f64 uses JAX's 64-bit bits (x64 on): check them through Uniform's mantissa.
	want64 := []uint64{17649965731882839947, 1415307058040849897, 8282622628079774249, 14024425113645909402, 2012979996110532418}
	u := random.Uniform(jaxKey("bits"), ir.Float64, sh, 0, 1).Float64s()
	for i, w := range want64 {
		require.Equal(t, math.Float64frombits(w>>12|0x3ff0000000000000)-1, u[i])
	}
}

func TestChunks(t *testing.T) {
	k := random.NewKey(42)
	for _, n := range []int{1, 2, 7, 100, 1001} {
		all := random.Bits(k, n).Uint32s()
		var got []uint32
		for off := 0; off < n; off += 13 {
			m := min(13, n-off)
			got = append(got, random.BitsAt(k, n, off, m).Uint32s()...)
		}
		require.Equal(t, all, got, "n=%d", n)
		if n == 100 {
			require.Equal(t, all, random.Bits(k, 4, 25).Uint32s(), "element i depends on the count, not the shape")
			require.Equal(t, all, random.Bits(k, 2, 5, 10).Uint32s())
		}
	}
	// A scalar request is element 0 of a one-element request.
	s0 := random.Bits(k)
	require.Empty(t, s0.Shape())
	require.Equal(t, random.Bits(k, 1).Uint32s(), s0.Uint32s())
	require.Empty(t, random.Normal(k, ir.Float32, nil).Shape())
	// Keys are the rows of Split.
	ks := random.Keys(k, 3)
	s := random.Split(k, 3).Uint32s()
	for i, ki := range ks {
		require.Equal(t, s[2*i:2*i+2], ki.Uint32s())
	}
}

func moments(x []float64) (mean, variance float64) {
	for _, v := range x {
		mean += v
	}
	mean /= float64(len(x))
	for _, v := range x {
		variance += (v - mean) * (v - mean)
	}
	return mean, variance / float64(len(x))
}

func float64s(a *trace.Array) []float64 {
	return trace.Convert(a, ir.Float64).Float64s()
}

func TestDistributions(t *testing.T) {
	const n = 100_000
	k := random.NewKey(7)
	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16, ir.Float16, ir.Float64} {
		u := random.Uniform(random.FoldIn(k, 1), dt, ir.Shape{n}, -2, 3)
		require.Equal(t, dt, u.DType())
		x := float64s(u)
		m, v := moments(x)
		require.InDelta(t, 0.5, m, 0.03, dt.String())
		require.InDelta(t, 25.0/12, v, 0.05, dt.String())
		require.GreaterOrEqual(t, slices.Min(x), -2.0)
		require.LessOrEqual(t, slices.Max(x), 3.0)

		z := random.Normal(random.FoldIn(k, 2), dt, ir.Shape{n})
		require.Equal(t, dt, z.DType())
		x = float64s(z)
		m, v = moments(x)
		require.InDelta(t, 0, m, 0.02, dt.String())
		require.InDelta(t, 1, v, 0.03, dt.String())
		require.False(t, slices.ContainsFunc(x, func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }))
		// Tail mass beyond 2σ is 4.55%.
		tail := 0
		for _, v := range x {
			if math.Abs(v) > 2 {
				tail++
			}
		}
		require.InDelta(t, 0.0455, float64(tail)/n, 0.005, dt.String())

		tn := random.TruncatedNormal(random.FoldIn(k, 3), dt, ir.Shape{n}, -1, 2)
		x = float64s(tn)
		require.Greater(t, slices.Min(x), -1.0-1e-9, dt.String())
		require.Less(t, slices.Max(x), 2.0+1e-9, dt.String())
		m, _ = moments(x)
		// Mean of N(0,1) truncated to (-1, 2): (φ(-1) - φ(2)) / (Φ(2) - Φ(-1)).
		phi := func(v float64) float64 { return math.Exp(-v*v/2) / math.Sqrt(2*math.Pi) }
		cdf := func(v float64) float64 { return 0.5 * (1 + math.Erf(v/math.Sqrt2)) }
		require.InDelta(t, (phi(-1)-phi(2))/(cdf(2)-cdf(-1)), m, 0.02, dt.String())
	}

	b := random.Bernoulli(k, 0.3, ir.Shape{n}).Bools()
	c := 0
	for _, v := range b {
		if v {
			c++
		}
	}
	require.InDelta(t, 0.3, float64(c)/n, 0.01)

	logits := []float32{0, 1, 2, -1}
	l := trace.BroadcastTo(rt.FromSlice(logits, 1, 4), n/4, 4)
	idx := random.Categorical(k, l, 1)
	require.Equal(t, ir.Int32, idx.DType())
	require.Equal(t, ir.Shape{n / 4}, idx.Shape())
	counts := make([]float64, 4)
	for _, i := range idx.Int32s() {
		counts[i]++
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v))
	}
	for i, v := range logits {
		require.InDelta(t, math.Exp(float64(v))/z, counts[i]/(n/4), 0.01, "category %d", i)
	}
	// Along axis 0.
	idx0 := random.Categorical(k, trace.Transpose(l, 1, 0), 0)
	require.Equal(t, ir.Shape{n / 4}, idx0.Shape())

	for _, m := range []int{0, 1, 2, 10, 500, 2000, 200_000} {
		p := random.Permutation(random.FoldIn(k, uint32(m)), m).Int32s()
		require.Len(t, p, m)
		s := slices.Clone(p)
		slices.Sort(s)
		for i, v := range s {
			require.Equal(t, int32(i), v)
		}
		if m >= 10 {
			require.NotEqual(t, s, p, "shuffled")
		}
	}
}

func TestErfInv(t *testing.T) {
	xs := []float64{-0.999, -0.9, -0.5, -0.1, 0, 0.3, 0.7, 0.99, 0.999999}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64} {
		got := float64s(random.ErfInv(trace.Convert(rt.FromSlice(xs, len(xs)), dt)))
		for i, x := range xs {
			// Near ±1 erfinv is ill-conditioned: an ulp of x moves it by ulp/erf'(y).
			y := math.Erfinv(x)
			tol := 1e-14 + 1e-15/(2/math.SqrtPi*math.Exp(-y*y))
			if dt == ir.Float32 {
				x = float64(float32(x))
				tol = 3e-6 * max(1, math.Abs(math.Erfinv(x)))
			}
			require.InDelta(t, math.Erfinv(x), got[i], tol, "%v erfinv(%v)", dt, x)
		}
	}
	inf := float64s(random.ErfInv(rt.FromSlice([]float32{-1, 1}, 2)))
	require.Equal(t, []float64{math.Inf(-1), math.Inf(1)}, inf)
}

func TestJitMatchesEager(t *testing.T) {
	k := random.NewKey(3)
	type out struct{ B, U, N, H, D, T, P, C, K, F *trace.Array }
	gen := func(k *trace.Array) out {
		return out{
			B: random.Bits(k, 3, 5),
			U: random.Uniform(k, ir.Float32, ir.Shape{7}, -1, 1),
			N: random.Normal(k, ir.Float32, ir.Shape{4, 4}),
			H: random.Normal(k, ir.BFloat16, ir.Shape{9}),
			D: random.Normal(k, ir.Float64, ir.Shape{5}),
			T: random.TruncatedNormal(k, ir.Float16, ir.Shape{6}, -2, 2),
			P: random.Permutation(k, 16),
			C: random.Categorical(k, trace.Zeros(ir.Shape{3, 5}, ir.Float32), 1),
			K: random.Split(k, 3),
			F: random.FoldIn(k, 11),
		}
	}
	eager := gen(k)
	jitted := rt.Jit(gen)(k)
	le := trace.Leaves(eager)
	lj := trace.Leaves(jitted)
	for i := range le {
		a, _ := le[i].Literal()
		b, _ := lj[i].Literal()
		require.Equal(t, trace.FormatLiteral(a, 1<<30), trace.FormatLiteral(b, 1<<30), "leaf %d", i)
	}
}

func TestJittedInitialiserFuses(t *testing.T) {
	k := random.NewKey(0)
	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16, ir.Float64} {
		low, err := rt.NewJitted(func(k *trace.Array) *trace.Array {
			return random.Normal(k, dt, ir.Shape{1024, 1024})
		}).Lower(k)
		require.NoError(t, err)
		c, err := low.Compile()
		require.NoError(t, err)
		m := c.MemoryAnalysis()
		out := int64(1024 * 1024 * dt.Size())
		require.Equal(t, out, m.OutputBytes)
		t.Logf("%v: temp %d B for %d B of output", dt, m.TempBytes, m.OutputBytes)
		require.LessOrEqual(t, float64(m.TempBytes), 0.05*float64(out), "%v: the generator must fuse into its output\n%s", dt, c.OptimizedIR())
	}
}
