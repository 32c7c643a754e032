package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The -compare mode: at each budget of -run, the planner's plan timed
// against the hand-written choices a JAX user would make that fit the same
// budget (a checkpoint policy on the layer scan, the stacked moments and
// parameters offloaded by hand), all run alternately in one process.

// hand is a hand-written memory choice for the step: a checkpoint policy
// on every layer of the scan (none: keep everything), and the stacked
// blocks' AdamW moments, and parameters, kept in pinned_host and copied in
// one layer at a time where the step reads them.
type hand struct {
	Policy                  string
	HostMoments, HostParams bool
}

// hands are the hand-written contenders: each policy with nothing
// offloaded, with the moments offloaded, and with the moments and
// parameters offloaded.
func hands() []hand {
	var out []hand
	for _, p := range []string{"none", "nothing_saveable", "dots_saveable", "offload_x"} {
		out = append(out, hand{p, false, false}, hand{p, true, false}, hand{p, true, true})
	}
	return out
}

func (h hand) String() string {
	s := h.Policy
	if h.HostMoments {
		s += " + moments"
	}
	if h.HostParams {
		s += " + params"
	}
	if h.HostMoments {
		s += " in pinned_host"
	}
	return s
}

// policy is the checkpoint policy h.Policy names (nil: none).
func (h hand) policy() trace.CheckpointPolicy {
	switch h.Policy {
	case "nothing_saveable":
		return trace.NothingSaveable
	case "dots_saveable":
		return trace.DotsSaveable
	case "offload_x":
		return trace.SaveAndOffloadOnlyTheseNames(nil, []string{nn.BlockInput}, ir.Device, ir.PinnedHost)
	}
	return nil
}

// step is trainStepLayered written by hand for h: the policy on the layer
// scan (nn.WithRemat), the host parameters copied in per layer
// (nn.WithParamOffload), every slice the update scan reads copied to
// device, and the new stacks written back to pinned_host where they came
// from.
func (h hand) step(p nn.Llama, s optim.AdamState[nn.Llama], ids, targets *trace.Array) (nn.Llama, optim.AdamState[nn.Llama], *trace.Array) {
	var opts []nn.StackOption
	if pol := h.policy(); pol != nil {
		opts = append(opts, nn.WithRemat(pol))
	}
	if h.HostParams {
		opts = append(opts, nn.WithParamOffload())
	}
	loss, g := trace.ValueAndGrad(func(p nn.Llama) *trace.Array {
		return nn.SoftmaxCrossEntropy(p.Logits(ids, nn.Context{}, opts...), targets)
	})(p)
	dev := func(b nn.TransformerBlock) nn.TransformerBlock { return mustTree(trace.MapAs(b, onDevice)) }
	p, s, loss = layeredUpdateIn(p, s, g, loss, func(x layerSlices) layerSlices {
		return layerSlices{dev(x.P), dev(x.G), dev(x.M), dev(x.V)}
	})
	host := func(b nn.TransformerBlock) nn.TransformerBlock {
		return mustTree(trace.MapAs(b, func(a *trace.Array) *trace.Array { return trace.DevicePut(a, ir.PinnedHost) }))
	}
	if h.HostParams {
		p.Blocks.Blocks = host(p.Blocks.Blocks)
	}
	if h.HostMoments {
		s.Mu.Blocks.Blocks, s.Nu.Blocks.Blocks = host(s.Mu.Blocks.Blocks), host(s.Nu.Blocks.Blocks)
	}
	return p, s, loss
}

// args returns the abstract arguments p and s (as abstractArgs makes
// them) with the stacks h offloads in pinned_host.
func (h hand) args(p nn.Llama, s optim.AdamState[nn.Llama]) (nn.Llama, optim.AdamState[nn.Llama]) {
	host := func(b nn.TransformerBlock) nn.TransformerBlock {
		return mustTree(trace.MapAs(b, func(a *trace.Array) *trace.Array {
			t := a.Type()
			t.Space = ir.PinnedHost
			return trace.Abstract(t)
		}))
	}
	if h.HostParams {
		p.Blocks.Blocks = host(p.Blocks.Blocks)
	}
	if h.HostMoments {
		s.Mu.Blocks.Blocks, s.Nu.Blocks.Blocks = host(s.Mu.Blocks.Blocks), host(s.Nu.Blocks.Blocks)
	}
	return p, s
}

// contender is one compiled step of the comparison and its timings.
type contender struct {
	name  string
	c     *rt.Compiled
	total int64 // the device total of its memory analysis
	// times and cpu are the wall and CPU seconds (user and system, every
	// thread of the process) of its timed calls.
	times, cpu []float64
}

