package nn

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// Normalizer is a normalisation layer over the last axis: LayerNorm or
// RMSNorm.
type Normalizer interface {
	Apply(x *trace.Array) *trace.Array
}

// FeedForward is a position-wise feed-forward layer: MLP or SwiGLU.
type FeedForward interface {
	Apply(x *trace.Array) *trace.Array
}

// NormPlacement is where a TransformerBlock normalises.
type NormPlacement int

const (
	// PreNorm normalises each sublayer's input (GPT-2, Llama; the zero
	// value): x = x + Attn(AttnNorm(x)); x = x + MLP(MLPNorm(x)).
	PreNorm NormPlacement = iota
	// PostNorm normalises after each residual sum (BERT, the original
	// Transformer): x = AttnNorm(x + Attn(x)); x = MLPNorm(x + MLP(x)).
	PostNorm
	// ParallelResidual runs attention and MLP side by side on the same
	// input (GPT-J, GPT-NeoX's use_parallel_residual):
	// x = x + Attn(AttnNorm(x)) + MLP(MLPNorm(x)).
	ParallelResidual
)

// String returns the placement's name.
func (p NormPlacement) String() string {
	switch p {
	case PreNorm:
		return "pre-norm"
	case PostNorm:
		return "post-norm"
	case ParallelResidual:
		return "parallel-residual"
	}
	return fmt.Sprintf("NormPlacement(%d)", int(p))
}

// TransformerBlock is one layer of a pretrained Transformer: self-attention
// and a feed-forward layer, each with a residual connection and a
// normalisation placed as Placement says. It covers BERT (post-norm,
// LayerNorm, GELU MLP), GPT-2 (pre-norm, LayerNorm, GELU MLP, causal) and
// Llama (pre-norm, RMSNorm, SwiGLU, causal, grouped-query heads, RoPE).
// Blocks of the same configuration stack into a TransformerStack.
type TransformerBlock struct {
	AttnNorm  Normalizer // LayerNorm or RMSNorm
	Attn      SelfAttention
	MLPNorm   Normalizer  // LayerNorm or RMSNorm
	MLP       FeedForward // MLP or SwiGLU
	Placement NormPlacement
}

// Apply runs the block on x [B, T, D] under ctx (padding, positions).
func (b TransformerBlock) Apply(x *trace.Array, ctx Context) *trace.Array {
	if b.AttnNorm == nil || b.MLPNorm == nil || b.MLP == nil {
		panic(trace.Errorf("nn.TransformerBlock", "AttnNorm, MLPNorm and MLP must be set"))
	}
	switch b.Placement {
	case PreNorm:
		x = trace.Add(x, b.Attn.Apply(b.AttnNorm.Apply(x), ctx))
		return trace.Add(x, b.MLP.Apply(b.MLPNorm.Apply(x)))
	case PostNorm:
		x = b.AttnNorm.Apply(trace.Add(x, b.Attn.Apply(x, ctx)))
		return b.MLPNorm.Apply(trace.Add(x, b.MLP.Apply(x)))
	case ParallelResidual:
		a := b.Attn.Apply(b.AttnNorm.Apply(x), ctx)
		return trace.Add(trace.Add(x, a), b.MLP.Apply(b.MLPNorm.Apply(x)))
	}
	panic(trace.Errorf("nn.TransformerBlock", "unknown placement %v", b.Placement))
}

// NormKind selects a BlockConfig's normalisation.
type NormKind int

const (
	LayerNormKind NormKind = iota // LayerNorm with scale and bias (the zero value)
	RMSNormKind                   // RMSNorm with scale
)

// FeedForwardKind selects a BlockConfig's feed-forward layer.
type FeedForwardKind int

const (
	// GeluMLPKind is Linear(D→Hidden), Activation, Linear(Hidden→D) (the
	// zero value).
	GeluMLPKind FeedForwardKind = iota
	// SwiGLUKind is Llama's gated MLP (SwiGLU) with Activation as its gate.
	SwiGLUKind
)

// BlockConfig describes a TransformerBlock for NewTransformerBlock.
type BlockConfig struct {
	Attention AttentionConfig // D, heads, biases, causal, RoPE, layout, init
	Hidden    int             // the feed-forward layer's hidden features
	Norm      NormKind
	// NormEps is the normalisations' epsilon: it must be set (1e-12 for
	// BERT, 1e-5 for GPT-2 and Llama 2, 1e-6 for some Llamas).
	NormEps   float64
	Placement NormPlacement
	FFN       FeedForwardKind
	// Activation of the MLP (default GeluErf) or the SwiGLU gate (default
	// Silu). GPT-2 uses GeluTanh.
	Activation Activation
	MLPBias    bool // biases on the MLP's Linear layers (BERT, GPT-2)
}

