package nn

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// KVCache is the keys and values a decoder has computed for the positions
// decoded so far, for every layer: K and V are [L, B, MaxLen, KVHeads,
// HeadDim], the key/value layout of DotProductAttention ([B, S, K, H])
// stacked on the layer axis of a TransformerStack, so that the stack's scan
// takes one layer's cache per step. Position p of batch row b in layer l is
// K[l, b, p]; positions not written yet hold anything (they are masked).
//
// A KVCache is a tree of arrays: it goes into and comes out of a jitted
// decode step, where it is donated (rt.Donate) so that the step's result
// reuses its buffers and memory stays flat as tokens are decoded. Its shape
// is fixed by MaxLen, so the step compiles once whatever the position.
type KVCache struct {
	K, V *trace.Array // [L, B, MaxLen, KVHeads, HeadDim]
}

// NewKVCache returns a zero cache of dtype dt for layers layers, batch rows
// and maxLen positions of kvHeads heads of headDim features.
func NewKVCache(dt ir.DType, layers, batch, maxLen, kvHeads, headDim int) KVCache {
	if layers <= 0 || batch <= 0 || maxLen <= 0 || kvHeads <= 0 || headDim <= 0 {
		panic(trace.Errorf("nn.NewKVCache", "layers=%d, batch=%d, maxLen=%d, kvHeads=%d, headDim=%d must be positive", layers, batch, maxLen, kvHeads, headDim))
	}
	s := ir.Shape{layers, batch, maxLen, kvHeads, headDim}
	return KVCache{K: trace.Zeros(s, dt), V: trace.Zeros(s, dt)}
}

// MaxLen returns the number of positions the cache holds.
func (c KVCache) MaxLen() int { return c.K.Shape()[2] }

// Batch returns the number of batch rows of the cache.
func (c KVCache) Batch() int { return c.K.Shape()[1] }

// headDims returns a's key/value heads and head size, checking that its
// projections agree with Heads and KVHeads.
func (a SelfAttention) headDims(op string) (kvh, hd int) {
	if a.Q.W == nil || a.K.W == nil || a.V.W == nil || a.O.W == nil {
		panic(trace.Errorf(op, "the Q, K, V and O projections need weights"))
	}
	kvh = a.KVHeads
	if kvh == 0 {
		kvh = a.Heads
	}
	qo := a.Q.Out()
	if a.Heads <= 0 || qo%a.Heads != 0 {
		panic(trace.Errorf(op, "Q has %d outputs, not a multiple of Heads=%d", qo, a.Heads))
	}
	hd = qo / a.Heads
	if a.K.Out() != kvh*hd || a.V.Out() != kvh*hd {
		panic(trace.Errorf(op, "K and V have %d and %d outputs, want KVHeads·head size = %d·%d", a.K.Out(), a.V.Out(), kvh, hd))
	}
	return kvh, hd
}

// cachePos checks a decode position: an integer scalar (every row at the
// same position) or a vector [batch] (one position per row), returned as
// int32.
func cachePos(op string, pos *trace.Array, batch int) *trace.Array {
	if pos == nil || !pos.DType().IsInteger() || !(pos.Rank() == 0 || pos.Rank() == 1 && pos.Shape()[0] == batch) {
		panic(trace.Errorf(op, "pos must be an integer scalar or vector [%d], got %v", batch, pos))
	}
	return trace.Convert(pos, ir.Int32)
}

// cachePositions returns the positions pos+t of T tokens: [T] for a scalar
// pos, [B, T] for a vector pos [B].
func cachePositions(pos *trace.Array, T int) *trace.Array {
	if pos.Rank() == 0 {
		return trace.Add(trace.Iota(ir.Int32, ir.Shape{T}, 0), pos)
	}
	B := pos.Shape()[0]
	return trace.Add(trace.Iota(ir.Int32, ir.Shape{B, T}, 1), trace.Reshape(pos, B, 1))
}

