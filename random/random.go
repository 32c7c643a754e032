// Package random is Ferry's counterpart of jax.random: a stateless,
// counter-based pseudo-random generator with explicit keys.
//
// A key is a u32[2] array (NewKey, Split, FoldIn). Bits are produced by the
// Threefry-2x32 block cipher with 20 rounds (Random123; JAX's threefry2x32),
// written only with trace ops on u32 arrays (add, xor, shifts, or) applied to
// iota counters. The bits of element i of an n-element request are a function
// of (key, n, i) alone, computed by one Threefry block, so:
//
//   - any chunk of a large array can be generated on its own (BitsAt);
//   - inside rt.Jit the generator is ordinary elementwise IR on iota, which the
//     compiler fuses into its consumer: a jitted initialiser holds no bit
//     buffer, only its output (see the package tests).
//
// Two bit layouts are available (SetPartitionable), the two of JAX's
// jax_threefry_partitionable flag:
//
//   - partitionable (the default, JAX's default since 0.5): element i is
//     y0 ^ y1 of the block on the counters (i>>32, i&0xffffffff) of its
//     row-major index; Split(key, n)[i] is (y0, y1) of the block on (0, i);
//     8- and 16-bit requests keep the low bits. Any request size works (the
//     index may pass 2^32). Uniform, Normal, TruncatedNormal and Gumbel in bf16
//     and f16 follow JAX's formulas in those dtypes (bf16 from 8 random bits,
//     f16 from 16), so they generate straight into the 16-bit dtype.
//   - original (JAX before 0.5): for n values, counters iota(n) (padded with
//     one 0 when n is odd) are split into halves x0 and x1, and the output is
//     concat(threefry(key, x0, x1)) truncated to n. 8- and 16-bit requests
//     (bf16 and f16 distributions) cut the u32 words of a ceil(n·w/32)-word
//     request into 32/w pieces, lowest bits first, as JAX does; the formulas
//     then run in the 16-bit dtype as in the partitionable layout.
//
// In both, NewKey, Split, FoldIn and Bits return the values of
// jax.random.PRNGKey, split, fold_in and bits for the same key, and Uniform
// and Normal in f32, and Uniform in f64 (with x64), follow jax.random's
// formulas on those bits (checked against values published by JAX). Package
// conformance checks every function here against pinned JAX in both layouts:
// keys, bits, Bernoulli, Categorical, Permutation and every bf16 and f16
// distribution bit for bit; f32 and f64 Uniform with bounds other than
// [0, 1), Normal and TruncatedNormal within a few ulps, because XLA on CPU
// fuses their multiply-adds into FMAs where Ferry rounds twice.
//
// Normal uses JAX's method: u uniform in (-1, 1), then sqrt(2)·erfinv(u), with
// erfinv by Giles' single-precision polynomial (as XLA's ErfInv for f32); in f64
// the polynomial is refined by two Newton steps on Erf. TruncatedNormal uses the
// inverse CDF: u uniform in (erf(lower/√2), erf(upper/√2)).
package random

