package nn

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// Context is what every layer of a sequence model sees beside its input:
// which tokens are padding, an extra mask or bias, and the token positions.
// All fields are optional.
type Context struct {
	// Padding [B, S] marks real tokens: bool true, or a nonzero integer
	// (Hugging Face's attention_mask as it comes). Keys that are padding are
	// masked for every query.
	Padding *trace.Array
	// Mask is a bool array broadcastable to [B, heads, T, S], true where
	// attention is allowed, combined with Padding and the causal mask.
	Mask *trace.Array
	// Bias is added to the attention logits; broadcastable to
	// [B, heads, T, S] (ALiBi, relative position biases).
	Bias *trace.Array
	// Positions (integers [T] or [B, T]) are the positions rotary
	// embeddings use; nil means 0, 1, …, T−1. With left padding, pass the
	// positions of the real tokens (a cumulative sum of Padding, minus 1).
	Positions *trace.Array
}

// attentionMask returns ctx's Padding and Mask as one bool mask
// broadcastable to [B, heads, T, S], or nil.
func (ctx Context) attentionMask(op string, B, S int) *trace.Array {
	m := ctx.Mask
	if p := ctx.Padding; p != nil {
		if p.Rank() != 2 || p.Shape()[0] != B || p.Shape()[1] != S {
			panic(trace.Errorf(op, "Padding must be [%d, %d] (batch, keys), got %v", B, S, p.Type()))
		}
		if p.DType() != ir.Bool {
			p = trace.NotEqual(p, trace.ZerosLike(p))
		}
		p = trace.Reshape(p, B, 1, 1, S)
		if m == nil {
			m = p
		} else {
			m = trace.And(m, p)
		}
	}
	return m
}

// SelfAttention is multi-head self-attention with the options pretrained
// models need: biases on any projection (a Linear's B), grouped-query
// attention (KVHeads < Heads), a causal mask, rotary position embeddings,
// and padding masks from the Context. The projections may hold PyTorch's
// [out, in] weights (Linear.Layout). Queries are x·Q split into Heads heads
// of size Q.Out()/Heads, keys and values x·K and x·V into KVHeads heads of
// the same size; the attention is DotProductAttention; O projects the heads
// back.
type SelfAttention struct {
	Q, K, V, O Linear
	Heads      int     // static: query heads
	KVHeads    int     // static: key/value heads; 0 means Heads
	Causal     bool    // static: each token attends to itself and earlier tokens
	RoPE       RoPE    // static: rotary embedding of queries and keys (none by default)
	Scale      float64 // static: logits scale; 0 means 1/√(head size)
	// BlockSize > 0 computes the attention blockwise over keys
	// (AttentionOptions.BlockSize); S must be a multiple of it.
	BlockSize int // static
}

// AttentionConfig describes a SelfAttention for NewSelfAttention.
type AttentionConfig struct {
	D       int // model width (input and output features)
	Heads   int // query heads
	KVHeads int // key/value heads; 0 means Heads
	HeadDim int // features per head; 0 means D/Heads
	// QKVBias gives the query, key and value projections biases (BERT,
	// GPT-2, Qwen2); OutBias gives the output projection one (BERT, GPT-2).
	QKVBias, OutBias bool
	Causal           bool
	RoPE             RoPE
	Layout           LinearLayout // of the four weights
	// Init initialises the weights; nil means NormalInit(0.02), the
	// initializer_range of BERT, GPT-2 and Llama. Biases start at zero.
	Init Initializer
}

func (c AttentionConfig) init() Initializer {
	if c.Init == nil {
		return NormalInit(0.02)
	}
	return c.Init
}

func (c AttentionConfig) dims(op string) (kv, hd int) {
	kv, hd = c.KVHeads, c.HeadDim
	if kv == 0 {
		kv = c.Heads
	}
	if c.D <= 0 || c.Heads <= 0 || kv <= 0 || c.Heads%kv != 0 {
		panic(trace.Errorf(op, "D=%d, Heads=%d, KVHeads=%d: need positive sizes and Heads a multiple of KVHeads", c.D, c.Heads, kv))
	}
	if hd == 0 {
		if c.D%c.Heads != 0 {
			panic(trace.Errorf(op, "D=%d is not a multiple of Heads=%d (set HeadDim)", c.D, c.Heads))
		}
		hd = c.D / c.Heads
	}
	return kv, hd
}

