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
