package nn

import (
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// AttentionOptions are the optional arguments of DotProductAttention, named
// after jax.nn.dot_product_attention's. The zero value is plain softmax
// attention with scale 1/√H.
type AttentionOptions struct {
	// Bias is added to the logits before masking and the softmax; it
	// broadcasts to [B, N, T, S] (NumPy rules: missing leading axes are 1).
	Bias *trace.Array
	// Mask is a bool array broadcastable to [B, N, T, S]: true where query t
	// may attend key s. A padding mask over keys is [B, 1, 1, S].
	Mask *trace.Array
	// Scale multiplies the logits; 0 means 1/√H.
	Scale float64
	// IsCausal masks key s for query t when s > t: the lower triangle of
	// [T, S] aligned at the top left, as JAX (for T < S a query sees the
	// first keys, not the last; pass a Mask for a KV cache).
	IsCausal bool
	// QuerySeqLengths (int32 [B]) masks queries t ≥ length; their rows see
	// no key, so their outputs are the mean of the values, as in JAX.
	QuerySeqLengths *trace.Array
	// KeyValueSeqLengths (int32 [B]) masks keys s ≥ length: padding.
	KeyValueSeqLengths *trace.Array
	// BlockSize > 0 computes the attention over blocks of BlockSize keys with
	// an online softmax (a scan over key blocks), so the logits of only one
	// block, [B, N, T, BlockSize], exist at a time instead of [B, N, T, S].
	// S must be a multiple of BlockSize. The result equals the plain
	// computation up to rounding. Under autodiff each block's step is
	// rematerialised, so the backward pass keeps no block's logits; it
	// keeps each step's running output ([B, T, N, Hv] per block of keys).
	BlockSize int
}

// maskedLogit is the value masked logits take: -0.7 times the largest finite
// value of the logits' dtype, as jax.nn.dot_product_attention. It is finite,
// so a row whose keys are all masked gets uniform weights, not NaN.
func maskedLogit(dt ir.DType) float64 {
	if dt == ir.Float64 {
		return -0.7 * math.MaxFloat64
	}
	return -0.7 * math.MaxFloat32
}

// DotProductAttention is jax.nn.dot_product_attention: softmax(scale·q·kᵀ +
// bias, masked)·v for
//
//	query [B, T, N, H], key [B, S, K, H], value [B, S, K, Hv] → [B, T, N, Hv]
//
// (or the same without the batch axis B). N must be a multiple of K: with
// K < N (grouped-query or multi-query attention) each key/value head serves
// G = N/K consecutive query heads, query head n using key head n/G, which is
// jnp.repeat(key, G, axis=-2) and Hugging Face's repeat_kv. q, k and v share
// a float dtype. For bf16 and f16 inputs the logits (q·kᵀ), the bias, the
// masking and the softmax are computed in f32, and the probabilities are
// rounded to the values' dtype for the product with v; the result has q's
// dtype. Masked logits are set to -0.7 times the largest finite f32, as JAX
// does, so fully masked rows average the values instead of giving NaN.
// Differentiable with respect to q, k, v and Bias.
func DotProductAttention(query, key, value *trace.Array, opts AttentionOptions) *trace.Array {
	const op = "nn.DotProductAttention"
	if query == nil || key == nil || value == nil {
		panic(trace.Errorf(op, "query, key and value must not be nil"))
	}
	r := query.Rank()
	if r != 3 && r != 4 || key.Rank() != r || value.Rank() != r {
		panic(trace.Errorf(op, "query, key and value must all be [B, T, N, H] or all [T, N, H], got %v, %v, %v", query.Type(), key.Type(), value.Type()))
	}
	dt := query.DType()
	if !dt.IsFloat() || key.DType() != dt || value.DType() != dt {
		panic(trace.Errorf(op, "query, key and value must share a float dtype, got %v, %v, %v", query.Type(), key.Type(), value.Type()))
	}
	if r == 3 {
		q := trace.ExpandDims(query, 0)
		k := trace.ExpandDims(key, 0)
		v := trace.ExpandDims(value, 0)
		return trace.Squeeze(DotProductAttention(q, k, v, opts), 0)
	}
	qs, ks, vs := query.Shape(), key.Shape(), value.Shape()
	B, T, N, H := qs[0], qs[1], qs[2], qs[3]
	S, K := ks[1], ks[2]
	if ks[0] != B || vs[0] != B || vs[1] != S || vs[2] != K || ks[3] != H {
		panic(trace.Errorf(op, "shapes do not match: query %v [B, T, N, H], key %v [B, S, K, H], value %v [B, S, K, Hv]", query.Type(), key.Type(), value.Type()))
	}
	if K == 0 || N%K != 0 {
		panic(trace.Errorf(op, "the %d query heads are not a multiple of the %d key/value heads", N, K))
	}
	G := N / K
	scale := opts.Scale
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(H))
	}
	if math.IsNaN(scale) || math.IsInf(scale, 0) {
		panic(trace.Errorf(op, "Scale %v is not finite", scale))
	}
	w := workDType(dt)
	a := attnPlan{B: B, T: T, S: S, N: N, K: K, G: G, w: w}
	// Logits, bias and mask live in the layout [B, K, T, G, S], the natural
	// output of the grouped dot_general (batch B, K; free T, G; free S), so
	// no transpose of a [.., T, S] array is needed.
	if opts.Bias != nil {
		if !opts.Bias.DType().IsFloat() {
			panic(trace.Errorf(op, "Bias must be a float array, got %v", opts.Bias.Type()))
		}
		a.bias = a.grouped(op, "Bias", trace.Convert(opts.Bias, w))
	}
	var masks []*trace.Array
	if opts.Mask != nil {
		if opts.Mask.DType() != ir.Bool {
			panic(trace.Errorf(op, "Mask must be bool, got %v", opts.Mask.Type()))
		}
		masks = append(masks, a.grouped(op, "Mask", opts.Mask))
	}
	if opts.QuerySeqLengths != nil {
		l := a.lengths(op, "QuerySeqLengths", opts.QuerySeqLengths)
		m := trace.Less(trace.Iota(ir.Int32, ir.Shape{B, T}, 1), trace.ExpandDims(l, 1))
		masks = append(masks, trace.Reshape(m, B, 1, T, 1, 1))
	}
	if opts.KeyValueSeqLengths != nil {
		a.kvLen = a.lengths(op, "KeyValueSeqLengths", opts.KeyValueSeqLengths)
	}
	a.causal = opts.IsCausal
	if len(masks) > 0 {
		m := masks[0]
		for _, o := range masks[1:] {
			m = trace.And(m, o)
		}
		a.mask = m
	}
	q := trace.Reshape(trace.Convert(query, w), B, T, K, G, H)
	q = trace.Mul(q, trace.ScalarAs(scale, w))
	k := trace.Convert(key, w)
	var o *trace.Array // [B, K, T, G, Hv]
	if opts.BlockSize > 0 {
		if S%opts.BlockSize != 0 {
			panic(trace.Errorf(op, "BlockSize %d does not divide the %d keys", opts.BlockSize, S))
		}
		o = a.blocked(q, k, value, opts.BlockSize)
	} else {
		o = a.plain(q, k, value)
	}
	o = trace.Transpose(o, 0, 2, 1, 3, 4)
	return trace.Convert(trace.Reshape(o, B, T, N, vs[3]), dt)
}

