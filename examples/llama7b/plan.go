package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Report is the analysis of one step size and its plan under a budget.
type Report struct {
	Layers, D, Seq, Batch int
	Parameters            int64 `json:"parameters"` // elements
	// Unconstrained is the step's memory analysis with every value kept,
	// by kind: arguments (parameters and optimizer state), the gradients
	// (temporaries of the parameters' size), the residuals the backward
	// pass reads, and the rest of the temporaries.
	Unconstrained Breakdown `json:"unconstrained"`
	// UnconstrainedSeconds is the unconstrained step at the H100 rates.
	UnconstrainedSeconds float64 `json:"unconstrained_seconds"`
	Budget               int64   `json:"budget_bytes"`
	Fits                 bool    `json:"fits"`
	// Plan is the plan under Budget when one fits; Minimum the smallest
	// budget the planner reached when none does.
	Plan         *passes.MemoryPlan `json:"plan,omitempty"`
	Planned      Breakdown          `json:"planned"`
	Minimum      int64              `json:"minimum_bytes,omitempty"`
	Error        string             `json:"error,omitempty"`
	StepSeconds  float64            `json:"step_seconds,omitempty"`
	Slowdown     float64            `json:"slowdown,omitempty"` // StepSeconds / UnconstrainedSeconds
	CompileSecs  float64            `json:"compile_seconds"`
	ActionTotals map[string]int64   `json:"action_bytes,omitempty"` // plan bytes per action
	// Traffic is what the planned program moves per step (its host link
	// copies), and Link the lower bounds the link imposes.
	Traffic Traffic     `json:"traffic"`
	Link    *LinkBounds `json:"link,omitempty"`
}

// Breakdown is a memory analysis by kind, in device bytes: the sizes of
// the parameters and optimizer state on device, of the gradients and of
// the residuals kept on device (both live in the temporaries, packed by
// live range with the rest, so they do not sum to Temp), and the analysis.
type Breakdown struct {
	Params, OptState, Gradients, Residuals int64
	Argument, Output, Alias, Temp, Total   int64
	HostArgument, HostTemp                 int64
}

// breakdown reads analysis m of a step whose parameters take params bytes
// and optimizer state state bytes (on device unless the plan moved them),
// with residuals kept on device.
func breakdown(m passes.MemoryAnalysis, params, state, residuals int64) Breakdown {
	b := Breakdown{Params: params, OptState: state, Gradients: params, Residuals: residuals,
		Argument: m.ArgumentBytes, Output: m.OutputBytes, Alias: m.AliasBytes, Temp: m.TempBytes, Total: m.TotalBytes(),
		HostArgument: m.HostArgumentBytes, HostTemp: m.HostTempBytes}
	return b
}

// kept sums the device bytes of the plan's residuals kept on device.
func kept(p *passes.MemoryPlan) int64 {
	n := int64(0)
	for _, v := range p.Values {
		if v.Action == "keep" {
			n += v.Bytes
		}
	}
	return n
}

