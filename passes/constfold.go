package passes

import (
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
)

// maxFoldElements is the largest result (in elements) constant folding makes.
const maxFoldElements = 1024

// constantFold evaluates ops whose operands are all constants with the
// reference executor and replaces them by constants, when every result has at
// most maxFoldElements elements. An elementwise op whose operands are all
// splats (a constant of equal elements, possibly broadcast or reshaped) is
// computed once on the scalars and becomes a broadcast scalar constant, so no
// large literal is ever made. Region ops, device_put, iota, broadcasts of
// scalars and collectives (whose values come from the other devices) are
// left alone; an op the executor rejects stays as it is.
func constantFold(st *State) error {
	return rewriteOps(st.Func, fold)
}

// fold returns replacements for op's results and the ops that define them.
func fold(f *ir.Func, op *ir.Op) ([]*ir.Value, []*ir.Op) {
	if isRegionOp(op) || len(op.Args) == 0 || len(op.Results) == 0 || op.Code.IsCollective() {
		return nil, nil
	}
	switch op.Code {
	case ir.DevicePut, ir.Constant, ir.Iota:
		return nil, nil
	}
	if op.Info().Elementwise {
		if v, ops := foldSplats(f, op); v != nil {
			return []*ir.Value{v}, ops
		}
	}
	if op.Code == ir.BroadcastInDim && op.Args[0].Type.Size() <= 1 {
		return nil, nil
	}
	ins := make([]*ir.Literal, len(op.Args))
	for i, a := range op.Args {
		if a.Op == nil || a.Op.Code != ir.Constant {
			return nil, nil
		}
		ins[i] = a.Op.Attrs.Literal("value")
	}
	for _, v := range op.Results {
		if v.Type.Size() > maxFoldElements {
			return nil, nil
		}
	}
	outs, err := eval.EvalOp(op, ins)
	if err != nil {
		return nil, nil
	}
	var reps []*ir.Value
	var ops []*ir.Op
	for i, l := range outs {
		c, err := f.NewOp(ir.Constant, nil, ir.Attrs{"value": l})
		if err != nil || !c.Result().Type.Equal(op.Results[i].Type) {
			return nil, nil
		}
		c.Loc = op.Loc
		reps = append(reps, c.Result())
		ops = append(ops, c)
	}
	return reps, ops
}

// foldSplats folds an elementwise op whose operands are all splats into a
// scalar constant, broadcast to the result's shape when it is not a scalar.
// Ops whose operands are all small plain constants are left to the general
// rule, which makes a plain constant.
func foldSplats(f *ir.Func, op *ir.Op) (*ir.Value, []*ir.Op) {
	res := op.Result()
	scalars := make([]*ir.Literal, len(op.Args))
	plain := true
	for i, a := range op.Args {
		l, ok := splat(a)
		if !ok {
			return nil, nil
		}
		scalars[i] = l
		plain = plain && a.Op.Code == ir.Constant
	}
	if plain && res.Type.Size() <= maxFoldElements {
		return nil, nil
	}
	outs, err := eval.EvalOp(&ir.Op{Code: op.Code, Attrs: op.Attrs}, scalars)
	if err != nil || len(outs) != 1 {
		return nil, nil
	}
	c, err := f.NewOp(ir.Constant, nil, ir.Attrs{"value": outs[0]})
	if err != nil {
		return nil, nil
	}
	c.Loc = op.Loc
	if res.Type.Rank() == 0 {
		if !c.Result().Type.Equal(res.Type) {
			return nil, nil
		}
		return c.Result(), []*ir.Op{c}
	}
	b, err := f.NewOp(ir.BroadcastInDim, []*ir.Value{c.Result()}, ir.Attrs{"shape": []int(res.Type.Shape.Clone()), "dims": []int{}})
	if err != nil || !b.Result().Type.Equal(res.Type) {
		return nil, nil
	}
	b.Loc = op.Loc
	return b.Result(), []*ir.Op{c, b}
}