// attnPlan is one DotProductAttention call's sizes and masks in the grouped
// layout [B, K, T, G, S].
type attnPlan struct {
	B, T, S, N, K, G int
	w                ir.DType
	bias, mask       *trace.Array // grouped, or nil
	kvLen            *trace.Array // int32 [B], or nil
	causal           bool
}

// lengths checks a [B] integer array of sequence lengths and returns it as
// int32.
func (a attnPlan) lengths(op, name string, l *trace.Array) *trace.Array {
	if l.Rank() != 1 || l.Shape()[0] != a.B || !l.DType().IsInteger() {
		panic(trace.Errorf(op, "%s must be an integer array [%d], got %v", name, a.B, l.Type()))
	}
	return trace.Convert(l, ir.Int32)
}

// grouped reshapes x, broadcastable to [B, N, T, S], to the grouped layout
// [B|1, K|1, T|1, G|1, S|1].
func (a attnPlan) grouped(op, name string, x *trace.Array) *trace.Array {
	if x.Rank() > 4 {
		panic(trace.Errorf(op, "%s %v is not broadcastable to [B, N, T, S] = [%d, %d, %d, %d]", name, x.Type(), a.B, a.N, a.T, a.S))
	}
	s := make([]int, 4)
	for i := range s {
		s[i] = 1
	}
	copy(s[4-x.Rank():], x.Shape())
	for i, full := range []int{a.B, a.N, a.T, a.S} {
		if s[i] != 1 && s[i] != full {
			panic(trace.Errorf(op, "%s %v is not broadcastable to [B, N, T, S] = [%d, %d, %d, %d]", name, x.Type(), a.B, a.N, a.T, a.S))
		}
	}
	if s[1] == 1 {
		return trace.Reshape(x, s[0], 1, s[2], 1, s[3])
	}
	x = trace.Reshape(x, s[0], a.K, a.G, s[2], s[3])
	return trace.Transpose(x, 0, 1, 3, 2, 4)
}

