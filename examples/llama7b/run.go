package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"sort"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The -run mode: the same step, small, run on this machine under budgets
// from the unconstrained total down to the smallest the planner fits.

// smallSize is the member of the family -run trains: 8 layers of width 512
// (8 heads, 2 key/value heads), SwiGLU of 1408, a 512-token vocabulary, two
// sequences of 256 tokens, f32.
func smallSize() Size {
	return Size{Config: nn.LlamaConfig{Vocab: 512, Layers: 8, D: 512, Heads: 8, KVHeads: 2, Hidden: 1408}, Seq: 256, Batch: 2, Param: ir.Float32}
}

// RunRow is one budget of -run.
type RunRow struct {
	Budget int64 `json:"budget_bytes"` // 0: unconstrained
	// Total is the plan's analysed device total; Peak the device pool's
	// measured peak over the steps (arguments on device included).
	Total, Peak int64
	Losses      []float64 `json:"losses"`
	// MaxLossDiff is the largest |loss − the unconstrained run's loss|.
	MaxLossDiff float64 `json:"max_loss_diff"`
	// Seconds is the fastest step after the first; Estimated the plan's
	// StepSeconds at rates measured on this machine; Error their relative
	// difference, (Estimated − Seconds) / Seconds.
	Seconds, Estimated, Error float64
	HostArguments             int64  `json:"host_argument_bytes"`
	Actions                   string `json:"actions"`
}

// runBudgets trains sz for steps steps under the unconstrained budget and
// under budgets down to the smallest that fits, each from the same
// initial parameters and batch.
func runBudgets(sz Size, steps int) ([]RunRow, error) {
	defer rt.SetWarnings(rt.SetWarnings(nil)) // see plan
	budgets, err := budgetLadder(sz)
	if err != nil {
		return nil, err
	}
	var rows []RunRow
	for _, b := range append([]int64{0}, budgets...) {
		row, err := runBudget(sz, b, steps)
		if err != nil {
			return nil, fmt.Errorf("budget %d: %w", b, err)
		}
		if len(rows) > 0 {
			for i, l := range row.Losses {
				row.MaxLossDiff = math.Max(row.MaxLossDiff, math.Abs(l-rows[0].Losses[i]))
			}
		}
		rows = append(rows, row)
	}
	return rows[1:], nil
}

// budgetLadder returns the budgets -run and -compare plan sz under: the
// unconstrained total, the smallest budget the planner fits, and two
// between them, a third of the way apart.
func budgetLadder(sz Size) ([]int64, error) {
	p, s, ids, targets, err := abstractArgs(sz)
	if err != nil {
		return nil, err
	}
	args := []any{p, s, ids, targets}
	base, err := compileStep(args, rt.MemoryBudget(1<<62))
	if err != nil {
		return nil, err
	}
	total := base.MemoryAnalysis().TotalBytes()
	_, err = compileStep(args, rt.MemoryBudget(1))
	var be *rt.MemoryBudgetError
	if !errors.As(err, &be) {
		return nil, fmt.Errorf("a budget of one byte: %v, want a *rt.MemoryBudgetError", err)
	}
	return []int64{total, be.Minimum + (total-be.Minimum)*2/3, be.Minimum + (total-be.Minimum)/3, be.Minimum}, nil
}

// concreteState returns the initial parameters (seed 0), AdamW state with
// f32 moments, and a batch of random tokens (seed 1) for sz.
func concreteState(sz Size) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array, *trace.Array, error) {
	p := nn.NewLlama(random.NewKey(0), sz.Param, sz.Config)
	s, err := adamW().Init(mustTree(trace.MapAs(p, func(a *trace.Array) *trace.Array { return trace.Convert(a, ir.Float32) })))
	if err != nil {
		return p, s, nil, nil, err
	}
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]int32, sz.Batch*sz.Seq)
	targets := make([]int32, len(ids))
	for b := range sz.Batch {
		prev := int32(r.IntN(sz.Config.Vocab))
		for t := range sz.Seq {
			next := int32(r.IntN(sz.Config.Vocab))
			ids[b*sz.Seq+t], targets[b*sz.Seq+t] = prev, next
			prev = next
		}
	}
	return p, s, rt.FromSlice(ids, sz.Batch, sz.Seq), rt.FromSlice(targets, sz.Batch, sz.Seq), nil
}

// runBudget compiles the step under budget (0: with everything kept, the
// estimate's budget above any total) and runs it steps times.
func runBudget(sz Size, budget int64, steps int) (RunRow, error) {
	row := RunRow{Budget: budget}
	p, s, ids, targets, err := concreteState(sz)
	if err != nil {
		return row, err
	}
	b := budget
	if b == 0 {
		b = 1 << 62
	}
	c, err := compileStep([]any{p, s, ids, targets}, rt.MemoryBudget(b))
	if err != nil {
		return row, err
	}
	pl := c.MemoryPlan()
	row.Total, row.Estimated = pl.TotalBytes, pl.StepSeconds
	acts := map[string]int64{}
	for _, v := range pl.Values {
		acts[v.Action] += v.Bytes
		if v.Scope < 0 {
			row.HostArguments += v.Bytes
		}
	}
	row.Actions = actionSummary(acts)
	best := math.Inf(1)
	for i := range steps {
		collect()
		rt.ResetPeakMemory()
		start := time.Now()
		outs, err := c.Call(p, s, ids, targets)
		if err != nil {
			return row, err
		}
		loss := outs[2].(*trace.Array).Item()
		d := time.Since(start).Seconds()
		if i > 0 || steps == 1 {
			best = math.Min(best, d)
		}
		if i > 0 || steps == 1 {
			// The first call of a plan that places arguments in
			// pinned_host finds them on device and copies them there;
			// its results are already there for the next call.
			row.Peak = max(row.Peak, rt.MemoryStats(ir.Device).PeakBytesInUse)
		}
		row.Losses = append(row.Losses, loss)
		p, s = outs[0].(nn.Llama), outs[1].(optim.AdamState[nn.Llama])
	}
	row.Seconds = best
	row.Error = (row.Estimated - row.Seconds) / row.Seconds
	for _, a := range append(append(trace.Leaves(p), trace.Leaves(s)...), ids, targets) {
		_ = a.Delete()
	}
	return row, nil
}

func actionSummary(acts map[string]int64) string {
	keys := make([]string, 0, len(acts))
	for k := range acts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := ""
	for _, k := range keys {
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%s %s", k, mibs(acts[k]))
	}
	return out
}

// collect lets garbage buffers go back to the pools before a measurement.
func collect() {
	for range 3 {
		goruntime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

func mibs(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func printRuns(w io.Writer, rows []RunRow) {
	fmt.Fprintln(w, "| budget | analysed total | measured peak | losses | max |Δloss| | step | estimate | error | plan |")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
	for _, r := range rows {
		ls := ""
		for i, l := range r.Losses {
			if i > 0 {
				ls += ", "
			}
			ls += fmt.Sprintf("%.6f", l)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.2g | %.3f s | %.3f s | %+.0f %% | %s |\n", mibs(r.Budget), mibs(r.Total), mibs(r.Peak), ls, r.MaxLossDiff,
			r.Seconds, r.Estimated, 100*r.Error, r.Actions)
	}
}
