//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// fakeBackend is a backend over the fake driver (without cuBLASLt, so
// every dot is a generated kernel) recording its stream operations;
// execute makes the fake run the kernels it launches (skipping the test
// without gcc).
func fakeBackend(t *testing.T, execute bool) (*fakeCUDA, *Backend) {
	t.Helper()
	fake, d := newFakeCUDA(t)
	fake.recordStreams()
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	if execute {
		fake.executeKernels(t)
	}
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	return fake, b
}

// controlPrograms are the scan, while and cond programs the device
// lowering runs: forward and reverse scans with consts, carries, xs and
// ys, a scan over pinned_host xs writing pinned_host ys (the offload
// plan's per-iteration copies), a carry swap (results that overlap other
// results' destinations), nested control flow, while loops and conds.
var controlPrograms = []struct {
	name   string
	params []ir.Type
	fn     func(x []*trace.Array) []*trace.Array
}{
	{"scan", []ir.Type{f32t(4), f32t(4, 4), f32t(5, 4)}, func(x []*trace.Array) []*trace.Array {
		w := x[1] // a const of the body
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			n := trace.Tanh(trace.Add(trace.MatMul(w, c[0]), xs[0]))
			return []*trace.Array{n}, []*trace.Array{trace.Mul(n, xs[0]), trace.Sum(n)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[2]})
		return append(c, ys...)
	}},
	{"scan_reverse", []ir.Type{f32t(3), f32t(6, 3), f32t(6, 3)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			n := trace.Add(trace.Mul(c[0], xs[0]), xs[1])
			return []*trace.Array{n}, []*trace.Array{trace.Exp(trace.Neg(trace.Mul(n, n)))}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1], x[2]}, trace.ScanReverse())
		return append(c, ys...)
	}},
	{"scan_offload", []ir.Type{f32t(4), f32t(5, 4).WithSpace(ir.PinnedHost)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			xd := trace.DevicePut(xs[0], ir.Device)
			n := trace.Sin(trace.Add(c[0], xd))
			return []*trace.Array{n}, []*trace.Array{trace.DevicePut(trace.Mul(n, xd), ir.PinnedHost)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	}},
	{"scan_swap", []ir.Type{f32t(4), f32t(4), f32t(3, 4)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{c[1], c[0]}, []*trace.Array{c[0], xs[0]}
		}, []*trace.Array{x[0], x[1]}, []*trace.Array{x[2]})
		return append(c, ys...)
	}},
	{"scan_cond", []ir.Type{f32t(3), f32t(4, 3)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			r := trace.Cond(trace.Greater(trace.Sum(xs[0]), trace.Scalar(0)),
				func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Add(o[0], o[1])} },
				func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Mul(o[0], o[1])} },
				c[0], xs[0])
			return r, []*trace.Array{trace.Sum(r[0])}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	}},
	{"while", []ir.Type{f32t(4), f32t(4)}, func(x []*trace.Array) []*trace.Array {
		return trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Less(s[0], trace.ScalarAs(7, ir.Int32))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(s[0], trace.ScalarAs(1, ir.Int32)), trace.Add(trace.Mul(s[1], x[1]), trace.Scalar(0.5))}
		}, trace.ScalarAs(0, ir.Int32), x[0])
	}},
	{"cond", []ir.Type{f32t(5), f32t(5)}, func(x []*trace.Array) []*trace.Array {
		return trace.Cond(trace.Greater(trace.Sum(x[0]), trace.Sum(x[1])),
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Sub(o[0], o[1]), o[1]} },
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{o[1], trace.Tanh(o[0])} },
			x[0], x[1])
	}},
}

// randomArgs returns a random literal for each of f's parameters.
func randomArgs(rng *rand.Rand, f *ir.Func) []*ir.Literal {
	var args []*ir.Literal
	for _, p := range f.Body.Params {
		args = append(args, randomLiteral(rng, p.Type))
	}
	return args
}

// uploadRandom uploads a random buffer for each of f's parameters to b.
func uploadRandom(t *testing.T, b *Backend, f *ir.Func, rng *rand.Rand) []trace.Buffer {
	t.Helper()
	var bufs []trace.Buffer
	for _, l := range randomArgs(rng, f) {
		buf, err := b.FromLiteral(l)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf)
	}
	return bufs
}

func f32t(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }

