package memview

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/ferryml/ferry/passes"
)

// Decisions of the memory budget's plan as the page names them
// (Decision.Decision), from the planner's actions (passes.PlannedValue.Action).
const (
	DecisionKept         = "kept"          // "keep": saved on device
	DecisionRecomputed   = "recomputed"    // "recompute": made again in the backward pass
	DecisionOffloaded    = "offloaded"     // "offload": to pinned_host and prefetched back
	DecisionStreamed     = "streamed"      // "stream": a pinned_host slice copied in again
	DecisionHostArgument = "host argument" // passes.ActionHostArgument
	DecisionHostState    = "host state"    // passes.ActionHostState
)

// decisionOrder lists the decisions in the order the totals show them.
var decisionOrder = []string{DecisionKept, DecisionRecomputed, DecisionOffloaded, DecisionStreamed, DecisionHostArgument, DecisionHostState}

// decisionOf names the planner's action a.
func decisionOf(a string) string {
	switch a {
	case "keep":
		return DecisionKept
	case "recompute":
		return DecisionRecomputed
	case "offload":
		return DecisionOffloaded
	case "stream":
		return DecisionStreamed
	}
	return a // the host actions keep their names
}

// Budget is the memory budget's plan of a program compiled under one
// (rt.MemoryBudget): passes.MemoryPlan as the planner reported it, its
// figures copied, not recomputed.
type Budget struct {
	// Bytes is the device budget and Label it in binary units ("48 MiB").
	Bytes int64  `json:"bytes"`
	Label string `json:"label"`
	// BaselineBytes is the device total with every residual kept and
	// TotalBytes the plan's (passes.MemoryPlan).
	BaselineBytes int64 `json:"baseline_bytes"`
	TotalBytes    int64 `json:"total_bytes"`
	// ComputeSeconds and StepSeconds are the planner's estimates of a call
	// without and with the plan's additions.
	ComputeSeconds float64 `json:"compute_seconds"`
	StepSeconds    float64 `json:"step_seconds"`
	// FlopRate, ElementRate and Bandwidth are the measured rates the
	// estimates use (FLOP/s, FLOP/s, bytes/s device↔pinned_host).
	FlopRate    float64 `json:"flop_rate"`
	ElementRate float64 `json:"element_rate"`
	Bandwidth   float64 `json:"bandwidth"`
	// Compiles is how many plans the planner traced and compiled.
	Compiles int `json:"compiles"`
	// Decisions are the plan's values in its order, Totals their sums per
	// decision (in the order kept, recomputed, offloaded, streamed, host
	// argument, host state; those with no value left out) and All the sum
	// of every decision.
	Decisions []Decision      `json:"decisions"`
	Totals    []DecisionTotal `json:"totals"`
	All       DecisionTotal   `json:"all"`
}

// Decision is one value of the plan (passes.PlannedValue).
type Decision struct {
	// Residual names the value: its checkpoint name, "scan carry" for the
	// carry of a scan at the start of an iteration (a layer's input),
	// "argument N" for an argument leaf, else its op.
	Residual string `json:"residual"`
	Name     string `json:"name,omitempty"`
	Op       string `json:"op"`
	Loc      string `json:"loc,omitempty"`
	Type     string `json:"type"`
	Scope    int    `json:"scope"`
	Index    int    `json:"index"`
	Carry    bool   `json:"carry,omitempty"`
	// Action is the planner's (keep, recompute, offload, stream, host
	// argument, host state), Decision the page's word for it (DecisionKept, ...).
	Action     string `json:"action"`
	Decision   string `json:"decision"`
	Iterations int    `json:"iterations"`
	Bytes      int64  `json:"bytes"`
	// Seconds is the time the planner estimated the decision adds to a
	// call, Flops the recomputation's arithmetic (recomputed values), and
	// Cost says what Seconds is: "recompute", "transfer" or "" (kept).
	Seconds float64 `json:"seconds"`
	Flops   float64 `json:"flops"`
	Cost    string  `json:"cost"`
}

