package passes_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// gradPlan compiles the small gradient model and returns the program, its
// top-level scans (forward, backward) and the forward scan's stacked results.
func gradPlan(t *testing.T) (*passes.Program, *ir.Op, *ir.Op) {
	p := compile(t, layersGrad(3, 4, 5, 6), passes.Options{})
	var scans []*ir.Op
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Scan {
			scans = append(scans, op)
		}
	}
	require.Len(t, scans, 2)
	return p, scans[0], scans[1]
}

// TestCheckPlanCatches corrupts valid plans in the ways the checker must see.
func TestCheckPlanCatches(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(p *passes.Program, fwd, bwd *ir.Op)
		msg     string
	}{
		{"overlapping live temps", func(p *passes.Program, fwd, _ *ir.Op) {
			ys, xs := fwd.Results[1], fwd.Results[2]
			b := p.Plan.Values[xs]
			b.Offset = p.Plan.Values[ys].Offset
			p.Plan.Values[xs] = b
		}, "share bytes"},
		{"missing buffer", func(p *passes.Program, fwd, _ *ir.Op) {
			delete(p.Plan.Values, fwd.Results[1])
		}, "buffers for"},
		{"wrong size", func(p *passes.Program, fwd, _ *ir.Op) {
			b := p.Plan.Values[fwd.Results[1]]
			b.Size--
			p.Plan.Values[fwd.Results[1]] = b
		}, "has buffer"},
		{"misaligned", func(p *passes.Program, fwd, _ *ir.Op) {
			b := p.Plan.Values[fwd.Results[1]]
			b.Offset += 4
			p.Plan.Values[fwd.Results[1]] = b
		}, "misaligned"},
		{"outside the arena", func(p *passes.Program, fwd, _ *ir.Op) {
			b := p.Plan.Values[fwd.Results[1]]
			b.Offset = p.Plan.Arena[ir.Device]
			p.Plan.Values[fwd.Results[1]] = b
		}, "outside"},
		{"alias of a parameter not donated", func(p *passes.Program, _, bwd *ir.Op) {
			b := p.Plan.Values[bwd.Results[1]]
			b.Kind, b.Param = passes.BufAlias, 1
			p.Plan.Values[bwd.Results[1]] = b
		}, "not donated"},
		{"alias of a parameter read later", func(p *passes.Program, _, bwd *ir.Op) {
			p.Donated = []bool{false, false, true}
			b := p.Plan.Values[bwd.Results[1]]
			b.Kind, b.Param = passes.BufAlias, 2 // w2 is read by the backward scan itself
			p.Plan.Values[bwd.Results[1]] = b
		}, "read later"},
		{"output in the wrong position", func(p *passes.Program, _, bwd *ir.Op) {
			b := p.Plan.Values[bwd.Results[1]]
			b.Index = 1
			p.Plan.Values[bwd.Results[1]] = b
		}, "first returned"},
		{"nested arena over a live temp", func(p *passes.Program, fwd, bwd *ir.Op) {
			o := p.Plan.SubOffset[bwd]
			o[ir.Device] = p.Plan.Values[fwd.Results[1]].Offset
			p.Plan.SubOffset[bwd] = o
		}, "share bytes"},
		{"nested temp outside its arena", func(p *passes.Program, _, bwd *ir.Op) {
			sub := p.Plan.Sub[bwd][0]
			v := sub.Region.Ops[0].Result()
			b := sub.Values[v]
			b.Offset = sub.Arena[ir.Device]
			sub.Values[v] = b
		}, "outside"},
		{"nested plan missing", func(p *passes.Program, _, bwd *ir.Op) {
			delete(p.Plan.Sub, bwd)
		}, "nested plans"},
		{"output inside a nested region", func(p *passes.Program, _, bwd *ir.Op) {
			sub := p.Plan.Sub[bwd][0]
			v := sub.Region.Ops[0].Result()
			b := sub.Values[v]
			b.Kind = passes.BufOutput
			sub.Values[v] = b
		}, "nested region"},
		{"ys slice at a carry position", func(p *passes.Program, fwd, _ *ir.Op) {
			sub, v := sliceValue(t, p, fwd)
			b := sub.Values[v]
			b.Index = 0 // the carry, not a y
			sub.Values[v] = b
		}, "not the only y returned there"},
		{"ys slice of the wrong size", func(p *passes.Program, fwd, _ *ir.Op) {
			sub, v := sliceValue(t, p, fwd)
			b := sub.Values[v]
			b.Size *= 2
			sub.Values[v] = b
		}, "has buffer ys slice of result 1 device 192 B, want 96 B"},
		{"ys slice outside a scan body", func(p *passes.Program, fwd, _ *ir.Op) {
			b := p.Plan.Values[fwd.Results[1]]
			b.Kind, b.Index = passes.BufSlice, 1
			p.Plan.Values[fwd.Results[1]] = b
		}, "outside a scan body"},
		{"analysis out of date", func(p *passes.Program, _, _ *ir.Op) {
			p.Analysis.TempBytes++
		}, "does not match"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, fwd, bwd := gradPlan(t)
			c.corrupt(p, fwd, bwd)
			err := passes.CheckPlan(p)
			require.Error(t, err)
			require.Contains(t, err.Error(), c.msg)
		})
	}
}