// Scan, while and cond run on the device: no step of theirs is a host
// step, with the fake driver running the launched kernels (built with gcc)
// every program's results match eval's, and the streams' events order
// every conflicting pair of operations.
func TestControlFlowOnDevice(t *testing.T) {
	fake, b := fakeBackend(t, true)
	for _, p := range controlPrograms {
		t.Run(p.name, func(t *testing.T) {
			rng := testseed.Rand(t, 21)
			f := traceFn(t, p.params, p.fn)
			args := randomArgs(rng, f)
			// f32 loops of elementwise ops and small sums, run by the
			// fake driver's host build of the kernels: mismatch's f32
			// tolerance (codegen_test.go says why).
			runAgainstEval(t, b, f, args, 1e-5, fake)
		})
	}
}

// A reverse scan launches its body's kernel once per iteration, reading
// slice length-1-i of its xs in iteration i and writing the y it computes
// in place into the same slice of its ys; the carry result is initialised
// by a copy from the carry operand and then read and written by every
// iteration. (Launches are recorded, not run: no gcc needed.)
func TestScanLaunchPointers(t *testing.T) {
	fake, b := fakeBackend(t, false)
	const n, m = 5, 3
	f := traceFn(t, []ir.Type{f32t(m), f32t(n, m)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			s := trace.Add(c[0], xs[0])
			return []*trace.Array{s}, []*trace.Array{trace.Mul(s, xs[0])}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]}, trace.ScanReverse())
		return append(c, ys...)
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := exe.(*executable)
	if hs := e.HostSteps(); len(hs) != 0 {
		t.Fatalf("host steps: %v", hs)
	}
	var scan *step
	for i := range e.steps {
		if e.steps[i].kind == stepLoop && e.steps[i].op.Code == ir.Scan {
			scan = &e.steps[i]
		}
	}
	if scan == nil || len(scan.subs) != 1 {
		t.Fatalf("no scan step in\n%v", e.prog.Func)
	}
	var body []string
	for _, s := range scan.subs[0].steps {
		if s.kind != stepKernel {
			t.Fatalf("body step %v is %d, want a kernel", s.op.Code, s.kind)
		}
		body = append(body, s.kernel.Entries[0].Name)
	}
	if len(body) != 1 {
		t.Fatalf("body has %d kernels (%v), want one fused kernel", len(body), body)
	}
	rng := testseed.Rand(t, 22)
	bufs := uploadRandom(t, b, f, rng)
	outs, err := exe.Execute(bufs, rt.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	carry, ys := outs[0].(*Buffer).m.ptr, outs[1].(*Buffer).m.ptr
	xs := bufs[1].(*Buffer).m.ptr
	fake.mu.Lock()
	launches := fake.launchArgs
	fake.mu.Unlock()
	if len(launches) != n {
		t.Fatalf("%d launches, want %d: %v", len(launches), n, launches)
	}
	slice := uintptr(m * 4)
	for it, l := range launches {
		idx := uintptr(n - 1 - it)
		// Operands (carry, x slice in the fusion's order), results (new
		// carry into the body's arena, y in place), n.
		if l.name != body[0] {
			t.Fatalf("launch %d is %s, want %s", it, l.name, body[0])
		}
		has := func(p uintptr) bool {
			for _, a := range l.args {
				if a == p {
					return true
				}
			}
			return false
		}
		if !has(xs+idx*slice) || !has(ys+idx*slice) || !has(carry) {
			t.Fatalf("iteration %d (slice %d): launch args %#x, want xs slice %#x, ys slice %#x and carry %#x",
				it, idx, l.args, xs+idx*slice, ys+idx*slice, carry)
		}
		for k := range n {
			if k != int(idx) && (has(xs+uintptr(k)*slice) || has(ys+uintptr(k)*slice)) {
				t.Fatalf("iteration %d touches slice %d: %#x", it, k, l.args)
			}
		}
	}
}

