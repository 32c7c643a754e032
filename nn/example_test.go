package nn_test

import (
	"bytes"
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

// Batched initialisation, as jax.vmap of an initialiser over layer keys:
// trace.Vmap of nn.NewBlock over 8 keys gives the parameters of 8 blocks
// stacked on a leading layer axis, ready for nn.Stack. Jitted, they are
// generated straight into bf16: the program's memory is its output (plus a
// few bytes of keys), and layer i is bit for bit nn.NewBlock with key i.
// Writing the init in f32 and casting the result to bf16 inside the same jit
// compiles to the same program (examples/init measures both).
func ExampleNewBlock_vmap() {
	const layers, d, heads, hidden = 8, 16, 2, 64
	initStack := func(key *trace.Array) nn.Block {
		return trace.Vmap(func(k *trace.Array) nn.Block {
			return nn.NewBlock(k, ir.BFloat16, d, heads, hidden)
		})(random.Split(key, layers))
	}
	key := random.NewKey(0)
	blocks := rt.Jit(initStack)(key)
	stack := nn.Stack{Blocks: blocks}
	fmt.Println("layers:", stack.Layers(), "heads:", blocks.Attn.Heads)
	fmt.Println("Wq:", blocks.Attn.Wq.Type(), "W1:", blocks.MLP.Layers[0].W.Type(), "b1:", blocks.MLP.Layers[0].B.Type(), "LN1 scale:", blocks.LN1.Scale.Type())

	// Layer 3 on its own, eagerly, with key 3.
	alone := nn.NewBlock(random.Keys(key, layers)[3], ir.BFloat16, d, heads, hidden)
	got, _ := stack.Layer(3).MLP.Layers[1].W.Literal()
	want, _ := alone.MLP.Layers[1].W.Literal()
	fmt.Println("layer 3 is NewBlock(key 3):", bytes.Equal(got.Data, want.Data))

	low, err := rt.Lower(initStack, key)
	if err != nil {
		panic(err)
	}
	c, err := low.Compile()
	if err != nil {
		panic(err)
	}
	m := c.MemoryAnalysis()
	fmt.Printf("output %d bytes, total within 1.05 × output: %v\n", m.OutputBytes, float64(m.TotalBytes()) <= 1.05*float64(m.OutputBytes))
	// Output:
	// layers: 8 heads: 2
	// Wq: bf16[8,16,16] W1: bf16[8,16,64] b1: bf16[8,64] LN1 scale: bf16[8,16]
	// layer 3 is NewBlock(key 3): true
	// output 51456 bytes, total within 1.05 × output: true
}
