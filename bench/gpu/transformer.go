package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// transformerConfig is the Transformer step of bench/gpu/README.md, the same
// in jax_bench.py: the model of examples/transformer (token embedding tied
// to the output, learned positions, pre-norm blocks in an nn.Stack with a
// 4·d GELU MLP, final LayerNorm) at this size, trained with
// chain(clip_by_global_norm(1), adamw(3e-3, 0.9, 0.95, 1e-8, 0.01)) and a
// constant learning rate, params and optimizer state donated.
var transformerConfig = struct {
	Vocab, D, Heads, Layers, Seq, Batch int
	LR                                  float64
}{Vocab: 256, D: 256, Heads: 4, Layers: 4, Seq: 128, Batch: 16, LR: 3e-3}

// tfModel is examples/transformer's model.
type tfModel = nn.TransformerLM

// transformerStep traces one training step and returns the function (its
// parameters: the model's leaves, the optimizer state's, x, y, then captured
// constants), which parameters are donated, and host literals of the
// initial arguments (initialised on the CPU backend).
func transformerStep() (*ir.Func, []bool, []*ir.Literal, error) {
	c := transformerConfig
	opt := optim.Chain(optim.ClipByGlobalNorm[tfModel](1), optim.AdamW[tfModel](optim.Constant(c.LR), 0.9, 0.95, 1e-8, 0.01))
	params := rt.Jit(func(k *trace.Array) tfModel {
		return nn.NewTransformerLM(k, ir.Float32, c.Vocab, c.Seq, c.Layers, c.D, c.Heads, 4*c.D)
	})(random.NewKey(0))
	state, err := opt.Init(params)
	if err != nil {
		return nil, nil, nil, err
	}
	type optState = optim.ChainState[optim.EmptyState, optim.AdamState[tfModel]]
	step := func(p tfModel, s optState, x, y *trace.Array) (tfModel, optState, *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p tfModel) *trace.Array { return p.Loss(x, y) })(p)
		upd, s2, err := opt.Update(g, s, p)
		if err != nil {
			return tfModel{}, optState{}, nil, err
		}
		p2, err := optim.ApplyUpdates(p, upd)
		if err != nil {
			return tfModel{}, optState{}, nil, err
		}
		return p2, s2, loss, nil
	}
	rng := rand.New(rand.NewPCG(3, 4))
	tok := make([]int32, c.Batch*(c.Seq+1))
	for i := range tok {
		tok[i] = int32(rng.IntN(c.Vocab))
	}
	xs, ys := make([]int32, c.Batch*c.Seq), make([]int32, c.Batch*c.Seq)
	for b := range c.Batch {
		copy(xs[b*c.Seq:], tok[b*(c.Seq+1):b*(c.Seq+1)+c.Seq])
		copy(ys[b*c.Seq:], tok[b*(c.Seq+1)+1:(b+1)*(c.Seq+1)])
	}
	x, y := rt.FromSlice(xs, c.Batch, c.Seq), rt.FromSlice(ys, c.Batch, c.Seq)
	low, err := rt.NewJitted(step, rt.Donate(0, 1)).Lower(params, state, x, y)
	if err != nil {
		return nil, nil, nil, err
	}
	var args []*trace.Array
	args = append(args, trace.Leaves(params)...)
	nDonated := len(args) + len(trace.Leaves(state))
	args = append(args, trace.Leaves(state)...)
	args = append(args, x, y)
	args = append(args, low.Captured()...)
	if len(args) != len(low.Func.Body.Params) {
		return nil, nil, nil, fmt.Errorf("transformer step: %d argument leaves for %d parameters", len(args), len(low.Func.Body.Params))
	}
	donated := make([]bool, len(args))
	lits := make([]*ir.Literal, len(args))
	for i, a := range args {
		donated[i] = i < nDonated
		if lits[i], err = a.Literal(); err != nil {
			return nil, nil, nil, err
		}
	}
	return low.Func, donated, lits, nil
}
