package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// TestLowerOpKernels lowers lone ops of every kind LowerOp describes to
// kernels of one group and runs each by a small interpreter of the plan's
// kernels (leaves and constants read through their views, nodes by
// eval.Elementwise, reductions folded through their output layout): on
// fresh random operands it gives what the oracle gives for the op. The ops
// the kernel form does not express are not described, and Lower attaches
// the kernels to the op steps of a compiled program.
func TestLowerOpKernels(t *testing.T) {
	rng := testseed.Rand(t, 41)
	f := ir.NewFunc("ops")
	b := f.Body
	x, y := b.AddParam(ir.TypeOf(ir.Int32, 3, 4, 5)), b.AddParam(ir.TypeOf(ir.Int32, 3, 4, 5))
	z, w := b.AddParam(ir.TypeOf(ir.Float32, 4)), b.AddParam(ir.TypeOf(ir.Float32, 6, 7))
	ix := b.AddParam(ir.TypeOf(ir.Int32, 2))
	s0, s1, pv := b.AddParam(ir.TypeOf(ir.Int32)), b.AddParam(ir.TypeOf(ir.Int32)), b.AddParam(ir.TypeOf(ir.Float32))
	add := func(code ir.Code, args []*ir.Value, attrs ir.Attrs) *ir.Op {
		op, err := b.AddOp(code, args, attrs)
		require.NoError(t, err, "%v", code)
		return op
	}
	described := []*ir.Op{
		add(ir.Add, []*ir.Value{x, y}, nil),
		add(ir.Neg, []*ir.Value{x}, nil),
		add(ir.Select, []*ir.Value{add(ir.Lt, []*ir.Value{x, y}, nil).Result(), x, y}, nil),
		add(ir.Convert, []*ir.Value{x}, ir.Attrs{"dtype": ir.Float16}),
		add(ir.Exp, []*ir.Value{w}, nil),
		add(ir.Transpose, []*ir.Value{x}, ir.Attrs{"perm": []int{2, 0, 1}}),
		add(ir.BroadcastInDim, []*ir.Value{z}, ir.Attrs{"shape": []int{3, 4, 5}, "dims": []int{1}}),
		add(ir.Slice, []*ir.Value{w}, ir.Attrs{"start": []int{1, 0}, "limit": []int{6, 7}, "strides": []int{2, 3}}),
		add(ir.Reshape, []*ir.Value{x}, ir.Attrs{"shape": []int{12, 5}}),
		add(ir.Iota, nil, ir.Attrs{"dtype": ir.Float32, "shape": []int{3, 4}, "dim": 1}),
		add(ir.ReduceSum, []*ir.Value{x}, ir.Attrs{"axes": []int{0, 2}}),
		add(ir.ReduceMax, []*ir.Value{w}, ir.Attrs{"axes": []int{1}}),
		add(ir.ReduceMin, []*ir.Value{w}, ir.Attrs{"axes": []int{0}}),
		add(ir.ArgMax, []*ir.Value{w}, ir.Attrs{"axis": 1, "dtype": ir.Int32}),
		add(ir.ArgMin, []*ir.Value{x}, ir.Attrs{"axis": 0, "dtype": ir.Int64}),
		add(ir.Gather, []*ir.Value{w, ix}, ir.Attrs{"axis": 0}),
		add(ir.Concatenate, []*ir.Value{w, w}, ir.Attrs{"axis": 1}),
		add(ir.DynamicSlice, []*ir.Value{x, s0, s1, s0}, ir.Attrs{"sizes": []int{2, 2, 3}}),
		add(ir.DynamicUpdateSlice, []*ir.Value{w, add(ir.Slice, []*ir.Value{w}, ir.Attrs{"start": []int{0, 0}, "limit": []int{2, 3}, "strides": []int{1, 1}}).Result(), s1, s0}, nil),
		add(ir.Pad, []*ir.Value{w, pv}, ir.Attrs{"low": []int{1, -2}, "high": []int{0, 2}, "interior": []int{1, 0}}),
	}
	for _, op := range described {
		k, ok := passes.LowerOp(op)
		require.True(t, ok, "%v is not described", op.Code)
		iotas := 0
		for _, nd := range k.Programs[0].Nodes {
			if nd.Iota {
				require.Equal(t, passes.NodeConst, nd.Kind)
				iotas++
			}
		}
		require.Equal(t, op.Code == ir.Iota, iotas == 1, "%v: %d iota nodes", op.Code, iotas)
		var ins []*ir.Literal
		for _, a := range op.Args {
			ins = append(ins, randprog.RandomLiteral(rng, a.Type))
		}
		want, err := eval.EvalOp(op, ins)
		require.NoError(t, err)
		got := runKernel(t, k, ins)
		for i := range want {
			require.NoError(t, sameLiteral(got[i], want[i]), "%v result %d", op.Code, i)
		}
	}
	dot := add(ir.DotGeneral, []*ir.Value{w, w}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{1}})
	k, ok := passes.LowerOp(dot)
	require.True(t, ok)
	require.Equal(t, passes.KernelOutput, k.Mode)
	require.Equal(t, [2]int{0, 1}, k.DotArgs)
	for _, op := range []*ir.Op{
		add(ir.ScatterAdd, []*ir.Value{w, ix, add(ir.Slice, []*ir.Value{w}, ir.Attrs{"start": []int{0, 0}, "limit": []int{2, 7}, "strides": []int{1, 1}}).Result()}, ir.Attrs{"axis": 0}),
		add(ir.Sort, []*ir.Value{w}, ir.Attrs{"dimension": 1, "num_keys": 1}),
	} {
		_, ok := passes.LowerOp(op)
		require.False(t, ok, "%v is described", op.Code)
	}
}