import (
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// maxCount is the largest number of 32-bit words one request may use: counters
// are u32.
const maxCount = 1<<32 - 1

// NewKey returns a PRNG key (a u32[2] array) from a seed, like
// jax.random.PRNGKey: key = [seed>>32, seed&0xffffffff].
func NewKey(seed uint64) *trace.Array {
	return trace.Const([]uint32{uint32(seed >> 32), uint32(seed)}, 2)
}

// Split returns n new keys as a u32[n,2] array, like jax.random.split: in the
// partitionable layout key i is the block (y0, y1) on counters (0, i); in the
// original one threefry2x32(key, iota(2n)) reshaped to [n,2].
func Split(key *trace.Array, n int) *trace.Array {
	if n < 0 {
		panic(trace.Errorf("random.Split", "negative count %d", n))
	}
	if Partitionable() {
		if n == 0 {
			keyWords("random.Split", key)
			return trace.Zeros(ir.Shape{0, 2}, ir.Uint32)
		}
		y0, y1 := blocks("random.Split", key, ir.Shape{n}, 0)
		return trace.Stack(1, y0, y1)
	}
	return trace.Reshape(Bits(key, 2*n), n, 2)
}

// Keys returns the n keys of Split(key, n) as a slice of u32[2] arrays.
func Keys(key *trace.Array, n int) []*trace.Array {
	ks := Split(key, n)
	out := make([]*trace.Array, n)
	for i := range out {
		out[i] = trace.Index(ks, i)
	}
	return out
}

// FoldIn mixes data into a key and returns a new key, like jax.random.fold_in:
// threefry2x32(key, [0, data]).
func FoldIn(key *trace.Array, data uint32) *trace.Array {
	k0, k1 := keyWords("random.FoldIn", key)
	y0, y1 := Block(k0, k1, u32(0), u32(float64(data)))
	return trace.Stack(0, y0, y1)
}

// Block applies the Threefry-2x32 block function with 20 rounds to the counter
// pairs (x0, x1) under the key (k0, k1); all operands are u32 arrays that
// broadcast together. It is the threefry2x32 primitive of JAX and
// threefry2x32_20 of Random123.
func Block(k0, k1, x0, x1 *trace.Array) (y0, y1 *trace.Array) {
	ks := [3]*trace.Array{k0, k1, trace.Xor(trace.Xor(k0, k1), u32(0x1BD11BDA))}
	rot := [2][4]uint32{{13, 15, 26, 6}, {17, 29, 16, 24}}
	x0 = trace.Add(x0, ks[0])
	x1 = trace.Add(x1, ks[1])
	for i := range 5 {
		for _, r := range rot[i%2] {
			x0 = trace.Add(x0, x1)
			x1 = trace.Xor(x0, rotl(x1, r))
		}
		x0 = trace.Add(x0, ks[(i+1)%3])
		x1 = trace.Add(trace.Add(x1, ks[(i+2)%3]), u32(float64(i+1)))
	}
	return x0, x1
}

func rotl(x *trace.Array, r uint32) *trace.Array {
	return trace.Or(trace.ShiftLeft(x, u32(float64(r))), trace.ShiftRightLogical(x, u32(float64(32-r))))
}

// u32 is a strong u32 scalar.
func u32(v float64) *trace.Array { return trace.ScalarAs(v, ir.Uint32) }

// keyWords checks that key is a u32[2] array and returns its two words as
// scalars.
func keyWords(op string, key *trace.Array) (k0, k1 *trace.Array) {
	if key == nil {
		panic(trace.Errorf(op, "nil key"))
	}
	if key.DType() != ir.Uint32 || !key.Shape().Equal(ir.Shape{2}) {
		panic(trace.Errorf(op, "key must be u32[2], got %v (use random.NewKey)", key.Type()))
	}
	return trace.Index(key, 0), trace.Index(key, 1)
}

func size(op string, shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(trace.Errorf(op, "shape %v has a negative dimension", shape))
		}
		n *= d
	}
	return n
}

// Bits returns random u32 bits of the given shape, like jax.random.bits with
// dtype uint32 (in the current layout, see the package doc).
func Bits(key *trace.Array, shape ...int) *trace.Array {
	n := size("random.Bits", shape)
	return BitsAt(key, n, 0, shape...)
}

// BitsAt returns elements [offset, offset+size(shape)) of the flat array
// Bits(key, total), in the given shape. Any chunk of a large request can be
// generated on its own with it: the concatenation of the chunks equals Bits.
func BitsAt(key *trace.Array, total, offset int, shape ...int) *trace.Array {
	const op = "random.BitsAt"
	k0, k1 := keyWords(op, key)
	n := size(op, shape)
	if Partitionable() {
		if total < 0 || offset < 0 || offset+n > total {
			panic(trace.Errorf(op, "chunk [%d, %d) is not inside [0, %d)", offset, offset+n, total))
		}
		if n == 0 {
			return trace.Zeros(ir.Shape(shape), ir.Uint32)
		}
		y0, y1 := blocks(op, key, ir.Shape(shape), offset)
		return trace.Xor(y0, y1)
	}
	if total < 0 || total > maxCount || offset < 0 || offset+n > total {
		panic(trace.Errorf(op, "chunk [%d, %d) is not inside [0, %d) (at most %d values)", offset, offset+n, total, maxCount))
	}
	if n == 0 {
		return trace.Zeros(ir.Shape(shape), ir.Uint32)
	}
	h := (total + 1) / 2
	i := trace.Iota(ir.Uint32, ir.Shape{n}, 0)
	if offset != 0 {
		i = trace.Add(i, u32(float64(offset)))
	}
	// Element i is word 0 of the block on counters (i, i+h) when i < h, else
	// word 1 of the block on (i-h, i); the counter i+h = total is JAX's zero
	// padding of an odd count.
	second := trace.GreaterEqual(i, u32(float64(h)))
	j := trace.Where(second, trace.Sub(i, u32(float64(h))), i)
	x1 := trace.Add(j, u32(float64(h)))
	if total%2 == 1 {
		x1 = trace.Where(trace.Equal(x1, u32(float64(total))), u32(0), x1)
	}
	y0, y1 := Block(k0, k1, j, x1)
	return trace.Reshape(trace.Where(second, y1, y0), shape...)
}

