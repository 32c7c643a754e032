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

// Remat returns a random traced training step and a description of it: L
// layers y = act(x·W1 + b)·W2 (+ x), each under trace.Checkpoint with a
// random policy, unrolled or scanned over stacked weights, a loss, and
// ValueAndGrad of it with respect to the weights and the input; the program
// returns the loss, the input's gradient and updated weights (W - 0.1·dW,
// which a donated W can hold). Parameters: x [B,D], W1 [L,D,H], b [L,H],
// W2 [L,H,D], all f32 (with HostParams, W1 sometimes in pinned_host).
func Remat(seed uint64, feat Features) (f *ir.Func, desc string, err error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x51ed2701))
	B, D, H, L := 1+rng.IntN(4), 1+rng.IntN(5), 1+rng.IntN(6), 1+rng.IntN(3)
	scanned := feat.Control && rng.IntN(2) == 0
	ps := policies()
	var pol policy
	for {
		pol = ps[rng.IntN(len(ps))]
		if !pol.offloads || !scanned || feat.ScanCopies {
			break
		}
	}
	act := []string{"tanh", "sin", "relu", "logistic", "gelu"}[rng.IntN(5)]
	residual := rng.IntN(2) == 0
	batched := rng.IntN(3) == 0
	hostW1 := feat.HostParams && rng.IntN(4) == 0 && (!scanned || feat.ScanCopies)
	desc = fmt.Sprintf("remat seed %d: B=%d D=%d H=%d L=%d scanned=%v policy=%s act=%s residual=%v batched=%v hostW1=%v",
		seed, B, D, H, L, scanned, pol.name, act, residual, batched, hostW1)

	layer := func(a []*trace.Array) []*trace.Array {
		x, w1, b, w2 := a[0], a[1], a[2], a[3]
		if w1.Space() != ir.Device {
			w1 = trace.DevicePut(w1, ir.Device)
		}
		x = trace.CheckpointName(x, "x")
		h := trace.CheckpointName(trace.Add(trace.MatMul(x, w1), b), "h")
		var z *trace.Array
		switch act {
		case "tanh":
			z = trace.Tanh(h)
		case "sin":
			z = trace.Sin(h)
		case "relu":
			z = trace.Relu(h)
		case "logistic":
			z = trace.Logistic(h)
		default:
			z = trace.Gelu(h, true)
		}
		z = trace.CheckpointName(z, "a")
		y := trace.MatMul(z, w2)
		if batched {
			// A batched product (batch dims) that the no-batch-dims
			// policies treat differently.
			bb := trace.Einsum("bi,bj->bij", y, y)
			y = trace.Add(y, trace.Mul(trace.Sum(bb, 2), trace.FullLike(y, 0.05)))
		}
		if residual {
			y = trace.Add(y, x)
		}
		return []*trace.Array{y}
	}
	ck := trace.Checkpoint(layer, pol.p)

	loss := func(p []*trace.Array) *trace.Array {
		x, w1, b, w2 := p[0], p[1], p[2], p[3]
		if scanned {
			carry, _ := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
				return ck(c[0], xs[0], xs[1], xs[2]), nil
			}, []*trace.Array{x}, []*trace.Array{w1, b, w2})
			x = carry[0]
		} else {
			if w1.Space() != ir.Device {
				w1 = trace.DevicePut(w1, ir.Device)
			}
			for l := range L {
				sl := func(w *trace.Array) *trace.Array {
					s := trace.SliceAxis(w, 0, l, l+1)
					return trace.Reshape(s, w.Shape()[1:]...)
				}
				x = ck(x, sl(w1), sl(b), sl(w2))[0]
			}
		}
		return trace.Sum(trace.Mul(x, x))
	}

	defer trace.Recover(&err)
	tr := trace.NewFuncTracer(fmt.Sprintf("remat%d", seed))
	w1t := ir.TypeOf(ir.Float32, L, D, H)
	if hostW1 {
		w1t = w1t.WithSpace(ir.PinnedHost)
	}
	types := []ir.Type{ir.TypeOf(ir.Float32, B, D), w1t, ir.TypeOf(ir.Float32, L, H), ir.TypeOf(ir.Float32, L, H, D)}
	var params []*trace.Array
	for _, t := range types {
		params = append(params, tr.Param(t))
	}
	var outs []*trace.Array
	func() {
		tr.Push()
		defer tr.Pop()
		val, grads := trace.ValueAndGrad(loss)(params)
		outs = append(outs, val, grads[0])
		for i := 1; i < 4; i++ {
			g := grads[i]
			w := params[i]
			if w.Space() != ir.Device {
				w = trace.DevicePut(w, ir.Device)
			}
			if g.Space() != ir.Device {
				g = trace.DevicePut(g, ir.Device)
			}
			nw := trace.Sub(w, trace.Mul(g, trace.FullLike(g, 0.1)))
			if params[i].Space() != ir.Device {
				nw = trace.DevicePut(nw, params[i].Space())
			}
			outs = append(outs, nw)
		}
	}()
	var results []*ir.Value
	for _, o := range outs {
		results = append(results, tr.Output(o))
	}
	tr.Close()
	if n := len(tr.Captures()); n > 0 {
		return nil, desc, fmt.Errorf("%s: the traced step captured %d arrays", desc, n)
	}
	f = tr.Func()
	f.Body.Results = results
	if err := ir.Verify(f); err != nil {
		return nil, desc, fmt.Errorf("%s: %w", desc, err)
	}
	return f, desc, nil
}