// TestLowerAttachesOpKernels: in a compiled program, an op step the kernel
// form describes carries its kernel, another (a sort) none.
func TestLowerAttachesOpKernels(t *testing.T) {
	f := ir.NewFunc("f")
	x, ix := f.Body.AddParam(ir.TypeOf(ir.Float32, 8, 3)), f.Body.AddParam(ir.TypeOf(ir.Int32, 5))
	g, err := f.Body.AddOp(ir.Gather, []*ir.Value{x, ix}, ir.Attrs{"axis": 0})
	require.NoError(t, err)
	s, err := f.Body.AddOp(ir.ReduceSum, []*ir.Value{g.Result()}, ir.Attrs{"axes": []int{1}})
	require.NoError(t, err)
	m, err := f.Body.AddOp(ir.Sort, []*ir.Value{x}, ir.Attrs{"dimension": 1, "num_keys": 1})
	require.NoError(t, err)
	f.Body.Results = []*ir.Value{s.Result(), g.Result(), m.Result()}
	ex, err := passes.Lower(compile(t, f, passes.Options{}))
	require.NoError(t, err)
	kinds := map[ir.Code]bool{}
	for _, st := range ex.Top.Steps {
		if st.Kind == passes.StepOp {
			kinds[st.Op.Code] = st.Kernel != nil
		}
	}
	require.Equal(t, map[ir.Code]bool{ir.Gather: true, ir.ReduceSum: true, ir.Sort: false}, kinds, "%s", ex)
}

// runKernel interprets the programs of a loop or input kernel over the
// operands ins and returns the fusion's results.
func runKernel(t *testing.T, k *passes.Kernel, ins []*ir.Literal) []*ir.Literal {
	t.Helper()
	require.Contains(t, []passes.KernelMode{passes.KernelLoop, passes.KernelInput}, k.Mode)
	rg := k.Op.Regions[0]
	outs := make([]*ir.Literal, len(rg.Results))
	for i, v := range rg.Results {
		outs[i] = ir.NewLiteral(v.Type)
	}
	for _, p := range k.Programs {
		vals := make([]*ir.Literal, len(p.Nodes))
		for n, nd := range p.Nodes {
			l := ir.NewLiteral(ir.TypeOf(nd.DType, p.Size))
			sz := nd.DType.Size()
			switch nd.Kind {
			case passes.NodeLeaf, passes.NodeConst:
				src := nd.Data
				if nd.Kind == passes.NodeLeaf {
					src = ins[nd.Operand].Data
				}
				for i := range p.Size {
					j := nd.View.At(i)
					copy(l.Data[i*sz:(i+1)*sz], src[j*sz:(j+1)*sz])
				}
			case passes.NodeIndexed:
				value := func(k, j int) int64 { return int64(ins[nd.Operands[k]].Float64At(j)) }
				for i := range p.Size {
					pc, j := nd.Index.Source(nd.View.At(i), value)
					src := ins[nd.Operands[nd.Index.Pieces[pc].Operand]].Data
					copy(l.Data[i*sz:(i+1)*sz], src[j*sz:(j+1)*sz])
				}
			case passes.NodeOp:
				var args []*ir.Literal
				for _, a := range nd.Args {
					args = append(args, vals[a])
				}
				require.NoError(t, eval.Elementwise(nd.Code, nd.Attrs, args, l))
			default:
				t.Fatalf("node kind %d", nd.Kind)
			}
			vals[n] = l
		}
		for _, r := range p.Results {
			copy(outs[r.Result].Data, vals[r.Node].Data)
		}
		for _, r := range p.Reduces {
			fold(t, r, vals[r.Node], outs[r.Result])
		}
	}
	return outs
}

// fold reduces x into out through r's output layout, element by element in
// order, each output starting from its first element.
func fold(t *testing.T, r passes.Reduce, x, out *ir.Literal) {
	t.Helper()
	if r.Code == ir.ArgMax || r.Code == ir.ArgMin {
		foldArg(r, x, out)
		return
	}
	code := map[ir.Code]ir.Code{ir.ReduceSum: ir.Add, ir.ReduceMax: ir.Max, ir.ReduceMin: ir.Min, ir.ReduceProd: ir.Mul}[r.Code]
	sz := x.Type.DType.Size()
	seen := make([]bool, r.Outputs)
	for i := range x.Type.Size() {
		o := r.Out.At(i)
		acc := &ir.Literal{Type: ir.TypeOf(x.Type.DType), Data: out.Data[o*sz : (o+1)*sz]}
		e := &ir.Literal{Type: ir.TypeOf(x.Type.DType), Data: x.Data[i*sz : (i+1)*sz]}
		if !seen[o] {
			seen[o] = true
			copy(acc.Data, e.Data)
			continue
		}
		require.NoError(t, eval.Elementwise(code, nil, []*ir.Literal{acc, e}, acc))
	}
}

// foldArg is fold for arg_max and arg_min: per output the position, among
// the elements going into it, of the first NaN, or else of the first
// maximum (minimum).
func foldArg(r passes.Reduce, x, out *ir.Literal) {
	best := make([]float64, r.Outputs)
	pos := make([]int, r.Outputs)
	seen := make([]int, r.Outputs)
	for i := range x.Type.Size() {
		o, v := r.Out.At(i), x.Float64At(i)
		k := seen[o]
		seen[o]++
		b := best[o]
		better := v > b
		if r.Code == ir.ArgMin {
			better = v < b
		}
		if k == 0 || b == b && (v != v || better) {
			best[o], pos[o] = v, k
		}
	}
	for o, p := range pos {
		out.SetFloat64At(o, float64(p))
	}
}