// cacheMask returns the attention mask of T queries at positions pos+t over
// the S cached keys followed by their own T keys: query t sees cached key s
// when s < pos (of its row) and new key j when j ≤ t. It is [1, 1, T, S+T]
// for a scalar pos and [B, 1, T, S+T] for a vector pos [B].
func cacheMask(pos *trace.Array, T, S int) *trace.Array {
	causal := trace.LessEqual(trace.Iota(ir.Int32, ir.Shape{T, T}, 1), trace.Iota(ir.Int32, ir.Shape{T, T}, 0))
	if pos.Rank() == 0 {
		old := trace.Less(trace.Iota(ir.Int32, ir.Shape{T, S}, 1), pos)
		return trace.Reshape(trace.Concatenate(1, old, causal), 1, 1, T, S+T)
	}
	B := pos.Shape()[0]
	old := trace.Less(trace.Iota(ir.Int32, ir.Shape{B, T, S}, 2), trace.Reshape(pos, B, 1, 1))
	mask := trace.Concatenate(2, old, trace.BroadcastTo(trace.Reshape(causal, 1, T, T), B, T, T))
	return trace.Reshape(mask, B, 1, T, S+T)
}

// ApplyCached attends x [B, T, D], the tokens at positions pos, pos+1, …,
// pos+T−1 (pos an integer scalar, traced or not, or a vector [B] of one
// position per row), to themselves and to the earlier positions 0 … pos−1
// (of their row) held in the layer's cache k, v [B, MaxLen,
// KVHeads, HeadDim]. It returns the result [B, T, D] and x's keys and
// values kn, vn [B, T, KVHeads, HeadDim], which the caller writes into the
// cache at pos (TransformerStack.ApplyCached does, with one
// DynamicUpdateSlice for all layers). Query t sees the cached keys below
// pos and x's keys up to t: cached positions from pos on are masked, so
// what the cache holds there does not matter. Rotary embeddings rotate
// queries and keys by their positions pos+t. With T = 1 this is one
// decoding step; with pos = 0 and the whole prompt, the prefill. The result
// equals Apply on the whole sequence at those positions. A's Causal flag is
// implied (the mask is causal); a Context's padding, mask and bias do not
// apply.
func (a SelfAttention) ApplyCached(x, pos, k, v *trace.Array) (y, kn, vn *trace.Array) {
	const op = "nn.SelfAttention.ApplyCached"
	if x == nil || x.Rank() != 3 {
		panic(trace.Errorf(op, "x must be [batch, t, d], got %v", x))
	}
	kvh, hd := a.headDims(op)
	sh := x.Shape()
	B, T := sh[0], sh[1]
	pos = cachePos(op, pos, B)
	for _, c := range []*trace.Array{k, v} {
		if c == nil || c.Rank() != 4 || c.Shape()[0] != B || c.Shape()[2] != kvh || c.Shape()[3] != hd {
			panic(trace.Errorf(op, "the cache must be [%d, maxLen, %d, %d], got %v", B, kvh, hd, c))
		}
	}
	S := k.Shape()[1]
	positions := cachePositions(pos, T)
	q := trace.Reshape(a.Q.Apply(x), B, T, a.Heads, hd)
	kn = a.RoPE.Apply(trace.Reshape(a.K.Apply(x), B, T, kvh, hd), positions)
	vn = trace.Reshape(a.V.Apply(x), B, T, kvh, hd)
	q = a.RoPE.Apply(q, positions)
	// The keys are the cache's S positions followed by x's T.
	mask := cacheMask(pos, T, S)
	dt := x.DType()
	keys := trace.Concatenate(1, trace.Convert(k, dt), kn)
	values := trace.Concatenate(1, trace.Convert(v, dt), vn)
	o := DotProductAttention(q, keys, values, AttentionOptions{Mask: mask, Scale: a.Scale})
	return a.O.Apply(trace.Reshape(o, B, T, a.Heads*hd)), kn, vn
}

// ApplyCached runs the block on x [B, T, D] at positions pos … pos+T−1 with
// its attention over the layer's cache k, v (SelfAttention.ApplyCached),
// returning the result and x's keys and values, to be written into the
// cache at pos.
func (b TransformerBlock) ApplyCached(x, pos, k, v *trace.Array) (y, kn, vn *trace.Array) {
	if b.AttnNorm == nil || b.MLPNorm == nil || b.MLP == nil {
		panic(trace.Errorf("nn.TransformerBlock.ApplyCached", "AttnNorm, MLPNorm and MLP must be set"))
	}
	var a *trace.Array
	switch b.Placement {
	case PreNorm:
		a, kn, vn = b.Attn.ApplyCached(b.AttnNorm.Apply(x), pos, k, v)
		x = trace.Add(x, a)
		return trace.Add(x, b.MLP.Apply(b.MLPNorm.Apply(x))), kn, vn
	case PostNorm:
		a, kn, vn = b.Attn.ApplyCached(x, pos, k, v)
		x = b.AttnNorm.Apply(trace.Add(x, a))
		return b.MLPNorm.Apply(trace.Add(x, b.MLP.Apply(x))), kn, vn
	case ParallelResidual:
		a, kn, vn = b.Attn.ApplyCached(b.AttnNorm.Apply(x), pos, k, v)
		return trace.Add(trace.Add(x, a), b.MLP.Apply(b.MLPNorm.Apply(x))), kn, vn
	}
	panic(trace.Errorf("nn.TransformerBlock.ApplyCached", "unknown placement %v", b.Placement))
}