// NewSelfAttention returns a SelfAttention of dtype dt as c describes.
func NewSelfAttention(key *trace.Array, dt ir.DType, c AttentionConfig) SelfAttention {
	kv, hd := c.dims("nn.NewSelfAttention")
	ks := random.Keys(key, 4)
	bias := func(on bool) Initializer {
		if on {
			return Zeros
		}
		return nil
	}
	w := c.init()
	return SelfAttention{
		Q:       NewLinearLayout(ks[0], dt, c.D, c.Heads*hd, c.Layout, w, bias(c.QKVBias)),
		K:       NewLinearLayout(ks[1], dt, c.D, kv*hd, c.Layout, w, bias(c.QKVBias)),
		V:       NewLinearLayout(ks[2], dt, c.D, kv*hd, c.Layout, w, bias(c.QKVBias)),
		O:       NewLinearLayout(ks[3], dt, c.Heads*hd, c.D, c.Layout, w, bias(c.OutBias)),
		Heads:   c.Heads,
		KVHeads: c.KVHeads,
		Causal:  c.Causal,
		RoPE:    c.RoPE,
	}
}

// Apply attends x [B, T, D] to itself under ctx; the result is [B, T, D].
func (a SelfAttention) Apply(x *trace.Array, ctx Context) *trace.Array {
	const op = "nn.SelfAttention"
	if x == nil || x.Rank() != 3 {
		panic(trace.Errorf(op, "x must be [batch, t, d], got %v", x))
	}
	kvh, hd := a.headDims(op)
	sh := x.Shape()
	B, T := sh[0], sh[1]
	q := trace.Reshape(a.Q.Apply(x), B, T, a.Heads, hd)
	k := trace.Reshape(a.K.Apply(x), B, T, kvh, hd)
	v := trace.Reshape(a.V.Apply(x), B, T, kvh, hd)
	q = a.RoPE.Apply(q, ctx.Positions)
	k = a.RoPE.Apply(k, ctx.Positions)
	o := DotProductAttention(q, k, v, AttentionOptions{
		Bias:      ctx.Bias,
		Mask:      ctx.attentionMask(op, B, T),
		Scale:     a.Scale,
		IsCausal:  a.Causal,
		BlockSize: a.BlockSize,
	})
	return a.O.Apply(trace.Reshape(o, B, T, a.Heads*hd))
}

// SwiGLU is the gated MLP of Llama, Mistral and Qwen:
// Down(Activation(Gate(x)) · Up(x)), with Silu as the activation by default.
type SwiGLU struct {
	Gate, Up, Down Linear
	Activation     Activation // static; nil means Silu
}

// NewSwiGLU returns a SwiGLU of dtype dt from d to hidden features and back,
// without biases (Llama's), with weights in the given layout drawn by init
// (nil means NormalInit(0.02)).
func NewSwiGLU(key *trace.Array, dt ir.DType, d, hidden int, layout LinearLayout, init Initializer) SwiGLU {
	if init == nil {
		init = NormalInit(0.02)
	}
	ks := random.Keys(key, 3)
	return SwiGLU{
		Gate: NewLinearLayout(ks[0], dt, d, hidden, layout, init, nil),
		Up:   NewLinearLayout(ks[1], dt, d, hidden, layout, init, nil),
		Down: NewLinearLayout(ks[2], dt, hidden, d, layout, init, nil),
	}
}

// Apply returns Down(Activation(Gate(x))·Up(x)) for x [..., d].
func (m SwiGLU) Apply(x *trace.Array) *trace.Array {
	act := m.Activation
	if act == nil {
		act = Silu
	}
	return m.Down.Apply(trace.Mul(act(m.Gate.Apply(x)), m.Up.Apply(x)))
}
