package passes_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// shardMesh is the mesh of the propagation tests; @S[spec] in their IR text
// stands for a sharding on it.
const shardMesh = "mesh[x=2,y=4]"

var shardMacro = regexp.MustCompile(`@S(\[[^\]]*\])`)

// propagate parses src (expanding @S[spec]), propagates shardings and
// returns the function and the analysis.
func propagate(t *testing.T, src string) (*ir.Func, *passes.ShardingAnalysis) {
	t.Helper()
	src = shardMacro.ReplaceAllString(src, "{sharding<"+shardMesh+", $1>}")
	f := parse(t, src)
	a, err := passes.AnalyzeShardings(f)
	require.NoError(t, err, "analysing\n%s", f)
	require.NoError(t, passes.PropagateShardings(f), "propagating\n%s", f)
	require.NoError(t, ir.Verify(f), "verifying after propagation\n%s", f)
	return f, a
}

// valueByID finds the value %id of f.
func valueByID(t *testing.T, f *ir.Func, id int) *ir.Value {
	t.Helper()
	var found *ir.Value
	var walk func(r *ir.Region)
	walk = func(r *ir.Region) {
		for _, v := range r.Params {
			if v.ID == id {
				found = v
			}
		}
		for _, op := range r.Ops {
			for _, v := range op.Results {
				if v.ID == id {
					found = v
				}
			}
			for _, sub := range op.Regions {
				walk(sub)
			}
		}
	}
	walk(f.Body)
	require.NotNil(t, found, "no %%%d in\n%s", id, f)
	return found
}

// wantSpecs checks the propagated spec of each value (id → spec text).
func wantSpecs(t *testing.T, f *ir.Func, want map[int]string) {
	t.Helper()
	for id, spec := range want {
		v := valueByID(t, f, id)
		s := v.Type.Sharding
		require.NotNil(t, s, "%%%d has no sharding after propagation:\n%s", id, f)
		require.Equal(t, shardMesh, s.Mesh.String(), "%%%d's mesh:\n%s", id, f)
		require.Equal(t, spec, s.Spec.String(), "%%%d's spec after propagation:\n%s", id, f)
	}
}

func TestShardPropElementwiseChain(t *testing.T) {
	f, a := propagate(t, `func @f(%0: f32[8,4]@S[x,{}], %1: f32[8,4]) -> (f16[8,4]) {
  %2 = add(%0, %1) : f32[8,4]
  %3 = exp(%2) : f32[8,4]
  %4 = convert(%3) {dtype=f16} : f16[8,4]
  return %4
}`)
	wantSpecs(t, f, map[int]string{1: "[x,{}]", 2: "[x,{}]", 3: "[x,{}]", 4: "[x,{}]"})
	require.Empty(t, a.Partial, "\n%s", f)
}

func TestShardPropBackwardFromResult(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[8,4], %1: f32[8,4]) -> (f32[8,4]@S[{},y]) {
  %2 = mul(%0, %1) : f32[8,4]
  %3 = neg(%2) : f32[8,4]@S[{},y]
  return %3
}`)
	wantSpecs(t, f, map[int]string{0: "[{},y]", 1: "[{},y]", 2: "[{},y]"})
}

func TestShardPropBiasBroadcast(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,y], %1: f32[4]) -> (f32[8,4]) {
  %2 = broadcast_in_dim(%1) {dims=[1], shape=[8,4]} : f32[8,4]
  %3 = add(%0, %2) : f32[8,4]
  return %3
}`)
	// The bias follows the activations backward through the broadcast: its
	// one dimension is the result's dimension 1, split over y.
	wantSpecs(t, f, map[int]string{1: "[y]", 2: "[x,y]", 3: "[x,y]"})
}

