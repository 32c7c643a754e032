package serve

import (
	"fmt"

	"github.com/ferryml/ferry/nn"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// BertEmbedder is a Model of an nn.Bert: the encoder under the padding
// mask, the mean of the hidden states over the real tokens, L2-normalised
// (sentence-transformers' Transformer, Pooling and Normalize modules, as
// all-MiniLM-L6-v2 is served). The program is jitted: it compiles once per
// batch shape.
type BertEmbedder struct {
	model nn.Bert
	jit   *rt.Jitted[func(nn.Bert, *trace.Array, *trace.Array, *trace.Array) *trace.Array]
}

// NewBertEmbedder returns the BertEmbedder of m.
func NewBertEmbedder(m nn.Bert) *BertEmbedder {
	return &BertEmbedder{model: m, jit: rt.NewJitted(MeanPooled)}
}

// MeanPooled returns the unit-length mean-pooled embeddings [B, D] of ids
// [B, T] (int32) with token types and the padding mask (1 on real tokens),
// both [B, T] int32: the traced function BertEmbedder runs.
func MeanPooled(m nn.Bert, ids, types, mask *trace.Array) *trace.Array {
	h := m.Encode(ids, types, nn.Context{Padding: mask})
	w := trace.ExpandDims(trace.Convert(mask, h.DType()), 2)
	mean := trace.Div(trace.Sum(trace.Mul(h, w), 1), trace.Maximum(trace.Sum(w, 1), trace.Scalar(1e-9)))
	norm := trace.Sqrt(trace.Sum(trace.Mul(mean, mean), 1))
	return trace.Div(mean, trace.ExpandDims(trace.Maximum(norm, trace.Scalar(1e-12)), 1))
}

// Run embeds a batch; it is the Model to give NewBatcher.
func (e *BertEmbedder) Run(b Batch) ([][]float32, error) {
	if n := e.MaxPositions(); b.Len > n {
		return nil, fmt.Errorf("serve: a batch of %d tokens per text, the model has %d positions", b.Len, n)
	}
	res, err := e.jit.Call(e.model, rt.FromSlice(b.IDs, b.Size, b.Len), rt.FromSlice(b.Types, b.Size, b.Len), rt.FromSlice(b.Mask, b.Size, b.Len))
	if err != nil {
		return nil, err
	}
	emb := res[0].(*trace.Array)
	flat, d := emb.Float32s(), emb.Shape()[1]
	rows := make([][]float32, b.Rows)
	for i := range rows {
		rows[i] = flat[i*d : (i+1)*d : (i+1)*d]
	}
	return rows, nil
}

// Dim returns the length of an embedding.
func (e *BertEmbedder) Dim() int { return e.model.Word.Table.Shape()[1] }

// MaxPositions returns the most tokens the model takes in a text.
func (e *BertEmbedder) MaxPositions() int { return e.model.Position.Table.Shape()[0] }

// Compiles returns how many times the program has been compiled: once per
// batch shape it has run.
func (e *BertEmbedder) Compiles() int64 { return e.jit.Stats().Misses }

// Tokenize returns a tokenizing function for NewHandler of t, with t's
// truncation and padding turned off: the Batcher pads, and a text too long
// is an error rather than cut short.
func Tokenize(t *tokenizer.Tokenizer) (func(text string) (Row, error), error) {
	t, err := t.WithTruncation(nil)
	if err != nil {
		return nil, err
	}
	if t, err = t.WithPadding(nil); err != nil {
		return nil, err
	}
	return func(text string) (Row, error) {
		enc, err := t.Encode(text)
		if err != nil {
			return Row{}, err
		}
		r := Row{IDs: make([]int32, enc.Len()), Types: make([]int32, enc.Len())}
		for i := range enc.IDs {
			r.IDs[i], r.Types[i] = int32(enc.IDs[i]), int32(enc.TypeIDs[i])
		}
		return r, nil
	}, nil
}