// cacheLayer is one scan step's inputs of TransformerStack.ApplyCached: the
// layer's block and its cache.
type cacheLayer struct {
	Block TransformerBlock
	K, V  *trace.Array
}

// layerKV is one layer's new keys and values, stacked by the scan.
type layerKV struct {
	K, V *trace.Array
}

// NewKVCache returns a zero cache for the stack's layers, batch rows and
// maxLen positions, in the dtype of its parameters.
func (s TransformerStack) NewKVCache(batch, maxLen int) KVCache {
	a := s.Blocks.Attn
	if a.Q.W == nil || a.K.W == nil || a.Q.W.Rank() != 3 || a.K.W.Rank() != 3 {
		panic(trace.Errorf("nn.TransformerStack.NewKVCache", "the stack needs stacked Q and K weights [L, ...], got %v, %v", a.Q.W, a.K.W))
	}
	out := func(l Linear) int { // the out features of a stacked [L, in, out] or [L, out, in] weight
		if l.Layout == LayoutOutIn {
			return l.W.Shape()[1]
		}
		return l.W.Shape()[2]
	}
	kvh := a.KVHeads
	if kvh == 0 {
		kvh = a.Heads
	}
	if a.Heads <= 0 || out(a.Q)%a.Heads != 0 {
		panic(trace.Errorf("nn.TransformerStack.NewKVCache", "Q has %d outputs, not a multiple of Heads=%d", out(a.Q), a.Heads))
	}
	return NewKVCache(a.K.W.DType(), s.Layers(), batch, maxLen, kvh, out(a.Q)/a.Heads)
}

// ApplyCached runs the L blocks on x [B, T, D] at positions pos … pos+T−1
// (pos an integer scalar, or a vector [B] of one position per row), each
// attending over its layer of cache (TransformerBlock.ApplyCached), with one
// scan step per layer that reads the cache; then it writes every layer's new
// keys and values into the cache at pos, after the last read, with
// DynamicUpdateSlice (one each for K and V, or one per row with a vector
// pos), so that a donated cache is updated in place. It returns the result
// and the updated cache. pos+T must be at most the cache's MaxLen
// (DynamicUpdateSlice would clamp the write).
func (s TransformerStack) ApplyCached(x, pos *trace.Array, cache KVCache) (*trace.Array, KVCache) {
	const op = "nn.TransformerStack.ApplyCached"
	if x == nil || x.Rank() != 3 {
		panic(trace.Errorf(op, "x must be [batch, t, d], got %v", x))
	}
	if cache.K == nil || cache.V == nil || cache.K.Rank() != 5 || cache.K.Shape()[0] != s.Layers() || cache.K.Shape()[2] < x.Shape()[1] {
		panic(trace.Errorf(op, "the cache must be [%d, B, maxLen ≥ %d, kvHeads, headDim], got %v", s.Layers(), x.Shape()[1], cache.K))
	}
	B := x.Shape()[0]
	pos = cachePos(op, pos, B)
	y, kv := trace.ScanTree(func(x *trace.Array, l cacheLayer) (*trace.Array, layerKV) {
		y, k, v := l.Block.ApplyCached(x, pos, l.K, l.V)
		return y, layerKV{K: k, V: v}
	}, x, cacheLayer{Block: s.Blocks, K: cache.K, V: cache.V})
	zero := trace.ScalarAs(0, ir.Int32)
	nk, nv := trace.Convert(kv.K, cache.K.DType()), trace.Convert(kv.V, cache.V.DType())
	if pos.Rank() == 0 {
		at := []*trace.Array{zero, zero, pos, zero, zero}
		return y, KVCache{K: trace.DynamicUpdateSlice(cache.K, nk, at), V: trace.DynamicUpdateSlice(cache.V, nv, at)}
	}
	k, v := cache.K, cache.V
	for b := range B {
		at := []*trace.Array{zero, trace.ScalarAs(float64(b), ir.Int32), trace.Reshape(trace.SliceAxis(pos, 0, b, b+1)), zero, zero}
		k = trace.DynamicUpdateSlice(k, trace.SliceAxis(nk, 1, b, b+1), at)
		v = trace.DynamicUpdateSlice(v, trace.SliceAxis(nv, 1, b, b+1), at)
	}
	return y, KVCache{K: k, V: v}
}

