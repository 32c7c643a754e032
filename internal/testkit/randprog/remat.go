package randprog

import (
	"fmt"
	"math/rand/v2"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// policy is a named checkpoint policy; offloads says whether it moves values
// to pinned_host.
type policy struct {
	name     string
	p        trace.CheckpointPolicy
	offloads bool
}

func policies() []policy {
	d, h := ir.Device, ir.PinnedHost
	return []policy{
		{"everything_saveable", trace.EverythingSaveable, false},
		{"nothing_saveable", trace.NothingSaveable, false},
		{"dots_saveable", trace.DotsSaveable, false},
		{"dots_with_no_batch_dims_saveable", trace.DotsWithNoBatchDimsSaveable, false},
		{"save_only_these_names(h,a)", trace.SaveOnlyTheseNames("h", "a"), false},
		{"save_any_names_but_these(x)", trace.SaveAnyNamesButThese("x"), false},
		{"save_and_offload_only_these_names([a],[x,h])", trace.SaveAndOffloadOnlyTheseNames([]string{"a"}, []string{"x", "h"}, d, h), true},
		{"offload_dot_with_no_batch_dims", trace.OffloadDotWithNoBatchDims(d, h), true},
		{"save_from_both_policies(save_only_these_names(a), offload_dot_with_no_batch_dims)",
			trace.SaveFromBothPolicies(trace.SaveOnlyTheseNames("a"), trace.OffloadDotWithNoBatchDims(d, h)), true},
	}
}

// rematGen is the shape of one random training step of Remat.
type rematGen struct {
	seed                      uint64
	B, D, H, L                int
	scanned                   bool
	pol                       policy
	act                       string
	residual, batched, hostW1 bool
	// ck is layer under the checkpoint policy.
	ck func(args ...*trace.Array) []*trace.Array
}

// Remat returns a random traced training step and a description of it: L
// layers y = act(x·W1 + b)·W2 (+ x), each under trace.Checkpoint with a
// random policy, unrolled or scanned over stacked weights, a loss, and
// ValueAndGrad of it with respect to the weights and the input; the program
// returns the loss, the input's gradient and updated weights (W - 0.1·dW,
// which a donated W can hold). Parameters: x [B,D], W1 [L,D,H], b [L,H],
// W2 [L,H,D], all f32 (with HostParams, W1 sometimes in pinned_host).
func Remat(seed uint64, feat Features) (f *ir.Func, desc string, err error) {
	g := newRematGen(seed, feat)
	desc = g.String()
	g.ck = trace.Checkpoint(g.layer, g.pol.p)
	defer trace.Recover(&err)
	f, err = g.trace()
	if err != nil {
		return nil, desc, fmt.Errorf("%s: %w", desc, err)
	}
	return f, desc, nil
}

// newRematGen draws the step's sizes and choices for seed.
func newRematGen(seed uint64, feat Features) *rematGen {
	rng := rand.New(rand.NewPCG(seed, seed^0x51ed2701))
	g := &rematGen{seed: seed}
	g.B, g.D, g.H, g.L = 1+rng.IntN(4), 1+rng.IntN(5), 1+rng.IntN(6), 1+rng.IntN(3)
	g.scanned = feat.Control && rng.IntN(2) == 0
	ps := policies()
	for {
		g.pol = ps[rng.IntN(len(ps))]
		if !g.pol.offloads || !g.scanned || feat.ScanCopies {
			break
		}
	}
	g.act = []string{"tanh", "sin", "relu", "logistic", "gelu"}[rng.IntN(5)]
	g.residual = rng.IntN(2) == 0
	g.batched = rng.IntN(3) == 0
	g.hostW1 = feat.HostParams && rng.IntN(4) == 0 && (!g.scanned || feat.ScanCopies)
	return g
}

// String describes the step.
func (g *rematGen) String() string {
	return fmt.Sprintf("remat seed %d: B=%d D=%d H=%d L=%d scanned=%v policy=%s act=%s residual=%v batched=%v hostW1=%v",
		g.seed, g.B, g.D, g.H, g.L, g.scanned, g.pol.name, g.act, g.residual, g.batched, g.hostW1)
}

// activation applies the step's activation function.
func (g *rematGen) activation(h *trace.Array) *trace.Array {
	switch g.act {
	case "tanh":
		return trace.Tanh(h)
	case "sin":
		return trace.Sin(h)
	case "relu":
		return trace.Relu(h)
	case "logistic":
		return trace.Logistic(h)
	default:
		return trace.Gelu(h, true)
	}
}

// layer is one layer, over (x, W1, b, W2).
func (g *rematGen) layer(a []*trace.Array) []*trace.Array {
	x, w1, b, w2 := a[0], a[1], a[2], a[3]
	if w1.Space() != ir.Device {
		w1 = trace.DevicePut(w1, ir.Device)
	}
	x = trace.CheckpointName(x, "x")
	h := trace.CheckpointName(trace.Add(trace.MatMul(x, w1), b), "h")
	z := trace.CheckpointName(g.activation(h), "a")
	y := trace.MatMul(z, w2)
	if g.batched {
		// A batched product (batch dims) that the no-batch-dims
		// policies treat differently.
		bb := trace.Einsum("bi,bj->bij", y, y)
		y = trace.Add(y, trace.Mul(trace.Sum(bb, 2), trace.FullLike(y, 0.05)))
	}
	if g.residual {
		y = trace.Add(y, x)
	}
	return []*trace.Array{y}
}

// loss runs the L checkpointed layers, scanned or unrolled, over the
// parameters (x, W1, b, W2) and returns the sum of squares of the output.
func (g *rematGen) loss(p []*trace.Array) *trace.Array {
	ck := g.ck
	x, w1, b, w2 := p[0], p[1], p[2], p[3]
	if g.scanned {
		carry, _ := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return ck(c[0], xs[0], xs[1], xs[2]), nil
		}, []*trace.Array{x}, []*trace.Array{w1, b, w2})
		x = carry[0]
	} else {
		if w1.Space() != ir.Device {
			w1 = trace.DevicePut(w1, ir.Device)
		}
		for l := range g.L {
			sl := func(w *trace.Array) *trace.Array {
				s := trace.SliceAxis(w, 0, l, l+1)
				return trace.Reshape(s, w.Shape()[1:]...)
			}
			x = ck(x, sl(w1), sl(b), sl(w2))[0]
		}
	}
	return trace.Sum(trace.Mul(x, x))
}

