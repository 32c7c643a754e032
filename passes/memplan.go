package passes

import (
	"fmt"
	"strings"
)

// MemoryPlan is what a memory budget (rt.MemoryBudget) decided for a
// function: for every value the backward pass needs from the forward pass
// (the residuals of scan bodies, stacked over their iterations, and of a
// function differentiated at the top level), whether it is
// kept on device, recomputed in the backward pass, or offloaded to
// pinned_host and prefetched back, with the bytes and estimated seconds of
// each choice. A MemoryAnalysis carries it (Plan) when the function was
// compiled under a budget.
type MemoryPlan struct {
	// Budget is the device byte budget planned for.
	Budget int64
	// BaselineBytes is the device total (MemoryAnalysis.TotalBytes) with
	// every value kept, and TotalBytes the total of this plan.
	BaselineBytes, TotalBytes int64
	// Values are the residuals, in trace order.
	Values []PlannedValue
	// ComputeSeconds estimates one call's arithmetic without the plan's
	// additions; StepSeconds adds the recomputation and the transfers the
	// plan does not hide behind a scan's compute.
	ComputeSeconds, StepSeconds float64
	// FlopRate (matrix-product FLOP/s), ElementRate (elementwise FLOP/s) and
	// Bandwidth (device↔pinned_host bytes/s) are the measured rates the
	// estimates use.
	FlopRate, ElementRate, Bandwidth float64
	// Compiles is how many plans were traced and compiled to find this one.
	Compiles int
}

// PlannedValue is one residual of a MemoryPlan.
type PlannedValue struct {
	// Scope numbers the planned scopes (scan bodies, functions
	// differentiated at the top level) in trace order and Index the
	// candidate ops of one scope (the planner's stable identity of a value).
	Scope, Index int
	// Op is the op that makes the value, Type its result type and Loc the
	// user's file:line that traced it.
	Op, Type, Loc string
	// Name is the value's checkpoint name (trace.CheckpointName), if the
	// op that makes it is one.
	Name string
	// Carry is true when the value is the carry of the scan at the start of
	// an iteration (a layer's input).
	Carry bool
	// Action is "keep", "recompute" or "offload"; or "stream" for the
	// device copy of a slice of a pinned_host array a scan streams in (made
	// again, prefetched, in the backward pass; its bytes are not kept); or
	// ActionHostArgument.
	Action string
	// Iterations is how many copies of the value one call makes (the scan's
	// length), and Bytes their device bytes in all.
	Iterations int
	Bytes      int64
	// Seconds estimates what the action adds to a call (0 for keep).
	Seconds float64
	// Flops is, for a recomputed value, the arithmetic the recomputation
	// adds to a call as the planner counts it (matrix-product and
	// elementwise FLOPs, at least one per element written), which Seconds
	// prices at the measured rates; 0 for the other actions (a streamed
	// value's cost is its copy).
	Flops float64
}

// ActionHostArgument is the Action of an argument leaf the plan places in
// pinned_host (Scope -1, Index the leaf's number among the arguments' array
// leaves, Loc naming it): the program reads it only as the xs of scans
// (stacked layer weights), which stream it in one slice at a time, so it
// needs no device memory of its own. A call that passes it on device copies
// it to pinned_host first. Seconds estimates the per-call copies of its
// slices in the forward pass (those of the backward pass are its stream
// values').
const ActionHostArgument = "host argument"

// ActionHostState is the Action of an argument leaf of optimizer state the
// plan places in pinned_host (Scope -1, Index the leaf): a donated argument
// the program reads only elementwise and returns updated at the same place
// among its results (Adam's moments). The program copies it to device where
// it is used and writes the new value to pinned_host, where the next call
// finds it. Seconds estimates both copies.
const ActionHostState = "host state"

// HostArguments returns the argument leaves the plan places in pinned_host
// (ActionHostArgument and ActionHostState), in order; nil for none.
func (p *MemoryPlan) HostArguments() []int {
	if p == nil {
		return nil
	}
	var out []int
	for _, v := range p.Values {
		if v.Action == ActionHostArgument || v.Action == ActionHostState {
			out = append(out, v.Index)
		}
	}
	return out
}

// String formats the plan: one line of totals, then one line per value.
func (p *MemoryPlan) String() string {
	if p == nil {
		return "no memory plan"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "memory plan for a budget of %s: device total %s (%s with everything kept), estimated step %.3gs (compute %.3gs); rates: matmul %.3g FLOP/s, elementwise %.3g FLOP/s, device↔host %.3g B/s; %d compiles",
		byteUnits(p.Budget), byteUnits(p.TotalBytes), byteUnits(p.BaselineBytes), p.StepSeconds, p.ComputeSeconds, p.FlopRate, p.ElementRate, p.Bandwidth, p.Compiles)
	for _, v := range p.Values {
		what := v.Op
		if v.Carry {
			what = "scan carry"
		}
		switch v.Action {
		case ActionHostArgument:
			fmt.Fprintf(&b, "\n  %s %d (%s): %s = %s in pinned_host, streamed into its scans, +%.3gs", v.Action, v.Index, v.Loc, v.Type, byteUnits(v.Bytes), v.Seconds)
			continue
		case ActionHostState:
			fmt.Fprintf(&b, "\n  %s %d (%s): %s = %s in pinned_host, copied in where used and its new value out, +%.3gs", v.Action, v.Index, v.Loc, v.Type, byteUnits(v.Bytes), v.Seconds)
			continue
		}
		fmt.Fprintf(&b, "\n  %-9s scope %d value %d: %s %s ×%d = %s, +%.3gs (%s)", v.Action, v.Scope, v.Index, what, v.Type, v.Iterations, byteUnits(v.Bytes), v.Seconds, v.Loc)
	}
	return b.String()
}