// logits returns the masked logits [B, K, T, G, s] of q [B, T, K, G, H]
// (already scaled) against the keys k [B, s, K, H] at positions
// start..start+s. bias and mask are the grouped bias and mask sliced to those
// keys (or nil).
func (a attnPlan) logits(q, k, bias, mask, start *trace.Array) *trace.Array {
	s := trace.DotGeneral(q, k, []int{0, 2}, []int{0, 2}, []int{4}, []int{3})
	if bias != nil {
		s = trace.Add(s, bias)
	}
	sb := k.Shape()[1]
	if a.causal || a.kvLen != nil {
		pos := trace.Iota(ir.Int32, ir.Shape{sb}, 0)
		if start != nil {
			pos = trace.Add(pos, start)
		}
		if a.causal {
			c := trace.LessEqual(trace.Reshape(pos, 1, sb), trace.Iota(ir.Int32, ir.Shape{a.T, 1}, 0))
			c = trace.Reshape(c, 1, 1, a.T, 1, sb)
			mask = andMask(mask, c)
		}
		if a.kvLen != nil {
			l := trace.Less(trace.Reshape(pos, 1, sb), trace.ExpandDims(a.kvLen, 1))
			mask = andMask(mask, trace.Reshape(l, a.B, 1, 1, 1, sb))
		}
	}
	if mask != nil {
		s = trace.Where(mask, s, trace.ScalarAs(maskedLogit(a.w), a.w))
	}
	return s
}

func andMask(m, o *trace.Array) *trace.Array {
	if m == nil {
		return o
	}
	return trace.And(m, o)
}

// pv is the product of probabilities p [B, K, T, G, s] and values
// v [B, s, K, Hv]: [B, K, T, G, Hv].
func pv(p, v *trace.Array) *trace.Array {
	return trace.DotGeneral(p, v, []int{0, 1}, []int{0, 2}, []int{4}, []int{1})
}

// plain computes the attention with the whole [B, K, T, G, S] logits.
func (a attnPlan) plain(q, k, v *trace.Array) *trace.Array {
	s := a.logits(q, k, a.bias, a.mask, nil)
	p := trace.Convert(trace.Softmax(s, 4), v.DType())
	return pv(p, v)
}

// sliceKeys returns x's block of bs keys at start along axis (x's size there
// may be 1, a broadcast axis, which is returned as it is).
func sliceKeys(x *trace.Array, axis int, start *trace.Array, bs int) *trace.Array {
	if x == nil || x.Shape()[axis] == 1 {
		return x
	}
	starts := make([]*trace.Array, x.Rank())
	sizes := x.Shape().Clone()
	for i := range starts {
		starts[i] = trace.ScalarInt(0)
	}
	starts[axis] = start
	sizes[axis] = bs
	return trace.DynamicSlice(x, starts, sizes)
}

// blocked computes the attention one block of bs keys at a time with the
// online softmax (running max m, running sum l, running output acc), as
// FlashAttention: acc and l are rescaled by exp(m_old − m_new) when a block
// raises the maximum. m starts at the masked logit, so a block whose keys are
// all masked weighs in only until a block with a larger logit wipes it out,
// exactly as masked keys do in the plain softmax. Each block's step is
// rematerialised.
func (a attnPlan) blocked(q, k, v *trace.Array, bs int) *trace.Array {
	w := a.w
	nb := a.S / bs
	hv := v.Shape()[3]
	bias, mask := a.bias, a.mask
	step := func(args []*trace.Array) []*trace.Array {
		q, k, v, m, l, acc, i := args[0], args[1], args[2], args[3], args[4], args[5], args[6]
		start := trace.Mul(i, trace.ScalarInt(bs))
		kb := sliceKeys(k, 1, start, bs)
		vb := sliceKeys(v, 1, start, bs)
		var bb, mb *trace.Array
		extra := args[7:]
		if bias != nil {
			bb, extra = sliceKeys(extra[0], 4, start, bs), extra[1:]
		}
		if mask != nil {
			mb = sliceKeys(extra[0], 4, start, bs)
		}
		s := a.logits(q, kb, bb, mb, start)
		mNew := trace.StopGradient(trace.Maximum(m, trace.MaxKeepDims(s, 4)))
		corr := trace.Exp(trace.Sub(m, mNew))
		p := trace.Exp(trace.Sub(s, mNew))
		l = trace.Add(trace.Mul(l, corr), trace.SumKeepDims(p, 4))
		acc = trace.Add(trace.Mul(acc, corr), trace.Convert(pv(trace.Convert(p, v.DType()), vb), w))
		return []*trace.Array{mNew, l, acc}
	}
	remat := trace.Checkpoint(step, trace.NothingSaveable)
	consts := []*trace.Array{}
	if bias != nil {
		consts = append(consts, bias)
	}
	if mask != nil {
		consts = append(consts, mask)
	}
	shape := ir.Shape{a.B, a.K, a.T, a.G, 1}
	init := []*trace.Array{
		trace.Full(shape, maskedLogit(w), w),
		trace.Zeros(shape, w),
		trace.Zeros(ir.Shape{a.B, a.K, a.T, a.G, hv}, w),
	}
	carry, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
		args := append([]*trace.Array{q, k, v, c[0], c[1], c[2], x[0]}, consts...)
		return remat(args...), nil
	}, init, []*trace.Array{trace.Arange(nb, ir.Int32)})
	return trace.Div(carry[2], carry[1])
}
