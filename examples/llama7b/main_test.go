package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
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