// plan compiles the step of size sz with abstract arguments twice: with
// everything kept, and under budget bytes.
func plan(sz Size, budget int64) (*Report, error) {
	p, s, ids, targets, err := abstractArgs(sz)
	if err != nil {
		return nil, err
	}
	args := []any{p, s, ids, targets}
	rates := rt.BudgetRates(h100MatmulFlops, h100ElemFlops, h100HostBytes)
	// The scanned update writes new stacks rather than updating the
	// donated ones in place (a scan's ys do not reuse its xs), which the
	// runtime reports once per compile: the report says it instead.
	defer rt.SetWarnings(rt.SetWarnings(nil))
	start := time.Now()
	// A budget above any total plans nothing and reports the estimate.
	base, err := compileStep(args, rt.MemoryBudget(1<<62), rates)
	if err != nil {
		return nil, err
	}
	bp := base.MemoryPlan()
	c := sz.Config
	r := &Report{Layers: c.Layers, D: c.D, Seq: sz.Seq, Batch: sz.Batch, Parameters: paramCount(p), Budget: budget,
		Unconstrained:        breakdown(base.MemoryAnalysis(), treeBytes(p), treeBytes(s), kept(bp)),
		UnconstrainedSeconds: bp.StepSeconds}
	fitted, err := compileStep(args, rt.MemoryBudget(budget), rates)
	r.CompileSecs = time.Since(start).Seconds()
	var be *rt.MemoryBudgetError
	switch {
	case errors.As(err, &be):
		r.Minimum, r.Error = be.Minimum, be.Error()
		return r, nil
	case err != nil:
		return nil, err
	}
	r.Fits = true
	r.Plan = fitted.MemoryPlan()
	r.StepSeconds = r.Plan.StepSeconds
	r.Slowdown = r.StepSeconds / r.UnconstrainedSeconds
	r.ActionTotals = map[string]int64{}
	for _, v := range r.Plan.Values {
		r.ActionTotals[v.Action] += v.Bytes
	}
	r.Traffic = trafficOf(fitted.Program().Func)
	r.Link = linkBounds(r.Unconstrained.Params, r.Unconstrained.OptState, budget, r.Traffic, r.UnconstrainedSeconds)
	ma := fitted.MemoryAnalysis()
	np := len(trace.Leaves(p))
	r.Planned = breakdown(ma, 0, 0, kept(r.Plan))
	r.Planned.Gradients = treeBytes(p)
	params := fitted.Lowered().Func.Body.Params
	for i := range params {
		if params[i].Type.Space != ir.Device {
			continue
		}
		if i < np {
			r.Planned.Params += params[i].Type.Bytes()
		} else if i < np+len(trace.Leaves(s)) {
			r.Planned.OptState += params[i].Type.Bytes()
		}
	}
	return r, nil
}

func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "Llama-style decoder: %d layers, d %d, seq %d, batch %d: %.3g parameters\n\n", r.Layers, r.D, r.Seq, r.Batch, float64(r.Parameters))
	u := r.Unconstrained
	fmt.Fprintf(w, "unconstrained step (everything kept on device): %s\n", gib(u.Total))
	fmt.Fprintf(w, "  parameters       %12s  (argument, donated)\n", gib(u.Params))
	fmt.Fprintf(w, "  optimizer state  %12s  (argument, donated: AdamW m, v in f32)\n", gib(u.OptState))
	fmt.Fprintf(w, "  gradients        %12s  (temporaries, one per parameter)\n", gib(u.Gradients))
	fmt.Fprintf(w, "  residuals        %12s  (what the backward pass reads from the forward pass)\n", gib(u.Residuals))
	fmt.Fprintf(w, "  (analysis: argument %s + output %s − alias %s + temp %s)\n", gib(u.Argument), gib(u.Output), gib(u.Alias), gib(u.Temp))
	fmt.Fprintf(w, "  estimated step at H100 SXM rates: %.3f s\n\n", r.UnconstrainedSeconds)
	if !r.Fits {
		fmt.Fprintf(w, "budget %s: does not fit; the smallest budget the planner reaches is %s\n%s\n", gib(r.Budget), gib(r.Minimum), r.Error)
		return
	}
	pl := r.Plan
	fmt.Fprintf(w, "budget %s, host memory unbounded: fits, device total %s (%d compiles, %.1f s)\n", gib(r.Budget), gib(pl.TotalBytes), pl.Compiles, r.CompileSecs)
	actions := make([]string, 0, len(r.ActionTotals))
	for a := range r.ActionTotals {
		actions = append(actions, a)
	}
	sort.Strings(actions)
	for _, a := range actions {
		fmt.Fprintf(w, "  %-14s %12s  (residuals and arguments by the plan's action)\n", a+":", gib(r.ActionTotals[a]))
	}
	q := r.Planned
	fmt.Fprintf(w, "  on device: parameters %s, optimizer state %s, temp %s (gradients %s, residuals kept %s); in pinned_host: arguments %s, temp %s\n",
		gib(q.Params), gib(q.OptState), gib(q.Temp), gib(q.Gradients), gib(q.Residuals), gib(q.HostArgument), gib(q.HostTemp))
	fmt.Fprintf(w, "  estimated step: %.3f s = %.2f× the unconstrained step\n", r.StepSeconds, r.Slowdown)
	r.Link.print(w)
	fmt.Fprintln(w)
	fmt.Fprintln(w, pl.String())
}