// trace traces the step into a verified function; it panics (with a
// trace error) where the tracer rejects it.
func (g *rematGen) trace() (*ir.Func, error) {
	tr := trace.NewFuncTracer(fmt.Sprintf("remat%d", g.seed))
	w1t := ir.TypeOf(ir.Float32, g.L, g.D, g.H)
	if g.hostW1 {
		w1t = w1t.WithSpace(ir.PinnedHost)
	}
	types := []ir.Type{ir.TypeOf(ir.Float32, g.B, g.D), w1t, ir.TypeOf(ir.Float32, g.L, g.H), ir.TypeOf(ir.Float32, g.L, g.H, g.D)}
	var params []*trace.Array
	for _, t := range types {
		params = append(params, tr.Param(t))
	}
	outs := g.step(tr, params)
	var results []*ir.Value
	for _, o := range outs {
		results = append(results, tr.Output(o))
	}
	tr.Close()
	if n := len(tr.Captures()); n > 0 {
		return nil, fmt.Errorf("the traced step captured %d arrays", n)
	}
	f := tr.Func()
	f.Body.Results = results
	if err := ir.Verify(f); err != nil {
		return nil, err
	}
	return f, nil
}

// step traces, inside tr, the loss and its gradients and returns the
// loss, the input's gradient and the updated weights.
func (g *rematGen) step(tr *trace.Tracer, params []*trace.Array) []*trace.Array {
	tr.Push()
	defer tr.Pop()
	val, grads := trace.ValueAndGrad(g.loss)(params)
	outs := []*trace.Array{val, grads[0]}
	for i := 1; i < 4; i++ {
		gr := grads[i]
		w := params[i]
		if w.Space() != ir.Device {
			w = trace.DevicePut(w, ir.Device)
		}
		if gr.Space() != ir.Device {
			gr = trace.DevicePut(gr, ir.Device)
		}
		nw := trace.Sub(w, trace.Mul(gr, trace.FullLike(gr, 0.1)))
		if params[i].Space() != ir.Device {
			nw = trace.DevicePut(nw, params[i].Space())
		}
		outs = append(outs, nw)
	}
	return outs
}
