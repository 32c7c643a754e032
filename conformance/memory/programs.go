package main

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// A program is one jitted function with abstract arguments, written the same
// way in xla_memory.py (same ops in the same order, same argument trees, same
// donation).
type program struct {
	name   string
	fn     any          // the function to jit
	args   func() []any // abstract arguments (trace.Abstract leaves)
	donate []int        // donated argument positions (jax.jit's donate_argnums)
}

// abs is an abstract array of dtype dt and shape dims.
func abs(dt ir.DType, dims ...int) *trace.Array { return trace.Abstract(ir.TypeOf(dt, dims...)) }

func f32(dims ...int) *trace.Array { return abs(ir.Float32, dims...) }

func key() *trace.Array { return abs(ir.Uint32, 2) }

func mlpOf(dt ir.DType, sizes ...int) nn.MLP {
	m := nn.MLP{Activation: nn.Relu}
	for i := 0; i+1 < len(sizes); i++ {
		m.Layers = append(m.Layers, nn.Linear{W: abs(dt, sizes[i], sizes[i+1]), B: abs(dt, sizes[i+1])})
	}
	return m
}

func lnOf(lead []int, d int) nn.LayerNorm {
	s := append(append([]int{}, lead...), d)
	return nn.LayerNorm{Scale: f32(s...), Bias: f32(s...), Eps: 1e-6}
}

func attnOf(lead []int, d, heads int) nn.Attention {
	s := append(append([]int{}, lead...), d, d)
	return nn.Attention{Wq: f32(s...), Wk: f32(s...), Wv: f32(s...), Wo: f32(s...), Heads: heads}
}

func blockOf(lead []int, d, heads, hidden int) nn.Block {
	w := func(dims ...int) *trace.Array { return f32(append(append([]int{}, lead...), dims...)...) }
	return nn.Block{
		LN1: lnOf(lead, d), Attn: attnOf(lead, d, heads), LN2: lnOf(lead, d),
		MLP: nn.MLP{Activation: nn.Gelu, Layers: []nn.Linear{{W: w(d, hidden), B: w(hidden)}, {W: w(hidden, d), B: w(d)}}},
	}
}

// adamState is an abstract optim.AdamState for params.
func adamState[P any](params P) optim.AdamState[P] {
	s, err := optim.Adam[P](optim.Constant(1e-3), 0.9, 0.999, 1e-8).Init(params)
	if err != nil {
		panic(err)
	}
	return s
}

func sq(x *trace.Array) *trace.Array { return trace.Square(x) }

// Weights are the stacked weights of the examples/offload model.
type Weights struct{ W1, W2 *trace.Array }

func offloadLayer(x *trace.Array, w Weights) *trace.Array {
	return trace.MatMul(trace.MatMul(x, w.W1), w.W2)
}

func namedLayer(x *trace.Array, w Weights) *trace.Array {
	return offloadLayer(trace.CheckpointName(x, "x"), w)
}

// offloadGrad is jit(grad(loss)) of the 10-layer scanned model with layer.
func offloadGrad(layer func(*trace.Array, Weights) *trace.Array) func(Weights, *trace.Array) Weights {
	return func(w Weights, x *trace.Array) Weights {
		return trace.Grad(func(w Weights) *trace.Array {
			final, _ := trace.ScanTree(func(x *trace.Array, w Weights) (*trace.Array, struct{}) {
				return layer(x, w), struct{}{}
			}, x, w)
			return trace.Sum(final)
		})(w)
	}
}

func mlpTrainStep(p nn.MLP, s optim.AdamState[nn.MLP], x, y *trace.Array) (nn.MLP, optim.AdamState[nn.MLP], *trace.Array, error) {
	opt := optim.Adam[nn.MLP](optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array { return nn.SoftmaxCrossEntropy(p.Apply(x), y) })(p)
	p, s, err := optim.Step(opt, g, s, p)
	return p, s, loss, err
}

// deepMLPGrad is grad(sum(h²)) of relu layers, each under trace.Remat(policy)
// when policy is not nil.
func deepMLPGrad(policy trace.CheckpointPolicy) func(nn.MLP, *trace.Array) nn.MLP {
	layer := func(x *trace.Array, l nn.Linear) *trace.Array { return trace.Relu(l.Apply(x)) }
	if policy != nil {
		layer = trace.Remat(layer, policy)
	}
	return func(p nn.MLP, x *trace.Array) nn.MLP {
		return trace.Grad(func(p nn.MLP) *trace.Array {
			h := x
			for _, l := range p.Layers {
				h = layer(h, l)
			}
			return trace.Sum(sq(h))
		})(p)
	}
}

