package passes_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// block copies the block [start, limit) of l.
func block(l *ir.Literal, start, limit []int) *ir.Literal {
	shape := make(ir.Shape, len(start))
	for d := range shape {
		shape[d] = limit[d] - start[d]
	}
	out := ir.NewLiteral(ir.Type{DType: l.Type.DType, Shape: shape})
	src := l.Type.Shape.Strides()
	idx := make([]int, len(shape))
	for i := range shape.Size() {
		rem, at := i, 0
		for d := len(shape) - 1; d >= 0; d-- {
			idx[d] = rem % shape[d]
			rem /= shape[d]
		}
		for d := range idx {
			at += (start[d] + idx[d]) * src[d]
		}
		out.SetFloat64At(i, l.Float64At(at))
	}
	return out
}

// TestShardRulesComputeLocally checks what the propagated shardings claim:
// every device computes its block of the result from its blocks of the
// operands (in the layouts the op wants, ShardingAnalysis.Operands) alone, with the op itself on the local shapes, and where the
// analysis marks the result partial, combining the devices' results over
// the partial axes (by its Reduction) gives the block. The reference is the op evaluated on the
// whole arrays.
func TestShardRulesComputeLocally(t *testing.T) {
	cases := []string{
		`func @f(%0: f64[8,4]@S[x,y], %1: f64[8,4]) -> (f64[8,4]) {
  %2 = mul(%0, %1) : f64[8,4]
  return %2
}`,
		`func @f(%0: f64[8,4]@S[x,y]) -> (f64[4,8]) {
  %1 = transpose(%0) {perm=[1,0]} : f64[4,8]
  return %1
}`,
		`func @f(%0: f64[8,4]@S[x,y]) -> (f64[4]) {
  %1 = reduce_sum(%0) {axes=[0]} : f64[4]
  return %1
}`,
		`func @f(%0: f64[8,4,8]@S[{},x,y]) -> (f64[8]) {
  %1 = reduce_sum(%0) {axes=[1,2]} : f64[8]
  return %1
}`,
		`func @f(%0: f64[8,16]@S[{},x], %1: f64[16,4]@S[x,y]) -> (f64[8,4]) {
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f64[8,4]
  return %2
}`,
		`func @f(%0: f64[8,16]@S[x,{}], %1: f64[16,4]@S[{},y]) -> (f64[8,4]) {
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f64[8,4]
  return %2
}`,
		`func @f(%0: f64[2,8,8]@S[x,{},y], %1: f64[2,8,4]) -> (f64[2,8,4]) {
  %2 = dot_general(%0, %1) {lhs_batch=[0], lhs_contract=[2], rhs_batch=[0], rhs_contract=[1]} : f64[2,8,4]
  return %2
}`,
		`func @f(%0: f64[8,4]@S[x,{}]) -> (f64[2,4,4]) {
  %1 = reshape(%0) {shape=[2,4,4]} : f64[2,4,4]
  return %1
}`,
		`func @f(%0: f64[4,2,4]@S[y,{},x]) -> (f64[8,4]) {
  %1 = reshape(%0) {shape=[8,4]} : f64[8,4]
  return %1
}`,
		`func @f(%0: f64[8,4]@S[{},y]) -> (f64[32]) {
  %1 = reshape(%0) {shape=[32]} : f64[32]
  return %1
}`,
		`func @f(%0: f64[8,16]@S[y,x], %1: f64[16,4]) -> (f64[8,4]) {
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f64[8,4]
  return %2
}`,
		`func @f(%0: f64[8,4]@S[x,{}], %1: f64[8,4]@S[{},x], %2: bool[8,4]) -> (f64[8,4], f64[8,4]) {
  %3 = add(%0, %1) : f64[8,4]
  %4 = select(%2, %1, %0) : f64[8,4]
  return %3, %4
}`,
		`func @f(%0: f64[16,4]@S[{},y], %1: i32[8]@S[x]) -> (f64[8,4]) {
  %2 = gather(%0, %1) {axis=0} : f64[8,4]
  return %2
}`,
		`func @f(%0: f64[16,4], %1: i32[8]@S[x], %2: f64[8,4]@S[x,y]) -> (f64[16,4]) {
  %3 = scatter_add(%0, %1, %2) {axis=0} : f64[16,4]
  return %3
}`,
		`func @f(%0: f64[8,4]@S[x,y], %1: f64[8,2], %2: i32[]) -> (f64[8,6], f64[8,4]) {
  %3 = concatenate(%0, %1) {axis=1} : f64[8,6]
  %4 = dynamic_update_slice(%0, %1, %2, %2) : f64[8,4]
  return %3, %4
}`,
		`func @f(%0: f64[16,4]@S[{},y], %1: f64[8,2], %2: i32[]) -> (f64[16,4], f64[2,4]) {
  %3 = dynamic_update_slice(%0, %1, %2, %2) : f64[16,4]
  %4 = dynamic_slice(%0, %2, %2) {sizes=[2,4]} : f64[2,4]
  return %3, %4
}`,
		`func @f(%0: f64[8,4]@S[x,y], %1: f64[]) -> (f64[8,4], f64[8,7], f64[8], f32[8,4], f64[4], f64[]) {
  %2 = sort(%0) {dimension=1, num_keys=1} : f64[8,4]
  %3 = pad(%0, %1) {high=[0,2], interior=[0,0], low=[0,1]} : f64[8,7]
  %4 = reduce_max(%0) {axes=[1]} : f64[8]
  %5 = convert(%0) {dtype=f32} : f32[8,4]
  %6 = reduce_prod(%0) {axes=[0]} : f64[4]
  %7 = reduce_min(%0) {axes=[0,1]} : f64[]
  return %2, %3, %4, %5, %6, %7
}`,
		// Annotated results that differ from what the operands imply: the
		// operands are wanted in the layouts that give the results.
		`func @f(%0: f64[8,4]@S[x,{}], %1: f64[4,8]@S[{},x]) -> (f64[8,4]@S[{},y], f64[8,8]@S[{},x], f64[4,8]@S[y,{}]) {
  %2 = optimization_barrier(%0) : f64[8,4]@S[{},y]
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f64[8,8]@S[{},x]
  %4 = transpose(%0) {perm=[1,0]} : f64[4,8]@S[y,{}]
  return %2, %3, %4
}`,
		`func @f(%0: f64[2,8,4]@S[{},x,y]) -> (f64[4,2,8]) {
  %1 = transpose(%0) {perm=[2,0,1]} : f64[4,2,8]
  return %1
}`,
		`func @f(%0: f64[4], %1: f64[8,4]@S[x,y]) -> (f64[8,4]) {
  %2 = broadcast_in_dim(%0) {dims=[1], shape=[8,4]} : f64[8,4]
  %3 = add(%2, %1) : f64[8,4]
  return %3
}`,
	}
	rng := testseed.Rand(t, 2)
	for _, src := range cases {
		f, a := propagate(t, src)
		for _, op := range f.Body.Ops {
			// Here the operands are wanted in layouts that give the results.
			r := op.Results[0]
			rs, _ := produced(a, op)
			require.True(t, rs.EquivalentTo(r.Type.Sharding, r.Type.Rank()), "%v gives %v, not %v", op.Describe(), rs, r.Type)
			checkLocal(t, f, a, op, rng)
		}
	}
}