// median is the median of xs.
func median(xs []float64) float64 {
	t := slices.Clone(xs)
	slices.Sort(t)
	return t[len(t)/2]
}

// CompareRow is one budget of -compare: the planner's plan and the fastest
// hand-written choice that fits the same budget, their median step times
// and the ratio planner / hand-written (below 1: the planner is faster), in
// wall seconds and in CPU seconds (what the step costs the machine's cores,
// less sensitive than wall time to other processes sharing them).
type CompareRow struct {
	Budget      int64   `json:"budget_bytes"`
	PlanTotal   int64   `json:"plan_total_bytes"`
	PlanActions string  `json:"plan_actions"`
	PlanSeconds float64 `json:"plan_seconds"`
	PlanCPU     float64 `json:"plan_cpu_seconds"`
	Hand        string  `json:"hand"`
	HandTotal   int64   `json:"hand_total_bytes"`
	HandSeconds float64 `json:"hand_seconds"`
	HandCPU     float64 `json:"hand_cpu_seconds"`
	Ratio       float64 `json:"ratio"`
	// CPUHand is the hand-written choice that fits with the least median
	// CPU time, CPUHandCPU that time, and CPURatio PlanCPU / CPUHandCPU.
	CPUHand        string  `json:"cpu_hand"`
	CPUHandCPU     float64 `json:"cpu_hand_cpu_seconds"`
	CPURatio       float64 `json:"cpu_ratio"`
	HandCandidates int     `json:"hand_candidates"` // hand-written choices that fit
}

// CompareReport is the output of -compare: a row per budget, and every
// hand-written choice with its device total and median step.
type CompareReport struct {
	Rounds int          `json:"rounds"`
	Rows   []CompareRow `json:"rows"`
	Hands  []HandTime   `json:"hands"`
}

// HandTime is one hand-written choice's device total and median step.
type HandTime struct {
	Name    string  `json:"name"`
	Total   int64   `json:"total_bytes"`
	Seconds float64 `json:"seconds"`
	CPU     float64 `json:"cpu_seconds"`
}