// bits64 returns the 64-bit random words of jax.random.bits(key, shape,
// uint64) as an i64 array: hi<<32 | lo with (hi, lo) the block on counters
// (i, i+n) for element i of n (original layout), or on the counters of i
// (partitionable layout).
func bits64(key *trace.Array, shape []int) *trace.Array {
	const op = "random.bits64"
	n := size(op, shape)
	if Partitionable() {
		if n == 0 {
			keyWords(op, key)
			return trace.Zeros(ir.Shape(shape), ir.Int64)
		}
		hi, lo := blocks(op, key, ir.Shape(shape), 0)
		return trace.Or(trace.ShiftLeft(trace.Convert(hi, ir.Int64), trace.ScalarAs(32, ir.Int64)), trace.Convert(lo, ir.Int64))
	}
	k0, k1 := keyWords(op, key)
	if 2*n > maxCount {
		panic(trace.Errorf(op, "%d values need more than 2^32 counters", n))
	}
	if n == 0 {
		return trace.Zeros(ir.Shape(shape), ir.Int64)
	}
	i := trace.Iota(ir.Uint32, ir.Shape{n}, 0)
	hi, lo := Block(k0, k1, i, trace.Add(i, u32(float64(n))))
	w := trace.Or(trace.ShiftLeft(trace.Convert(hi, ir.Int64), trace.ScalarAs(32, ir.Int64)), trace.Convert(lo, ir.Int64))
	return trace.Reshape(w, shape...)
}

func checkFloat(op string, dt ir.DType) {
	if !dt.IsFloat() {
		panic(trace.Errorf(op, "dtype must be a float type, got %v", dt))
	}
}

// workDType is the dtype the generator computes in for dt: f64 for f64, f32
// otherwise (bf16 and f16 are converted at the end).
func workDType(dt ir.DType) ir.DType {
	if dt == ir.Float64 {
		return ir.Float64
	}
	return ir.Float32
}

// genDType is the dtype a distribution computes in for dt: dt itself for bf16
// and f16 (JAX's formulas run in the requested dtype), workDType otherwise.
func genDType(dt ir.DType) ir.DType {
	if dt == ir.BFloat16 || dt == ir.Float16 {
		return dt
	}
	return workDType(dt)
}

// narrowBits returns random words of width 8 or 16 (in the low bits of a u32
// array of the given shape), like jax.random's bits of uint8 or uint16: the
// low bits of Bits in the partitionable layout; in the original one the u32
// words of Bits(key, ceil(n·width/32)) cut into 32/width pieces, lowest
// first (JAX's bits.view(uint8 or uint16)).
func narrowBits(key *trace.Array, shape ir.Shape, width int) *trace.Array {
	mask := u32(float64(uint32(1)<<width - 1))
	if Partitionable() {
		return trace.And(Bits(key, shape...), mask)
	}
	n := size("random.narrowBits", shape)
	k := 32 / width
	m := (n + k - 1) / k
	if n == 0 {
		keyWords("random.narrowBits", key)
		return trace.Zeros(shape, ir.Uint32)
	}
	words := trace.BroadcastInDim(Bits(key, m), ir.Shape{m, k}, []int{0})
	shifts := trace.Mul(trace.Iota(ir.Uint32, ir.Shape{m, k}, 1), u32(float64(width)))
	pieces := trace.Reshape(trace.And(trace.ShiftRightLogical(words, shifts), mask), m*k)
	return trace.Reshape(trace.SliceAxis(pieces, 0, 0, n), shape...)
}

// unit returns floats uniform in [0, 1) of dtype f32 or f64 from the mantissa
// bits, as jax.random.uniform does before scaling.
func unit(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	if dt == ir.Float64 {
		b := trace.ShiftRightLogical(bits64(key, shape), trace.ScalarAs(12, ir.Int64))
		b = trace.Or(b, trace.ScalarAs(float64(0x3ff0000000000000), ir.Int64))
		return trace.Sub(trace.BitcastConvert(b, ir.Float64), trace.ScalarAs(1, ir.Float64))
	}
	one := func(b *trace.Array) *trace.Array {
		return trace.Sub(trace.BitcastConvert(trace.Or(b, u32(0x3f800000)), ir.Float32), trace.ScalarAs(1, ir.Float32))
	}
	switch dt {
	case ir.BFloat16:
		// JAX: 8 random bits (the low byte), the top 7 as the mantissa of a
		// bf16 in [1, 2). Built as the equal f32 and converted exactly.
		b := trace.ShiftRightLogical(narrowBits(key, shape, 8), u32(1))
		return trace.Convert(one(trace.ShiftLeft(b, u32(16))), dt)
	case ir.Float16:
		// JAX: 16 random bits (the low half), the top 10 as the mantissa.
		b := trace.ShiftRightLogical(narrowBits(key, shape, 16), u32(6))
		return trace.Convert(one(trace.ShiftLeft(b, u32(13))), dt)
	}
	return one(trace.ShiftRightLogical(Bits(key, shape...), u32(9)))
}

