package nn

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// TransformerLM is a decoder-only language model: a token embedding tied to
// the output projection, learned positions, a Stack of pre-norm blocks run by
// a scan over the layer axis, and a final LayerNorm. It is the model of
// examples/transformer and of the benchmarks that time its training step.
// Its leaves, in trace.Flatten's order, are Tok, Pos, then Blocks' and Norm's.
type TransformerLM struct {
	Tok    Embedding    // [vocab, d], also the output projection
	Pos    *trace.Array // [seq, d]
	Blocks Stack
	Norm   LayerNorm
}

// NewTransformerLM returns a TransformerLM of dtype dt for vocab tokens, up
// to seq positions, layers blocks of width d with heads heads and an MLP of
// hidden features (4·d is usual), positions normal with standard deviation
// 0.02.
func NewTransformerLM(key *trace.Array, dt ir.DType, vocab, seq, layers, d, heads, hidden int) TransformerLM {
	ks := random.Keys(key, 3)
	return TransformerLM{
		Tok:    NewEmbedding(ks[0], dt, vocab, d),
		Pos:    NormalInit(0.02)(ks[1], dt, ir.Shape{seq, d}),
		Blocks: NewStack(ks[2], dt, layers, d, heads, hidden),
		Norm:   NewLayerNorm(dt, d),
	}
}

// Logits runs the model on ids [batch, t] (int32, t at most seq):
// logits [batch, t, vocab]. opts apply to the Stack (remat, offload).
func (m TransformerLM) Logits(ids *trace.Array, opts ...StackOption) *trace.Array {
	if ids.Rank() != 2 {
		panic(trace.Errorf("nn.TransformerLM", "ids are %v, want [batch, t]", ids.Type()))
	}
	t, seq := ids.Shape()[1], m.Pos.Shape()[0]
	if t > seq {
		panic(trace.Errorf("nn.TransformerLM", "%d positions, the model has %d", t, seq))
	}
	pos := m.Pos
	if t != seq {
		pos = trace.SliceAxis(pos, 0, 0, t)
	}
	x := trace.Add(m.Tok.Apply(ids), pos)
	x = m.Blocks.Apply(x, opts...)
	return m.Tok.Attend(m.Norm.Apply(x))
}

// Loss is the mean cross-entropy of the next-token predictions of ids
// [batch, t] against labels [batch, t] (usually ids shifted by one).
func (m TransformerLM) Loss(ids, labels *trace.Array, opts ...StackOption) *trace.Array {
	return SoftmaxCrossEntropy(m.Logits(ids, opts...), labels)
}