// sliceValue returns the forward scan body's plan and a value of it planned
// as a slice of the scan's stacked ys, failing the test if there is none.
func sliceValue(t *testing.T, p *passes.Program, fwd *ir.Op) (*passes.RegionPlan, *ir.Value) {
	sub := p.Plan.Sub[fwd][0]
	for _, v := range sub.Region.Results {
		if b, ok := sub.Values[v]; ok && b.Kind == passes.BufSlice {
			return sub, v
		}
	}
	t.Fatal("the forward scan's residuals are not planned in their ys slices")
	return nil, nil
}

// TestScanYsArePlannedInTheirSlices: the forward scan's stacked residuals
// computed by body ops take no room in the body arena.
func TestScanYsArePlannedInTheirSlices(t *testing.T) {
	p, fwd, _ := gradPlan(t)
	sub, v := sliceValue(t, p, fwd)
	b := sub.Values[v]
	require.Equal(t, v.Type.Bytes(), b.Size)
	require.NoError(t, passes.CheckPlan(p))
}

// TestPlanRunSeesOverlap checks that the plan-following executor of the tests
// notices a plan that lets two live values share bytes.
func TestPlanRunSeesOverlap(t *testing.T) {
	p, fwd, _ := gradPlan(t)
	args := randprog.Args(rand.New(rand.NewPCG(3, 4)), p.Func)
	want, err := eval.Run(p.Func, args)
	require.NoError(t, err)
	got, err := runPlan(p, args)
	require.NoError(t, err)
	require.NoError(t, sameResults(want, got))

	ys, xs := fwd.Results[1], fwd.Results[2]
	b := p.Plan.Values[xs]
	b.Offset = p.Plan.Values[ys].Offset
	p.Plan.Values[xs] = b
	got, err = runPlan(p, args)
	require.NoError(t, err)
	require.Error(t, sameResults(want, got))
}

// TestPeakLive reports the values live at the gradient program's peak:
// the stacked residuals of the forward scan and the backward body's temps.
func TestPeakLive(t *testing.T) {
	p, fwd, bwd := gradPlan(t)
	pk := passes.PeakLive(p, ir.Device)
	require.LessOrEqual(t, pk.Bytes, p.Analysis.TempBytes, "alignment padding is not counted")
	var live []*ir.Value
	for _, lv := range pk.Live {
		live = append(live, lv.Value)
	}
	require.Contains(t, live, fwd.Results[1])
	require.Contains(t, live, fwd.Results[2])
	require.Contains(t, pk.Path, "scan")
	_ = bwd
	require.Contains(t, pk.String(), "peak device")
}
