package main

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Size is the model and batch of one run.
type Size struct {
	Config nn.LlamaConfig
	Seq    int      // tokens per sequence
	Batch  int      // sequences per step
	Param  ir.DType // the parameters' dtype (bf16 for the 7B plan)
}

// llama7B is a Llama-style 7B decoder with grouped-query attention (the
// shape of Mistral 7B without its sliding window): 32 layers of width 4096,
// 32 query heads and 8 key/value heads of 128, SwiGLU of 14336, a 32000
// token vocabulary, untied embeddings.
var llama7B = nn.LlamaConfig{Vocab: 32000, Layers: 32, D: 4096, Heads: 32, KVHeads: 8, Hidden: 14336}

// State is what a training step carries from one step to the next: the
// parameters and AdamW's state (step count, first and second moments). The
// moments are f32 whatever the parameters' dtype; no f32 master copy of the
// parameters is kept, so a step costs 2 + 4 + 4 = 10 bytes per bf16
// parameter (a master copy would add 4 more).
type State struct {
	Params nn.Llama
	Opt    optim.AdamState[nn.Llama]
}

// adamW is the optimizer of the step (AdamW with Llama's β2 = 0.95 and
// weight decay 0.1).
func adamW() optim.Optimizer[nn.Llama, optim.AdamState[nn.Llama]] {
	return optim.AdamW[nn.Llama](optim.Constant(3e-4), 0.9, 0.95, 1e-8, 0.1)
}

// trainStep is one training step: the next-token loss of ids against
// targets, its gradient, and the AdamW update. The caller donates p and s.
func trainStep(p nn.Llama, s optim.AdamState[nn.Llama], ids, targets *trace.Array) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	loss, g := trace.ValueAndGrad(func(p nn.Llama) *trace.Array {
		return nn.SoftmaxCrossEntropy(p.Logits(ids, nn.Context{}), targets)
	})(p)
	p, s, err := optim.Step(adamW(), g, s, p)
	if err != nil {
		panic(err)
	}
	return p, s, loss
}

// shapes returns the types of a Llama's parameters in dtype dt, as
// jax.eval_shape would: nn.NewLlama traced with an abstract key, never run.
func shapes(dt ir.DType, c nn.LlamaConfig) (_ nn.Llama, err error) {
	defer trace.Recover(&err)
	tr := trace.NewFuncTracer("llama_shapes")
	defer tr.Close()
	key := tr.Param(ir.TypeOf(ir.Uint32, 2))
	tr.Push()
	m := nn.NewLlama(key, dt, c)
	tr.Pop()
	return trace.MapAs(m, func(a *trace.Array) *trace.Array { return trace.Abstract(ir.TypeOf(a.DType(), a.Shape()...)) })
}

// abstractArgs returns the step's arguments as abstract arrays (no memory
// allocated): parameters in sz.Param, f32 moments, int32 ids and targets.
func abstractArgs(sz Size) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array, *trace.Array, error) {
	p, err := shapes(sz.Param, sz.Config)
	if err != nil {
		return p, optim.AdamState[nn.Llama]{}, nil, nil, err
	}
	m, err := shapes(ir.Float32, sz.Config)
	if err != nil {
		return p, optim.AdamState[nn.Llama]{}, nil, nil, err
	}
	v, _ := shapes(ir.Float32, sz.Config)
	s := optim.AdamState[nn.Llama]{Count: trace.Abstract(ir.TypeOf(ir.Int32)), Mu: m, Nu: v}
	ids := trace.Abstract(ir.TypeOf(ir.Int32, sz.Batch, sz.Seq))
	return p, s, ids, trace.Abstract(ir.TypeOf(ir.Int32, sz.Batch, sz.Seq)), nil
}

// compileStep lowers and compiles the step for args with opts (donating
// the parameters and the optimizer state).
func compileStep(args []any, opts ...rt.Option) (*rt.Compiled, error) {
	opts = append([]rt.Option{rt.WithName("llama_train_step"), rt.Donate(0, 1)}, opts...)
	low, err := rt.NewJitted(stepFunc(), opts...).Lower(args...)
	if err != nil {
		return nil, err
	}
	return low.Compile()
}

// stepFunc returns the step -update selects.
func stepFunc() func(nn.Llama, optim.AdamState[nn.Llama], *trace.Array, *trace.Array) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	if *updateFlag == "whole" {
		return trainStep
	}
	return trainStepLayered
}

// treeBytes is the bytes of every array leaf of tree.
func treeBytes(tree any) int64 {
	n := int64(0)
	for _, l := range trace.Leaves(tree) {
		n += l.Type().Bytes()
	}
	return n
}

