package nn_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Grouped-query attention with a padding mask: 4 query heads share 2
// key/value heads, and the last key of the second sequence is padding. The
// blocked form (an online softmax over blocks of keys) gives the same result.
func ExampleDotProductAttention() {
	const B, T, N, K, H = 2, 4, 4, 2, 8
	ks := random.Keys(random.NewKey(0), 3)
	q := random.Normal(ks[0], ir.Float32, ir.Shape{B, T, N, H})
	k := random.Normal(ks[1], ir.Float32, ir.Shape{B, T, K, H})
	v := random.Normal(ks[2], ir.Float32, ir.Shape{B, T, K, H})
	keep := rt.FromSlice([]bool{true, true, true, true, true, true, true, false}, B, 1, 1, T)

	o := nn.DotProductAttention(q, k, v, nn.AttentionOptions{Mask: keep, IsCausal: true})
	fmt.Println(o.Type())

	blocked := nn.DotProductAttention(q, k, v, nn.AttentionOptions{Mask: keep, IsCausal: true, BlockSize: 2})
	diff := trace.Max(trace.Abs(trace.Sub(o, blocked))).Item()
	fmt.Println("blocked equals plain:", diff < 1e-5)
	// Output:
	// f32[2,4,4,8]
	// blocked equals plain: true
}

// A BERT-style post-norm encoder: 3 layers stacked on a leading axis and run
// by one scan, PyTorch-layout weights, a padding mask as Hugging Face's
// attention_mask. The real tokens' outputs do not depend on the padding.
func ExampleTransformerStack() {
	cfg := nn.BlockConfig{
		Attention: nn.AttentionConfig{D: 16, Heads: 2, QKVBias: true, OutBias: true, Layout: nn.LayoutOutIn},
		Hidden:    32, NormEps: 1e-12, Placement: nn.PostNorm, Activation: nn.GeluErf, MLPBias: true,
	}
	stack := rt.Jit(func(k *trace.Array) nn.TransformerStack {
		return nn.NewTransformerStack(k, ir.Float32, 3, cfg)
	})(random.NewKey(0))
	fmt.Println("Q:", stack.Blocks.Attn.Q.W.Type(), "layout", stack.Blocks.Attn.Q.Layout)

	encode := rt.Jit(func(s nn.TransformerStack, x, mask *trace.Array) *trace.Array {
		return s.Apply(x, nn.Context{Padding: mask})
	})
	x := random.Normal(random.NewKey(1), ir.Float32, ir.Shape{1, 5, 16})
	padded := trace.Concatenate(1, x, trace.Ones(ir.Shape{1, 2, 16}, ir.Float32))
	mask := rt.FromSlice([]int32{1, 1, 1, 1, 1, 0, 0}, 1, 7)
	a := encode(stack, x, rt.FromSlice([]int32{1, 1, 1, 1, 1}, 1, 5))
	b := trace.SliceAxis(encode(stack, padded, mask), 1, 0, 5)
	fmt.Println(a.Type(), "same with padding:", trace.Max(trace.Abs(trace.Sub(a, b))).Item() < 1e-5)
	// Output:
	// Q: f32[3,16,16] layout out,in
	// f32[1,5,16] same with padding: true
}