// HostSteps names the steps nested in regions that still run on the host
// (sort has no device kernel), with the region path.
func TestHostStepsNested(t *testing.T) {
	_, b := fakeBackend(t, false)
	f := traceFn(t, []ir.Type{f32t(4), f32t(3, 4)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Sort(trace.Add(c[0], xs[0]), 0)}, nil
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hs := exe.(*executable).HostSteps()
	if len(hs) != 1 || !strings.HasPrefix(hs[0], "scan body / sort: ") {
		t.Fatalf("host steps %q, want the sort in the scan body", hs)
	}
}

// trainStep is a traced training step and its arguments.
type trainStep struct {
	name string
	f    *ir.Func
	args []*ir.Literal
}

// lowerStep traces fn on args with rt.Lower and returns the function with
// literals of its arguments' leaves and captured arrays.
func lowerStep(t *testing.T, name string, fn any, args ...any) trainStep {
	t.Helper()
	low, err := rt.Lower(fn, args...)
	if err != nil {
		t.Fatal(err)
	}
	var leaves []*trace.Array
	for _, a := range args {
		leaves = append(leaves, trace.Leaves(a)...)
	}
	leaves = append(leaves, low.Captured()...)
	if len(leaves) != len(low.Func.Body.Params) {
		t.Fatalf("%s: %d leaves for %d parameters", name, len(leaves), len(low.Func.Body.Params))
	}
	s := trainStep{name: name, f: low.Func}
	for _, a := range leaves {
		l, err := a.Literal()
		if err != nil {
			t.Fatal(err)
		}
		s.args = append(s.args, l)
	}
	return s
}

// trainSteps are the examples' training steps at small sizes: the MLP with
// Adam, and the Transformer LM (its layer stack a scan, forward and
// backward) with clipping and AdamW, plain, with dots remat, with each
// layer's input offloaded to pinned_host, and (loss and gradients) with
// that and the stacked layer parameters kept in pinned_host, streamed in
// per layer.
func trainSteps(t *testing.T) []trainStep {
	const batch, features, hidden, classes = 4, 6, 8, 3
	mlp := rt.Jit(func(key *trace.Array) nn.MLP {
		return nn.NewMLP(key, ir.Float32, []int{features, hidden, classes}, nn.Relu)
	})(random.NewKey(1))
	adam := optim.Adam[nn.MLP](optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	mstate, err := adam.Init(mlp)
	if err != nil {
		t.Fatal(err)
	}
	rng := testseed.Rand(t, 23)
	xf := make([]float32, batch*features)
	for i := range xf {
		xf[i] = float32(rng.NormFloat64())
	}
	yl := make([]int32, batch)
	for i := range yl {
		yl[i] = int32(rng.IntN(classes))
	}
	mlpStep := func(p nn.MLP, s optim.AdamState[nn.MLP], x, y *trace.Array) (nn.MLP, optim.AdamState[nn.MLP], *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array { return nn.SoftmaxCrossEntropy(p.Apply(x), y) })(p)
		p, s, err := optim.Step(adam, g, s, p)
		return p, s, loss, err
	}
	steps := []trainStep{lowerStep(t, "mlp", mlpStep, mlp, mstate, rt.FromSlice(xf, batch, features), rt.FromSlice(yl, batch))}

	const vocab, seq, layers, d, heads = 11, 6, 3, 8, 2
	type lm = nn.TransformerLM
	model := rt.Jit(func(k *trace.Array) lm {
		return nn.NewTransformerLM(k, ir.Float32, vocab, seq, layers, d, heads, 2*d)
	})(random.NewKey(2))
	opt := optim.Chain(optim.ClipByGlobalNorm[lm](1), optim.AdamW[lm](optim.Constant(3e-3), 0.9, 0.95, 1e-8, 0.01))
	state, err := opt.Init(model)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int32, 2*seq)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
	}
	x := rt.FromSlice(ids, 2, seq)
	hostModel := model
	hostModel.Blocks.Blocks, err = trace.MapAs(model.Blocks.Blocks, func(a *trace.Array) *trace.Array { return trace.DevicePut(a, ir.PinnedHost) })
	if err != nil {
		t.Fatal(err)
	}
	offload := trace.SaveAndOffloadOnlyTheseNames(nil, []string{nn.BlockInput}, ir.Device, ir.PinnedHost)
	type optState = optim.ChainState[optim.EmptyState, optim.AdamState[lm]]
	for _, v := range []struct {
		name  string
		model lm
		opts  []nn.StackOption
	}{
		{"transformer", model, nil},
		{"transformer_remat_dots", model, []nn.StackOption{nn.WithRemat(trace.DotsSaveable)}},
		{"transformer_offload_activations", model, []nn.StackOption{nn.WithRemat(offload)}},
	} {
		step := func(p lm, s optState, x, y *trace.Array) (lm, optState, *trace.Array, error) {
			loss, g := trace.ValueAndGrad(func(p lm) *trace.Array { return p.Loss(x, y, v.opts...) })(p)
			upd, s2, err := opt.Update(g, s, p)
			if err != nil {
				return lm{}, optState{}, nil, err
			}
			p2, err := optim.ApplyUpdates(p, upd)
			return p2, s2, loss, err
		}
		steps = append(steps, lowerStep(t, v.name, step, v.model, state, x, x))
	}
	// Parameters in pinned_host: the loss and gradients (the optimizer
	// reads device arrays only).
	grads := func(p lm, x, y *trace.Array) (*trace.Array, lm) {
		return trace.ValueAndGrad(func(p lm) *trace.Array {
			return p.Loss(x, y, nn.WithRemat(offload), nn.WithParamOffload())
		})(p)
	}
	return append(steps, lowerStep(t, "transformer_offload_params_grad", grads, hostModel, x, x))
}

