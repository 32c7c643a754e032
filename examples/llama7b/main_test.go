package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// tinySize is a member of the family small enough to compile in a test.
func tinySize(layers int) Size {
	return Size{Config: nn.LlamaConfig{Vocab: 96, Layers: layers, D: 64, Heads: 4, KVHeads: 2, Hidden: 160}, Seq: 32, Batch: 1, Param: ir.BFloat16}
}

// The planner fits the tiny step into a budget well below its unconstrained
// total (moving the stacked parameters and moments to pinned_host), and the
// report's figures agree with the plan: the device total is within the
// budget, the parameters' bytes are those of the configuration, and what
// moved is no longer counted on device.
func TestPlanTiny(t *testing.T) {
	r := testseed.Rand(t, 1)
	sz := tinySize(2 + r.IntN(3))
	c := sz.Config
	l, d, kv := int64(c.Layers), int64(c.D), int64(c.KVHeads*(c.D/c.Heads))
	want := 2*int64(c.Vocab)*d + d + l*(2*d+2*d*d+2*d*kv+3*d*int64(c.Hidden))
	base, err := plan(sz, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if base.Parameters != want || base.Unconstrained.Params != 2*want || base.Unconstrained.OptState != 8*want+4 {
		t.Fatalf("parameters %d (%d bytes), state %d bytes; want %d, %d, %d", base.Parameters, base.Unconstrained.Params, base.Unconstrained.OptState, want, 2*want, 8*want+4)
	}
	budget := base.Unconstrained.Total / 4
	rep, err := plan(sz, budget)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Fits || rep.Plan.TotalBytes > budget || rep.Planned.Total != rep.Plan.TotalBytes {
		t.Fatalf("budget %d: fits %v, %s", budget, rep.Fits, rep.Error)
	}
	if rep.Planned.Params+rep.Planned.OptState+rep.Planned.HostArgument != base.Unconstrained.Params+base.Unconstrained.OptState {
		t.Errorf("on device %d + %d, in pinned_host %d: want the arguments' %d in all", rep.Planned.Params, rep.Planned.OptState, rep.Planned.HostArgument, base.Unconstrained.Params+base.Unconstrained.OptState)
	}
	// Whatever the plan, the state it cannot keep on device crosses the
	// link in and out once per step (AdamW reads and writes all of it).
	floor := base.Unconstrained.Params + base.Unconstrained.OptState - budget
	if rep.Link.FloorBytes != floor || rep.Traffic.ToDevice < floor || rep.Traffic.ToHost < floor {
		t.Errorf("link floor %d bytes, want %d; the plan copies %d in and %d out", rep.Link.FloorBytes, floor, rep.Traffic.ToDevice, rep.Traffic.ToHost)
	}
	if rep.StepSeconds < rep.UnconstrainedSeconds {
		t.Errorf("the plan's step %g s is faster than the unconstrained %g s", rep.StepSeconds, rep.UnconstrainedSeconds)
	}
	var out bytes.Buffer
	rep.print(&out)
	if !strings.Contains(out.String(), "fits, device total") {
		t.Errorf("the report does not say it fits:\n%s", out.String())
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Error(err)
	}
}

// poolRounding bounds how far the pool's measured peak may exceed the
// analysed total: the pool counts each buffer rounded up to its
// allocator's alignment, which the analysis does not, so a few scalars
// (the step count, the loss) add a few hundred bytes.
const poolRounding = 1 << 10

// Run under budgets from the unconstrained total down to the smallest that
// fits, the tiny model's measured device peak stays within each budget
// (up to poolRounding) and its losses are the unconstrained run's.
func TestRunTiny(t *testing.T) {
	r := testseed.Rand(t, 2)
	sz := tinySize(2 + r.IntN(2))
	sz.Param = ir.Float32
	rows, err := runBudgets(sz, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	for i, row := range rows {
		if row.Peak > row.Budget+poolRounding || row.Total > row.Budget {
			t.Errorf("budget %d: measured peak %d, analysed total %d", row.Budget, row.Peak, row.Total)
		}
		if i > 0 && row.Budget >= rows[i-1].Budget {
			t.Errorf("budgets %d then %d, want decreasing", rows[i-1].Budget, row.Budget)
		}
		if row.MaxLossDiff > 1e-5 || len(row.Losses) != 2 {
			t.Errorf("budget %d: losses %v, %g from the unconstrained run's", row.Budget, row.Losses, row.MaxLossDiff)
		}
	}
	if rows[len(rows)-1].HostArguments == 0 {
		t.Errorf("the smallest budget placed no argument in pinned_host: %+v", rows[len(rows)-1])
	}
}

// The traffic walker counts a copy to pinned_host inside a scan once per
// iteration: a scan of L steps writing a [k] f32 slice to pinned_host per
// step moves 4·k·L bytes to the host and none to the device.
func TestTrafficScan(t *testing.T) {
	r := testseed.Rand(t, 3)
	L, k := 2+r.IntN(7), 8*(1+r.IntN(16))
	f := func(xs *trace.Array) *trace.Array {
		_, ys := trace.ScanTree(func(c, x *trace.Array) (*trace.Array, *trace.Array) {
			y := trace.Mul(x, trace.Add(c, x))
			return y, trace.DevicePut(y, ir.PinnedHost)
		}, trace.Zeros(ir.Shape{k}, ir.Float32), xs)
		return ys
	}
	low, err := rt.Lower(f, trace.Abstract(ir.TypeOf(ir.Float32, L, k)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	tr := trafficOf(c.Program().Func)
	if want := int64(4 * k * L); tr.ToHost != want || tr.ToDevice != 0 {
		t.Errorf("L=%d k=%d: to host %d, to device %d; want %d, 0", L, k, tr.ToHost, tr.ToDevice, want)
	}
}

// Sharded FSDP-style over n devices (one sequence each), every device holds
// its 1/n of the parameters and AdamW state, gathers each layer's
// parameters in the forward and again in the backward pass, and the
// planner fits each device into its arguments and half the rest of its
// unconstrained total.
func TestPlanFSDPTiny(t *testing.T) {
	r := testseed.Rand(t, 4)
	n := []int{2, 4}[r.IntN(2)]
	sz := tinySize(2 + r.IntN(3))
	sz.Batch = n
	c := sz.Config
	l, d, kv := int64(c.Layers), int64(c.D), int64(c.KVHeads*(c.D/c.Heads))
	blocks := l * (2*d + 2*d*d + 2*d*kv + 3*d*int64(c.Hidden))
	params := 2*int64(c.Vocab)*d + d + blocks
	base, err := planFSDP(sz, n, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if base.Params != 2*params/int64(n) || base.OptState != 8*params/int64(n)+4 {
		t.Fatalf("%d devices: per device parameters %d, state %d bytes; want %d, %d", n, base.Params, base.OptState, 2*params/int64(n), 8*params/int64(n)+4)
	}
	u := base.Unconstrained
	if u.Traffic.AllGather < 2*2*blocks {
		t.Errorf("all-gathered %d bytes per device, want at least the stacked blocks' %d twice", u.Traffic.AllGather, 2*blocks)
	}
	budget := u.Argument + (u.Total-u.Argument)/2
	rep, err := planFSDP(sz, n, budget)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Fits || rep.Planned.Total > budget {
		t.Fatalf("budget %d per device: fits %v, %s", budget, rep.Fits, rep.Error)
	}
	if q := rep.Planned; q.Traffic.Flops < u.Traffic.Flops || q.Serial < u.Serial || q.Traffic.ToDevice < q.Traffic.ToHost {
		t.Errorf("planned %+v beside unconstrained %+v", q, u)
	}
	var out bytes.Buffer
	rep.print(&out)
	if !strings.Contains(out.String(), "fits") {
		t.Errorf("the report does not say it fits:\n%s", out.String())
	}
}

// A hand-written contender of -compare (a checkpoint policy, moments and
// parameters offloaded by hand) computes the step the planner plans: from
// the same state, its loss and new parameters and moments are the
// unconstrained step's.
func TestHandStepsAgree(t *testing.T) {
	defer rt.SetWarnings(rt.SetWarnings(nil))
	r := testseed.Rand(t, 5)
	sz := tinySize(2 + r.IntN(2))
	sz.Param = ir.Float32
	all := hands()
	h := all[r.IntN(len(all))]
	p, s, ids, targets, err := abstractArgs(sz)
	if err != nil {
		t.Fatal(err)
	}
	args := []any{p, s, ids, targets}
	base, err := compileStep(args)
	if err != nil {
		t.Fatal(err)
	}
	hp, hs := h.args(p, s)
	low, err := rt.NewJitted(h.step, rt.Donate(0, 1)).Lower(hp, hs, ids, targets)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	run := func(c *rt.Compiled) ([]*trace.Array, float64) {
		p, s, ids, targets, err := concreteState(sz)
		if err != nil {
			t.Fatal(err)
		}
		p, s, _, _, err = timeCall(c, p, s, ids, targets)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := c.Call(p, s, ids, targets)
		if err != nil {
			t.Fatal(err)
		}
		return append(trace.Leaves(outs[0]), trace.Leaves(outs[1])...), outs[2].(*trace.Array).Item()
	}
	want, wantLoss := run(base)
	got, gotLoss := run(hc)
	if math.Abs(gotLoss-wantLoss) > 1e-5 {
		t.Errorf("%v: second step's loss %g, want %g", h, gotLoss, wantLoss)
	}
	for i := range want {
		if got[i].Space() != hc.Lowered().Func.Body.Params[i].Type.Space {
			t.Errorf("%v: result leaf %d in %v, the step reads it from %v", h, i, got[i].Space(), hc.Lowered().Func.Body.Params[i].Type.Space)
		}
		g, w := got[i].Float64s(), want[i].Float64s()
		for k := range w {
			if math.Abs(g[k]-w[k]) > 1e-5*(1+math.Abs(w[k])) {
				t.Fatalf("%v: leaf %d element %d is %g, want %g", h, i, k, g[k], w[k])
			}
		}
	}
}

// -compare at a tiny size, with the hand-written step that keeps
// everything and two others, under a budget above any total and one of
// half the unconstrained total: the planner's plan is within each budget,
// the hand-written choices it compares with fit it too, and under the
// first every one is a candidate, the first with the unconstrained total.
func TestCompareTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles and runs five steps")
	}
	defer rt.SetWarnings(rt.SetWarnings(nil))
	r := testseed.Rand(t, 6)
	sz := tinySize(2 + r.IntN(2))
	sz.Param = ir.Float32
	p, s, ids, targets, err := abstractArgs(sz)
	if err != nil {
		t.Fatal(err)
	}
	base, err := compileStep([]any{p, s, ids, targets})
	if err != nil {
		t.Fatal(err)
	}
	total := base.MemoryAnalysis().TotalBytes()
	all := hands()
	hs := []hand{all[0], all[1+r.IntN(len(all)-1)], all[1+r.IntN(len(all)-1)]}
	rep, err := compareBudgets(sz, []int64{1 << 40, total / 2}, hs, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 || len(rep.Hands) != len(hs) {
		t.Fatalf("%d rows, %d hand-written choices", len(rep.Rows), len(rep.Hands))
	}
	if rep.Hands[0].Total != total || rep.Rows[0].PlanTotal != total {
		t.Errorf("hand-written %s: device total %d, the plan's %d; want the unconstrained %d", rep.Hands[0].Name, rep.Hands[0].Total, rep.Rows[0].PlanTotal, total)
	}
	for _, row := range rep.Rows {
		if row.PlanTotal > row.Budget || row.HandCandidates > 0 && (row.HandTotal > row.Budget || row.Ratio <= 0) {
			t.Errorf("budget %d: %+v", row.Budget, row)
		}
	}
	if rep.Rows[0].HandCandidates != len(hs) {
		t.Errorf("%d hand-written choices fit the unconstrained total, want all %d", rep.Rows[0].HandCandidates, len(hs))
	}
}
