package passes_test

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/internal/testkit/spmdref"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// spmdRun runs part on every device of its mesh (internal/testkit/spmdref) on its
// blocks of args and returns the global results, of whole's result types.
func spmdRun(t *testing.T, part *passes.Partitioned, whole *ir.Func, args []*ir.Literal) []*ir.Literal {
	t.Helper()
	global := make([]ir.Type, len(whole.Body.Results))
	for i, v := range whole.Body.Results {
		global[i] = v.Type
	}
	got, err := spmdref.Eval(part, global, args, time.Minute)
	require.NoError(t, err, "per device:\n%s", part.Func)
	return got
}

// partitionMesh is the 2×4 mesh of the partition tests.
func partitionMesh(t *testing.T) *ir.Mesh {
	m, err := ir.NewMesh([]int{2, 4}, []string{"x", "y"})
	require.NoError(t, err)
	return m
}

// checkPartition partitions f, runs it on random arguments over the mesh
// and compares with the whole program evaluated by eval.
func checkPartition(t *testing.T, f *ir.Func, rng *rand.Rand) *passes.Partitioned {
	t.Helper()
	whole := ir.Clone(f)
	stripShardings(whole.Body)
	part, err := passes.Partition(f)
	require.NoError(t, err, "partitioning\n%s", f)
	args := randprog.Args(rng, whole)
	want, err := eval.Run(whole, args)
	require.NoError(t, err)
	got := spmdRun(t, part, whole, args)
	require.Len(t, got, len(want))
	for i := range want {
		require.True(t, got[i].Type.EqualUnsharded(want[i].Type), "result %d: %v, want %v", i, got[i].Type, want[i].Type)
		for j := range want[i].Type.Size() {
			w, g := want[i].Float64At(j), got[i].Float64At(j)
			if w == g || math.IsNaN(w) && math.IsNaN(g) {
				continue
			}
			tol := 1e-3 // sums in another order
			require.LessOrEqual(t, math.Abs(w-g), tol*(1+math.Abs(w)), "result %d element %d: %v, want %v\nglobal:\n%s\nper device:\n%s", i, j, g, w, f, part.Func)
		}
	}
	return part
}

// stripShardings drops the shardings of r's values.
func stripShardings(r *ir.Region) {
	for _, v := range r.Params {
		v.Type = v.Type.WithSharding(nil)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			v.Type = v.Type.WithSharding(nil)
		}
		for _, sub := range op.Regions {
			stripShardings(sub)
		}
	}
}