// The examples' training steps run entirely on the device (no host step;
// the Transformer's layer stack is a scan step with its body compiled), and
// with the fake driver running the launched kernels their results match
// eval's.
func TestTrainStepsOnDevice(t *testing.T) {
	fake, b := fakeBackend(t, true)
	for _, s := range trainSteps(t) {
		t.Run(s.name, func(t *testing.T) {
			exe, err := b.Compile(s.f, rt.CompileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			e := exe.(*executable)
			if hs := e.HostSteps(); len(hs) != 0 {
				t.Fatalf("host steps: %v", hs)
			}
			scans, copies, prefetched := 0, 0, 0
			var count func(g *region)
			count = func(g *region) {
				prefetched += len(g.sched.Prefetch)
				for _, st := range g.steps {
					if st.kind == stepLoop && st.op.Code == ir.Scan {
						scans++
					}
					if st.kind == stepCopy {
						copies++
					}
					for _, sub := range st.subs {
						count(sub)
					}
				}
			}
			count(e.top)
			t.Logf("%d top-level steps, %d scans, %d copies between spaces (%d double buffered)", len(e.steps), scans, copies, prefetched)
			if strings.HasPrefix(s.name, "transformer") && scans < 2 {
				t.Fatalf("%d scan steps, want the layer stack's forward and backward scans", scans)
			}
			if strings.Contains(s.name, "offload") && copies == 0 {
				t.Fatalf("no copy between memory spaces")
			}
			// Training steps: gradients summed over the batch and the
			// layers' scan in another order than eval's, then divided by
			// Adam's root mean square (which amplifies the relative error
			// of small gradients): ten times mismatch's f32 tolerance, below
			// JAX's f32 gradient tolerance (default_gradient_tolerance,
			// 2e-3).
			runAgainstEval(t, b, s.f, s.args, 1e-4, fake)
		})
	}
}

// runAgainstEval compiles f on b, checks that no step runs on the host,
// executes it on args and compares every result with eval's within tol
// (relative to 1+|want|). Over a fake driver recording streams, it also
// checks that every conflicting pair of stream operations is ordered.
func runAgainstEval(t *testing.T, b *Backend, f *ir.Func, args []*ir.Literal, tol float64, fake *fakeCUDA) {
	t.Helper()
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hs := exe.(*executable).HostSteps(); len(hs) != 0 {
		t.Fatalf("host steps: %v", hs)
	}
	var bufs []trace.Buffer
	for _, l := range args {
		buf, err := b.FromLiteral(l)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf)
	}
	want, err := eval.Run(f, args)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := exe.Execute(bufs, rt.ExecOptions{})
	if err != nil {
		if fake != nil {
			v, _, _ := fake.snapshot()
			t.Fatalf("%v\n%s", err, strings.Join(v, "\n"))
		}
		t.Fatal(err)
	}
	if fake != nil && fake.streams != nil {
		fake.mu.Lock()
		races := fake.streams.races(kernelsOf(exe.(*executable)))
		n := len(fake.streams.ops)
		fake.streams.ops = nil
		fake.mu.Unlock()
		if len(races) > 0 {
			t.Fatalf("%d of %d stream operations race:\n%s", len(races), n, strings.Join(races[:min(len(races), 10)], "\n"))
		}
	}
	for i, w := range want {
		got, err := outs[i].Literal()
		if err != nil {
			t.Fatal(err)
		}
		if !got.Type.Equal(w.Type) {
			t.Fatalf("result %d is %v, want %v", i, got.Type, w.Type)
		}
		for j := range w.Type.Size() {
			if g, x := got.Float64At(j), w.Float64At(j); math.Abs(g-x) > tol*(1+math.Abs(x)) {
				t.Fatalf("result %d (%v) element %d = %v, want %v", i, w.Type, j, g, x)
			}
		}
	}
}

