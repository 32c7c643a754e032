package trace_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// ckWeights are a small model's parameters.
type ckWeights struct{ W1, W2, B *trace.Array }

// ckLayer is one layer with names for the policies: the input "x", the hidden
// pre-activation "h" (a dot), the activation "a", and a batched dot.
func ckLayer(x *trace.Array, w ckWeights) *trace.Array {
	x = trace.CheckpointName(x, "x")
	h := trace.CheckpointName(trace.MatMul(x, w.W1), "h")
	a := trace.CheckpointName(trace.Tanh(trace.Add(h, w.B)), "a")
	y := trace.MatMul(a, w.W2)
	// A batched dot (batch dims) on top, so that the no-batch-dims policies
	// see both kinds.
	bx := trace.Reshape(y, 2, 2, 3)
	bb := trace.Einsum("bij,bkj->bik", bx, bx)
	return trace.Add(trace.Sin(y), trace.Mul(trace.Sum(bb), trace.ScalarAs(0.01, ir.Float64)))
}

func ckPolicies() map[string]trace.CheckpointPolicy {
	return map[string]trace.CheckpointPolicy{
		"everything_saveable":              trace.EverythingSaveable,
		"nothing_saveable":                 trace.NothingSaveable,
		"nil":                              nil,
		"dots_saveable":                    trace.DotsSaveable,
		"dots_with_no_batch_dims_saveable": trace.DotsWithNoBatchDimsSaveable,
		"save_only_these_names":            trace.SaveOnlyTheseNames("h", "a"),
		"save_any_names_but_these":         trace.SaveAnyNamesButThese("x"),
		"save_and_offload_only_these_names": trace.SaveAndOffloadOnlyTheseNames([]string{"a"}, []string{"x", "h"},
			ir.Device, ir.PinnedHost),
		"offload_dot_with_no_batch_dims": trace.OffloadDotWithNoBatchDims(ir.Device, ir.PinnedHost),
		"save_from_both_policies": trace.SaveFromBothPolicies(trace.SaveOnlyTheseNames("a"),
			trace.OffloadDotWithNoBatchDims(ir.Device, ir.PinnedHost)),
		"custom": func(op *ir.Op, name string) trace.RematDecision {
			if op.Code == ir.Tanh {
				return trace.RematDecision{Action: trace.Offload, Src: ir.Device, Dst: ir.PinnedHost}
			}
			if name == "x" {
				return trace.RematDecision{Action: trace.Save}
			}
			return trace.RematDecision{Action: trace.Recompute}
		},
	}
}

func ckData(seed uint64) (ckWeights, *trace.Array) {
	r := rand.New(rand.NewPCG(seed, 3))
	w := ckWeights{W1: gtRand(r, -1, 1, 3, 4), W2: gtRand(r, -1, 1, 4, 3), B: gtRand(r, -0.5, 0.5, 4)}
	return w, gtRand(r, -1, 1, 4, 3)
}

func ckClose(t *testing.T, what string, want, got ckWeights) {
	t.Helper()
	for _, p := range [][2]*trace.Array{{want.W1, got.W1}, {want.W2, got.W2}, {want.B, got.B}} {
		require.Equal(t, ir.Device, p[1].Space(), what)
		gtExpectClose(t, what, p[1].Float64s(), p[0].Float64s(), 1e-12)
	}
}

// Every policy gives the gradients of the plain function: eagerly, under
// rt.Jit, for a two-layer function and for a scanned layer.
func TestCheckpointPoliciesGradients(t *testing.T) {
	w, x := ckData(1)
	plain := func(w ckWeights) *trace.Array { return trace.Sum(ckLayer(ckLayer(x, w), w)) }
	want := trace.Grad(plain)(w)
	scanLoss := func(layer func(*trace.Array, ckWeights) *trace.Array) func(w ckWeights) *trace.Array {
		return func(w ckWeights) *trace.Array {
			ws := ckWeights{W1: trace.Stack(0, w.W1, trace.Mul(w.W1, trace.ScalarAs(0.5, ir.Float64)), w.W1),
				W2: trace.Stack(0, w.W2, w.W2, trace.Neg(w.W2)), B: trace.Stack(0, w.B, w.B, w.B)}
			out, _ := trace.ScanTree(func(c *trace.Array, w ckWeights) (*trace.Array, struct{}) {
				return layer(c, w), struct{}{}
			}, x, ws)
			return trace.Sum(out)
		}
	}
	wantScan := trace.Grad(scanLoss(ckLayer))(w)
	for name, pol := range ckPolicies() {
		t.Run(name, func(t *testing.T) {
			for _, cse := range []bool{true, false} {
				layer := trace.Remat(ckLayer, pol, trace.PreventCSE(cse))
				loss := func(w ckWeights) *trace.Array { return trace.Sum(layer(layer(x, w), w)) }
				ckClose(t, "eager", want, trace.Grad(loss)(w))
				ckClose(t, "jit", want, rt.Jit(trace.Grad(loss))(w))
				ckClose(t, "scan eager", wantScan, trace.Grad(scanLoss(layer))(w))
				ckClose(t, "scan jit", wantScan, rt.Jit(trace.Grad(scanLoss(layer)))(w))
				// Without differentiation it is the function itself.
				gtExpectClose(t, "value", rt.Jit(loss)(w).Float64s(), plain(w).Float64s(), 1e-12)
			}
		})
	}
}