func TestPartitionCases(t *testing.T) {
	cases := []string{
		// Data parallel: batch split, weights replicated; the gradient of the
		// weights is a partial sum over x.
		`func @f(%0: f32[8,4]@S[x,{}], %1: f32[4,4], %2: f32[8,4]@S[x,{}]) -> (f32[8,4], f32[4,4]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  %4 = tanh(%3) : f32[8,4]
  %5 = dot_general(%0, %2) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[4,4]
  return %4, %5
}`,
		// Megatron: column- then row-parallel, one all-reduce.
		`func @f(%0: f32[8,16], %1: f32[16,32]@S[{},y], %2: f32[32,16]@S[y,{}]) -> (f32[8,16]@S[]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,32]
  %4 = logistic(%3) : f32[8,32]
  %5 = dot_general(%4, %2) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,16]@S[]
  return %5
}`,
		// Resharding between layouts, a reduction over a split dimension,
		// and an iota split along its counted dimension.
		`func @f(%0: f32[8,16]@S[x,y]) -> (f32[8,16]@S[y,x], f32[16]@S[{x,y}], f32[8,16]@S[{},{x,y}], i32[8,16]@S[{x,y},{}]) {
  %1 = exp(%0) : f32[8,16]@S[y,x]
  %2 = reduce_sum(%0) {axes=[0]} : f32[16]
  %3 = sharding_constraint(%2) {sharding="sharding<mesh[x=2,y=4], [{x,y}]>"} : f32[16]@S[{x,y}]
  %4 = neg(%0) : f32[8,16]@S[{},{x,y}]
  %5 = iota() {dim=0, dtype=i32, shape=[8,16]} : i32[8,16]@S[{x,y},{}]
  return %1, %3, %4, %5
}`,
		// A partial sum its user wants split: reduce-scattered (not the
		// second, split first over another axis).
		`func @f(%0: f32[8,16]@S[{},x], %1: f32[16,4]@S[x,{}]) -> (f32[8,4]@S[x,{}], f32[8,4]@S[{y,x},{}]) { // reduce-scattered
  %2 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  %3 = sharding_constraint(%2) {sharding="sharding<mesh[x=2,y=4], [x,{}]>"} : f32[8,4]@S[x,{}]
  %4 = exp(%0) : f32[8,16]
  %5 = dot_general(%4, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,4]
  %6 = sharding_constraint(%5) {sharding="sharding<mesh[x=2,y=4], [{y,x},{}]>"} : f32[8,4]@S[{y,x},{}]
  return %3, %6
}`,
		// A scan over stacked layers split on their rows (FSDP-like): the
		// body gets one layer's block and gathers it.
		`func @f(%0: f32[3,16,16]@S[{},x,{}], %1: f32[8,16]@S[y,{}]) -> (f32[8,16], f32[3,8]) {
  %2, %3 = scan(%1, %0) {length=3, num_carry=1, num_consts=0} (
    ^(%4: f32[8,16], %5: f32[16,16]) {
      %6 = dot_general(%4, %5) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,16]
      %7 = tanh(%6) : f32[8,16]
      %8 = reduce_max(%7) {axes=[1]} : f32[8]
      return %7, %8
    }) : f32[8,16], f32[3,8]
  return %2, %3
}`,
		// Reshapes whose result layout no layout of the operand gives
		// block for block (the original Threefry layout: bits of a flat
		// iota reshaped to a matrix split on its columns or on both
		// dimensions): the operand is reshaped whole, then sliced.
		`func @f(%0: f32[128]) -> (f32[8,16]@S[x,y], f32[8,16]@S[{},y], f32[8,16]@S[y,x]) {
  %1 = iota() {dim=0, dtype=f32, shape=[128]} : f32[128]
  %2 = mul(%0, %1) : f32[128]
  %3 = reshape(%2) {shape=[8,16]} : f32[8,16]@S[x,y]
  %4 = reshape(%2) {shape=[8,16]} : f32[8,16]@S[{},y]
  %5 = reshape(%2) {shape=[8,16]} : f32[8,16]@S[y,x]
  return %3, %4, %5
}`,
	}
	rng := testseed.Rand(t, 5)
	for i, src := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			src = strings.ReplaceAll(src, "@S[]", "{sharding<"+shardMesh+", []>}")
			src = shardMacro.ReplaceAllString(src, "{sharding<"+shardMesh+", $1>}")
			part := checkPartition(t, parse(t, src), rng)
			if strings.Contains(src, "reduce-scattered") {
				require.Equal(t, 1, strings.Count(part.Func.String(), "reduce_scatter("), "%s", part.Func)
			}
		})
	}
}

// TestPartitionRandom partitions random programs whose parameters are split
// at random over the mesh and compares them with the whole programs.
func TestPartitionRandom(t *testing.T) {
	m := partitionMesh(t)
	n := 60
	if testing.Short() {
		n = 20
	}
	for i := range n {
		seed := uint64(i)*7919 + 11
		f := randprog.New(seed, randprog.All())
		rng := rand.New(rand.NewPCG(seed, 9))
		shardParams(t, f, m, rng)
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkPartition(t, f, rng) })
	}
}

// TestPartitionDump: FERRY_DUMP_IR gets the function with its propagated
// shardings and the per-device program.
func TestPartitionDump(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("FERRY_DUMP_IR", dir)
	src := strings.ReplaceAll(`func @dumped(%0: f32[8,4]@S[x,{}]) -> (f32[8,4]) {
  %1 = exp(%0) : f32[8,4]
  return %1
}`, "@S[x,{}]", "{sharding<"+shardMesh+", [x,{}]>}")
	_, err := passes.Partition(parse(t, src))
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(dir, "*-dumped-*.ir"))
	require.NoError(t, err)
	require.Len(t, files, 2)
	var texts []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		texts = append(texts, string(b))
	}
	require.Contains(t, files[0], "-dumped-partitioned.ir") // sorted by name
	require.Contains(t, texts[0], "%1 = exp(%0) : f32[4,4]")
	require.Contains(t, files[1], "-dumped-propagated.ir")
	require.Contains(t, texts[1], "%1 = exp(%0) : f32[8,4]{sharding<mesh[x=2,y=4], [x,{}]>}")
}