func TestShardPropTranspose(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,y], %1: f32[4,8]) -> (f32[4,8], f32[8,4]@S[{},x]) {
  %2 = transpose(%0) {perm=[1,0]} : f32[4,8]
  %3 = transpose(%1) {perm=[1,0]} : f32[8,4]@S[{},x]
  return %2, %3
}`)
	wantSpecs(t, f, map[int]string{2: "[y,x]", 1: "[x,{}]"})
}

func TestShardPropReshape(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,{}], %1: f32[8,4]@S[{},y], %2: f32[8]@S[{x,y}], %3: f32[1,8]@S[{},x], %4: f32[2,16]) -> (f32[2,4,4], f32[32], f32[32], f32[2,4], f32[8], f32[32]@S[x]) {
  %5 = reshape(%0) {shape=[2,4,4]} : f32[2,4,4]
  %6 = reshape(%0) {shape=[32]} : f32[32]
  %7 = reshape(%1) {shape=[32]} : f32[32]
  %8 = reshape(%2) {shape=[2,4]} : f32[2,4]
  %9 = reshape(%3) {shape=[8]} : f32[8]
  %10 = reshape(%4) {shape=[32]} : f32[32]@S[x]
  return %5, %6, %7, %8, %9, %10
}`)
	wantSpecs(t, f, map[int]string{
		5:  "[x,{},{}]", // split: the major part keeps the axis
		6:  "[x]",       // merge with the minor dimension whole
		7:  "[{}]",      // merge of a split minor dimension: not clean
		8:  "[{},{}]",   // split into parts the 8 devices do not divide
		9:  "[x]",       // size-1 dimensions do not matter
		4:  "[x,{}]",    // backward: [32] on x is [2,16] on x
		10: "[x]",
	})
}

// matmulSrc is x[b,k]·w[k,n] with the given shardings of x and w.
func matmulSrc(xs, ws string) string {
	return `func @f(%0: f32[8,16]` + xs + `, %1: f32[16,4]` + ws + `) -> (f32[8,4]) {
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  return %2
}`
}

func TestShardPropMatmul(t *testing.T) {
	f, a := propagate(t, matmulSrc("@S[x,{}]", ""))
	wantSpecs(t, f, map[int]string{2: "[x,{}]", 1: "[{},{}]"})
	require.Empty(t, a.Partial, "\n%s", f)

	f, a = propagate(t, matmulSrc("", "@S[{},y]"))
	wantSpecs(t, f, map[int]string{2: "[{},y]", 0: "[{},{}]"})
	require.Empty(t, a.Partial, "\n%s", f)

	// k split over x on both sides: each device sums its part of k.
	f, a = propagate(t, matmulSrc("@S[{},x]", "@S[x,y]"))
	wantSpecs(t, f, map[int]string{2: "[{},y]"})
	require.Len(t, a.Partial, 1, "\n%s", f)
	require.Equal(t, ir.PartialReduction{Axes: []string{"x"}, Reduction: "sum"}, a.Partial[valueByID(t, f, 2)], "\n%s", f)

	// k split on one side only: the other side is proposed the same split.
	f, a = propagate(t, matmulSrc("@S[y,x]", ""))
	wantSpecs(t, f, map[int]string{1: "[x,{}]", 2: "[y,{}]"})
	require.Equal(t, []string{"x"}, a.Partial[valueByID(t, f, 2)].Axes, "\n%s", f)
}

func TestShardPropBatchedDot(t *testing.T) {
	f, a := propagate(t, `func @f(%0: f32[2,8,16]@S[x,{},{}], %1: f32[2,16,4]) -> (f32[2,8,4]) {
  %2 = dot_general(%0, %1) {lhs_batch=[0], lhs_contract=[2], rhs_batch=[0], rhs_contract=[1]} : f32[2,8,4]
  return %2
}`)
	wantSpecs(t, f, map[int]string{1: "[x,{},{}]", 2: "[x,{},{}]"})
	require.Empty(t, a.Partial, "\n%s", f)
}

func TestShardPropReduction(t *testing.T) {
	f, a := propagate(t, `func @f(%0: f32[8,4]@S[x,y]) -> (f32[4], f32[8]) {
  %1 = reduce_sum(%0) {axes=[0]} : f32[4]
  %2 = reduce_max(%0) {axes=[1]} : f32[8]
  return %1, %2
}`)
	wantSpecs(t, f, map[int]string{1: "[y]", 2: "[x]"})
	require.Equal(t, ir.PartialReduction{Axes: []string{"x"}, Reduction: "sum"}, a.Partial[valueByID(t, f, 1)], "\n%s", f)
	require.Equal(t, ir.PartialReduction{Axes: []string{"y"}, Reduction: "max"}, a.Partial[valueByID(t, f, 2)], "\n%s", f)
}