// Grad of grad through a checkpointed function.
func TestCheckpointSecondOrder(t *testing.T) {
	f := func(x *trace.Array) *trace.Array { return trace.Sin(trace.Mul(x, x)) }
	for name, pol := range ckPolicies() {
		t.Run(name, func(t *testing.T) {
			g := trace.Remat(f, pol)
			d2 := func(f func(*trace.Array) *trace.Array) func(*trace.Array) *trace.Array {
				return trace.Grad(func(x *trace.Array) *trace.Array {
					return trace.Sum(trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(f(x)) })(x))
				})
			}
			x := gtF([]float64{0.3, -0.7, 1.1}, 3)
			gtExpectClose(t, "eager", d2(g)(x).Float64s(), d2(f)(x).Float64s(), 1e-12)
			gtExpectClose(t, "jit", rt.Jit(d2(g))(x).Float64s(), d2(f)(x).Float64s(), 1e-12)
		})
	}
}

// scanIR lowers jit(grad) of a scanned checkpointed layer and returns the
// traced IR and the forward scan op.
func ckScanIR(t *testing.T, pol trace.CheckpointPolicy, opts ...trace.CheckpointOption) (*ir.Func, *ir.Op) {
	w, x := ckData(2)
	layer := trace.Remat(func(x *trace.Array, w ckWeights) *trace.Array {
		x = trace.CheckpointName(x, "x")
		return trace.MatMul(trace.Tanh(trace.MatMul(x, w.W1)), w.W2)
	}, pol, opts...)
	ws := ckWeights{W1: trace.Stack(0, w.W1, w.W1), W2: trace.Stack(0, w.W2, w.W2)}
	g := func(ws ckWeights) ckWeights {
		return trace.Grad(func(ws ckWeights) *trace.Array {
			out, _ := trace.ScanTree(func(c *trace.Array, w ckWeights) (*trace.Array, struct{}) {
				return layer(c, ckWeights{W1: w.W1, W2: w.W2}), struct{}{}
			}, x, ckWeights{W1: ws.W1, W2: ws.W2})
			return trace.Sum(out)
		})(ws)
	}
	low, err := rt.NewJitted(g).Lower(ckWeights{W1: ws.W1, W2: ws.W2})
	require.NoError(t, err)
	f := low.Func
	for _, op := range f.Body.Ops {
		if op.Code == ir.Scan && !op.Attrs.Bool("reverse") {
			return f, op
		}
	}
	t.Fatalf("no forward scan in\n%v", f)
	return nil, nil
}