// initPairwise is the attention case of examples/init (n nodes, c channels).
func initPairwise(key *trace.Array) *trace.Array {
	const n, c = 512, 64
	ks := random.Keys(key, 5)
	h := random.Normal(ks[0], ir.Float32, ir.Shape{n, c})
	wq := nn.LecunNormal(ks[1], ir.Float32, ir.Shape{c, c})
	wk := nn.LecunNormal(ks[2], ir.Float32, ir.Shape{c, c})
	gamma := trace.Add(trace.Scalar(1), trace.Mul(trace.Scalar(0.02), random.Normal(ks[3], ir.Float32, ir.Shape{c})))
	beta := trace.Mul(trace.Scalar(0.02), random.Normal(ks[4], ir.Float32, ir.Shape{c}))
	q := trace.MatMul(h, wq)
	k := trace.MatMul(h, wk)
	diff := trace.Sub(trace.Reshape(q, n, 1, c), trace.Reshape(k, 1, n, c))
	return trace.Add(trace.Mul(trace.Tanh(diff), gamma), beta)
}

// The small examples/transformer model: tied embedding, scanned pre-norm
// blocks, final LayerNorm.
const tfVocab, tfSeq, tfLayers, tfD, tfHeads, tfBatch = 96, 64, 2, 128, 4, 16

// TModel is examples/transformer's model.
type TModel = nn.TransformerLM

type tfState = optim.ChainState[optim.EmptyState, optim.AdamState[TModel]]

func tfOptimizer() optim.Optimizer[TModel, tfState] {
	return optim.Chain(
		optim.ClipByGlobalNorm[TModel](1),
		optim.AdamW[TModel](optim.WarmupCosine(3e-3, 100, 2000, 3e-4), 0.9, 0.95, 1e-8, 0.01),
	)
}

func tfTrainStep(p TModel, s tfState, x, y *trace.Array) (TModel, tfState, *trace.Array, error) {
	loss, g := trace.ValueAndGrad(func(p TModel) *trace.Array { return p.Loss(x, y) })(p)
	u, s2, err := tfOptimizer().Update(g, s, p)
	if err != nil {
		return p, s, loss, err
	}
	p2, err := optim.ApplyUpdates(p, u)
	return p2, s2, loss, err
}

func tfArgs() []any {
	p := TModel{
		Tok: nn.Embedding{Table: f32(tfVocab, tfD)}, Pos: f32(tfSeq, tfD),
		Blocks: nn.Stack{Blocks: blockOf([]int{tfLayers}, tfD, tfHeads, 4*tfD)}, Norm: lnOf(nil, tfD),
	}
	s, err := tfOptimizer().Init(p)
	if err != nil {
		panic(err)
	}
	return []any{p, s, abs(ir.Int32, tfBatch, tfSeq), abs(ir.Int32, tfBatch, tfSeq)}
}