// uniformWork is Uniform computed in the working dtype w (f32 or f64).
func uniformWork(key *trace.Array, w ir.DType, shape ir.Shape, lo, hi float64) *trace.Array {
	f := unit(key, w, shape)
	// As JAX: the bounds are rounded to the dtype before hi - lo.
	l, h := trace.ScalarAs(lo, w), trace.ScalarAs(hi, w)
	f = trace.Add(trace.Mul(f, trace.Sub(h, l)), l)
	return trace.Maximum(f, l)
}

// Uniform returns values uniform in [lo, hi) of float dtype dt and the given
// shape, like jax.random.uniform (same values for f32, and for f64 with x64).
func Uniform(key *trace.Array, dt ir.DType, shape ir.Shape, lo, hi float64) *trace.Array {
	checkFloat("random.Uniform", dt)
	return trace.Convert(uniformWork(key, genDType(dt), shape, lo, hi), dt)
}

// Normal returns standard normal values of float dtype dt, like
// jax.random.normal: sqrt(2)·erfinv(u) for u uniform in (-1, 1), erfinv by
// Giles' polynomial (see ErfInv).
func Normal(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	checkFloat("random.Normal", dt)
	w := genDType(dt)
	u := uniformWork(key, w, shape, nextAfter(-1, 0, w), 1)
	return trace.Convert(trace.Mul(trace.ScalarAs(math.Sqrt2, w), ErfInv(u)), dt)
}

// TruncatedNormal returns standard normal values truncated to (lower, upper),
// like jax.random.truncated_normal: inverse-CDF sampling, sqrt(2)·erfinv(u)
// for u uniform in (erf(lower/√2), erf(upper/√2)), clipped strictly inside the
// bounds.
func TruncatedNormal(key *trace.Array, dt ir.DType, shape ir.Shape, lower, upper float64) *trace.Array {
	const op = "random.TruncatedNormal"
	checkFloat(op, dt)
	if !(lower < upper) {
		panic(trace.Errorf(op, "lower %v must be below upper %v", lower, upper))
	}
	w := genDType(dt)
	a := math.Erf(lower / math.Sqrt2)
	b := math.Erf(upper / math.Sqrt2)
	if w != workDType(dt) {
		// As JAX in a 16-bit dtype: the bounds, √2 and the quotient rounded
		// to it before erf, whose result rounds too.
		r := func(v float64) float64 { return roundTo(v, w) }
		a = r(math.Erf(r(r(lower) / r(math.Sqrt2))))
		b = r(math.Erf(r(r(upper) / r(math.Sqrt2))))
	}
	u := uniformWork(key, w, shape, a, b)
	out := trace.Mul(trace.ScalarAs(math.Sqrt2, w), ErfInv(u))
	// The bounds one ulp of the working dtype inwards (for bf16/f16 drawn in
	// f32, one f32 ulp: the value rounds to dt after the clip).
	lo := nextAfter(roundTo(lower, w), math.Inf(1), w)
	hi := nextAfter(roundTo(upper, w), math.Inf(-1), w)
	return trace.Convert(trace.Clip(out, trace.ScalarAs(lo, w), trace.ScalarAs(hi, w)), dt)
}