// On a GPU (skipped elsewhere): the control-flow programs and the
// examples' training steps run with no host step and match eval.
func TestDeviceControlFlow(t *testing.T) {
	b, err := Register()
	if err != nil {
		t.Skipf("cuda backend unavailable: %v", err)
	}
	for _, p := range controlPrograms {
		t.Run(p.name, func(t *testing.T) {
			rng := testseed.Rand(t, 24)
			f := traceFn(t, p.params, p.fn)
			args := randomArgs(rng, f)
			// On a GPU, CUDA's f32 functions (2–4 ulps) and NVRTC's FMA
			// contraction join the reduction order: ten times the fake
			// driver's 1e-5.
			runAgainstEval(t, b, f, args, 1e-4, nil)
		})
	}
	for _, s := range trainSteps(t) {
		t.Run(s.name, func(t *testing.T) {
			// Sums run in another order on the device (and cuBLASLt's
			// products split K its own way); Adam's update divides by the
			// gradients' root mean square: 1e-3, within JAX's f32
			// gradient tolerance (2e-3).
			runAgainstEval(t, b, s.f, s.args, 1e-3, nil)
		})
	}
}

// A scan over pinned_host weights copies each layer's slice to the device
// once, double buffered: the copy of slice i+1 is issued during iteration
// i, right after the last reader of the slice's device buffer (before the
// iteration's copy of its y to pinned_host), and iteration i+1 issues no
// copy of its own; the results match eval and no stream operations race.
func TestScanPrefetch(t *testing.T) {
	fake, b := fakeBackend(t, true)
	const n = 5
	f := traceFn(t, []ir.Type{f32t(4, 4), f32t(n, 4, 4).WithSpace(ir.PinnedHost)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			w := trace.DevicePut(xs[0], ir.Device)
			h := trace.Tanh(trace.MatMul(c[0], w))
			return []*trace.Array{h}, []*trace.Array{trace.DevicePut(h, ir.PinnedHost)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(c, ys...)
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var body *region
	for _, s := range exe.(*executable).steps {
		if s.kind == stepLoop && s.op.Code == ir.Scan {
			body = s.subs[0]
		}
	}
	if body == nil || len(body.sched.Prefetch) == 0 {
		t.Fatalf("the weights' copy is not double buffered")
	}
	rng := testseed.Rand(t, 25)
	var args []*ir.Literal
	var bufs []trace.Buffer
	for _, p := range f.Body.Params {
		l := randomLiteral(rng, p.Type)
		args = append(args, l)
		buf, err := b.FromLiteral(l)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf)
	}
	fake.mu.Lock()
	fake.streams.ops = nil
	fake.mu.Unlock()
	outs, err := exe.Execute(bufs, rt.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	xs := bufs[1].(*Buffer).m.ptr
	ys := outs[1].(*Buffer).m.ptr
	const slice = 4 * 4 * 4
	fake.mu.Lock()
	var order []string
	for _, op := range fake.streams.ops {
		switch a := op.accesses; op.what {
		case "cuMemcpyHtoDAsync":
			if a[0].p >= xs && a[0].p < xs+n*slice {
				order = append(order, fmt.Sprintf("in%d", (a[0].p-xs)/slice))
			}
		case "cuMemcpyDtoHAsync":
			if a[1].p >= ys && a[1].p < ys+n*slice {
				order = append(order, fmt.Sprintf("out%d", (a[1].p-ys)/slice))
			}
		}
	}
	fake.mu.Unlock()
	want := []string{"in0"}
	for i := range n {
		if i+1 < n {
			want = append(want, fmt.Sprintf("in%d", i+1))
		}
		want = append(want, fmt.Sprintf("out%d", i))
	}
	if !slices.Equal(order, want) {
		t.Fatalf("copies issued in the order %v, want %v", order, want)
	}
	fake.mu.Lock()
	races := fake.streams.races(kernelsOf(exe.(*executable)))
	fake.mu.Unlock()
	if len(races) > 0 {
		t.Fatalf("stream operations race:\n%s", strings.Join(races, "\n"))
	}
	wantOuts, err := eval.Run(f, args)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range wantOuts {
		got, err := outs[i].Literal()
		if err != nil {
			t.Fatal(err)
		}
		for j := range w.Type.Size() {
			// f32 elementwise ops on scan slices: mismatch's tolerance.
			if g, x := got.Float64At(j), w.Float64At(j); math.Abs(g-x) > 1e-5*(1+math.Abs(x)) {
				t.Fatalf("result %d element %d = %v, want %v", i, j, g, x)
			}
		}
	}
}

// A dot in a scan body is a cuBLASLt matmul like a top-level one: each
// iteration runs it on that iteration's slice of the stacked weights.
func TestScanMatmulInBody(t *testing.T) {
	fake, d := newFakeCUDA(t)
	lt := fake.withCublasLt(d)
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	f := traceFn(t, []ir.Type{f32t(8, 8), f32t(n, 8, 8)}, func(x []*trace.Array) []*trace.Array {
		c, _ := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.MatMul(c[0], xs[0])}, nil
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return c
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var body *region
	for _, s := range exe.(*executable).steps {
		if s.kind == stepLoop && s.op.Code == ir.Scan {
			body = s.subs[0]
		}
	}
	if body == nil || len(body.steps) != 1 || body.steps[0].kind != stepMatmul {
		t.Fatalf("the scan body's dot is not a cuBLASLt step")
	}
	rng := testseed.Rand(t, 26)
	bufs := uploadRandom(t, b, f, rng)
	if _, err := exe.Execute(bufs, rt.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	calls := lt.find("cublasLtMatmul")
	if len(calls) != n {
		t.Fatalf("%d cublasLtMatmul calls, want %d", len(calls), n)
	}
	xs := bufs[1].(*Buffer).m.ptr
	for i, c := range calls {
		// A is the rhs (column-major view of the row-major product).
		if want := xs + uintptr(i*8*8*4); c.args[3] != want {
			t.Fatalf("iteration %d: A = %#x, want the weights' slice %#x", i, c.args[3], want)
		}
	}
	if v, _, _ := fake.snapshot(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// An output fusion runs from the plan's description: without cuBLASLt its
// kernel's Product entry computes the dot into the result buffer and the
// epilogue reads it there (run by the fake, the results match eval's);
// with cuBLASLt the matmul writes D straight into that result's buffer and
// the Product entry is not launched, only the epilogue.
func TestOutputFusionSteps(t *testing.T) {
	f := traceFn(t, []ir.Type{f32t(6, 8), f32t(8, 5), f32t(5)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.MatMul(x[0], x[1]), x[2]), true)}
	})
	t.Run("generated", func(t *testing.T) {
		fake, b := fakeBackend(t, true)
		// A product of K = 8 terms, a bias and gelu: mismatch's f32
		// tolerance.
		runAgainstEval(t, b, f, randomArgs(testseed.Rand(t, 27), f), 1e-5, fake)
	})
	t.Run("cublaslt", func(t *testing.T) { checkLtOutputFusion(t, f) })
}

// checkLtOutputFusion runs f, one output fusion, with a fake cuBLASLt.
func checkLtOutputFusion(t *testing.T, f *ir.Func) {
	fake, d := newFakeCUDA(t)
	lt := fake.withCublasLt(d)
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	bl, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := bl.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var s *step
	for i := range exe.(*executable).steps {
		if st := &exe.(*executable).steps[i]; st.op.Code == ir.Fusion {
			s = st
		}
	}
	if s == nil || s.kind != stepMatmul || s.kernel == nil || !s.kernel.Entries[0].Product {
		t.Fatalf("the output fusion is not a cuBLASLt step with a Product entry first: %+v", s)
	}
	outs, err := exe.Execute(uploadRandom(t, bl, f, testseed.Rand(t, 28)), rt.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	calls := lt.find("cublasLtMatmul")
	if res := outs[0].(*Buffer).m.ptr; len(calls) != 1 || calls[0].args[8] != res || calls[0].args[10] != res {
		t.Fatalf("cublasLtMatmul calls %v: want one writing C = D = the result buffer %#x", calls, res)
	}
	_, _, launches := fake.snapshot()
	if slices.Contains(launches, s.kernel.Entries[0].Name) || !slices.Contains(launches, s.kernel.Entries[1].Name) {
		t.Fatalf("launches %v: want the epilogue %s and not the Product entry %s", launches, s.kernel.Entries[1].Name, s.kernel.Entries[0].Name)
	}
}