// DecisionTotal sums the decisions of one kind.
type DecisionTotal struct {
	Decision string  `json:"decision"`
	Count    int     `json:"count"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	Flops    float64 `json:"flops"`
}

// budgetOf copies the plan p (nil: no budget).
func budgetOf(p *passes.MemoryPlan) *Budget {
	if p == nil {
		return nil
	}
	b := &Budget{Bytes: p.Budget, Label: HumanBytes(p.Budget), BaselineBytes: p.BaselineBytes, TotalBytes: p.TotalBytes,
		ComputeSeconds: p.ComputeSeconds, StepSeconds: p.StepSeconds, FlopRate: p.FlopRate, ElementRate: p.ElementRate,
		Bandwidth: p.Bandwidth, Compiles: p.Compiles, Decisions: []Decision{}, Totals: []DecisionTotal{}, All: DecisionTotal{Decision: "all"}}
	sums := map[string]*DecisionTotal{}
	for _, v := range p.Values {
		d := Decision{Name: v.Name, Op: v.Op, Loc: v.Loc, Type: v.Type, Scope: v.Scope, Index: v.Index, Carry: v.Carry,
			Action: v.Action, Decision: decisionOf(v.Action), Iterations: v.Iterations, Bytes: v.Bytes, Seconds: v.Seconds, Flops: v.Flops}
		switch {
		case v.Action == passes.ActionHostArgument || v.Action == passes.ActionHostState:
			d.Residual = fmt.Sprintf("argument %d", v.Index)
			if v.Loc != "" {
				d.Residual += " " + v.Loc
			}
			d.Loc = ""
		case v.Carry:
			d.Residual = "scan carry"
		case v.Name != "":
			d.Residual = v.Name
		default:
			d.Residual = v.Op
		}
		switch d.Decision {
		case DecisionRecomputed:
			d.Cost = "recompute"
		case DecisionOffloaded, DecisionStreamed, DecisionHostArgument, DecisionHostState:
			d.Cost = "transfer"
		}
		b.Decisions = append(b.Decisions, d)
		s := sums[d.Decision]
		if s == nil {
			s = &DecisionTotal{Decision: d.Decision}
			sums[d.Decision] = s
		}
		for _, t := range []*DecisionTotal{s, &b.All} {
			t.Count++
			t.Bytes += d.Bytes
			t.Seconds += d.Seconds
			t.Flops += d.Flops
		}
	}
	for _, k := range decisionOrder {
		if s := sums[k]; s != nil {
			b.Totals = append(b.Totals, *s)
		}
	}
	return b
}

// title is the program's Title, or when it has none its name with its
// budget: "main_gradFn — budget 48 MiB", or "main_gradFn — no budget".
func (p *Program) title() string {
	switch {
	case p.Title != "":
		return p.Title
	case p.Budget != nil:
		return p.Name + " — budget " + p.Budget.Label
	}
	return p.Name + " — no budget"
}

// HumanBytes formats n bytes in binary units: whole units as "48 MiB",
// others with up to two decimals ("1.5 KiB", "47.25 MiB"), below 1 KiB as
// "123 B".
func HumanBytes(n int64) string {
	a := n
	if a < 0 {
		a = -a
	}
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if a < u.size {
			continue
		}
		if n%u.size == 0 {
			return fmt.Sprintf("%d %s", n/u.size, u.name)
		}
		s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", float64(n)/float64(u.size)), "0"), ".")
		return s + " " + u.name
	}
	return fmt.Sprintf("%d B", n)
}

// humanSeconds formats an estimate: "0 s", "12.3 µs", "4.56 ms", "1.23 s".
func humanSeconds(s float64) string {
	a := math.Abs(s)
	switch {
	case s == 0:
		return "0 s"
	case a >= 1:
		return fmt.Sprintf("%.3g s", s)
	case a >= 1e-3:
		return fmt.Sprintf("%.3g ms", s*1e3)
	case a >= 1e-6:
		return fmt.Sprintf("%.3g µs", s*1e6)
	}
	return fmt.Sprintf("%.3g ns", s*1e9)
}

// humanRate formats a count with an SI prefix: "1.23 G" + unit.
func humanRate(x float64, unit string) string {
	a := math.Abs(x)
	for _, u := range []struct {
		f float64
		p string
	}{{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if a >= u.f {
			return fmt.Sprintf("%.3g %s%s", x/u.f, u.p, unit)
		}
	}
	return fmt.Sprintf("%.3g %s", x, unit)
}

// costText describes what d's estimate is.
func costText(d Decision) string {
	switch d.Decision {
	case DecisionRecomputed:
		return humanRate(d.Flops, "FLOP") + " recomputed"
	case DecisionOffloaded:
		if d.Seconds == 0 {
			return "copies out and back hidden by the scan's compute"
		}
		return "copies out and back not hidden by the scan's compute"
	case DecisionStreamed:
		return "copied in again for the backward pass"
	case DecisionHostArgument:
		return "slices copied in"
	case DecisionHostState:
		return "copied in and its new value out"
	}
	return ""
}

// writeBudgetSection writes the plan section of the program with role
// ("program" or "baseline"): a summary of the plan and its decisions as a
// table with totals. A program without a budget writes a line saying so.
func writeBudgetSection(w io.Writer, p *Program, role string) {
	e := html.EscapeString
	fmt.Fprintf(w, "<section class=\"plan\" id=\"plan-%s\" data-program=\"%s\">\n<h2>Memory budget plan — %s: %s</h2>\n", role, role, role, e(p.title()))
	b := p.Budget
	if b == nil {
		fmt.Fprintf(w, "<p class=\"note\">Compiled without a memory budget (rt.MemoryBudget): every residual is where the program's own remat and offload choices put it.</p>\n</section>\n")
		return
	}
	fmt.Fprintf(w, "<p>Budget <b class=\"budget\" data-bytes=\"%d\">%s</b> of device memory: the plan's device total is %s (%d bytes), %s with every residual kept. "+
		"Estimated call: %s (compute %s, the plan adds %s). Rates measured: matrix products %s/s, elementwise %s/s, device↔pinned_host %s/s. %d plans compiled.</p>\n",
		b.Bytes, e(b.Label), HumanBytes(b.TotalBytes), b.TotalBytes, HumanBytes(b.BaselineBytes),
		humanSeconds(b.StepSeconds), humanSeconds(b.ComputeSeconds), humanSeconds(b.All.Seconds),
		humanRate(b.FlopRate, "FLOP"), humanRate(b.ElementRate, "FLOP"), humanRate(b.Bandwidth, "B"), b.Compiles)
	fmt.Fprintf(w, "<table class=\"decisions\">\n<tr><th>#</th><th>residual</th><th>made by</th><th>type</th><th title=\"copies per call: the length of the scans around it\">×</th><th>decision</th><th>bytes</th><th>estimated time</th><th>cost</th></tr>\n")
	for i, d := range b.Decisions {
		made := d.Op
		if d.Loc != "" {
			made += " at " + d.Loc
		}
		if d.Scope >= 0 {
			made += fmt.Sprintf(" (scope %d value %d)", d.Scope, d.Index)
		}
		fmt.Fprintf(w, "<tr class=\"decision %s\" data-decision=\"%s\" data-bytes=\"%d\" data-seconds=\"%g\" data-flops=\"%g\"><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td class=\"d\">%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			strings.ReplaceAll(d.Decision, " ", "-"), e(d.Decision), d.Bytes, d.Seconds, d.Flops, i+1, e(d.Residual), e(made), e(d.Type), d.Iterations,
			e(d.Decision), HumanBytes(d.Bytes), humanSeconds(d.Seconds), e(costText(d)))
	}
	for _, t := range append(append([]DecisionTotal{}, b.Totals...), b.All) {
		what := t.Decision
		if what == "all" {
			what = "all decisions"
		}
		of := ""
		if t.Flops > 0 {
			of = humanRate(t.Flops, "FLOP") + " recomputed"
		}
		fmt.Fprintf(w, "<tr class=\"total\" data-decision=\"%s\" data-count=\"%d\" data-bytes=\"%d\" data-seconds=\"%g\"><td></td><td colspan=\"4\">total %s: %d</td><td class=\"d\">%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			e(t.Decision), t.Count, t.Bytes, t.Seconds, e(what), t.Count, e(t.Decision), HumanBytes(t.Bytes), humanSeconds(t.Seconds), of)
	}
	fmt.Fprintf(w, "</table>\n</section>\n")
}