// produced returns the layout of op's first result that each device computes
// from its blocks of the operands laid out as a wants them, and the partial
// reduction it leaves: what op's rule proposes for the result when asked
// again with those operands and the results' shardings (as the partitioner
// asks it; splits that do not divide the shape dropped), or else the
// result's sharding and partial reduction in a. They differ where the
// result's sharding came from elsewhere — a sharding_constraint after a pad
// that cannot split the padded dimension, say — and the partitioner then
// reshards the result from what the op gives.
func produced(a *passes.ShardingAnalysis, op *ir.Op) (*ir.NamedSharding, ir.PartialReduction) {
	res := op.Results[0]
	results := make([]*ir.NamedSharding, len(op.Results))
	for i, r := range op.Results {
		results[i] = a.Shardings[r]
	}
	fw := op.Info().Shard(op, a.Operands[op], results)
	if len(fw.Results) == 0 || fw.Results[0] == nil || !fw.Results[0].Mesh.Equal(a.Mesh) {
		return a.Shardings[res], a.Partial[res]
	}
	spec := make(ir.PartitionSpec, res.Type.Rank())
	for d := range spec {
		if d < len(fw.Results[0].Spec) {
			n := 1
			for _, ax := range fw.Results[0].Spec[d] {
				n *= a.Mesh.AxisSize(ax)
			}
			if res.Type.Shape[d]%n == 0 {
				spec[d] = fw.Results[0].Spec[d]
			}
		}
	}
	var pr ir.PartialReduction
	if len(fw.Partial) > 0 {
		pr = fw.Partial[0]
	}
	return &ir.NamedSharding{Mesh: a.Mesh, Spec: spec}, pr
}

