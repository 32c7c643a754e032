package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The -budget mode: the model under rt.MemoryBudget at 8 budgets from the
// fully offloaded case's total (activation and parameter offload) up to the
// baseline's, with the weights passed on device (the planner moves them to
// pinned_host where no plan fits otherwise), beside the fastest hand-written choice that fits each budget:
// the nine remat policies of trace (and a plain scan), each with the weights
// on device and in pinned_host (streamed in by the layer's device_put), all
// compiled, checked and timed in the same run, the timed runs alternating.

var (
	budgetFlag = flag.Bool("budget", false, "run the memory budget table (rt.MemoryBudget against hand-written remat/offload choices)")
	budgetReps = flag.Int("budget-reps", 5, "-budget: timed runs per case (the fastest counts), alternating between cases")
)

// BudgetRow is one budget of the -budget table.
type BudgetRow struct {
	BudgetBytes int64 `json:"budget_bytes"`
	// TotalBytes is the plan's analysed device total, PeakDeviceBytes the
	// allocator's measured peak of the call (the weights' bytes included when
	// they are on device).
	TotalBytes      int64   `json:"total_bytes"`
	PeakDeviceBytes int64   `json:"peak_device_bytes"`
	Seconds         float64 `json:"seconds"`
	// EstimatedSeconds is the planner's model of the step.
	EstimatedSeconds float64 `json:"estimated_seconds"`
	// HostParams: the planner placed the weights (passed on device) in
	// pinned_host, as no plan fits with them on device.
	HostParams        bool    `json:"host_params"`
	MaxAbsGradDiff    float64 `json:"max_abs_grad_diff"`
	BestManualSeconds float64 `json:"best_manual_seconds"`
	BestManualCase    string  `json:"best_manual_case"`
	BestManualPeak    int64   `json:"best_manual_peak_device_bytes"`
	Plan              string  `json:"plan"`
	Error             string  `json:"error,omitempty"`
}

// manualPolicies are trace's nine policies, with the layer input named "x".
var manualPolicies = []struct {
	name   string
	policy trace.CheckpointPolicy
}{
	{"everything_saveable", trace.EverythingSaveable},
	{"nothing_saveable", trace.NothingSaveable},
	{"dots_saveable", trace.DotsSaveable},
	{"dots_with_no_batch_dims_saveable", trace.DotsWithNoBatchDimsSaveable},
	{"save_only_these_names(x)", trace.SaveOnlyTheseNames("x")},
	{"save_any_names_but_these(x)", trace.SaveAnyNamesButThese("x")},
	{"save_and_offload_only_these_names(offload x)", offloadPolicy},
	{"offload_dot_with_no_batch_dims", trace.OffloadDotWithNoBatchDims(ir.Device, ir.PinnedHost)},
	{"save_from_both_policies(dots, offload x)", trace.SaveFromBothPolicies(trace.DotsSaveable, offloadPolicy)},
}

// scanLoss scans layer over the stacked weights.
func scanLoss(layer func(*trace.Array, Weights) *trace.Array) func(Weights, *trace.Array) *trace.Array {
	return func(w Weights, x *trace.Array) *trace.Array {
		final, _ := trace.ScanTree(func(x *trace.Array, w Weights) (*trace.Array, struct{}) {
			return layer(x, w), struct{}{}
		}, x, w)
		return trace.Sum(final)
	}
}

// budgetCase is one compiled program of the table.
type budgetCase struct {
	name  string
	host  bool
	c     *rt.Compiled
	total int64
	peak  int64
	diff  float64
	secs  float64
	row   *BudgetRow // for the planner's cases
}

