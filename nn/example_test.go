package nn_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A small bf16 language model: embedding, 4 stacked Transformer blocks
// initialised and applied one layer per scan step, tied output projection, and
// the gradient of the loss, which has the model's own type.
func Example() {
	type Model struct {
		Embed  nn.Embedding
		Blocks nn.Stack
		Norm   nn.LayerNorm
	}
	const vocab, d, heads, hidden, layers = 32, 16, 2, 64, 4
	initModel := rt.Jit(func(key *trace.Array) Model {
		ks := random.Keys(key, 2)
		return Model{
			Embed:  nn.NewEmbedding(ks[0], ir.BFloat16, vocab, d),
			Blocks: nn.NewStack(ks[1], ir.BFloat16, layers, d, heads, hidden),
			Norm:   nn.NewLayerNorm(ir.BFloat16, d),
		}
	})
	m := initModel(random.NewKey(0))
	fmt.Println("Wq:", m.Blocks.Blocks.Attn.Wq.Type(), "W1:", m.Blocks.Blocks.MLP.Layers[0].W.Type())

	loss := func(m Model, ids, labels *trace.Array) *trace.Array {
		x := m.Embed.Apply(ids)
		x = m.Blocks.Apply(x, nn.WithRemat(trace.DotsWithNoBatchDimsSaveable))
		return nn.SoftmaxCrossEntropy(m.Embed.Attend(m.Norm.Apply(x)), labels)
	}
	step := rt.Jit(func(m Model, ids, labels *trace.Array) (*trace.Array, Model) {
		return trace.ValueAndGrad(func(m Model) *trace.Array { return loss(m, ids, labels) })(m)
	})
	ids := rt.FromSlice([]int32{1, 2, 3, 4, 5, 6, 7, 8}, 2, 4)
	labels := rt.FromSlice([]int32{2, 3, 4, 5, 6, 7, 8, 9}, 2, 4)
	l, g := step(m, ids, labels)
	fmt.Println("loss:", l.Type(), l.Item() > 0)
	fmt.Println("grad Wq:", g.Blocks.Blocks.Attn.Wq.Type())
	// Output:
	// Wq: bf16[4,16,16] W1: bf16[4,16,64]
	// loss: f32[] true
	// grad Wq: bf16[4,16,16]
}

// A TransformerLM's training loss, and the matrix-product FLOPs of one
// training step counted before it runs (rt.Lowered.CostAnalysis): the
// forward pass's 442368 (per layer 4·2·32·16·16 for the projections,
// 2·2·32·16·64 for the MLP, 2·2·4·8·8·16 for attention; 2·32·16·16 for the
// logits) and twice that for the backward pass.
func ExampleTransformerLM() {
	const vocab, seq, layers, d, heads, batch = 16, 8, 2, 16, 2, 4
	m := rt.Jit(func(k *trace.Array) nn.TransformerLM {
		return nn.NewTransformerLM(k, ir.Float32, vocab, seq, layers, d, heads, 4*d)
	})(random.NewKey(0))
	ids := make([]int32, batch*seq)
	for i := range ids {
		ids[i] = int32(i % vocab)
	}
	x := rt.FromSlice(ids, batch, seq)
	step := func(m nn.TransformerLM, x, y *trace.Array) (*trace.Array, nn.TransformerLM) {
		return trace.ValueAndGrad(func(m nn.TransformerLM) *trace.Array { return m.Loss(x, y) })(m)
	}
	loss, _ := rt.Jit(step)(m, x, x)
	fmt.Printf("loss %v, near ln %d: %v\n", loss.Type(), vocab, loss.Item() > 1 && loss.Item() < 5)
	low, err := rt.Lower(step, m, x, x)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%.0f matmul FLOPs a step\n", low.CostAnalysis().DotFlops)
	// Output:
	// loss f32[], near ln 16: true
	// 1327104 matmul FLOPs a step
}