// checkLocal checks op of f as TestShardRulesComputeLocally says, on random
// whole operands.
func checkLocal(t *testing.T, f *ir.Func, a *passes.ShardingAnalysis, op *ir.Op, rng *rand.Rand) {
	t.Helper()
	// Whole operands at random, and the whole result.
	args := make([]*ir.Literal, len(op.Args))
	for i, v := range op.Args {
		args[i] = ir.NewLiteral(v.Type.WithSharding(nil))
		for j := range v.Type.Size() {
			args[i].SetFloat64At(j, rng.NormFloat64())
		}
	}
	whole := ir.NewFunc("whole")
	var wargs []*ir.Value
	for _, l := range args {
		wargs = append(wargs, whole.Body.AddParam(l.Type))
	}
	wop, err := whole.Body.AddOp(op.Code, wargs, op.Attrs)
	require.NoError(t, err)
	want, err := eval.EvalOp(wop, args)
	require.NoError(t, err)
	res := op.Results[0]
	rs, pr := produced(a, op)
	sum := map[int]*ir.Literal{} // device → its local result
	for _, dev := range a.Mesh.Devices() {
		local := ir.NewFunc("local")
		var largs []*ir.Value
		var lits []*ir.Literal
		for i, v := range op.Args {
			start, limit, err := a.Operands[op][i].ShardBounds(v.Type.Shape, dev)
			require.NoError(t, err)
			lits = append(lits, block(args[i], start, limit))
			largs = append(largs, local.Body.AddParam(lits[i].Type))
		}
		attrs := ir.Attrs{}
		for k, x := range op.Attrs {
			attrs[k] = x
		}
		for _, k := range []string{"shape", "sizes"} { // the local result's shape
			if _, ok := attrs[k]; ok {
				shape, err := rs.ShardShape(res.Type.Shape)
				require.NoError(t, err)
				attrs[k] = []int(shape)
			}
		}
		lop, err := local.Body.AddOp(op.Code, largs, attrs)
		require.NoError(t, err, "the local op of %v on device %d\n%s", op.Code, dev, f)
		got, err := eval.EvalOp(lop, lits)
		require.NoError(t, err)
		sum[dev] = got[0]
	}
	groups, err := a.Mesh.AxisGroups(pr.Axes...)
	require.NoError(t, err)
	for _, g := range groups {
		total := sum[g[0]].Clone()
		for _, dev := range g[1:] {
			for j := range total.Type.Size() {
				x, y := total.Float64At(j), sum[dev].Float64At(j)
				switch pr.Reduction {
				case "max":
					x = math.Max(x, y)
				case "min":
					x = math.Min(x, y)
				case "prod":
					x *= y
				default:
					x += y
				}
				total.SetFloat64At(j, x)
			}
		}
		for _, dev := range g {
			start, limit, err := rs.ShardBounds(res.Type.Shape, dev)
			require.NoError(t, err)
			wb := block(want[0], start, limit)
			require.Equal(t, wb.Type.Shape, total.Type.Shape, "device %d's block of %v\n%s", dev, res, f)
			for j := range wb.Type.Size() {
				w, g := wb.Float64At(j), total.Float64At(j)
				if w == g || math.IsNaN(w) && math.IsNaN(g) {
					continue
				}
				tol := 1e-9 // f64, or the same sums in the same order
				if len(pr.Axes) > 0 && res.Type.DType != ir.Float64 {
					tol = 1e-2 // partial sums of rounded values, combined here in float64
				}
				require.LessOrEqual(t, math.Abs(w-g), tol*(1+math.Abs(w)), "device %d, element %d of %v: %v, want %v\n%s", dev, j, res, g, w, f)
			}
		}
	}
}

// TestShardRulesComputeLocallyRandom runs the local-compute check on the ops
// of random programs whose parameters are split at random over a 2×3 mesh.
// Ops whose local form needs more than the local result shape in place of a
// shape attribute (iota, slice) and region and collective ops are skipped.
func TestShardRulesComputeLocallyRandom(t *testing.T) {
	m, err := ir.NewMesh([]int{2, 3}, []string{"x", "y"})
	require.NoError(t, err)
	skip := map[ir.Code]bool{ir.Iota: true, ir.Constant: true, ir.Slice: true, ir.Scan: true, ir.While: true, ir.Cond: true, ir.Fusion: true}
	checked, constraints := 0, 0
	for i := range 100 {
		seed := uint64(i)*104729 + 7
		f := randprog.New(seed, randprog.All())
		rng := rand.New(rand.NewPCG(seed, 3))
		shardParams(t, f, m, rng)
		a, err := passes.AnalyzeShardings(f)
		require.NoError(t, err, "seed %d\n%s", seed, f)
		require.NoError(t, passes.PropagateShardings(f))
		for _, op := range f.Body.Ops {
			if skip[op.Code] || op.Code.IsCollective() || op.Code.Info().Class == ir.ClassRegion {
				continue
			}
			if op.Code == ir.ShardingConstraint {
				// Its local form is its operand, laid out as it names.
				s, err := ir.ConstraintSharding(op)
				require.NoError(t, err)
				require.True(t, a.Operands[op][0].EquivalentTo(s, op.Args[0].Type.Rank()), "seed %d: %v wants its operand as %v\n%s", seed, op.Describe(), a.Operands[op][0], f)
				require.True(t, op.Results[0].Type.Sharding.EquivalentTo(s, op.Args[0].Type.Rank()), "seed %d: %v gives %v\n%s", seed, op.Describe(), op.Results[0].Type, f)
				constraints++
				continue
			}
			checkLocal(t, f, a, op, rng)
			checked++
		}
	}
	require.Positive(t, constraints)
	t.Logf("%d ops checked, %d sharding constraints", checked, constraints)
}
