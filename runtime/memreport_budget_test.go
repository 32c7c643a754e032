package runtime_test

import (
	"fmt"
	"html"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// budgetJSON is the memory budget's plan as a report embeds it.
type budgetJSON struct {
	Bytes          int64   `json:"bytes"`
	Label          string  `json:"label"`
	BaselineBytes  int64   `json:"baseline_bytes"`
	TotalBytes     int64   `json:"total_bytes"`
	ComputeSeconds float64 `json:"compute_seconds"`
	StepSeconds    float64 `json:"step_seconds"`
	FlopRate       float64 `json:"flop_rate"`
	ElementRate    float64 `json:"element_rate"`
	Bandwidth      float64 `json:"bandwidth"`
	Compiles       int     `json:"compiles"`
	Decisions      []struct {
		Residual, Name, Op, Loc, Type string
		Scope, Index, Iterations      int
		Carry                         bool
		Action, Decision, Cost        string
		Bytes                         int64
		Seconds, Flops                float64
	} `json:"decisions"`
	Totals []decisionTotalJSON `json:"totals"`
	All    decisionTotalJSON   `json:"all"`
}

type decisionTotalJSON struct {
	Decision string
	Count    int
	Bytes    int64
	Seconds  float64
	Flops    float64
}

// pageDecisions is what the planner's actions are called on the page.
var pageDecisions = map[string]string{"keep": "kept", "recompute": "recomputed", "offload": "offloaded", "stream": "streamed",
	passes.ActionHostArgument: "host argument", passes.ActionHostState: "host state"}

// namedBudgetLayer is budgetLayer with its tanh tagged "h".
func namedBudgetLayer(x *trace.Array, w budgetW) *trace.Array {
	return trace.MatMul(trace.CheckpointName(trace.Tanh(trace.MatMul(x, w.W1)), "h"), w.W2)
}

// budgetPrograms compiles the model without a budget and under one a
// quarter of the way from the smallest plan to everything kept, rounded
// up to whole KiB (less than 1 MiB: its label is "N KiB").
func budgetPrograms(t *testing.T) (base, c *rt.Compiled, budget int64, label string, d *budgetData) {
	t.Helper()
	d = newBudgetData(budgetModel{L: 4, B: 128, D: 32, H: 64}, testseed.Uint64(t))
	base, err := compileBudget(t, d, namedBudgetLayer)
	if err != nil {
		t.Fatal(err)
	}
	full := base.MemoryAnalysis().TotalBytes()
	_, err = compileBudget(t, d, namedBudgetLayer, rt.MemoryBudget(1))
	be, ok := err.(*rt.MemoryBudgetError)
	if !ok {
		t.Fatalf("a budget of 1 byte: %v", err)
	}
	budget = (be.Minimum + (full-be.Minimum)/4 + 1023) &^ 1023
	if budget >= full || budget >= 1<<20 {
		t.Fatalf("budget %d: the model needs %d bytes with everything kept, %d at least: not a KiB budget below it", budget, full, be.Minimum)
	}
	if c, err = compileBudget(t, d, namedBudgetLayer, rt.MemoryBudget(budget)); err != nil {
		t.Fatal(err)
	}
	return base, c, budget, fmt.Sprintf("%d KiB", budget>>10), d
}

var decisionRowRE = regexp.MustCompile(`(?s)<tr class="decision[^"]*" data-decision="([^"]*)" data-bytes="([0-9]+)" data-seconds="([^"]*)" data-flops="([^"]*)">(.*?)</tr>`)
var totalRowRE = regexp.MustCompile(`<tr class="total" data-decision="([^"]*)" data-count="([0-9]+)" data-bytes="([0-9]+)" data-seconds="([^"]*)">`)

// planSection returns the plan section of the program with role.
func planSection(t *testing.T, page, role string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<section class="plan" id="plan-` + role + `".*?</section>`).FindString(page)
	if m == "" {
		t.Fatalf("the page has no plan section of the %s", role)
	}
	return m
}

// TestMemoryReportBudget: a scanned model compiled under a memory budget
// beside itself without one. The page's data and its plan table carry the
// budget and, for every value of the planner's plan (c.MemoryPlan()), its
// decision, bytes, estimated seconds and FLOPs as the plan has them, with
// totals per decision that sum the plan; the titles tell the programs apart.
func TestMemoryReportBudget(t *testing.T) {
	base, c, budget, label, _ := budgetPrograms(t)
	plan := c.MemoryPlan()
	if plan == nil {
		t.Fatal("no plan")
	}
	d, pageBytes := compileReport(t, c, base)
	page := string(pageBytes)

	// Titles.
	wantTitle, wantBase := d.Name+" — budget "+label, d.Name+" — no budget"
	if d.Title != wantTitle || d.Baseline == nil || d.Baseline.Title != wantBase {
		t.Errorf("titles %q and %q, want %q and %q", d.Title, d.Baseline.Title, wantTitle, wantBase)
	}
	for _, want := range []string{"<title>Ferry memory: " + wantTitle + ", beside " + wantBase + "</title>",
		"<h1>Ferry memory: " + wantTitle + ", beside " + wantBase + "</h1>"} {
		if !strings.Contains(page, html.EscapeString(want)) && !strings.Contains(page, want) {
			t.Errorf("the page has no %q", want)
		}
	}

	// The budget and the plan's figures in the data.
	b := d.Budget
	if b == nil {
		t.Fatal("the data has no budget")
	}
	if d.Baseline.Budget != nil {
		t.Errorf("the baseline has a budget: %+v", d.Baseline.Budget)
	}
	if b.Bytes != budget || b.Label != label || b.BaselineBytes != plan.BaselineBytes || b.TotalBytes != plan.TotalBytes ||
		b.TotalBytes != c.MemoryAnalysis().TotalBytes() || b.StepSeconds != plan.StepSeconds || b.ComputeSeconds != plan.ComputeSeconds ||
		b.FlopRate != plan.FlopRate || b.ElementRate != plan.ElementRate || b.Bandwidth != plan.Bandwidth || b.Compiles != plan.Compiles {
		t.Errorf("budget %+v; the plan: %v", b, plan)
	}
	if len(b.Decisions) != len(plan.Values) {
		t.Fatalf("%d decisions, the plan has %d values:\n%v", len(b.Decisions), len(plan.Values), plan)
	}
	sums := checkDecisions(t, b, plan)
	checkPlanTable(t, page, budget, label, plan, sums)
	if bs := planSection(t, page, "baseline"); !strings.Contains(bs, "without a memory budget") || decisionRowRE.MatchString(bs) {
		t.Errorf("the baseline's section:\n%s", bs)
	}

	// Each alone: the baseline's page has no plan section, the budgeted
	// program's has its own only.
	db, pb := compileReport(t, base, nil)
	if db.Title != wantBase || db.Budget != nil || strings.Contains(string(pb), `class="plan"`) {
		t.Errorf("the baseline alone: title %q, budget %v, plan section %v", db.Title, db.Budget, strings.Contains(string(pb), `class="plan"`))
	}
	dc, pc := compileReport(t, c, nil)
	if dc.Title != wantTitle || dc.Budget == nil || len(decisionRowRE.FindAllString(string(pc), -1)) != len(plan.Values) || strings.Contains(string(pc), `id="plan-baseline"`) {
		t.Errorf("the budgeted program alone: title %q, budget %v", dc.Title, dc.Budget != nil)
	}
}

// decisionSum is the count, bytes and seconds of the values under one
// decision of a memory plan.
type decisionSum struct {
	n       int
	bytes   int64
	seconds float64
}

// checkDecisions checks the report data's decisions against the plan's
// values, one by one, and returns their sums per decision.
func checkDecisions(t *testing.T, b *budgetJSON, plan *passes.MemoryPlan) map[string]*decisionSum {
	t.Helper()
	sums := map[string]*decisionSum{}
	moved, named := 0, 0
	for i, v := range plan.Values {
		g := b.Decisions[i]
		want, ok := pageDecisions[v.Action]
		if !ok {
			t.Fatalf("the plan has action %q", v.Action)
		}
		if g.Action != v.Action || g.Decision != want || g.Bytes != v.Bytes || g.Seconds != v.Seconds || g.Flops != v.Flops ||
			g.Op != v.Op || g.Type != v.Type || g.Name != v.Name || g.Iterations != v.Iterations || g.Scope != v.Scope || g.Index != v.Index {
			t.Errorf("decision %d: %+v, the plan has %+v", i, g, v)
		}
		if v.Action == "recompute" && !(v.Flops > 0 && g.Cost == "recompute") || v.Action == "offload" && g.Cost != "transfer" {
			t.Errorf("decision %d: %s with %g FLOPs, cost %q", i, v.Action, v.Flops, g.Cost)
		}
		// The planner counts at least one FLOP per element it writes again.
		if v.Action == "recompute" && strings.HasPrefix(v.Type, "f32[") && v.Flops < float64(v.Bytes/4) {
			t.Errorf("decision %d: recomputing %s (%d bytes) counts %g FLOPs", i, v.Type, v.Bytes, v.Flops)
		}
		if v.Action != "keep" {
			moved++
		}
		if v.Name == "h" {
			named++
			if g.Residual != "h" {
				t.Errorf("decision %d: the value named h shows as %q", i, g.Residual)
			}
		}
		s := sums[want]
		if s == nil {
			s = &decisionSum{}
			sums[want] = s
		}
		s.n, s.bytes, s.seconds = s.n+1, s.bytes+v.Bytes, s.seconds+v.Seconds
	}
	if moved == 0 || named == 0 {
		t.Errorf("under a budget below everything kept, %d values recomputed, offloaded or streamed and %d named h:\n%v", moved, named, plan)
	}
	return sums
}

// checkPlanTable checks the page's plan table: a row per value in the plan's
// order, a total per decision and one of all.
func checkPlanTable(t *testing.T, page string, budget int64, label string, plan *passes.MemoryPlan, sums map[string]*decisionSum) {
	t.Helper()
	sec := planSection(t, page, "program")
	if !strings.Contains(sec, fmt.Sprintf(`<b class="budget" data-bytes="%d">%s</b>`, budget, label)) {
		t.Errorf("the plan section does not give the budget %d (%s):\n%s", budget, label, sec)
	}
	rows := decisionRowRE.FindAllStringSubmatch(sec, -1)
	if len(rows) != len(plan.Values) {
		t.Fatalf("%d rows in the plan table, the plan has %d values:\n%s", len(rows), len(plan.Values), sec)
	}
	for i, r := range rows {
		v := plan.Values[i]
		secs, _ := strconv.ParseFloat(r[3], 64)
		flops, _ := strconv.ParseFloat(r[4], 64)
		if r[1] != pageDecisions[v.Action] || r[2] != strconv.FormatInt(v.Bytes, 10) || secs != v.Seconds || flops != v.Flops {
			t.Errorf("row %d: %s %s bytes %s s %s FLOPs; the plan has %s %d bytes %g s %g FLOPs", i, r[1], r[2], r[3], r[4], v.Action, v.Bytes, v.Seconds, v.Flops)
		}
		for _, want := range []string{v.Type, v.Op, v.Loc} {
			if !strings.Contains(r[5], html.EscapeString(want)) {
				t.Errorf("row %d has no %q: %s", i, want, r[5])
			}
		}
		if v.Bytes%1024 == 0 && v.Bytes < 1<<20 && !strings.Contains(r[5], fmt.Sprintf("<td>%d KiB</td>", v.Bytes>>10)) {
			t.Errorf("row %d does not give %d bytes as %d KiB: %s", i, v.Bytes, v.Bytes>>10, r[5])
		}
	}
	totals := totalRowRE.FindAllStringSubmatch(sec, -1)
	if len(totals) != len(sums)+1 {
		t.Errorf("%d total rows, want one per decision (%d) and one of all", len(totals), len(sums))
	}
	var all decisionSum
	for _, s := range sums {
		all.n, all.bytes, all.seconds = all.n+s.n, all.bytes+s.bytes, all.seconds+s.seconds
	}
	for _, r := range totals {
		s := sums[r[1]]
		if r[1] == "all" {
			s = &all
		}
		secs, _ := strconv.ParseFloat(r[4], 64)
		if s == nil || r[2] != strconv.Itoa(s.n) || r[3] != strconv.FormatInt(s.bytes, 10) || !sumClose(secs, s.seconds) {
			t.Errorf("total %s: %s values %s bytes %s s; the plan sums to %+v", r[1], r[2], r[3], r[4], s)
		}
	}
}

// sumClose compares a sum as the page prints it (%g of the same float sum in
// another order) with the test's.
func sumClose(a, b float64) bool {
	d := a - b
	return d <= 1e-12*max(1, b) && -d <= 1e-12*max(1, b)
}

// TestMemoryReportBudgetEnv: FERRY_MEMORY_REPORT writes the page of a
// function jitted under a budget with the budget in its title and data.
func TestMemoryReportBudgetEnv(t *testing.T) {
	_, c, budget, label, d := budgetPrograms(t)
	dir := t.TempDir()
	t.Setenv(rt.EnvMemoryReport, dir)
	l, err := rt.NewJitted(budgetGrad(namedBudgetLayer), rt.MemoryBudget(budget)).Lower(d.w, d.xa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Compile(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.memory.html"))
	if len(files) != 1 {
		t.Fatalf("pages %v, want one", files)
	}
	page, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var r reportJSON
	parseReport(t, page, &r)
	if r.Budget == nil || r.Budget.Bytes != budget || !strings.HasSuffix(r.Title, " — budget "+label) || len(r.Budget.Decisions) != len(c.MemoryPlan().Values) {
		t.Errorf("the page of a budgeted function: title %q, budget %+v", r.Title, r.Budget)
	}
}
