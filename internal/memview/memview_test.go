package memview

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ferryml/ferry/passes"
)

// TestBuildNoPlan: a program without a buffer plan is an error naming it.
func TestBuildNoPlan(t *testing.T) {
	for _, p := range []*passes.Program{nil, {}} {
		if _, err := Build(p); err == nil || !strings.Contains(err.Error(), "no buffer plan") {
			t.Errorf("Build(%v): %v", p, err)
		}
	}
}

// TestPageSelfContained: a page loads nothing from elsewhere and its data
// cannot close its script block.
func TestPageSelfContained(t *testing.T) {
	var b bytes.Buffer
	p := &Program{Name: `</script><script src="x.js">`, Steps: []Step{}, Spaces: []Space{}}
	if err := WriteProgramPage(&b, p); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if strings.Contains(strings.ReplaceAll(page, "http://www.w3.org/2000/svg", ""), "http") {
		t.Errorf("the page has an address")
	}
	for _, bad := range []string{"<script src", "<link", "@import", "url("} {
		if strings.Contains(page, bad) {
			t.Errorf("the page has %q", bad)
		}
	}
	if n := strings.Count(page, "</script>"); n != 3 {
		t.Errorf("%d </script>, want 3", n)
	}
}

// TestHumanBytes: whole binary units print without decimals, others with
// up to two.
func TestHumanBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {1536, "1.5 KiB"}, {48 << 20, "48 MiB"}, {48<<20 + 1<<18, "48.25 MiB"},
		{3 << 30, "3 GiB"}, {(1 << 20) - 1, "1024 KiB"}, {-2048, "-2 KiB"}, {5 << 40, "5 TiB"}} {
		if got := HumanBytes(c.n); got != c.want {
			t.Errorf("HumanBytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestBudgetOf: every action of a plan becomes its decision with the
// plan's figures; the totals sum them per decision; the titles say
// whether there is a budget; the page's plan table escapes what it shows.
func TestBudgetOf(t *testing.T) {
	plan := &passes.MemoryPlan{Budget: 48 << 20, BaselineBytes: 60 << 20, TotalBytes: 47 << 20, ComputeSeconds: 0.5, StepSeconds: 0.75,
		FlopRate: 1e11, ElementRate: 1e9, Bandwidth: 1e10, Compiles: 7, Values: []passes.PlannedValue{
			{Scope: -1, Index: 2, Op: "argument", Type: "f32[4,8]{pinned_host}", Loc: "w.W1", Action: passes.ActionHostArgument, Iterations: 1, Bytes: 128, Seconds: 0.01},
			{Scope: 0, Index: 0, Op: "checkpoint_name", Type: "f32[8]", Loc: "a.go:3", Carry: true, Action: "offload", Iterations: 4, Bytes: 4 << 20, Seconds: 0.02},
			{Scope: 0, Index: 1, Op: "tanh", Type: "f32[8]", Loc: "a.go:4", Action: "recompute", Iterations: 4, Bytes: 8 << 20, Seconds: 0.2, Flops: 3e6},
			{Scope: 0, Index: 2, Op: "checkpoint_name", Name: "<h>", Type: "f32[8]", Loc: "a.go:5", Action: "keep", Iterations: 4, Bytes: 1 << 20},
			{Scope: 0, Index: 3, Op: "device_put", Type: "f32[8]", Loc: "a.go:6", Action: "stream", Iterations: 4, Bytes: 2 << 20, Seconds: 0.015},
			{Scope: 0, Index: 4, Op: "mul", Type: "f32[8]", Loc: "a.go:7", Action: "recompute", Iterations: 4, Bytes: 1 << 20, Seconds: 0.005, Flops: 1e6},
			{Scope: -1, Index: 5, Op: "argument", Type: "f32[8]{pinned_host}", Loc: "state.M", Action: passes.ActionHostState, Iterations: 1, Bytes: 32, Seconds: 0.001},
		}}
	b := budgetOf(plan)
	if b.Bytes != plan.Budget || b.Label != "48 MiB" || b.TotalBytes != plan.TotalBytes || b.BaselineBytes != plan.BaselineBytes ||
		b.StepSeconds != 0.75 || b.ComputeSeconds != 0.5 || b.Compiles != 7 || b.Bandwidth != 1e10 {
		t.Errorf("budget %+v", b)
	}
	want := []struct{ residual, decision, cost string }{
		{"argument 2 w.W1", DecisionHostArgument, "transfer"}, {"scan carry", DecisionOffloaded, "transfer"},
		{"tanh", DecisionRecomputed, "recompute"}, {"<h>", DecisionKept, ""}, {"device_put", DecisionStreamed, "transfer"},
		{"mul", DecisionRecomputed, "recompute"}, {"argument 5 state.M", DecisionHostState, "transfer"}}
	for i, d := range b.Decisions {
		v := plan.Values[i]
		if d.Residual != want[i].residual || d.Decision != want[i].decision || d.Cost != want[i].cost || d.Action != v.Action ||
			d.Bytes != v.Bytes || d.Seconds != v.Seconds || d.Flops != v.Flops || d.Type != v.Type || d.Iterations != v.Iterations {
			t.Errorf("decision %d: %+v, want %+v from %+v", i, d, want[i], v)
		}
	}
	wantTotals := []DecisionTotal{{DecisionKept, 1, 1 << 20, 0, 0}, {DecisionRecomputed, 2, 9 << 20, 0.205, 4e6}, {DecisionOffloaded, 1, 4 << 20, 0.02, 0},
		{DecisionStreamed, 1, 2 << 20, 0.015, 0}, {DecisionHostArgument, 1, 128, 0.01, 0}, {DecisionHostState, 1, 32, 0.001, 0}}
	if len(b.Totals) != len(wantTotals) {
		t.Fatalf("totals %+v", b.Totals)
	}
	near := func(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 }
	for i, g := range b.Totals {
		w := wantTotals[i]
		if g.Decision != w.Decision || g.Count != w.Count || g.Bytes != w.Bytes || !near(g.Seconds, w.Seconds) || g.Flops != w.Flops {
			t.Errorf("total %d: %+v, want %+v", i, g, w)
		}
	}
	if a := b.All; a.Count != 7 || a.Bytes != 16<<20+160 || !near(a.Seconds, 0.251) || a.Flops != 4e6 {
		t.Errorf("all: %+v", a)
	}

	p := &Program{Name: "f", Steps: []Step{}, Spaces: []Space{}, Budget: b}
	q := &Program{Name: "f", Steps: []Step{}, Spaces: []Space{}}
	if p.title() != "f — budget 48 MiB" || q.title() != "f — no budget" {
		t.Errorf("titles %q, %q", p.title(), q.title())
	}
	p.Baseline = q
	var page bytes.Buffer
	if err := WriteProgramPage(&page, p); err != nil {
		t.Fatal(err)
	}
	s := page.String()
	for _, want := range []string{"<title>Ferry memory: f — budget 48 MiB, beside f — no budget</title>", `<td>&lt;h&gt;</td>`, `id="plan-program"`, `id="plan-baseline"`,
		`<b class="budget" data-bytes="50331648">48 MiB</b>`, "<td>9 MiB</td>", "4 MFLOP recomputed"} {
		if !strings.Contains(s, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if strings.Contains(s, "<h>") {
		t.Errorf("the page has a name unescaped")
	}
}
