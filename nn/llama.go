package nn

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// LlamaConfig is the shape of a Llama-style decoder, named after Hugging
// Face's LlamaConfig.
type LlamaConfig struct {
	Vocab     int     // vocab_size
	Layers    int     // num_hidden_layers
	D         int     // hidden_size
	Heads     int     // num_attention_heads
	KVHeads   int     // num_key_value_heads; 0 means Heads
	HeadDim   int     // head_dim; 0 means D/Heads
	Hidden    int     // intermediate_size
	Eps       float64 // rms_norm_eps; 0 means 1e-5
	RopeTheta float64 // rope_theta; 0 means 10000
	// TieEmbeddings computes the logits with the embedding table
	// (tie_word_embeddings) instead of LMHead.
	TieEmbeddings bool
}

// Llama is a Llama-style decoder (Llama 2 and 3, Mistral without sliding
// windows, Qwen2 with QKV biases set): token embeddings, Layers pre-norm
// causal TransformerBlocks with RMSNorm, grouped-query attention, rotary
// embeddings in the rotate-half convention and a SwiGLU MLP, no biases,
// stacked and scanned; a final RMSNorm; and LMHead [Vocab, D] (nil W when
// the embeddings are tied). Every Linear keeps PyTorch's [out, in] layout.
// Parameter paths: Embed.Table,
// Blocks.Blocks.{AttnNorm.Scale,Attn.{Q,K,V,O}.W,MLPNorm.Scale,MLP.{Gate,Up,Down}.W}
// (stacked on a layer axis), Norm.Scale, LMHead.W.
// Llama 3.1's rope_scaling is not applied.
type Llama struct {
	Embed  Embedding
	Blocks TransformerStack
	Norm   RMSNorm
	LMHead Linear
}

// BlockConfig returns the configuration of c's blocks.
func (c LlamaConfig) BlockConfig() BlockConfig {
	eps := c.Eps
	if eps == 0 {
		eps = 1e-5
	}
	return BlockConfig{
		Attention: AttentionConfig{D: c.D, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Causal: true,
			RoPE: RoPE{Style: RoPEHalf, Theta: c.RopeTheta}, Layout: LayoutOutIn},
		Hidden: c.Hidden, Norm: RMSNormKind, NormEps: eps, Placement: PreNorm, FFN: SwiGLUKind,
	}
}

// NewLlama returns a Llama of dtype dt with weights normal of standard
// deviation 0.02 and unit norm scales.
func NewLlama(key *trace.Array, dt ir.DType, c LlamaConfig) Llama {
	if c.Vocab <= 0 {
		panic(trace.Errorf("nn.NewLlama", "Vocab=%d must be positive", c.Vocab))
	}
	bc := c.BlockConfig()
	ks := random.Keys(key, 3)
	init := NormalInit(0.02)
	m := Llama{
		Embed:  Embedding{Table: init(ks[0], dt, ir.Shape{c.Vocab, c.D})},
		Blocks: NewTransformerStack(ks[1], dt, c.Layers, bc),
		Norm:   NewRMSNormEps(dt, c.D, bc.NormEps),
	}
	if !c.TieEmbeddings {
		m.LMHead = NewLinearLayout(ks[2], dt, c.D, c.Vocab, LayoutOutIn, init, nil)
	}
	return m
}

// Logits returns the next-token logits [B, T, Vocab] of ids [B, T] (int32).
// ctx.Padding masks padding keys; ctx.Positions (default 0..T−1) are the
// rotary positions (with left padding, the real tokens' positions). opts
// apply to the blocks' scan.
func (m Llama) Logits(ids *trace.Array, ctx Context, opts ...StackOption) *trace.Array {
	if ids == nil || ids.Rank() != 2 {
		panic(trace.Errorf("nn.Llama", "ids must be [batch, t], got %v", ids))
	}
	x := m.Blocks.Apply(m.Embed.Apply(ids), ctx, opts...)
	x = m.Norm.Apply(x)
	if m.LMHead.W == nil {
		return m.Embed.Attend(x)
	}
	return m.LMHead.Apply(x)
}