// programs lists every program, in the order of xla_memory.py.
func programs() []program {
	mlpSizes := []int{784, 512, 10}
	wide := []int{784, 4096, 4096, 10}
	deep := []int{1024, 1024, 1024, 1024, 1024}
	type lnGradArg = struct {
		X  *trace.Array
		LN nn.LayerNorm
	}
	offW := func() Weights { return Weights{W1: f32(10, 256, 1024), W2: f32(10, 1024, 256)} }
	ps := []program{
		{name: "elementwise_chain", args: func() []any { return []any{f32(2048, 1024)} },
			fn: func(x *trace.Array) *trace.Array {
				return trace.Add(trace.Mul(trace.Tanh(trace.Add(trace.Mul(x, trace.Scalar(2)), trace.Scalar(1))), trace.Exp(trace.Neg(x))), x)
			}},
		{name: "elementwise_two_outputs", args: func() []any { return []any{f32(2048, 1024), f32(2048, 1024)} },
			fn: func(x, y *trace.Array) (*trace.Array, *trace.Array) {
				return trace.Add(trace.Mul(x, y), trace.Scalar(1)), trace.Tanh(trace.Sub(x, y))
			}},
		{name: "elementwise_broadcast", args: func() []any { return []any{f32(2048, 1024), f32(1024)} },
			fn: func(x, b *trace.Array) *trace.Array {
				return trace.Mul(trace.Maximum(trace.Add(x, b), trace.Scalar(0)), trace.Sqrt(trace.Add(trace.Abs(b), trace.Scalar(1))))
			}},
		{name: "reduce_sum_rows", args: func() []any { return []any{f32(4096, 1024)} },
			fn: func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(x, x), 1) }},
		{name: "reduce_mixed", args: func() []any { return []any{f32(1024, 2048)} },
			fn: func(x *trace.Array) (*trace.Array, *trace.Array, *trace.Array) {
				return trace.Sum(x), trace.Max(x, 0), trace.Mean(trace.Exp(x), 1)
			}},
		{name: "softmax", args: func() []any { return []any{f32(1024, 2048)} },
			fn: func(x *trace.Array) *trace.Array { return trace.Softmax(x, 1) }},
		{name: "log_softmax", args: func() []any { return []any{f32(1024, 2048)} },
			fn: func(x *trace.Array) *trace.Array { return trace.LogSoftmax(x, 1) }},
		{name: "layernorm", args: func() []any { return []any{f32(4096, 1024), lnOf(nil, 1024)} },
			fn: func(x *trace.Array, p nn.LayerNorm) *trace.Array { return p.Apply(x) }},
		{name: "layernorm_grad", args: func() []any { return []any{lnGradArg{X: f32(4096, 1024), LN: lnOf(nil, 1024)}} },
			fn: func(a lnGradArg) lnGradArg {
				return trace.Grad(func(a lnGradArg) *trace.Array { return trace.Sum(sq(a.LN.Apply(a.X))) })(a)
			}},
		{name: "softmax_grad", args: func() []any { return []any{f32(1024, 2048), f32(1024, 2048)} },
			fn: func(x, w *trace.Array) *trace.Array {
				return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(trace.Softmax(x, 1), w)) })(x)
			}},
		{name: "matmul_chain", args: func() []any { return []any{f32(1024, 1024), f32(1024, 4096), f32(4096, 1024)} },
			fn: func(x, a, b *trace.Array) *trace.Array { return trace.MatMul(trace.Relu(trace.MatMul(x, a)), b) }},
		{name: "mlp_forward", args: func() []any { return []any{mlpOf(ir.Float32, mlpSizes...), f32(128, 784)} },
			fn: func(p nn.MLP, x *trace.Array) *trace.Array { return p.Apply(x) }},
		{name: "mlp_value_and_grad", args: func() []any { return []any{mlpOf(ir.Float32, mlpSizes...), f32(128, 784), abs(ir.Int32, 128)} },
			fn: func(p nn.MLP, x, y *trace.Array) (*trace.Array, nn.MLP) {
				return trace.ValueAndGrad(func(p nn.MLP) *trace.Array { return nn.SoftmaxCrossEntropy(p.Apply(x), y) })(p)
			}},
		{name: "mlp_train_step_adam", donate: []int{0, 1}, fn: mlpTrainStep, args: func() []any {
			p := mlpOf(ir.Float32, mlpSizes...)
			return []any{p, adamState(p), f32(128, 784), abs(ir.Int32, 128)}
		}},
		{name: "mlp_train_step_adam_wide", donate: []int{0, 1}, fn: mlpTrainStep, args: func() []any {
			p := mlpOf(ir.Float32, wide...)
			return []any{p, adamState(p), f32(1024, 784), abs(ir.Int32, 1024)}
		}},
		{name: "deep_mlp_grad", fn: deepMLPGrad(nil), args: func() []any { return []any{mlpOf(ir.Float32, deep...), f32(2048, 1024)} }},
		{name: "deep_mlp_grad_remat_nothing", fn: deepMLPGrad(trace.NothingSaveable), args: func() []any { return []any{mlpOf(ir.Float32, deep...), f32(2048, 1024)} }},
		{name: "deep_mlp_grad_remat_dots", fn: deepMLPGrad(trace.DotsSaveable), args: func() []any { return []any{mlpOf(ir.Float32, deep...), f32(2048, 1024)} }},
	}
	for _, a := range []struct {
		name       string
		b, t, d, h int
	}{{"attention_t128", 8, 128, 256, 4}, {"attention_t512", 4, 512, 256, 8}, {"attention_t2048", 1, 2048, 512, 8}} {
		ps = append(ps, program{name: a.name, args: func() []any { return []any{attnOf(nil, a.d, a.h), f32(a.b, a.t, a.d)} },
			fn: func(at nn.Attention, x *trace.Array) *trace.Array { return at.Apply(x) }})
	}
	ps = append(ps,
		program{name: "attention_grad_t512", args: func() []any { return []any{attnOf(nil, 256, 8), f32(4, 512, 256)} },
			fn: func(at nn.Attention, x *trace.Array) nn.Attention {
				return trace.Grad(func(at nn.Attention) *trace.Array { return trace.Sum(sq(at.Apply(x))) })(at)
			}},
		program{name: "offload_baseline", fn: offloadGrad(offloadLayer), args: func() []any { return []any{offW(), f32(256, 256)} }},
		program{name: "offload_remat_nothing", fn: offloadGrad(trace.Remat(offloadLayer, trace.NothingSaveable)), args: func() []any { return []any{offW(), f32(256, 256)} }},
		program{name: "offload_remat_dots", fn: offloadGrad(trace.Remat(offloadLayer, trace.DotsSaveable)), args: func() []any { return []any{offW(), f32(256, 256)} }},
		program{name: "offload_remat_save_x", fn: offloadGrad(trace.Remat(namedLayer, trace.SaveOnlyTheseNames("x"))), args: func() []any { return []any{offW(), f32(256, 256)} }},
		program{name: "init_mlp", args: func() []any { return []any{key()} },
			fn: func(k *trace.Array) nn.MLP { return nn.NewMLP(k, ir.Float32, []int{784, 512, 10}, nil) }},
		program{name: "init_random_matrix", args: func() []any { return []any{key()} },
			fn: func(k *trace.Array) *trace.Array {
				return trace.Mul(trace.Scalar(0.02), random.Normal(k, ir.Float32, ir.Shape{4096, 8192}))
			}},
		program{name: "init_stack_bf16", args: func() []any { return []any{key()} },
			fn: func(k *trace.Array) nn.Stack { return nn.NewStack(k, ir.BFloat16, 8, 256, 4, 1024) }},
		program{name: "init_pairwise", args: func() []any { return []any{key()} }, fn: initPairwise},
		program{name: "transformer_train_step", donate: []int{0, 1}, fn: tfTrainStep, args: tfArgs},
	)
	return ps
}
