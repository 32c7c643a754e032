package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The optimizer-state program of REFERENCES.md §1: four f32[D,D] weights,
// x = gelu(x @ w_i) (tanh form), loss mean((out − input)²) + 0.001·Σ‖w‖²,
// chain(clip_by_global_norm(1.0), adam(0.1)), params and state donated.

// OptParams are the four weights.
type OptParams struct{ W [4]*trace.Array }

const gib = 1 << 30

func init() {
	xla["optimizer"] = [2]int64{gibs(2.11), gibs(4.59)}
	xla["optimizer_offload"] = [2]int64{gibs(1.91), gibs(2.87)}
}

// gibs converts GiB to bytes.
func gibs(x float64) int64 { return int64(x * gib) }

func optLoss(p OptParams, input *trace.Array) *trace.Array {
	x := input
	reg := trace.Scalar(0)
	for _, w := range p.W {
		x = trace.Gelu(trace.MatMul(x, w), true)
		reg = trace.Add(reg, trace.Sum(trace.Square(w)))
	}
	d := trace.Sub(x, input)
	return trace.Add(trace.Mean(trace.Square(d)), trace.Mul(trace.Scalar(0.001), reg))
}

var optimizer = optim.Chain(optim.ClipByGlobalNorm[OptParams](1.0), optim.Adam[OptParams](optim.Constant(0.1), 0.9, 0.999, 1e-8))

// OptState is the optimizer's state: clipping's (empty) and Adam's.
type OptState = optim.ChainState[optim.EmptyState, optim.AdamState[OptParams]]

// optStep is one jitted training step; the state may live in pinned_host
// (optim's Update moves each leaf to device inside the step).
func optStep(p OptParams, s OptState, input *trace.Array) (OptParams, OptState, error) {
	g := trace.Grad(func(p OptParams) *trace.Array { return optLoss(p, input) })(p)
	upd, s2, err := optimizer.Update(g, s, p)
	if err != nil {
		return OptParams{}, OptState{}, err
	}
	p2, err := optim.ApplyUpdates(p, upd)
	return p2, s2, err
}

func newOptStep(offload bool) *rt.Jitted[func(OptParams, OptState, *trace.Array) (OptParams, OptState, error)] {
	opts := []rt.Option{rt.Donate(0, 1)}
	if offload {
		opts = append(opts, rt.OutSpace(1, ir.PinnedHost))
	}
	return rt.NewJitted(optStep, opts...)
}

// optArgs returns params, state and input at width d: concrete random values,
// or abstract arrays (types only) for analysis at full size. With offload the
// state is made directly in pinned_host (optim.InitIn): it never takes device
// memory.
func optArgs(r *rand.Rand, d int, abstract, offload bool) (OptParams, OptState, *trace.Array, error) {
	mk := func(scale float64) *trace.Array {
		if abstract {
			return trace.Abstract(ir.TypeOf(ir.Float32, d, d))
		}
		return randn(r, scale, d, d)
	}
	var p OptParams
	for i := range p.W {
		p.W[i] = mk(1 / math.Sqrt(float64(d)))
	}
	input := mk(1)
	space := ir.Device
	if offload {
		space = ir.PinnedHost
	}
	s, err := optim.InitIn(optimizer, p, space)
	return p, s, input, err
}

// optimizerRows analyses both cases at full width, then runs three steps of each
// at execWidth and compares the results with the device-only run.
func optimizerRows(fullWidth, execWidth int, seed uint64) ([]Row, error) {
	var rows []Row
	var ref []float32
	for _, offload := range []bool{false, true} {
		name := "optimizer"
		if offload {
			name = "optimizer_offload"
		}
		status.Phase("%s: tracing and compiling the step at DIM = %d (analysis only)…", name, fullWidth)
		step := newOptStep(offload)
		p, s, in, err := optArgs(nil, fullWidth, true, offload)
		if err != nil {
			return nil, err
		}
		low, err := step.Lower(p, s, in)
		if err != nil {
			return nil, err
		}
		c, err := low.Compile()
		if err != nil {
			return nil, err
		}
		m := c.MemoryAnalysis()
		row := Row{
			Case: name, TempBytes: m.TempBytes, ArgumentBytes: m.ArgumentBytes, OutputBytes: m.OutputBytes,
			AliasBytes: m.AliasBytes, TotalBytes: m.TotalBytes(), HostTempBytes: m.HostTempBytes,
			HostArgumentBytes: m.HostArgumentBytes, HostOutputBytes: m.HostOutputBytes,
			XLATempBytes: xla[name][0], XLATotalBytes: xla[name][1], Dim: fullWidth, ExecDim: execWidth,
		}

		// Execute at a small width with the same seed for both cases.
		status.Phase("%s: compiling and running 3 steps at DIM = %d…", name, execWidth)
		r := rand.New(rand.NewPCG(seed, 3))
		p, s, in, err = optArgs(r, execWidth, false, offload)
		if err != nil {
			return nil, err
		}
		// The first step traces and compiles at this width, making scalar
		// constants eagerly that are garbage afterwards but may still be in
		// the pool: measure the peak over the other two steps.
		for k := range 3 {
			if k == 1 {
				collect()
				rt.ResetPeakMemory()
			}
			if p, s, err = step.Fn()(p, s, in); err != nil {
				return nil, err
			}
		}
		row.PeakDeviceBytes = rt.MemoryStats(ir.Device).PeakBytesInUse
		leaves := trace.Leaves(s)
		if offload && leaves[len(leaves)-1].Space() != ir.PinnedHost {
			return nil, fmt.Errorf("%s: the new optimizer state is in %v, want pinned_host", name, leaves[len(leaves)-1].Space())
		}
		var got []float32
		for _, a := range append(trace.Leaves(p), leaves...) {
			got = append(got, a.Float32s()...)
		}
		if ref == nil {
			ref = got
		} else {
			for i := range got {
				row.MaxAbsGradDiff = math.Max(row.MaxAbsGradDiff, math.Abs(float64(got[i])-float64(ref[i])))
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}