// measure runs c once with the weights w and returns the gradients copied
// out, the seconds and the call's device peak: the pool's peak less what
// was in use before the call, plus the device arguments the call reads.
func (bc *budgetCase) measure(w Weights, x *trace.Array) (hostGrads, float64, int64, error) {
	collect()
	before := rt.MemoryStats(ir.Device).BytesInUse
	rt.ResetPeakMemory()
	start := time.Now()
	outs, err := bc.c.Call(w, x)
	if err != nil {
		return hostGrads{}, 0, 0, err
	}
	g := outs[0].(Weights)
	_ = g.W1.Float32s()[0] // wait for the result
	secs := time.Since(start).Seconds()
	peak := rt.MemoryStats(ir.Device).PeakBytesInUse - before + bc.c.MemoryAnalysis().ArgumentBytes
	return hostCopy(g), secs, peak, nil
}

func maxDiff(a, b hostGrads) float64 {
	m := 0.0
	for _, p := range [][2][]float32{{a.W1, b.W1}, {a.W2, b.W2}} {
		for i := range p[0] {
			m = math.Max(m, math.Abs(float64(p[0][i])-float64(p[1][i])))
		}
	}
	return m
}

// runBudget prints the -budget table.
func runBudget(w, wHost Weights, x *trace.Array, asJSON bool) error {
	args := func(host bool) Weights {
		if host {
			return wHost
		}
		return w
	}
	compile := func(name string, loss func(Weights, *trace.Array) *trace.Array, host bool, opts ...rt.Option) (*budgetCase, error) {
		low, err := rt.NewJitted(gradOf(loss), append(opts, rt.WithName("budget"))...).Lower(args(host), x)
		if err != nil {
			return nil, err
		}
		c, err := low.Compile()
		if err != nil {
			return nil, err
		}
		return &budgetCase{name: name, host: host, c: c, total: c.MemoryAnalysis().TotalBytes()}, nil
	}
	// The hand-written cases.
	var manual []*budgetCase
	nManual := 2 * (1 + len(manualPolicies))
	add := func(name string, loss func(Weights, *trace.Array) *trace.Array, host bool) error {
		status.Phase("hand-written case %d/%d: compiling %s…", len(manual)+1, nManual, name)
		bc, err := compile(name, loss, host)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		manual = append(manual, bc)
		return nil
	}
	if err := add("plain scan", baselineLoss, false); err != nil {
		return err
	}
	if err := add("plain scan, params in pinned_host", scanLoss(func(x *trace.Array, w Weights) *trace.Array {
		return layer(x, Weights{W1: trace.DevicePut(w.W1, ir.Device), W2: trace.DevicePut(w.W2, ir.Device)})
	}), true); err != nil {
		return err
	}
	for _, p := range manualPolicies {
		named := trace.Remat(func(x *trace.Array, w Weights) *trace.Array {
			return layer(trace.CheckpointName(x, "x"), w)
		}, p.policy)
		hostNamed := trace.Remat(func(x *trace.Array, w Weights) *trace.Array {
			w = Weights{W1: trace.DevicePut(w.W1, ir.Device), W2: trace.DevicePut(w.W2, ir.Device)}
			return layer(trace.CheckpointName(x, "x"), w)
		}, p.policy)
		if err := add(p.name, scanLoss(named), false); err != nil {
			return err
		}
		if err := add(p.name+", params in pinned_host", scanLoss(hostNamed), true); err != nil {
			return err
		}
	}
	baseline, lo := manual[0].total, int64(math.MaxInt64)
	for _, m := range manual {
		lo = min(lo, m.total)
	}
	// The planner's cases: weights on device, else in pinned_host.
	var rows []*BudgetRow
	var planned []*budgetCase
	for i := range 8 {
		b := lo + (baseline-lo)*int64(i)/7
		row := &BudgetRow{BudgetBytes: b}
		rows = append(rows, row)
		status.Phase("budget %d/8 (%s): planning and compiling…", i+1, backend.FormatBytes(b))
		// The weights are passed on device: the planner places them.
		bc, err := compile("budget", baselineLoss, false, rt.MemoryBudget(b))
		if err != nil {
			var be *rt.MemoryBudgetError
			if !errors.As(err, &be) {
				return err
			}
			row.Error = err.Error()
			continue
		}
		p := bc.c.MemoryPlan()
		row.TotalBytes, row.EstimatedSeconds, row.HostParams = bc.total, p.StepSeconds, len(p.HostArguments()) > 0
		row.Plan = planSummary(p)
		bc.row = row
		planned = append(planned, bc)
	}
	// Correctness and peaks, one case at a time; then the timed runs,
	// alternating.
	all := append(append([]*budgetCase{}, manual...), planned...)
	var ref hostGrads
	for i, bc := range all {
		status.Update("checking and measuring case %d/%d (%s)", i+1, len(all), bc.name)
		g, secs, peak, err := bc.measure(args(bc.host), x)
		if err != nil {
			return fmt.Errorf("%s: %w", bc.name, err)
		}
		if i == 0 {
			ref = g
		}
		bc.peak, bc.secs, bc.diff = peak, secs, maxDiff(g, ref)
	}
	for rep := range *budgetReps {
		status.Phase("timed runs, round %d/%d of %d cases…", rep+1, *budgetReps, len(all))
		for _, bc := range all {
			_, secs, _, err := bc.measure(args(bc.host), x)
			if err != nil {
				return err
			}
			bc.secs = min(bc.secs, secs)
		}
	}
	for _, bc := range planned {
		r := bc.row
		r.PeakDeviceBytes, r.Seconds, r.MaxAbsGradDiff = bc.peak, bc.secs, bc.diff
	}
	for _, r := range rows {
		r.BestManualSeconds = math.Inf(1)
		for _, m := range manual {
			if m.total <= r.BudgetBytes && m.peak <= r.BudgetBytes && m.secs < r.BestManualSeconds {
				r.BestManualSeconds, r.BestManualCase, r.BestManualPeak = m.secs, m.name, m.peak
			}
		}
		if math.IsInf(r.BestManualSeconds, 1) {
			r.BestManualSeconds = 0
		}
	}

	status.Clear()
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	f := func(b int64) string { return fmt.Sprintf("%10s", backend.FormatBytes(b)) }
	fmt.Printf("hand-written cases (device memory; seconds: fastest of %d):\n", *budgetReps+1)
	for _, m := range manual {
		fmt.Printf("  %-62s total %s  peak %s  %7.4f s  max|Δgrad| %.3g\n", m.name, f(m.total), f(m.peak), m.secs, m.diff)
	}
	fmt.Printf("\nrt.MemoryBudget (device memory; seconds a call):\n%10s %10s %10s %9s %9s %6s %10s %9s  %s\n", "budget", "total", "peak", "seconds", "estimate", "host", "max|Δgrad|", "best man.", "best manual case; plan")
	for _, r := range rows {
		if r.Error != "" {
			fmt.Printf("%s  error: %s\n", f(r.BudgetBytes), r.Error)
			continue
		}
		fmt.Printf("%s %s %s %9.4f %9.4f %6v %10.3g %9.4f  %s; %s\n", f(r.BudgetBytes), f(r.TotalBytes), f(r.PeakDeviceBytes), r.Seconds, r.EstimatedSeconds, r.HostParams, r.MaxAbsGradDiff, r.BestManualSeconds, r.BestManualCase, r.Plan)
	}
	return nil
}

// planSummary counts a plan's actions: "offload 10 (10.00 MiB), recompute 10 (...)".
func planSummary(p *passes.MemoryPlan) string {
	n := map[string]int{}
	b := map[string]int64{}
	for _, v := range p.Values {
		n[v.Action]++
		b[v.Action] += v.Bytes
	}
	s := ""
	for _, a := range []string{passes.ActionHostArgument, "keep", "recompute", "offload", "stream"} {
		if n[a] == 0 {
			continue
		}
		if s != "" {
			s += ", "
		}
		label, what := a, "values"
		if a == passes.ActionHostArgument {
			label, what = "in pinned_host:", "arguments"
		}
		s += fmt.Sprintf("%s %d %s (%.2f MiB)", label, n[a], what, float64(b[a])/mib)
	}
	if s == "" {
		s = "nothing to plan"
	}
	return s
}
