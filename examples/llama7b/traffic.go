package main

import (
	"fmt"
	"io"

	"github.com/ferryml/ferry/ir"
)

// Traffic is what one call of a compiled (per-device) program moves, in
// bytes, each op counted once per iteration of the scans around it: over
// the interconnect by collective, and over the host link by direction.
type Traffic struct {
	// AllGather is the bytes the all-gathers assemble (their results),
	// ReduceScatter and AllReduce the bytes they reduce (their operands),
	// Other the operands of the other collectives.
	AllGather, ReduceScatter, AllReduce, Other int64
	// ToDevice and ToHost are the device_put copies from pinned_host to
	// device and back.
	ToDevice, ToHost int64
	// Flops and DotFlops are the program's arithmetic (passes.Cost's, with
	// transcendental elements counted as elementwise operations).
	Flops, DotFlops float64
}

// trafficOf counts the traffic of one call of f.
func trafficOf(f *ir.Func) Traffic {
	var t Traffic
	t.region(f.Body, 1)
	return t
}

func (t *Traffic) region(r *ir.Region, times int64) {
	for _, op := range r.Ops {
		t.op(op, times)
	}
}

func (t *Traffic) op(op *ir.Op, times int64) {
	switch op.Code {
	case ir.Scan:
		t.region(op.Regions[0], times*int64(op.Attrs.Int("length")))
		return
	case ir.AllGather:
		t.AllGather += op.Result().Type.Bytes() * times
	case ir.ReduceScatter:
		t.ReduceScatter += op.Args[0].Type.Bytes() * times
	case ir.AllReduce:
		for _, a := range op.Args {
			t.AllReduce += a.Type.Bytes() * times
		}
	case ir.AllToAll, ir.CollectivePermute:
		for _, a := range op.Args {
			t.Other += a.Type.Bytes() * times
		}
	case ir.DevicePut:
		from, to := op.Args[0].Type.Space, op.Result().Type.Space
		switch {
		case from == to:
		case to == ir.Device:
			t.ToDevice += op.Result().Type.Bytes() * times
		default:
			t.ToHost += op.Result().Type.Bytes() * times
		}
	}
	// Other loops and fused groups: their bodies once.
	for _, r := range op.Regions {
		if op.Code != ir.Scan {
			t.region(r, times)
		}
	}
}

// Seconds prices t at rates: the arithmetic, the host link (one way at
// r.host bytes/s in each direction, the two directions at once) and the
// collectives as a ring over n devices at r.bus bytes/s of NCCL bus
// bandwidth (an all-gather or reduce-scatter of S bytes takes
// S·(n−1)/n / bus, an all-reduce twice that).
func (t Traffic) Seconds(r Rates, n int) (compute, link, collectives float64) {
	compute = t.DotFlops/r.Matmul + (t.Flops-t.DotFlops)/r.Elem
	link = float64(max(t.ToDevice, t.ToHost)) / r.Host
	ring := float64(n-1) / float64(n)
	collectives = (float64(t.AllGather+t.ReduceScatter+t.Other) + 2*float64(t.AllReduce)) * ring / r.Bus
	return compute, link, collectives
}

// LinkBounds sets a plan's host-link traffic beside what any plan must
// move when the state does not fit on the device, each priced at the
// link's one-way rate with both directions at once (PCIe is full duplex).
type LinkBounds struct {
	// InSeconds and OutSeconds are the plan's copies to and from the
	// device at the link's rate; Seconds the larger (both directions at
	// once) and TurnSeconds their sum (one direction at a time).
	InSeconds, OutSeconds, Seconds, TurnSeconds float64
	// FloorBytes is the state (parameters and optimizer state) that cannot
	// stay on the device: its size less the budget. It must cross in once
	// and out once per step whatever the plan (every byte of it changes),
	// so FloorSeconds = FloorBytes / rate bounds every plan.
	FloorBytes   int64
	FloorSeconds float64
	// FusedIn and FusedOut are the copies of a plan with the AdamW update
	// fused into the backward scan: each layer's parameters in for the
	// forward pass and again for the backward pass, its moments in once,
	// the new parameters and moments out once, no stack of gradients on
	// device; FusedSeconds their larger at the rate.
	FusedIn, FusedOut int64
	FusedSeconds      float64
	// ResidentBytes is the fused plan with the parameters kept on device
	// (they fit beside the working set when the budget exceeds them): only
	// the moments cross, in once and out once; ResidentSeconds at the rate.
	ResidentBytes   int64
	ResidentSeconds float64
	// GoalBytes is what may cross in the time the 1.3× goal leaves
	// (0.3 × the unconstrained step, the rest being the step's own).
	GoalBytes int64
	// Unconstrained is the unconstrained step's seconds the ratios use.
	Unconstrained float64
}

// linkBounds prices traffic t of a plan of a step with params and state
// bytes of parameters and optimizer state under budget at the H100 host
// link, beside the step's unconstrained seconds.
func linkBounds(params, state, budget int64, t Traffic, unconstrained float64) *LinkBounds {
	bw := h100.Host
	l := &LinkBounds{InSeconds: float64(t.ToDevice) / bw, OutSeconds: float64(t.ToHost) / bw, Unconstrained: unconstrained}
	l.Seconds, l.TurnSeconds = max(l.InSeconds, l.OutSeconds), l.InSeconds+l.OutSeconds
	l.FloorBytes = max(params+state-budget, 0)
	l.FloorSeconds = float64(l.FloorBytes) / bw
	l.FusedIn, l.FusedOut = 2*params+state, params+state
	l.FusedSeconds = float64(max(l.FusedIn, l.FusedOut)) / bw
	if params < budget {
		l.ResidentBytes = state
		l.ResidentSeconds = float64(state) / bw
	}
	l.GoalBytes = int64(0.3 * unconstrained * bw)
	return l
}

func (l *LinkBounds) print(w io.Writer) {
	if l == nil {
		return
	}
	u := l.Unconstrained
	fmt.Fprintf(w, "  host link at %.0f GB/s each way: the plan copies %s in (%.3f s) and %s out (%.3f s): %.3f s = %.1f× the unconstrained step with both directions at once, %.3f s in turn\n",
		h100.Host/1e9, gib(int64(l.InSeconds*h100.Host)), l.InSeconds, gib(int64(l.OutSeconds*h100.Host)), l.OutSeconds, l.Seconds, l.Seconds/u, l.TurnSeconds)
	fmt.Fprintf(w, "  lower bound for any plan: the state that cannot stay on device (%s) crosses in and out: %.3f s = %.1f× the unconstrained step\n",
		gib(l.FloorBytes), l.FloorSeconds, l.FloorSeconds/u)
	fmt.Fprintf(w, "  the update fused into the backward scan (parameters in twice, moments once, both out once): %s in, %s out: %.3f s = %.1f×\n",
		gib(l.FusedIn), gib(l.FusedOut), l.FusedSeconds, l.FusedSeconds/u)
	if l.ResidentBytes > 0 {
		fmt.Fprintf(w, "  the same with the parameters kept on device, only the moments crossing: %s each way: %.3f s = %.1f×\n",
			gib(l.ResidentBytes), l.ResidentSeconds, l.ResidentSeconds/u)
	}
	fmt.Fprintf(w, "  the 1.3× goal leaves %.3f s of link time: %s each way\n", 0.3*u, gib(l.GoalBytes))
}
