package ir_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// TestIndexRules reads the result of random dynamic_slice,
// dynamic_update_slice, concatenate, pad and gather ops element by element
// through IndexRuleOf's rule (starts and indices out of range included) and
// compares it with the oracle's kernels, which compute each op from its
// definition.
func TestIndexRules(t *testing.T) {
	r := testseed.Rand(t, 17)
	seen := map[ir.Code]int{}
	for it := 0; it < 300; it++ {
		op, ins := randomIndexOp(r)
		if op == nil {
			continue
		}
		seen[op.Code]++
		rule, ok := ir.IndexRuleOf(op)
		if !ok {
			t.Fatalf("%v: no rule", op.Code)
		}
		want, err := eval.EvalOp(op, ins)
		if err != nil {
			t.Fatal(err)
		}
		value := func(k, j int) int64 { return int64(ins[k].Float64At(j)) }
		got := ir.View[float32](want[0])
		for i := range got {
			p, j := rule.Source(i, value)
			src := ins[rule.Pieces[p].Operand]
			if g := ir.View[float32](src)[j]; g != got[i] {
				t.Fatalf("%v of %v: element %d is operand %d[%d] = %v, want %v", op.Code, op.Args[0].Type, i, rule.Pieces[p].Operand, j, g, got[i])
			}
		}
	}
	if len(seen) != 5 {
		t.Errorf("ops drawn: %v", seen)
	}
	t.Logf("ops drawn: %v", seen)
	x := ir.NewFunc("f").Body.AddParam(ir.TypeOf(ir.Float32, 2))
	if _, ok := ir.IndexRuleOf(&ir.Op{Code: ir.Add, Args: []*ir.Value{x, x}, Results: []*ir.Value{x}}); ok {
		t.Error("add has an index rule")
	}
}

// randomIndexOp returns a random op with an index rule and random operands
// (f32 data numbered 1, 2, ..., int32 starts and indices, some out of
// range), or nil when the draw is not a valid op.
func randomIndexOp(r *rand.Rand) (*ir.Op, []*ir.Literal) {
	f := ir.NewFunc("f")
	shape := func(lo int) ir.Shape {
		s := make(ir.Shape, 1+r.IntN(3))
		for d := range s {
			s[d] = lo + r.IntN(4)
		}
		return s
	}
	var args []*ir.Value
	var ins []*ir.Literal
	param := func(t ir.Type) {
		args = append(args, f.Body.AddParam(t))
		l := ir.NewLiteral(t)
		for i := range t.Size() {
			if t.DType == ir.Int32 {
				ir.View[int32](l)[i] = int32(r.IntN(12) - 3)
			} else {
				ir.View[float32](l)[i] = float32(len(ins)*1000 + i + 1)
			}
		}
		ins = append(ins, l)
	}
	xs := shape(1)
	param(ir.TypeOf(ir.Float32, xs...))
	var code ir.Code
	attrs := ir.Attrs{}
	switch r.IntN(5) {
	case 0:
		code = ir.DynamicSlice
		sizes := make([]int, len(xs))
		for d := range xs {
			sizes[d] = r.IntN(xs[d] + 1)
			param(ir.TypeOf(ir.Int32))
		}
		attrs["sizes"] = sizes
	case 1:
		code = ir.DynamicUpdateSlice
		us := make(ir.Shape, len(xs))
		for d := range xs {
			us[d] = r.IntN(xs[d] + 1)
		}
		param(ir.TypeOf(ir.Float32, us...))
		for range xs {
			param(ir.TypeOf(ir.Int32))
		}
	case 2:
		code = ir.Concatenate
		axis := r.IntN(len(xs))
		for range r.IntN(3) {
			s := slicesClone(xs)
			s[axis] = r.IntN(3)
			param(ir.TypeOf(ir.Float32, s...))
		}
		attrs["axis"] = axis
	case 3:
		code = ir.Pad
		if r.IntN(4) == 0 {
			xs[r.IntN(len(xs))] = 0
			args, ins = nil, nil
			param(ir.TypeOf(ir.Float32, xs...))
		}
		param(ir.TypeOf(ir.Float32))
		low, high, interior := make([]int, len(xs)), make([]int, len(xs)), make([]int, len(xs))
		for d := range xs {
			low[d], high[d], interior[d] = r.IntN(5)-2, r.IntN(4)-1, r.IntN(3)
		}
		attrs["low"], attrs["high"], attrs["interior"] = low, high, interior
	default:
		code = ir.Gather
		is := shape(0)
		param(ir.TypeOf(ir.Int32, is[:min(len(is), 2)]...))
		attrs["axis"] = r.IntN(len(xs))
	}
	op, err := f.Body.AddOp(code, args, attrs)
	if err != nil {
		return nil, nil
	}
	return op, ins
}

func slicesClone(s ir.Shape) ir.Shape { return append(ir.Shape(nil), s...) }