// The residuals the forward scan stacks follow the policy: everything for
// everything_saveable, only the layer input for nothing_saveable, and only a
// pinned_host stack of the input when it is offloaded.
func TestCheckpointScanResiduals(t *testing.T) {
	ys := func(op *ir.Op) []ir.Type {
		var ts []ir.Type
		for _, v := range op.Results[op.Attrs.Int("num_carry"):] {
			ts = append(ts, v.Type)
		}
		return ts
	}
	_, fwd := ckScanIR(t, trace.EverythingSaveable)
	require.GreaterOrEqual(t, len(ys(fwd)), 2, "%v", ys(fwd))

	_, fwd = ckScanIR(t, trace.NothingSaveable)
	require.Equal(t, []ir.Type{ir.TypeOf(ir.Float64, 2, 4, 3)}, ys(fwd), "only the layer input is stacked")

	f, fwd := ckScanIR(t, trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost))
	require.Equal(t, []ir.Type{ir.TypeOf(ir.Float64, 2, 4, 3).WithSpace(ir.PinnedHost)}, ys(fwd), "the input, stacked in pinned_host")
	// The backward scan reads it slice by slice and moves each to device.
	var bwd *ir.Op
	for _, op := range f.Body.Ops {
		if op.Code == ir.Scan && op.Attrs.Bool("reverse") {
			bwd = op
		}
	}
	require.NotNil(t, bwd)
	found := false
	for _, op := range bwd.Regions[0].Ops {
		if op.Code == ir.DevicePut && op.Args[0].Op == nil && op.Args[0].Type.Space == ir.PinnedHost && op.Results[0].Type.Space == ir.Device {
			found = true
		}
	}
	require.True(t, found, "backward body:\n%v", f)

	// prevent_cse puts barriers in the backward body; without it there are none.
	count := func(f *ir.Func) int {
		n := 0
		f.Body.Walk(func(op *ir.Op) {
			if op.Code == ir.OptimizationBarrier {
				n++
			}
		})
		return n
	}
	f, _ = ckScanIR(t, trace.NothingSaveable)
	require.Positive(t, count(f))
	f, _ = ckScanIR(t, trace.NothingSaveable, trace.PreventCSE(false))
	require.Zero(t, count(f))
}

// Without barriers, CSE would merge the recomputed matrix product with the
// forward one; with them (the default) both stay in the compiled program.
func TestCheckpointPreventCSE(t *testing.T) {
	x := gtF([]float64{1, 2, 3, 4, 5, 6}, 2, 3)
	w := gtF([]float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, 3, 2)
	for _, cse := range []bool{true, false} {
		layer := trace.Remat(func(x, w *trace.Array) *trace.Array { return trace.Sin(trace.Tanh(trace.MatMul(x, w))) }, trace.NothingSaveable, trace.PreventCSE(cse))
		g := func(w *trace.Array) (*trace.Array, *trace.Array) {
			return trace.ValueAndGrad(func(w *trace.Array) *trace.Array { return trace.Sum(layer(x, w)) })(w)
		}
		low, err := rt.Lower(g, w)
		require.NoError(t, err)
		c, err := low.Compile()
		require.NoError(t, err)
		text := c.OptimizedIR()
		require.NotContains(t, text, "optimization_barrier", "the compiler removes the barriers")
		require.NotContains(t, text, "checkpoint_name")
		tanhs := strings.Count(text, "tanh(")
		if cse {
			require.Equal(t, 2, tanhs, "forward and recomputed tanh:\n%s", text)
		} else {
			require.Equal(t, 1, tanhs, "merged by CSE:\n%s", text)
		}
		want := trace.Grad(func(w *trace.Array) *trace.Array { return trace.Sum(trace.Sin(trace.Tanh(trace.MatMul(x, w)))) })(w)
		outs, err := c.Call(w)
		require.NoError(t, err)
		gtExpectClose(t, fmt.Sprint("prevent_cse=", cse), outs[1].(*trace.Array).Float64s(), want.Float64s(), 1e-12)
	}
}

