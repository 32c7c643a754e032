package passes

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
)

// TestCompileUnboundCollective: a program holding a collective over an axis
// the executor does not bind is refused before any pass runs, naming the
// axis and the op's location (in a scan body too); one whose axes are bound
// (BoundAxes, as a ShardMap's per-device programs will be) compiles.
func TestCompileUnboundCollective(t *testing.T) {
	f := ir.NewFunc("psum")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 4))
	body := f.NewRegion()
	c := body.AddParam(ir.TypeOf(ir.Float32, 4))
	op, err := body.AddOp(ir.AllReduce, []*ir.Value{c}, ir.Attrs{"axis": "data", "size": 2, "reduction": "sum"})
	if err != nil {
		t.Fatal(err)
	}
	op.Loc = "train.go:9"
	body.Results = op.Results
	scan, err := f.Body.AddOp(ir.Scan, []*ir.Value{x}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": 3}, body)
	if err != nil {
		t.Fatal(err)
	}
	f.Body.Results = scan.Results
	_, err = Compile(f, Options{})
	if err == nil || !strings.Contains(err.Error(), `unbound axis name "data"`) || !strings.Contains(err.Error(), "train.go:9") {
		t.Fatalf("Compile: got %v, want the unbound axis named with the op's location", err)
	}
	if _, err := Compile(f, Options{BoundAxes: []string{"data"}}); err != nil {
		t.Fatalf("Compile with the axis bound: %v", err)
	}
}

// collectiveSites lists the collectives of r and its nested regions as
// "path code axis", where path names the enclosing region ops (a fusion
// among them would put a collective inside a fused kernel).
func collectiveSites(r *ir.Region, path string) []string {
	var out []string
	for _, op := range r.Ops {
		if op.Code.IsCollective() {
			out = append(out, path+op.Code.String()+" "+op.Attrs.String("axis"))
		}
		for i, sub := range op.Regions {
			out = append(out, collectiveSites(sub, fmt.Sprintf("%s%s.%d>", path, op.Code, i))...)
		}
	}
	slices.Sort(out)
	return out
}

// TestCollectivesThroughPipeline: every pass leaves the collectives of a
// per-device program where every device runs them: none is folded (not
// even of a constant operand), fused, duplicated, dropped while used, or
// moved into or out of a region (scan body, cond branch), while the
// elementwise ops around them are fused; and the buffer plan gives no
// collective's result memory that overlaps its operand (the communicators
// need them disjoint), donated parameters included.
func TestCollectivesThroughPipeline(t *testing.T) {
	f, err := ir.Parse(`func @step(%0: f32[8], %1: f32[3,2,8], %2: bool[], %3: f32[8]) -> (f32[8], f32[4], i32[], f32[8], f32[3,8], f32[8]) {
  %4 = constant() {value=dense<f32[4], [1, 2, 3, 4]>} : f32[4]
  %5 = all_reduce(%4) {axis="x", reduction="sum", size=2} : f32[4]
  %6 = axis_index() {axis="x", size=2} : i32[]
  %7 = exp(%0) : f32[8]
  %8 = mul(%7, %7) : f32[8]
  %9 = all_reduce(%8) {axis="x", reduction="sum", size=2} : f32[8]
  %10 = tanh(%9) : f32[8]
  %11 = add(%10, %7) : f32[8]
  %20, %21 = scan(%11, %1) {length=3, num_carry=1, num_consts=0, reverse=false} (
    ^(%12: f32[8], %13: f32[2,8]) {
      %14 = all_gather(%13) {axis="y", dimension=0, size=4, tiled=true} : f32[8,8]
      %15 = dot_general(%14, %12) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8]
      %16 = neg(%15) : f32[8]
      %17 = all_reduce(%16) {axis="x,y", reduction="max", size=8} : f32[8]
      %18 = exp(%17) : f32[8]
      return %18, %17
    }) : f32[8], f32[3,8]
  %25 = cond(%2, %20) (
    ^(%22: f32[8]) {
      %23 = collective_permute(%22) {axis="y", pairs=[0, 1, 1, 0], size=4} : f32[8]
      return %23
    },
    ^(%24: f32[8]) {
      return %24
    }) : f32[8]
  %26 = all_reduce(%3) {axis="x", reduction="min", size=2} : f32[8]
  return %25, %5, %6, %20, %21, %26
}`)
	require.NoError(t, err)
	bound := []string{"x", "y", "x,y"}
	want := collectiveSites(f.Body, "")
	for _, fip := range []bool{false, true} {
		p, err := Compile(f, Options{BoundAxes: bound, FusionInPlace: fip, Donated: []bool{false, false, false, true}})
		require.NoError(t, err)
		require.Equal(t, want, collectiveSites(p.Func.Body, ""), "%s", p.Func)
		fused := false
		p.Func.Body.Walk(func(op *ir.Op) { fused = fused || op.Code == ir.Fusion })
		require.True(t, fused, "the elementwise ops are fused: %s", p.Func)
		checkCollectiveBuffers(t, p.Plan)
	}
}

// checkCollectiveBuffers fails when a collective's result shares memory
// with its operand in plan (or a nested plan).
func checkCollectiveBuffers(t *testing.T, plan *RegionPlan) {
	t.Helper()
	for _, op := range plan.Region.Ops {
		for _, sub := range plan.Sub[op] {
			checkCollectiveBuffers(t, sub)
		}
		if !op.Code.IsCollective() || len(op.Args) == 0 {
			continue
		}
		a, r := plan.Values[op.Args[0]], plan.Values[op.Result()]
		same := a.Kind == r.Kind && a.Space == r.Space
		switch {
		case same && a.Kind == BufTemp:
			require.False(t, a.Offset < r.Offset+r.Size && r.Offset < a.Offset+a.Size, "%s: operand %+v and result %+v overlap", op.Describe(), a, r)
		case same && a.Kind != BufSlice:
			require.NotEqual(t, a.Index, r.Index, "%s: operand %+v and result %+v share a buffer", op.Describe(), a, r)
		case a.Kind == BufParam && r.Kind == BufAlias:
			require.NotEqual(t, a.Index, r.Param, "%s: the result is written over its donated operand", op.Describe())
		}
	}
}