// NewTransformerBlock returns a TransformerBlock of dtype dt as c describes:
// weights drawn by c.Attention.Init (default NormalInit(0.02)) in
// c.Attention.Layout, zero biases, unit norm scales.
func NewTransformerBlock(key *trace.Array, dt ir.DType, c BlockConfig) TransformerBlock {
	const op = "nn.NewTransformerBlock"
	a := c.Attention
	if c.Hidden <= 0 {
		panic(trace.Errorf(op, "Hidden=%d must be positive", c.Hidden))
	}
	if !(c.NormEps > 0) {
		panic(trace.Errorf(op, "NormEps=%v must be positive (BERT 1e-12, GPT-2 1e-5)", c.NormEps))
	}
	ks := random.Keys(key, 2)
	b := TransformerBlock{Attn: NewSelfAttention(ks[0], dt, a), Placement: c.Placement}
	norm := func() Normalizer {
		switch c.Norm {
		case LayerNormKind:
			return NewLayerNormEps(dt, a.D, c.NormEps)
		case RMSNormKind:
			return NewRMSNormEps(dt, a.D, c.NormEps)
		}
		panic(trace.Errorf(op, "unknown NormKind %d", int(c.Norm)))
	}
	b.AttnNorm, b.MLPNorm = norm(), norm()
	switch c.FFN {
	case GeluMLPKind:
		act := c.Activation
		if act == nil {
			act = GeluErf
		}
		var bias Initializer
		if c.MLPBias {
			bias = Zeros
		}
		mk := random.Keys(ks[1], 2)
		b.MLP = MLP{Layers: []Linear{
			NewLinearLayout(mk[0], dt, a.D, c.Hidden, a.Layout, a.init(), bias),
			NewLinearLayout(mk[1], dt, c.Hidden, a.D, a.Layout, a.init(), bias),
		}, Activation: act}
	case SwiGLUKind:
		m := NewSwiGLU(ks[1], dt, a.D, c.Hidden, a.Layout, a.init())
		m.Activation = c.Activation
		b.MLP = m
	default:
		panic(trace.Errorf(op, "unknown FeedForwardKind %d", int(c.FFN)))
	}
	return b
}

// TransformerStack is L TransformerBlocks whose parameters are stacked on a
// leading layer axis (every leaf of Blocks is [L, ...]), applied with one
// scan step per layer: the program holds one layer's code whatever L is,
// and works with the StackOptions WithRemat and WithParamOffload as Stack
// does.
type TransformerStack struct {
	Blocks TransformerBlock
}

// NewTransformerStack returns L stacked blocks of dtype dt as c describes,
// initialised one layer per scan step (see NewStack).
func NewTransformerStack(key *trace.Array, dt ir.DType, L int, c BlockConfig) TransformerStack {
	if L <= 0 {
		panic(trace.Errorf("nn.NewTransformerStack", "L=%d must be positive", L))
	}
	keys := random.Split(key, L)
	_, blocks := trace.ScanTree(func(s struct{}, k *trace.Array) (struct{}, TransformerBlock) {
		return s, NewTransformerBlock(k, dt, c)
	}, struct{}{}, keys)
	return TransformerStack{Blocks: blocks}
}

// Layers returns the number of stacked blocks L.
func (s TransformerStack) Layers() int { return s.Blocks.Attn.Q.W.Shape()[0] }

// Layer returns block i of the stack (its parameters sliced at index i).
func (s TransformerStack) Layer(i int) TransformerBlock {
	b, err := trace.MapAs(s.Blocks, func(a *trace.Array) *trace.Array { return trace.Index(a, i) })
	if err != nil {
		panic(trace.WrapError("nn.TransformerStack.Layer", err))
	}
	return b
}

// Apply runs the L blocks in order on x [B, T, D] under ctx, with
// trace.ScanTree over the layer axis. WithRemat and WithParamOffload apply as
// in Stack.Apply; WithLayerParams, typed for Stack's blocks, is an error here.
func (s TransformerStack) Apply(x *trace.Array, ctx Context, opts ...StackOption) *trace.Array {
	var cfg stackConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.params != nil {
		panic(trace.Errorf("nn.TransformerStack.Apply", "WithLayerParams applies to Stack's Block, not to TransformerBlock"))
	}
	layer := func(x *trace.Array, b TransformerBlock) *trace.Array {
		if cfg.offload {
			var err error
			b, err = trace.MapAs(b, func(a *trace.Array) *trace.Array { return trace.DevicePut(a, ir.Device) })
			if err != nil {
				panic(trace.WrapError("nn.TransformerStack.Apply", err))
			}
		}
		return b.Apply(trace.CheckpointName(x, BlockInput), ctx)
	}
	if cfg.policy != nil {
		layer = trace.Remat(layer, cfg.policy)
	}
	y, _ := trace.ScanTree(func(x *trace.Array, b TransformerBlock) (*trace.Array, struct{}) {
		return layer(x, b), struct{}{}
	}, x, s.Blocks)
	return y
}