// Offloaded residuals of a scan are read back in reverse order by the
// backward scan, and by a reverse forward scan in forward order; nested scans
// of checkpointed layers differentiate correctly too.
func TestCheckpointOffloadScanOrderAndNesting(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	x0 := gtRand(r, -1, 1, 3)
	xs := gtRand(r, -1, 1, 5, 3)
	ws := gtRand(r, -1, 1, 5, 3, 3)
	pol := trace.SaveAndOffloadOnlyTheseNames(nil, []string{"c", "x"}, ir.Device, ir.PinnedHost)
	cell := func(c, x, w *trace.Array) *trace.Array {
		c = trace.CheckpointName(c, "c")
		x = trace.CheckpointName(x, "x")
		return trace.Tanh(trace.Add(trace.MatMul(w, c), trace.Mul(x, c)))
	}
	for _, rev := range []bool{false, true} {
		var opts []trace.ScanOption
		if rev {
			opts = append(opts, trace.ScanReverse())
		}
		loss := func(cell func(c, x, w *trace.Array) *trace.Array) func(p []*trace.Array) *trace.Array {
			return func(p []*trace.Array) *trace.Array {
				c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
					n := cell(c[0], x[0], x[1])
					// The ys depend on the iteration: a wrong order changes the gradient.
					return []*trace.Array{n}, []*trace.Array{trace.Mul(n, x[0])}
				}, []*trace.Array{p[0]}, []*trace.Array{p[1], p[2]}, opts...)
				return trace.Add(trace.Sum(c[0]), trace.Sum(trace.Mul(ys[0], ys[0])))
			}
		}
		in := []*trace.Array{x0, xs, ws}
		want := trace.Grad(loss(cell))(in)
		got := rt.Jit(trace.Grad(loss(trace.Remat(cell, pol))))(in)
		for i := range want {
			gtExpectClose(t, fmt.Sprintf("reverse=%v grad %d", rev, i), got[i].Float64s(), want[i].Float64s(), 1e-12)
		}
	}

	// Nested: an outer scan over blocks, each an inner scan of checkpointed
	// cells, the inner body offloading its carry.
	xs2 := trace.Reshape(xs, 5, 1, 3)
	ws2 := trace.Reshape(ws, 5, 1, 3, 3)
	nested := func(cell func(c, x, w *trace.Array) *trace.Array) func(p []*trace.Array) *trace.Array {
		return func(p []*trace.Array) *trace.Array {
			c, _ := trace.Scan(func(c, blk []*trace.Array) ([]*trace.Array, []*trace.Array) {
				ci, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
					return []*trace.Array{cell(c[0], x[0], x[1])}, nil
				}, c, blk)
				return ci, nil
			}, []*trace.Array{p[0]}, []*trace.Array{p[1], p[2]})
			return trace.Sum(trace.Mul(c[0], c[0]))
		}
	}
	in := []*trace.Array{x0, xs2, ws2}
	want := trace.Grad(nested(cell))(in)
	for _, g := range []func([]*trace.Array) []*trace.Array{trace.Grad(nested(trace.Remat(cell, pol))), rt.Jit(trace.Grad(nested(trace.Remat(cell, pol))))} {
		got := g(in)
		for i := range want {
			gtExpectClose(t, fmt.Sprintf("nested grad %d", i), got[i].Float64s(), want[i].Float64s(), 1e-12)
		}
	}
}

// CheckpointName is the identity; DevicePut moves concrete arrays.
func TestCheckpointNameAndDevicePut(t *testing.T) {
	x := gtF([]float64{1, 2, 3}, 3)
	require.Same(t, x, trace.CheckpointName(x, "x"))
	h := trace.DevicePut(x, ir.PinnedHost)
	require.Equal(t, ir.PinnedHost, h.Space())
	require.Equal(t, x.Float64s(), h.Float64s())
	require.Same(t, h, trace.DevicePut(h, ir.PinnedHost))
	d := trace.DevicePut(h, ir.Device)
	require.Equal(t, ir.Device, d.Space())
	require.Equal(t, x.Float64s(), d.Float64s())
	// Traced: a device_put op; its gradient is on device.
	g := rt.Jit(trace.Grad(func(h *trace.Array) *trace.Array {
		return trace.Sum(trace.Sin(trace.DevicePut(h, ir.Device)))
	}))(h)
	require.Equal(t, ir.Device, g.Space())
	gtExpectClose(t, "grad", g.Float64s(), trace.Cos(x).Float64s(), 1e-12)
}

// A checkpointed function that closes over differentiated arrays (here the
// weights, captured rather than passed) gives them their gradients too, under
// every policy, at the top level and inside a scan.
func TestCheckpointClosure(t *testing.T) {
	w, x := ckData(3)
	want := trace.Grad(func(w ckWeights) *trace.Array { return trace.Sum(ckLayer(ckLayer(x, w), w)) })(w)
	for name, pol := range ckPolicies() {
		t.Run(name, func(t *testing.T) {
			loss := func(w ckWeights) *trace.Array {
				layer := trace.Checkpoint(func(a []*trace.Array) []*trace.Array { return []*trace.Array{ckLayer(a[0], w)} }, pol)
				return trace.Sum(layer(layer(x)[0])[0])
			}
			ckClose(t, "eager", want, trace.Grad(loss)(w))
			ckClose(t, "jit", want, rt.Jit(trace.Grad(loss))(w))
			scanLoss := func(w ckWeights) *trace.Array {
				layer := trace.Checkpoint(func(a []*trace.Array) []*trace.Array { return []*trace.Array{ckLayer(a[0], w)} }, pol)
				c, _ := trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
					return layer(c[0]), nil
				}, []*trace.Array{x}, nil, trace.ScanLength(2))
				return trace.Sum(c[0])
			}
			ckClose(t, "scan jit", want, rt.Jit(trace.Grad(scanLoss))(w))
		})
	}
}