func TestShardPropConflict(t *testing.T) {
	// Two operands disagree: the result takes the first operand's sharding
	// (a tie; %1 is the partitioner's to reshard). With three, the one two
	// operands share wins.
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,{}], %1: f32[8,4]@S[{},x], %2: bool[8,4], %3: f32[8,4]@S[{},x]) -> (f32[8,4], f32[8,4], f32[8,4]) {
  %4 = add(%0, %1) : f32[8,4]
  %5 = select(%2, %0, %3) : f32[8,4]
  %6 = select(%2, %1, %3) : f32[8,4]
  return %4, %5, %6
}`)
	wantSpecs(t, f, map[int]string{0: "[x,{}]", 1: "[{},x]", 4: "[x,{}]", 2: "[x,{}]", 5: "[x,{}]", 6: "[{},x]"})

	// Two users propose different shardings for an unannotated value: the
	// earliest user's wins.
	f, _ = propagate(t, `func @f(%0: f32[8,4]@S[x,{}], %1: f32[8,4]@S[{},x], %2: f32[8,4]) -> (f32[8,4], f32[8,4]) {
  %3 = add(%2, %0) : f32[8,4]
  %4 = add(%1, %2) : f32[8,4]
  return %3, %4
}`)
	wantSpecs(t, f, map[int]string{2: "[x,{}]", 3: "[x,{}]", 4: "[{},x]"})
}

func TestShardPropSlicePadConcat(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,y], %1: f32[8,4]@S[x,y]) -> (f32[8,2], f32[8,6], f32[8,8], f32[16,4]) {
  %2 = slice(%0) {limit=[8,3], start=[0,1], strides=[1,1]} : f32[8,2]
  %3 = constant() {value=dense<f32[], 0>} : f32[]
  %4 = pad(%0, %3) {high=[0,1], interior=[0,0], low=[0,1]} : f32[8,6]
  %5 = concatenate(%0, %1) {axis=1} : f32[8,8]
  %6 = concatenate(%0, %1) {axis=0} : f32[16,4]
  return %2, %4, %5, %6
}`)
	// Only the dimensions the op leaves whole keep their axes.
	wantSpecs(t, f, map[int]string{2: "[x,{}]", 3: "[]", 4: "[x,{}]", 5: "[x,{}]", 6: "[{},y]"})
}

func TestShardPropGatherScatterDynamicSlice(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[16,4]@S[{},y], %1: i32[8]@S[x], %2: f32[16,4], %3: f32[8,4]@S[x,y], %4: i32[], %5: f32[8,2]) -> (f32[8,4], f32[16,4], f32[2,4], f32[16,4]) {
  %6 = gather(%0, %1) {axis=0} : f32[8,4]
  %7 = scatter_add(%2, %1, %3) {axis=0} : f32[16,4]
  %8 = dynamic_slice(%0, %4, %4) {sizes=[2,4]} : f32[2,4]
  %9 = dynamic_update_slice(%7, %5, %4, %4) : f32[16,4]
  return %6, %7, %8, %9
}`)
	wantSpecs(t, f, map[int]string{
		6: "[x,y]",   // rows like the indices, columns like the table
		2: "[{},y]",  // the scattered-into operand: its axis whole, columns like the updates
		7: "[{},y]",  // the result like the operand
		8: "[{},y]",  // the sliced dimension whole
		4: "[]",      // start indices replicated
		9: "[{},{}]", // the update covers no dimension whole: the window may land anywhere
		5: "[{},{}]", // the update covers no dimension whole
	})
}

func TestShardPropIotaTakesUsers(t *testing.T) {
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[{},y]) -> (f32[8,4]) {
  %1 = iota() {dim=1, dtype=f32, shape=[8,4]} : f32[8,4]
  %2 = constant() {value=dense<f32[], 2>} : f32[]
  %3 = broadcast_in_dim(%2) {dims=[], shape=[8,4]} : f32[8,4]
  %4 = mul(%1, %3) : f32[8,4]
  %5 = add(%0, %4) : f32[8,4]
  return %5
}`)
	wantSpecs(t, f, map[int]string{1: "[{},y]", 2: "[]", 3: "[{},y]", 4: "[{},y]", 5: "[{},y]"})
}

