package main

import (
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