// ErfInv returns the inverse error function of x (f32 or f64; bf16 and f16 are
// computed in f32) by Giles' single-precision polynomial, as XLA's ErfInv for
// f32: erfinv(±1) = ±inf. In f64 two Newton steps on Erf refine it to about
// double precision.
func ErfInv(x *trace.Array) *trace.Array {
	dt := x.DType()
	checkFloat("random.ErfInv", dt)
	w := workDType(dt)
	if dt != w {
		return trace.Convert(ErfInv(trace.Convert(x, w)), dt)
	}
	c := func(v float64) *trace.Array { return trace.ScalarAs(v, w) }
	small := [9]float64{2.81022636e-08, 3.43273939e-07, -3.5233877e-06,
		-4.39150654e-06, 0.00021858087, -0.00125372503,
		-0.00417768164, 0.246640727, 1.50140941}
	large := [9]float64{-0.000200214257, 0.000100950558, 0.00134934322,
		-0.00367342844, 0.00573950773, -0.0076224613,
		0.00943887047, 1.00167406, 2.83297682}
	if w == ir.Float32 {
		for i := range small {
			small[i] = float64(float32(small[i]))
			large[i] = float64(float32(large[i]))
		}
	}
	ww := trace.Neg(trace.Log1p(trace.Neg(trace.Mul(x, x))))
	lt := trace.Less(ww, c(5))
	ww = trace.Where(lt, trace.Sub(ww, c(2.5)), trace.Sub(trace.Sqrt(ww), c(3)))
	coef := func(i int) *trace.Array { return trace.Where(lt, c(small[i]), c(large[i])) }
	p := coef(0)
	for i := 1; i < len(small); i++ {
		p = trace.Add(coef(i), trace.Mul(p, ww))
	}
	y := trace.Mul(p, x)
	if w == ir.Float64 {
		// Newton on erf(y) = x: y -= (erf(y) - x) / (2/√π · exp(-y²)).
		for range 2 {
			d := trace.Mul(c(2/math.SqrtPi), trace.Exp(trace.Neg(trace.Mul(y, y))))
			y = trace.Sub(y, trace.Div(trace.Sub(trace.Erf(y), x), d))
		}
	}
	one := trace.Equal(trace.Abs(x), c(1))
	return trace.Where(one, trace.Mul(x, c(math.Inf(1))), y)
}

// Bernoulli returns bool values that are true with probability p, like
// jax.random.bernoulli: Uniform(key, f32, shape, 0, 1) < p.
func Bernoulli(key *trace.Array, p float64, shape ir.Shape) *trace.Array {
	if math.IsNaN(p) {
		panic(trace.Errorf("random.Bernoulli", "p is NaN"))
	}
	return trace.Less(uniformWork(key, ir.Float32, shape, 0, 1), trace.ScalarAs(p, ir.Float32))
}

// Gumbel returns standard Gumbel values of float dtype dt, like
// jax.random.gumbel: -log(-log(u)) for u uniform in [tiny, 1).
func Gumbel(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	checkFloat("random.Gumbel", dt)
	w := genDType(dt)
	tiny := math.SmallestNonzeroFloat64 * (1 << 52) // smallest normal f64
	switch w {
	case ir.Float32, ir.BFloat16:
		tiny = float64(math.Float32frombits(0x00800000))
	case ir.Float16:
		tiny = math.Ldexp(1, -14)
	}
	u := uniformWork(key, w, shape, tiny, 1)
	return trace.Convert(trace.Neg(trace.Log(trace.Neg(trace.Log(u)))), dt)
}

// Categorical returns i32 indices along axis drawn with probabilities
// softmax(logits, axis), like jax.random.categorical: the arg max of
// logits + Gumbel noise. The result has logits' shape without axis.
func Categorical(key *trace.Array, logits *trace.Array, axis int) *trace.Array {
	const op = "random.Categorical"
	if logits == nil || logits.Rank() == 0 {
		panic(trace.Errorf(op, "logits must be an array of rank ≥ 1"))
	}
	checkFloat(op, logits.DType())
	w := genDType(logits.DType())
	g := Gumbel(key, w, logits.Shape())
	return trace.ArgMax(trace.Add(g, trace.Convert(logits, w)), axis)
}

// Permutation returns a random permutation of 0..n-1 as i32[n], like
// jax.random.permutation(key, n): JAX's shuffle, ceil(3·ln n / ln(2³²-1))
// rounds of a stable sort (trace.SortMulti) by random u32 keys from
// split(key): O(n log n) per round.
func Permutation(key *trace.Array, n int) *trace.Array {
	const op = "random.Permutation"
	if n < 0 {
		panic(trace.Errorf(op, "negative length %d", n))
	}
	if n > 1<<31-1 {
		panic(trace.Errorf(op, "n = %d is more than int32 indices reach", n))
	}
	keyWords(op, key)
	x := trace.Arange(n, ir.Int32)
	rounds := int(math.Ceil(3 * math.Log(float64(max(1, n))) / math.Log(maxCount)))
	for range rounds {
		ks := Split(key, 2)
		var sub *trace.Array
		key, sub = trace.Index(ks, 0), trace.Index(ks, 1)
		// A stable sort of x by fresh random bits, as JAX's _shuffle does.
		x = trace.SortMulti([]*trace.Array{Bits(sub, n), x}, 0, 1)[1]
	}
	return x
}