// paramCount is the number of elements of every leaf of tree.
func paramCount(tree any) int64 {
	n := int64(0)
	for _, l := range trace.Leaves(tree) {
		n += int64(l.Type().Size())
	}
	return n
}

func gib(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// outer is a Llama's parameters outside the stack of blocks.
type outer struct {
	Embed  nn.Embedding
	Norm   nn.RMSNorm
	LMHead nn.Linear
}

func outerOf(m nn.Llama) outer { return outer{m.Embed, m.Norm, m.LMHead} }

// layerSlices is one layer's parameters, gradient and moments: the xs of
// the per-layer update.
type layerSlices struct{ P, G, M, V nn.TransformerBlock }

// layerUpdate is one layer's new parameters and moments: its ys.
type layerUpdate struct{ P, M, V nn.TransformerBlock }

// onDevice copies x to device when it is elsewhere (a slice of stacked
// weights or moments the memory budget placed in pinned_host).
func onDevice(x *trace.Array) *trace.Array {
	if x.Space() == ir.Device {
		return x
	}
	return trace.DevicePut(x, ir.Device)
}

func mustTree[T any](t T, err error) T {
	if err != nil {
		panic(err)
	}
	return t
}

// trainStepLayered is trainStep with the AdamW update of the stacked
// blocks written as a scan over the layers, one layer's parameters,
// gradient and moments per step, the way the 7B step fits 24 GiB (see the
// package comment): the program then reads the stacked parameters and
// moments only as scans' xs, so the memory budget can keep them in
// pinned_host and stream them, and writes their new values one layer at a
// time. The update is the same AdamW, leaf by leaf, with the same count.
func trainStepLayered(p nn.Llama, s optim.AdamState[nn.Llama], ids, targets *trace.Array) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	loss, g := trace.ValueAndGrad(func(p nn.Llama) *trace.Array {
		return nn.SoftmaxCrossEntropy(p.Logits(ids, nn.Context{}), targets)
	})(p)
	return layeredUpdate(p, s, g, loss)
}

// layeredUpdate is the AdamW update of trainStepLayered: the outer
// parameters with optim.Step, the stacked blocks with a scan over the
// layers, each layer's parameters copied to device where they are
// elsewhere. It returns the new parameters and state, and loss.
func layeredUpdate(p nn.Llama, s optim.AdamState[nn.Llama], g nn.Llama, loss *trace.Array) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	return layeredUpdateIn(p, s, g, loss, func(x layerSlices) layerSlices {
		x.P = mustTree(trace.MapAs(x.P, onDevice))
		return x
	})
}

// layeredUpdateIn is layeredUpdate with in applied to each layer's slices
// inside the scan before the update reads them.
func layeredUpdateIn(p nn.Llama, s optim.AdamState[nn.Llama], g nn.Llama, loss *trace.Array, in func(layerSlices) layerSlices) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	o, os, err := optim.Step(optim.AdamW[outer](optim.Constant(3e-4), 0.9, 0.95, 1e-8, 0.1), outerOf(g),
		optim.AdamState[outer]{Count: s.Count, Mu: outerOf(s.Mu), Nu: outerOf(s.Nu)}, outerOf(p))
	if err != nil {
		panic(err)
	}
	layerOpt := optim.AdamW[nn.TransformerBlock](optim.Constant(3e-4), 0.9, 0.95, 1e-8, 0.1)
	_, up := trace.ScanTree(func(c struct{}, x layerSlices) (struct{}, layerUpdate) {
		x = in(x)
		np, ns, err := optim.Step(layerOpt, x.G, optim.AdamState[nn.TransformerBlock]{Count: s.Count, Mu: x.M, Nu: x.V}, x.P)
		if err != nil {
			panic(err)
		}
		return c, layerUpdate{np, ns.Mu, ns.Nu}
	}, struct{}{}, layerSlices{p.Blocks.Blocks, g.Blocks.Blocks, s.Mu.Blocks.Blocks, s.Nu.Blocks.Blocks})
	llama := func(o outer, b nn.TransformerBlock) nn.Llama {
		return nn.Llama{Embed: o.Embed, Blocks: nn.TransformerStack{Blocks: b}, Norm: o.Norm, LMHead: o.LMHead}
	}
	return llama(o, up.P), optim.AdamState[nn.Llama]{Count: os.Count, Mu: llama(os.Mu, up.M), Nu: llama(os.Nu, up.V)}, loss
}
