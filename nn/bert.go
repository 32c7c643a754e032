package nn

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// BertConfig is the shape of a BERT encoder, named after Hugging Face's
// BertConfig.
type BertConfig struct {
	Vocab        int     // vocab_size
	MaxPositions int     // max_position_embeddings
	TypeVocab    int     // type_vocab_size (2 for BERT)
	Layers       int     // num_hidden_layers
	D            int     // hidden_size
	Heads        int     // num_attention_heads
	Hidden       int     // intermediate_size
	Eps          float64 // layer_norm_eps (1e-12); 0 means 1e-12
}

// Bert is a BERT encoder: word, position and token-type embeddings summed
// and normalised, then Layers post-norm TransformerBlocks (biases, exact
// GELU, no causal mask) stacked and scanned, and the pooler (a tanh dense
// layer on the first token). Every Linear keeps PyTorch's [out, in] layout,
// so a Hugging Face checkpoint's weights load as they are stored. The
// parameter paths are Word.Table, Position.Table, TokenType.Table,
// EmbedNorm.{Scale,Bias}, Encoder.Blocks.{AttnNorm,Attn.{Q,K,V,O},MLPNorm,
// MLP.Layers[0|1]}.{W,B,Scale,Bias} (stacked on a layer axis) and
// Pooler.{W,B}.
type Bert struct {
	Word, Position, TokenType Embedding
	EmbedNorm                 LayerNorm
	Encoder                   TransformerStack
	Pooler                    Linear
}

// BlockConfig returns the configuration of c's encoder blocks.
func (c BertConfig) BlockConfig() BlockConfig {
	eps := c.Eps
	if eps == 0 {
		eps = 1e-12
	}
	return BlockConfig{
		Attention: AttentionConfig{D: c.D, Heads: c.Heads, QKVBias: true, OutBias: true, Layout: LayoutOutIn},
		Hidden:    c.Hidden, NormEps: eps, Placement: PostNorm, Activation: GeluErf, MLPBias: true,
	}
}

// NewBert returns a Bert of dtype dt with weights normal of standard
// deviation 0.02 (BERT's initializer_range), zero biases, unit norm scales.
func NewBert(key *trace.Array, dt ir.DType, c BertConfig) Bert {
	if c.Vocab <= 0 || c.MaxPositions <= 0 || c.TypeVocab <= 0 {
		panic(trace.Errorf("nn.NewBert", "Vocab=%d, MaxPositions=%d, TypeVocab=%d must be positive", c.Vocab, c.MaxPositions, c.TypeVocab))
	}
	bc := c.BlockConfig()
	ks := random.Keys(key, 5)
	init := NormalInit(0.02)
	return Bert{
		Word:      Embedding{Table: init(ks[0], dt, ir.Shape{c.Vocab, c.D})},
		Position:  Embedding{Table: init(ks[1], dt, ir.Shape{c.MaxPositions, c.D})},
		TokenType: Embedding{Table: init(ks[2], dt, ir.Shape{c.TypeVocab, c.D})},
		EmbedNorm: NewLayerNormEps(dt, c.D, bc.NormEps),
		Encoder:   NewTransformerStack(ks[3], dt, c.Layers, bc),
		Pooler:    NewLinearLayout(ks[4], dt, c.D, c.D, LayoutOutIn, init, Zeros),
	}
}

// Encode returns the last hidden states [B, T, D] of ids [B, T] (int32).
// tokenTypes [B, T] may be nil (all type 0). ctx.Padding is the attention
// mask; ctx.Positions (default 0..T−1) index the position embeddings. opts
// apply to the encoder's scan (remat, offload).
func (m Bert) Encode(ids, tokenTypes *trace.Array, ctx Context, opts ...StackOption) *trace.Array {
	const op = "nn.Bert"
	if ids == nil || ids.Rank() != 2 {
		panic(trace.Errorf(op, "ids must be [batch, t], got %v", ids))
	}
	T := ids.Shape()[1]
	if max := m.Position.Table.Shape()[0]; T > max {
		panic(trace.Errorf(op, "%d positions, the model has %d", T, max))
	}
	pos := ctx.Positions
	if pos == nil {
		pos = trace.Iota(ir.Int32, ir.Shape{T}, 0)
	}
	if tokenTypes == nil {
		tokenTypes = trace.Zeros(ids.Shape(), ir.Int32)
	}
	x := trace.Add(trace.Add(m.Word.Apply(ids), m.TokenType.Apply(tokenTypes)), m.Position.Apply(pos))
	x = m.EmbedNorm.Apply(x)
	return m.Encoder.Apply(x, ctx, opts...)
}

// Pool returns tanh(Pooler(h[:, 0])) [B, D], BERT's pooled output, from
// the hidden states h [B, T, D] of Encode.
func (m Bert) Pool(h *trace.Array) *trace.Array {
	return trace.Tanh(m.Pooler.Apply(trace.Squeeze(trace.SliceAxis(h, 1, 0, 1), 1)))
}
