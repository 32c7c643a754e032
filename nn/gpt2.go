package nn

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// GPT2Config is the shape of a GPT-2 model, named after Hugging Face's
// GPT2Config.
type GPT2Config struct {
	Vocab        int     // vocab_size
	MaxPositions int     // n_positions
	Layers       int     // n_layer
	D            int     // n_embd
	Heads        int     // n_head
	Hidden       int     // n_inner; 0 means 4·D
	Eps          float64 // layer_norm_epsilon; 0 means 1e-5
}

// GPT2 is a GPT-2 language model: token and learned position embeddings,
// Layers pre-norm causal TransformerBlocks (biases, tanh GELU) stacked and
// scanned, a final LayerNorm, and logits from the token embedding (tied).
// Linear weights are [in, out], the layout of Hugging Face GPT-2's Conv1D;
// its fused c_attn [D, 3D] splits into Attn.Q, Attn.K and Attn.V along its
// output axis. Parameter paths: Tok.Table, Pos.Table,
// Blocks.Blocks.{AttnNorm,Attn.{Q,K,V,O},MLPNorm,MLP.Layers[0|1]}.{W,B,Scale,Bias}
// (stacked on a layer axis), Norm.{Scale,Bias}.
type GPT2 struct {
	Tok, Pos Embedding
	Blocks   TransformerStack
	Norm     LayerNorm
}

// BlockConfig returns the configuration of c's blocks.
func (c GPT2Config) BlockConfig() BlockConfig {
	eps, hidden := c.Eps, c.Hidden
	if eps == 0 {
		eps = 1e-5
	}
	if hidden == 0 {
		hidden = 4 * c.D
	}
	return BlockConfig{
		Attention: AttentionConfig{D: c.D, Heads: c.Heads, QKVBias: true, OutBias: true, Causal: true},
		Hidden:    hidden, NormEps: eps, Placement: PreNorm, Activation: GeluTanh, MLPBias: true,
	}
}

// NewGPT2 returns a GPT2 of dtype dt with weights normal of standard
// deviation 0.02, zero biases, unit norm scales.
func NewGPT2(key *trace.Array, dt ir.DType, c GPT2Config) GPT2 {
	if c.Vocab <= 0 || c.MaxPositions <= 0 {
		panic(trace.Errorf("nn.NewGPT2", "Vocab=%d, MaxPositions=%d must be positive", c.Vocab, c.MaxPositions))
	}
	bc := c.BlockConfig()
	ks := random.Keys(key, 3)
	init := NormalInit(0.02)
	return GPT2{
		Tok:    Embedding{Table: init(ks[0], dt, ir.Shape{c.Vocab, c.D})},
		Pos:    Embedding{Table: init(ks[1], dt, ir.Shape{c.MaxPositions, c.D})},
		Blocks: NewTransformerStack(ks[2], dt, c.Layers, bc),
		Norm:   NewLayerNormEps(dt, c.D, bc.NormEps),
	}
}

// Logits returns the next-token logits [B, T, Vocab] of ids [B, T] (int32).
// ctx.Padding masks padding keys; ctx.Positions (default 0..T−1) index the
// position embeddings. opts apply to the blocks' scan.
func (m GPT2) Logits(ids *trace.Array, ctx Context, opts ...StackOption) *trace.Array {
	const op = "nn.GPT2"
	if ids == nil || ids.Rank() != 2 {
		panic(trace.Errorf(op, "ids must be [batch, t], got %v", ids))
	}
	T := ids.Shape()[1]
	if max := m.Pos.Table.Shape()[0]; T > max {
		panic(trace.Errorf(op, "%d positions, the model has %d", T, max))
	}
	pos := ctx.Positions
	if pos == nil {
		pos = trace.Iota(ir.Int32, ir.Shape{T}, 0)
	}
	x := trace.Add(m.Tok.Apply(ids), m.Pos.Apply(pos))
	x = m.Blocks.Apply(x, ctx, opts...)
	return m.Tok.Attend(m.Norm.Apply(x))
}
