package passes_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// gatherScan is one device's program of an FSDP-style scan: each iteration
// all-gathers its two weight slices (xs) and uses them in turn.
const gatherScan = `func @fsdp(%0: f32[2,8], %1: f32[3,2,8], %2: f32[3,2,8]) -> (f32[2,8]) {
  %20 = scan(%0, %1, %2) {length=3, num_carry=1, num_consts=0, reverse=false} (
    ^(%3: f32[2,8], %4: f32[2,8], %5: f32[2,8]) {
      %6 = all_gather(%4) {axis="y", dimension=0, size=4, tiled=true} : f32[8,8]
      %7 = dot_general(%3, %6) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]
      %8 = tanh(%7) : f32[2,8]
      %9 = all_gather(%5) {axis="y", dimension=0, size=4, tiled=true} : f32[8,8]
      %10 = dot_general(%8, %9) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]
      return %10
    }) : f32[2,8]
  return %20
}`

// With Options.PrefetchGathers the prefetch pass moves a scan body's
// all_gathers of xs slices to the front and gives each gathered layer bytes
// of its own for the whole iteration (the analysis grows by the second
// gathered buffer, which the two gathers shared before); without it the
// body keeps its order and sharing.
func TestPrefetchGathers(t *testing.T) {
	compileGather := func(prefetch bool) (*passes.Program, *ir.Region, *passes.RegionPlan) {
		f, err := ir.Parse(gatherScan)
		require.NoError(t, err)
		p, err := passes.Compile(f, passes.Options{BoundAxes: []string{"y"}, PrefetchGathers: prefetch})
		require.NoError(t, err)
		for _, op := range p.Func.Body.Ops {
			if op.Code == ir.Scan {
				return p, op.Regions[0], p.Plan.Sub[op][0]
			}
		}
		t.Fatal("no scan")
		return nil, nil, nil
	}
	gathered := func(b *ir.Region, bp *passes.RegionPlan) []passes.Buffer {
		var out []passes.Buffer
		for _, op := range b.Ops {
			if op.Code == ir.AllGather {
				out = append(out, bp.Values[op.Result()])
			}
		}
		return out
	}
	on, b, bp := compileGather(true)
	require.Equal(t, ir.AllGather, b.Ops[0].Code, "%s", on.Func)
	require.Equal(t, ir.AllGather, b.Ops[1].Code, "%s", on.Func)
	g := gathered(b, bp)
	require.Len(t, g, 2)
	require.True(t, g[0].Offset+g[0].Size <= g[1].Offset || g[1].Offset+g[1].Size <= g[0].Offset, "the gathered layers share bytes: %+v", g)

	off, b, bp := compileGather(false)
	require.NotEqual(t, ir.AllGather, b.Ops[1].Code, "%s", off.Func)
	g = gathered(b, bp)
	require.Len(t, g, 2)
	require.Equal(t, g[0].Offset, g[1].Offset, "without prefetching the second gather reuses the first one's bytes")
	require.Equal(t, off.Analysis.TempBytes+8*8*4, on.Analysis.TempBytes, "the reserved layer is counted")
}
