package random_test

import (
	"math"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// Values printed by the jax.random module documentation (JAX with its default
// jax_threefry_partitionable=True):
//
//	>>> key = random.key(0)
//	>>> random.uniform(key)                   # 0.947667
//	>>> key, subkey = random.split(key)
//	>>> random.uniform(subkey)                # 0.00729382
func TestPartitionableMatchesJAXDocs(t *testing.T) {
	defer random.SetPartitionable(random.SetPartitionable(true))
	key := random.NewKey(0)
	require.InDelta(t, 0.947667, random.Uniform(key, ir.Float32, ir.Shape{}, 0, 1).Float64s()[0], 1e-6)
	sub := trace.Index(random.Split(key, 2), 1)
	require.InDelta(t, 0.00729382, random.Uniform(sub, ir.Float32, ir.Shape{}, 0, 1).Float64s()[0], 1e-8)
	// Split key 0 is the block on counters (0, 0): Random123's zero vector.
	require.Equal(t, []uint32{0x6b200159, 0x99ba4efe}, trace.Index(random.Split(key, 2), 0).Uint32s())
}

// refBits is the partitionable layout written out with the block function on
// one counter pair at a time.
func refBits(key *trace.Array, i uint64) (y0, y1 uint32) {
	k := key.Uint32s()
	c := func(v uint32) *trace.Array { return rt.FromSlice([]uint32{v}) }
	a, b := random.Block(c(k[0]), c(k[1]), c(uint32(i>>32)), c(uint32(i)))
	return a.Uint32s()[0], b.Uint32s()[0]
}

// Element i depends on (key, i) only: any shape, any chunk, any request size.
func TestPartitionableLayout(t *testing.T) {
	defer random.SetPartitionable(random.SetPartitionable(true))
	key := random.FoldIn(random.NewKey(42), 7)
	b := random.Bits(key, 3, 5, 2).Uint32s()
	for _, i := range []int{0, 1, 7, 29} {
		y0, y1 := refBits(key, uint64(i))
		require.Equal(t, y0^y1, b[i], "element %d", i)
	}
	flat := random.Bits(key, 30).Uint32s()
	require.Equal(t, flat, b, "the shape does not change the bits")
	require.Equal(t, flat[:7], random.Bits(key, 7).Uint32s(), "the request size does not change the bits")
	require.Equal(t, flat[11:17], random.BitsAt(key, 30, 11, 2, 3).Uint32s(), "a chunk alone")
	// Counters past 2^32 use the high word: a chunk far into a huge request.
	far := uint64(3)<<32 + 5
	got := random.BitsAt(key, int(far)+4, int(far), 4).Uint32s()
	for j := range got {
		y0, y1 := refBits(key, far+uint64(j))
		require.Equal(t, y0^y1, got[j], "element 2^32·3+%d", 5+j)
	}
	// Split: key i is the block on (0, i) itself.
	ks := random.Split(key, 3).Uint32s()
	for i := range 3 {
		y0, y1 := refBits(key, uint64(i))
		require.Equal(t, []uint32{y0, y1}, ks[2*i:2*i+2])
	}
}

// 16-bit dtypes follow JAX's formulas in the dtype: bf16 from the low byte
// (7 mantissa bits), f16 from the low half (10 mantissa bits), then
// x·(hi−lo)+lo rounded in the dtype.
func TestPartitionable16BitUniform(t *testing.T) {
	defer random.SetPartitionable(random.SetPartitionable(true))
	key := random.NewKey(3)
	const n = 64
	bits := random.Bits(key, n).Uint32s()
	for _, c := range []struct {
		dt         ir.DType
		mask       uint32
		shift, den float64
	}{{ir.BFloat16, 0xff, 1, 128}, {ir.Float16, 0xffff, 6, 1024}} {
		lo, hi := -0.5, 3.0
		got := random.Uniform(key, c.dt, ir.Shape{n}, lo, hi)
		require.Equal(t, c.dt, got.DType())
		r := func(v float64) float64 { return trace.Convert(rt.FromSlice([]float64{v}), c.dt).Float64s()[0] }
		for i, g := range got.Float64s() {
			m := math.Floor(float64(bits[i]&c.mask) / math.Exp2(c.shift))
			want := math.Max(r(lo), r(r(m/c.den*r(r(hi)-r(lo)))+r(lo)))
			require.Equal(t, want, g, "%v element %d (bits %#x)", c.dt, i, bits[i])
		}
		// Normal in the dtype: finite, in range, the same eager and jitted.
		nrm := random.Normal(key, c.dt, ir.Shape{n})
		jit := rt.Jit(func(k *trace.Array) *trace.Array { return random.Normal(k, c.dt, ir.Shape{n}) })(key)
		require.Equal(t, nrm.Float64s(), jit.Float64s())
		for _, v := range nrm.Float64s() {
			require.False(t, math.IsNaN(v) || math.IsInf(v, 0), "%v normal %v", c.dt, v)
		}
	}
}

// In the original layout, 16-bit dtypes draw JAX's 8-bit (bf16) or 16-bit
// (f16) random words: the u32 words of Bits(key, ceil(n·w/32)) cut into
// 32/w pieces, lowest bits first, then the formulas of the dtype as in the
// partitionable layout.
func TestOriginal16BitUniform(t *testing.T) {
	defer random.SetPartitionable(random.SetPartitionable(false))
	key := random.NewKey(5)
	const n = 37
	for _, c := range []struct {
		dt         ir.DType
		width      int
		shift, den float64
	}{{ir.BFloat16, 8, 1, 128}, {ir.Float16, 16, 6, 1024}} {
		k := 32 / c.width
		words := random.Bits(key, (n+k-1)/k).Uint32s()
		lo, hi := -0.5, 3.0
		got := random.Uniform(key, c.dt, ir.Shape{n}, lo, hi)
		require.Equal(t, c.dt, got.DType())
		r := func(v float64) float64 { return trace.Convert(rt.FromSlice([]float64{v}), c.dt).Float64s()[0] }
		for i, g := range got.Float64s() {
			b := words[i/k] >> (c.width * (i % k)) & (1<<c.width - 1)
			m := math.Floor(float64(b) / math.Exp2(c.shift))
			want := math.Max(r(lo), r(r(m/c.den*r(r(hi)-r(lo)))+r(lo)))
			require.Equal(t, want, g, "%v element %d (bits %#x)", c.dt, i, b)
		}
	}
}
