// Package nn is a small neural-network library on top of package trace: weight
// initialisers, layers (Linear, MLP, LayerNorm, RMSNorm, Embedding, Dropout,
// causal multi-head Attention, a pre-norm Transformer Block), stacked blocks
// applied with a scan (Stack) and a cross-entropy loss.
//
// For pretrained models (BERT, GPT-2, Llama) there are DotProductAttention
// (jax.nn.dot_product_attention: biases, masks, causal, grouped-query heads,
// an optional blocked online softmax), Linear weights in PyTorch's
// [out, in] layout used as stored (LayoutOutIn), SelfAttention with biases,
// padding masks, grouped-query heads and rotary embeddings (RoPEHalf,
// RoPEInterleaved), SwiGLU, the GELU forms by name (GeluErf, GeluTanh),
// TransformerBlock in pre-norm, post-norm and parallel-residual placements,
// TransformerStack (blocks stacked on a layer axis and scanned), and the
// model types Bert, GPT2 and Llama.
//
// Modules are plain Go structs whose exported *trace.Array fields are the
// parameters, so a module is a tree: rt.Jit, trace.Grad, trace.ScanTree and
// the optimisers take it whole, and the gradient of a loss with respect to a
// module has the module's own type. Non-array fields (a head count, an epsilon,
// an activation function) are static parts of the tree.
//
// Constructors take a PRNG key (package random) and the parameters' dtype and
// generate straight into that dtype: there is no float32 copy first, so a
// bfloat16 model jitted at initialisation needs bfloat16 memory only.
//
// Stack holds L blocks with every parameter stacked on a leading layer axis.
// NewStack initialises one layer per scan step and Stack.Apply runs one layer
// per scan step, optionally under a rematerialisation policy (trace.Remat) and
// with the parameters kept in host memory and copied in per layer.
package nn