// compareBudgets times, at each of budgets (those of -run by default,
// budgetLadder's), the planner's plan against the hand-written choices hs,
// rounds times each, alternating.
func compareBudgets(sz Size, budgets []int64, hs []hand, rounds int) (*CompareReport, error) {
	defer rt.SetWarnings(rt.SetWarnings(nil)) // see plan
	if budgets == nil {
		var err error
		if budgets, err = budgetLadder(sz); err != nil {
			return nil, err
		}
	}
	p, s, ids, targets, err := abstractArgs(sz)
	if err != nil {
		return nil, err
	}
	args := []any{p, s, ids, targets}
	var planned, handed []*contender
	var actions []string
	for _, b := range budgets {
		c, err := compileStep(args, rt.MemoryBudget(b))
		if err != nil {
			return nil, fmt.Errorf("budget %d: %w", b, err)
		}
		planned = append(planned, &contender{name: "plan " + mibs(b), c: c, total: c.MemoryAnalysis().TotalBytes()})
		acts := map[string]int64{}
		for _, v := range c.MemoryPlan().Values {
			acts[v.Action] += v.Bytes
		}
		actions = append(actions, actionSummary(acts))
	}
	for _, h := range hs {
		hp, hs := h.args(p, s)
		low, err := rt.NewJitted(h.step, rt.WithName("llama_train_step_"+h.Policy), rt.Donate(0, 1)).Lower(hp, hs, ids, targets)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", h, err)
		}
		c, err := low.Compile()
		if err != nil {
			return nil, fmt.Errorf("%v: %w", h, err)
		}
		handed = append(handed, &contender{name: h.String(), c: c, total: c.MemoryAnalysis().TotalBytes()})
	}
	all := append(append([]*contender{}, planned...), handed...)
	if err := timeAlternating(sz, all, rounds); err != nil {
		return nil, err
	}
	rep := &CompareReport{Rounds: rounds}
	for _, h := range handed {
		rep.Hands = append(rep.Hands, HandTime{h.name, h.total, median(h.times), median(h.cpu)})
	}
	for i, b := range budgets {
		pc := planned[i]
		row := CompareRow{Budget: b, PlanTotal: pc.total, PlanActions: actions[i], PlanSeconds: median(pc.times), PlanCPU: median(pc.cpu),
			HandSeconds: math.Inf(1), CPUHandCPU: math.Inf(1)}
		for _, h := range handed {
			if h.total > b {
				continue
			}
			row.HandCandidates++
			if m := median(h.times); m < row.HandSeconds {
				row.Hand, row.HandTotal, row.HandSeconds, row.HandCPU = h.name, h.total, m, median(h.cpu)
			}
			if m := median(h.cpu); m < row.CPUHandCPU {
				row.CPUHand, row.CPUHandCPU = h.name, m
			}
		}
		if row.HandCandidates > 0 {
			row.Ratio, row.CPURatio = row.PlanSeconds/row.HandSeconds, row.PlanCPU/row.CPUHandCPU
		} else {
			row.HandSeconds, row.CPUHandCPU = 0, 0
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

// timeAlternating calls each contender once to warm it, then rounds times
// in turn (each round starting one contender further on), and records the
// seconds of each timed call. One training state goes from call to call:
// each contender's new parameters and moments are the next one's, placed
// before the call where its compiled step expects every argument leaf
// (device or pinned_host), so one state is alive at a time.
func timeAlternating(sz Size, all []*contender, rounds int) error {
	p, s, ids, targets, err := concreteState(sz)
	if err != nil {
		return err
	}
	for r := -1; r < rounds; r++ {
		for k := range all {
			c := all[(k+max(r, 0))%len(all)]
			var d, cpu float64
			p, s, d, cpu, err = timeCall(c.c, p, s, ids, targets)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if r >= 0 {
				c.times, c.cpu = append(c.times, d), append(c.cpu, cpu)
			}
		}
	}
	for _, a := range append(append(trace.Leaves(p), trace.Leaves(s)...), ids, targets) {
		_ = a.Delete()
	}
	return nil
}

// timeCall runs c once on p and s (donated) and returns the new p and s
// and the call's wall and CPU seconds.
func timeCall(c *rt.Compiled, p nn.Llama, s optim.AdamState[nn.Llama], ids, targets *trace.Array) (_ nn.Llama, _ optim.AdamState[nn.Llama], wall, cpu float64, err error) {
	params := c.Lowered().Func.Body.Params
	i := 0
	place := func(a *trace.Array) *trace.Array {
		sp := params[i].Type.Space
		i++
		if a.Space() == sp {
			return a
		}
		b := trace.DevicePut(a, sp)
		_ = a.Delete()
		return b
	}
	p, s = mustTree(trace.MapAs(p, place)), mustTree(trace.MapAs(s, place))
	collect()
	start, cpu0 := time.Now(), cpuSeconds()
	outs, err := c.Call(p, s, ids, targets)
	if err != nil {
		return p, s, 0, 0, err
	}
	loss := outs[2].(*trace.Array).Item()
	wall, cpu = time.Since(start).Seconds(), cpuSeconds()-cpu0
	if math.IsNaN(loss) {
		return p, s, 0, 0, fmt.Errorf("loss is NaN")
	}
	return outs[0].(nn.Llama), outs[1].(optim.AdamState[nn.Llama]), wall, cpu, nil
}

func (r *CompareReport) print(w io.Writer) {
	fmt.Fprintf(w, "median of %d alternating steps per contender; ratio = the planner's step / the fastest hand-written choice that fits, in wall seconds and in CPU seconds (each with its own fastest)\n\n", r.Rounds)
	fmt.Fprintln(w, "| budget | planner: total | plan | wall | CPU | fastest hand-written that fits (wall) | total | wall | ratio | fastest (CPU) | CPU | ratio | fit |")
	fmt.Fprintln(w, "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
	for _, row := range r.Rows {
		if row.HandCandidates == 0 {
			fmt.Fprintf(w, "| %s | %s | %s | %.3f s | %.3f s | none fits | | | | | | | 0 |\n", mibs(row.Budget), mibs(row.PlanTotal), row.PlanActions, row.PlanSeconds, row.PlanCPU)
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.3f s | %.3f s | %s | %s | %.3f s | %.2f× | %s | %.3f s | %.2f× | %d |\n", mibs(row.Budget), mibs(row.PlanTotal), row.PlanActions,
			row.PlanSeconds, row.PlanCPU, row.Hand, mibs(row.HandTotal), row.HandSeconds, row.Ratio, row.CPUHand, row.CPUHandCPU, row.CPURatio, row.HandCandidates)
	}
	fmt.Fprintln(w, "\n| hand-written choice | device total | step | CPU |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: |")
	hs := slices.Clone(r.Hands)
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].Total > hs[j].Total })
	for _, h := range hs {
		fmt.Fprintf(w, "| %s | %s | %.3f s | %.3f s |\n", h.Name, mibs(h.Total), h.Seconds, h.CPU)
	}
}