// NewKVCache returns a zero cache for batch rows and maxLen positions (at
// most MaxPositions).
func (m GPT2) NewKVCache(batch, maxLen int) KVCache {
	if max := m.Pos.Table.Shape()[0]; maxLen > max {
		panic(trace.Errorf("nn.GPT2.NewKVCache", "maxLen %d is beyond the model's %d positions", maxLen, max))
	}
	return m.Blocks.NewKVCache(batch, maxLen)
}

// LogitsCached returns the next-token logits [B, T, Vocab] of ids [B, T]
// (int32) at positions pos … pos+T−1 (pos an int32 scalar, or a vector [B]
// of one position per row), attending over the earlier positions in cache, and the cache with ids' keys and values
// written in. The logits equal Logits' at those positions of the whole
// sequence.
func (m GPT2) LogitsCached(ids, pos *trace.Array, cache KVCache) (*trace.Array, KVCache) {
	const op = "nn.GPT2.LogitsCached"
	if ids == nil || ids.Rank() != 2 {
		panic(trace.Errorf(op, "ids must be [batch, t], got %v", ids))
	}
	pos = cachePos(op, pos, ids.Shape()[0])
	positions := cachePositions(pos, ids.Shape()[1])
	x := trace.Add(m.Tok.Apply(ids), m.Pos.Apply(positions))
	x, cache = m.Blocks.ApplyCached(x, pos, cache)
	return m.Tok.Attend(m.Norm.Apply(x)), cache
}

// NewKVCache returns a zero cache for batch rows and maxLen positions.
func (m Llama) NewKVCache(batch, maxLen int) KVCache { return m.Blocks.NewKVCache(batch, maxLen) }

// LogitsCached returns the next-token logits [B, T, Vocab] of ids [B, T]
// (int32) at positions pos … pos+T−1 (pos an int32 scalar, or a vector [B]
// of one position per row; the rotary positions), attending over the earlier positions in cache, and the cache
// with ids' keys and values written in. The logits equal Logits' at those
// positions of the whole sequence.
func (m Llama) LogitsCached(ids, pos *trace.Array, cache KVCache) (*trace.Array, KVCache) {
	if ids == nil || ids.Rank() != 2 {
		panic(trace.Errorf("nn.Llama.LogitsCached", "ids must be [batch, t], got %v", ids))
	}
	x, cache := m.Blocks.ApplyCached(m.Embed.Apply(ids), pos, cache)
	x = m.Norm.Apply(x)
	if m.LMHead.W == nil {
		return m.Embed.Attend(x), cache
	}
	return m.LMHead.Apply(x), cache
}

// GPT2 returns m as the GPT2 it is: the same embeddings, blocks (pre-norm,
// causal attention without biases, the MLP with its biases and GELU) and
// final norm, sharing m's arrays. It gives a TransformerLM GPT2's KV-cache
// decoding (LogitsCached) and Generate.
func (m TransformerLM) GPT2() GPT2 {
	b := m.Blocks.Blocks
	return GPT2{
		Tok: m.Tok,
		Pos: Embedding{Table: m.Pos},
		Blocks: TransformerStack{Blocks: TransformerBlock{
			AttnNorm: b.LN1,
			Attn: SelfAttention{
				Q: Linear{W: b.Attn.Wq}, K: Linear{W: b.Attn.Wk}, V: Linear{W: b.Attn.Wv}, O: Linear{W: b.Attn.Wo},
				Heads: b.Attn.Heads, Causal: true,
			},
			MLPNorm:   b.LN2,
			MLP:       b.MLP,
			Placement: PreNorm,
		}},
		Norm: m.Norm,
	}
}