func TestShardPropScan(t *testing.T) {
	// The carry [x,{}] and the xs [{},x,{}] (leading axis dropped) flow into
	// the body; the stacked ys get a whole leading dimension.
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,{}], %1: f32[3,8,4]@S[{},x,{}]) -> (f32[8,4], f32[3,8,4]) {
  %2, %3 = scan(%0, %1) {length=3, num_carry=1, num_consts=0} (
    ^(%4: f32[8,4], %5: f32[8,4]) {
      %6 = add(%4, %5) : f32[8,4]
      %7 = tanh(%6) : f32[8,4]
      return %7, %6
    }) : f32[8,4], f32[3,8,4]
  return %2, %3
}`)
	wantSpecs(t, f, map[int]string{2: "[x,{}]", 3: "[{},x,{}]", 4: "[x,{}]", 5: "[x,{}]", 6: "[x,{}]", 7: "[x,{}]"})
}

// TestShardPropUnshardedUnchanged: a function without shardings comes out of
// PropagateShardings exactly as it went in.
func TestShardPropUnshardedUnchanged(t *testing.T) {
	src := `func @f(%0: f32[8,4], %1: f32[4]) -> (f32[8]) {
  %2 = broadcast_in_dim(%1) {dims=[1], shape=[8,4]} : f32[8,4]
  %3 = add(%0, %2) : f32[8,4]
  %4 = reduce_sum(%3) {axes=[1]} : f32[8]
  return %4
}`
	f := parse(t, src)
	before := f.String()
	a, err := passes.AnalyzeShardings(f)
	require.NoError(t, err)
	require.Nil(t, a.Mesh)
	require.Empty(t, a.Shardings)
	require.NoError(t, passes.PropagateShardings(f))
	require.Equal(t, before, f.String())
}

func TestShardPropTwoMeshes(t *testing.T) {
	f := parse(t, `func @f(%0: f32[8,4]{sharding<mesh[x=2], [x,{}]>}, %1: f32[8,4]{sharding<mesh[y=4], [{},y]>}) -> (f32[8,4]) {
  %2 = add(%0, %1) : f32[8,4]
  return %2
}`)
	err := passes.PropagateShardings(f)
	require.Error(t, err)
	require.Contains(t, err.Error(), "%0 is on mesh[x=2] but %1 is on mesh[y=4]")
}

// TestShardRuleTable is the meta-test of the op table: every op has a
// sharding rule, and the ops that replicate by default are exactly the ones
// listed here on purpose.
func TestShardRuleTable(t *testing.T) {
	byDefault := []ir.Code{ir.While, ir.Cond, ir.Fusion,
		ir.AllReduce, ir.AllGather, ir.ReduceScatter, ir.AllToAll, ir.CollectivePermute, ir.AxisIndex}
	require.ElementsMatch(t, byDefault, ir.DefaultShardedOps, "update this list when an op gets a rule of its own (or loses it)")
	for _, c := range ir.AllCodes() {
		if c.Info().Shard == nil {
			t.Errorf("%v has no sharding rule; give it one or list it in ir.DefaultShardedOps", c)
		}
	}
	// The default rule proposes a replicated result, whatever the operand.
	f, _ := propagate(t, `func @f(%0: f32[8,4]@S[x,y]) -> (f32[8,4]) {
  %1 = all_reduce(%0) {axis="i", reduction="sum", size=2} : f32[8,4]
  return %1
}`)
	wantSpecs(t, f, map[int]string{1: "[{},{}]"})
	// Every elementwise op shares its sharding between operands and result.
	for _, c := range ir.AllCodes() {
		info := c.Info()
		if !info.Elementwise || slices.Contains(byDefault, c) {
			continue
		}
		m, _ := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
		s, _ := ir.NewNamedSharding(m, ir.P("x", "y"))
		args := make([]*ir.NamedSharding, max(info.NumArgs, 1))
		args[len(args)-1] = s
		op := &ir.Op{Code: c, Results: []*ir.Value{{Type: ir.TypeOf(ir.Float32, 8, 4)}}}
		for range args {
			op.Args = append(op.Args, &ir.Value{Type: ir.TypeOf(ir.Float32, 8, 4)})
		}
		p := info.Shard(op, args, []*ir.NamedSharding{nil})
		require.Len(t, p.Results, 1, "%v", c)
		require.True(t, p.Results[0].Equal(s), fmt.Sprintf("%v proposes %v", c, p.Results[0]))
		for i := range args {
			require.True(t, p.Args[i].Equal(s), "%v operand %d: %v", c, i, p.Args[i])
		}
	}
}

// TestShardPropBadSharding: a sharding that does not fit its shape is an
// error naming the value, not a crash.
func TestShardPropBadSharding(t *testing.T) {
	m, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	s, err := ir.NewNamedSharding(m, ir.P("y"))
	require.NoError(t, err)
	f := ir.NewFunc("f")
	p := f.Body.AddParam(ir.TypeOf(ir.Float32, 6).WithSharding(s))
	op, err := f.Body.AddOp(ir.Neg, []*ir.Value{p}, nil)
	require.NoError(t, err)
	f.Body.Results = op.Results
	err = passes.PropagateShardings(f)
	require.Error(t, err)
	require.Contains(t, err.Error(), "%0")
	require.Contains(t, err.Error(), "does not divide")
}

// TestShardPropRandom runs propagation on random programs (every op kind,
// scans included) whose parameters are split at random over a 2×3 mesh: it
// must not fail, every value must end up with a sharding on that mesh that
// fits its shape (ir.Verify), the parameters keep theirs, and a second run
// changes nothing.
func TestShardPropRandom(t *testing.T) {
	m, err := ir.NewMesh([]int{2, 3}, []string{"x", "y"})
	require.NoError(t, err)
	split := 0
	for i := range 300 {
		seed := uint64(i)*7919 + 13
		f := randprog.New(seed, randprog.All())
		rng := rand.New(rand.NewPCG(seed, 1))
		given := shardParams(t, f, m, rng)
		require.NoError(t, passes.PropagateShardings(f), "seed %d\n%s", seed, f)
		require.NoError(t, ir.Verify(f), "seed %d\n%s", seed, f)
		for j, p := range f.Body.Params {
			require.True(t, p.Type.Sharding.Equal(given[j]), "seed %d: parameter %v changed\n%s", seed, p, f)
		}
		forEach(f.Body, func(v *ir.Value) {
			require.NotNil(t, v.Type.Sharding, "seed %d: %v has no sharding\n%s", seed, v, f)
			require.True(t, v.Type.Sharding.Mesh.Equal(m), "seed %d: %v", seed, v)
			if !v.Type.Sharding.IsFullyReplicated() {
				split++
			}
		})
		once := f.String()
		require.NoError(t, passes.PropagateShardings(f))
		require.Equal(t, once, f.String(), "seed %d: a second run changed the shardings", seed)
	}
	require.Greater(t, split, 300, "too few values were split; the test checks little")
	t.Logf("%d split values", split)
}

// forEach calls fn on every value of r and its nested regions.
func forEach(r *ir.Region, fn func(*ir.Value)) {
	for _, v := range r.Params {
		fn(v)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			fn(v)
		}
		for _, sub := range op.Regions {
			forEach(sub, fn)
		}
	}
}

// shardParams splits the parameters of f at random over the x and y axes of
// m (where they divide) and returns their shardings. The sharding
// constraints of f (random programs put theirs on one-device meshes) move to
// m, each with a random spec that fits its value, and the region parameters
// that took a constrained value's sharding lose it (propagation gives them
// one): a function uses one mesh.
func shardParams(t *testing.T, f *ir.Func, m *ir.Mesh, rng *rand.Rand) []*ir.NamedSharding {
	f.Body.Walk(func(op *ir.Op) {
		if op.Code == ir.ShardingConstraint {
			s := randFitting(t, m, op.Args[0].Type.Shape, rng)
			op.Attrs["sharding"] = s.String()
			op.Results[0].Type = op.Results[0].Type.WithSharding(s)
		}
		for _, r := range op.Regions {
			for _, p := range r.Params {
				if p.Type.Sharding != nil && !p.Type.Sharding.Mesh.Equal(m) {
					p.Type = p.Type.WithSharding(nil)
				}
			}
		}
	})
	var given []*ir.NamedSharding
	for _, p := range f.Body.Params {
		spec := make(ir.PartitionSpec, p.Type.Rank())
		free := []string{"x", "y"}
		for d, n := range p.Type.Shape {
			k := rng.IntN(2)
			if k < len(free) && n%m.AxisSize(free[k]) == 0 && rng.IntN(3) > 0 {
				spec[d] = []string{free[k]}
				free = append(free[:k:k], free[k+1:]...)
			}
		}
		s, err := ir.NewNamedSharding(m, spec)
		require.NoError(t, err)
		p.Type = p.Type.WithSharding(s)
		given = append(given, s)
	}
	return given
}

// randFitting returns a random sharding over m that fits shape: each
// dimension split over some of the axes not used yet (x, y, both or
// neither) whose sizes multiply to a divisor of it.
func randFitting(t *testing.T, m *ir.Mesh, shape ir.Shape, rng *rand.Rand) *ir.NamedSharding {
	spec := make(ir.PartitionSpec, rng.IntN(len(shape)+1))
	used := map[string]bool{}
	for d := range spec {
		ways := 1
		for _, a := range rng.Perm(m.NumAxes()) {
			name := m.AxisNames()[a]
			if n := ways * m.AxisSize(name); !used[name] && shape[d]%n == 0 && rng.IntN(2) == 0 {
				spec[d] = append(spec[d], name)
				used[name], ways = true, n
			}
		}
	}
	s, err := ir.NewNamedSharding(m, spec)
	require.NoError(t, err)
	return s
}
