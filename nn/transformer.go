package nn

import (
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// Attention is causal multi-head self-attention without biases: queries, keys
// and values x·Wq, x·Wk, x·Wv split into Heads heads, softmax(q·kᵀ/√dh) under
// a causal mask, then the heads concatenated and projected by Wo. The scores
// and the softmax are computed in f32 for 16-bit inputs.
type Attention struct {
	Wq, Wk, Wv, Wo *trace.Array // [d, d]
	Heads          int          // static; d must be a multiple of Heads
}

// NewAttention returns an Attention over d features with heads heads, of dtype
// dt, with LecunNormal projections.
func NewAttention(key *trace.Array, dt ir.DType, d, heads int) Attention {
	if heads <= 0 || d%heads != 0 {
		panic(trace.Errorf("nn.NewAttention", "d=%d is not a multiple of heads=%d", d, heads))
	}
	ks := random.Keys(key, 4)
	s := ir.Shape{d, d}
	return Attention{
		Wq: LecunNormal(ks[0], dt, s), Wk: LecunNormal(ks[1], dt, s),
		Wv: LecunNormal(ks[2], dt, s), Wo: LecunNormal(ks[3], dt, s),
		Heads: heads,
	}
}

// CausalMask returns the bool [t, t] mask that is true where key position k
// may be attended from query position q, that is k ≤ q.
func CausalMask(t int) *trace.Array {
	s := ir.Shape{t, t}
	return trace.GreaterEqual(trace.Iota(ir.Int32, s, 0), trace.Iota(ir.Int32, s, 1))
}

// Apply attends x [batch, t, d] to itself causally; the result is [batch, t, d].
func (a Attention) Apply(x *trace.Array) *trace.Array {
	if x.Rank() != 3 {
		panic(trace.Errorf("nn.Attention", "x must be [batch, t, d], got %v", x.Type()))
	}
	sh := x.Shape()
	b, t, d := sh[0], sh[1], sh[2]
	h := a.Heads
	if h <= 0 || d%h != 0 {
		panic(trace.Errorf("nn.Attention", "d=%d is not a multiple of Heads=%d", d, h))
	}
	dh := d / h
	split := func(w *trace.Array) *trace.Array { return trace.Reshape(dense(x, w), b, t, h, dh) }
	q, k, v := split(a.Wq), split(a.Wk), split(a.Wv)
	w := workDType(x.DType())
	s := trace.Convert(trace.Einsum("bqhd,bkhd->bhqk", q, k), w)
	s = trace.Mul(s, trace.ScalarAs(1/math.Sqrt(float64(dh)), w))
	s = trace.Where(CausalMask(t), s, trace.ScalarAs(-1e30, w))
	p := trace.Convert(trace.Softmax(s, 3), x.DType())
	o := trace.Reshape(trace.Einsum("bhqk,bkhd->bqhd", p, v), b, t, d)
	return dense(o, a.Wo)
}

// Block is a pre-norm Transformer block:
//
//	x = x + Attn(LN1(x))
//	x = x + MLP(LN2(x))
type Block struct {
	LN1  LayerNorm
	Attn Attention
	LN2  LayerNorm
	MLP  MLP
}

// NewBlock returns a Block of dtype dt over d features with heads attention
// heads and a two-layer GELU MLP d → hidden → d.
func NewBlock(key *trace.Array, dt ir.DType, d, heads, hidden int) Block {
	ks := random.Keys(key, 2)
	return Block{
		LN1:  NewLayerNorm(dt, d),
		Attn: NewAttention(ks[0], dt, d, heads),
		LN2:  NewLayerNorm(dt, d),
		MLP:  NewMLP(ks[1], dt, []int{d, hidden, d}, Gelu),
	}
}

// Apply runs the block on x [batch, t, d].
func (bl Block) Apply(x *trace.Array) *trace.Array {
	x = trace.Add(x, bl.Attn.Apply(bl.LN1.Apply(x)))
	return trace.Add(x, bl.MLP.Apply(bl.LN2.Apply(x)))
}

// BlockInput is the checkpoint name (trace.CheckpointName) Stack.Apply gives
// each layer's input, for policies such as
// trace.SaveAndOffloadOnlyTheseNames(nil, []string{nn.BlockInput}, ir.Device, ir.PinnedHost).
const BlockInput = "block_input"

// Stack is L Transformer blocks whose parameters are stacked on a leading
// layer axis: every leaf of Blocks is [L, ...]. It is applied with one scan
// step per layer.
type Stack struct {
	Blocks Block
}

// NewStack returns L stacked blocks of dtype dt (see NewBlock). It initialises
// one layer per scan step (trace.ScanTree over L split keys, the blocks stacked
// as the scan's outputs), so a jitted NewStack holds one layer's temporaries at
// a time and generates straight into dt.
func NewStack(key *trace.Array, dt ir.DType, L, d, heads, hidden int) Stack {
	if L <= 0 {
		panic(trace.Errorf("nn.NewStack", "L=%d must be positive", L))
	}
	keys := random.Split(key, L)
	_, blocks := trace.ScanTree(func(c struct{}, k *trace.Array) (struct{}, Block) {
		return c, NewBlock(k, dt, d, heads, hidden)
	}, struct{}{}, keys)
	return Stack{Blocks: blocks}
}

// Layers returns the number of stacked blocks L.
func (s Stack) Layers() int { return s.Blocks.Attn.Wq.Shape()[0] }

// Layer returns block i of the stack (its parameters sliced at index i).
func (s Stack) Layer(i int) Block {
	b, err := trace.MapAs(s.Blocks, func(a *trace.Array) *trace.Array { return trace.Index(a, i) })
	if err != nil {
		panic(trace.WrapError("nn.Stack.Layer", err))
	}
	return b
}

// StackOption configures Stack.Apply.
type StackOption func(*stackConfig)

type stackConfig struct {
	policy  trace.CheckpointPolicy
	offload bool
	params  func(Block) Block
}

// WithRemat applies policy to each layer: the block's apply is wrapped in
// trace.Remat(policy), so what the backward pass keeps of a layer is decided
// per layer (and, with an offloading policy, moved to host per layer). The
// layer input is named BlockInput.
func WithRemat(policy trace.CheckpointPolicy) StackOption {
	return func(c *stackConfig) { c.policy = policy }
}

// WithParamOffload is for stacked parameters kept in pinned host memory
// (trace.DevicePut(leaf, ir.PinnedHost)): each scan step copies its layer's
// slice to the device (inside the remat region if WithRemat is given).
func WithParamOffload() StackOption {
	return func(c *stackConfig) { c.offload = true }
}

// WithLayerParams applies f to each layer's parameters inside its scan
// step, before the block runs (after WithParamOffload's copy). For FSDP, f
// constrains every leaf to its sharded layout (trace.WithShardingConstraint,
// the stacked leaf's spec without the layer dimension): the partitioner
// then gathers one layer's parameters per step, where the block needs them
// whole, and the layer's gradient, constrained alike (the constraint's
// transpose), is reduced back to that layout, so no device holds more than
// its share of the stack and one layer.
func WithLayerParams(f func(Block) Block) StackOption {
	return func(c *stackConfig) { c.params = f }
}

// Apply runs the L blocks in order on x [batch, t, d] with trace.ScanTree over
// the layer axis.
func (s Stack) Apply(x *trace.Array, opts ...StackOption) *trace.Array {
	var cfg stackConfig
	for _, o := range opts {
		o(&cfg)
	}
	layer := func(x *trace.Array, b Block) *trace.Array {
		if cfg.offload {
			var err error
			b, err = trace.MapAs(b, func(a *trace.Array) *trace.Array { return trace.DevicePut(a, ir.Device) })
			if err != nil {
				panic(trace.WrapError("nn.Stack.Apply", err))
			}
		}
		if cfg.params != nil {
			b = cfg.params(b)
		}
		return b.Apply(trace.CheckpointName(x, BlockInput))
	}
	if cfg.policy != nil {
		layer = trace.Remat(layer, cfg.policy)
	}
	y, _ := trace.ScanTree(func(x *trace.Array, b Block) (*trace.Array, struct{}) {
		return layer(x, b), struct{}{}
	}, x, s.Blocks)
	return y
}
