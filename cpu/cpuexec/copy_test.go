package cpuexec

import (
	"bytes"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// freshRand returns a generator with a new seed, logged for reproduction.
func freshRand(t *testing.T) *rand.Rand {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

// offloadScanFunc is the shape of an offloaded training step: a forward scan
// over layer weights w (f32[L,n,n], pinned_host, axis 0) that copies each
// slice to device, computes c = tanh(c @ w[i]) and offloads every layer's
// input to pinned_host (ys), and a reverse scan that reads those residuals
// back in reverse order with the weights, computes g = tanh(g @ w[i]) + r[i]
// and offloads every g (ys). Results: the final carries and the three
// stacked host arrays.
func offloadScanFunc(t testing.TB, L, n int) *ir.Func {
	f := ir.NewFunc("offload_scan")
	vT := ir.TypeOf(ir.Float32, n, n)
	hT := vT.WithSpace(ir.PinnedHost)
	stT := ir.TypeOf(ir.Float32, L, n, n).WithSpace(ir.PinnedHost)
	px, pw := f.Body.AddParam(vT), f.Body.AddParam(stT)

	fwd := f.NewRegion()
	c, wi := fwd.AddParam(vT), fwd.AddParam(hT)
	r := add1(t, fwd, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, c)
	wd := add1(t, fwd, ir.DevicePut, ir.Attrs{"space": ir.Device}, wi)
	y := add1(t, fwd, ir.Tanh, nil, add1(t, fwd, ir.DotGeneral, matmulAttrs(), c, wd))
	fwd.Results = []*ir.Value{y, r}
	fop := addOp(t, f.Body, ir.Scan, []*ir.Value{px, pw}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": L, "reverse": false}, fwd)

	bwd := f.NewRegion()
	g, bw, br := bwd.AddParam(vT), bwd.AddParam(hT), bwd.AddParam(hT)
	wd2 := add1(t, bwd, ir.DevicePut, ir.Attrs{"space": ir.Device}, bw)
	h := add1(t, bwd, ir.Tanh, nil, add1(t, bwd, ir.DotGeneral, matmulAttrs(), g, wd2))
	rd := add1(t, bwd, ir.DevicePut, ir.Attrs{"space": ir.Device}, br)
	g2 := add1(t, bwd, ir.Add, nil, h, rd)
	gy := add1(t, bwd, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, g2)
	bwd.Results = []*ir.Value{g2, gy}
	bop := addOp(t, f.Body, ir.Scan, []*ir.Value{fop.Results[0], pw, fop.Results[1]}, ir.Attrs{"num_consts": 0, "num_carry": 1, "length": L, "reverse": true}, bwd)
	f.Body.Results = []*ir.Value{fop.Results[0], fop.Results[1], bop.Results[0], bop.Results[1]}
	return f
}

// runWith executes e on a copy of args with the copy settings of the
// environment variables given.
func runWith(t *testing.T, e *Executable, args []*ir.Literal, async, gbps string) []*ir.Literal {
	t.Helper()
	t.Setenv("FERRY_ASYNC_COPY", async)
	t.Setenv("FERRY_HOST_COPY_GBPS", gbps)
	a := &countAlloc{}
	got, rel, err := e.Execute(cloneAll(args), a)
	require.NoError(t, err)
	out := cloneAll(got)
	for _, r := range rel {
		r()
	}
	a.requireReleased(t, true)
	return out
}

// The offloaded scans compiled by the real pipeline give eval's bits with
// asynchronous copies on and off, over a fast and a slow simulated link; the
// stacked residuals are in pinned_host and the reverse scan reads them in
// reverse order.
func TestAsyncCopyOffloadScan(t *testing.T) {
	const L, n = 5, 24
	f := offloadScanFunc(t, L, n)
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(t, err)
	e, err := New(p)
	require.NoError(t, err)
	copies, prefetched := copySteps(e.body)
	require.Equal(t, 5, copies, "every device_put between spaces is a copy step")
	require.Positive(t, prefetched, "some copies of xs slices are double buffered")
	r := freshRand(t)
	args := randArgs(r, f)
	for i := 0; i < args[1].Type.Size(); i++ {
		args[1].SetFloat64At(i, (r.Float64()*2-1)/float64(n)*2)
	}
	want, err := eval.Run(f, cloneAll(args))
	require.NoError(t, err)
	require.Equal(t, ir.PinnedHost, want[1].Type.Space, "residuals stacked in pinned_host")
	require.Equal(t, ir.PinnedHost, want[3].Type.Space)

	// An independent float64 check, layer by layer from eval's own f32
	// values: residual 0 is x, residual l+1 (then the final carry) is
	// tanh(residual l @ w[l]); the reverse scan's ys slice l is
	// tanh(prev @ w[l]) + residual l with prev the next slice (the final
	// carry for l = L-1): the residuals are read in reverse order.
	at := func(l *ir.Literal, k, i int) float64 { return l.Float64At(k*n*n + i) }
	layer := func(in func(int) float64, l int, i int) float64 {
		row, col := i/n, i%n
		var s float64
		for j := 0; j < n; j++ {
			s += in(row*n+j) * at(args[1], l, j*n+col)
		}
		return math.Tanh(s)
	}
	for i := 0; i < n*n; i++ {
		require.Equal(t, args[0].Float64At(i), at(want[1], 0, i), "residual 0 is x")
	}
	for l := 0; l < L; l++ {
		in := func(i int) float64 { return at(want[1], l, i) }
		for i := 0; i < n*n; i++ {
			next := want[0].Float64At(i)
			if l+1 < L {
				next = at(want[1], l+1, i)
			}
			require.InDelta(t, layer(in, l, i), next, 1e-5, "forward layer %d", l)
		}
	}
	for l := L - 1; l >= 0; l-- {
		prev := func(i int) float64 { return want[0].Float64At(i) }
		if l+1 < L {
			prev = func(i int) float64 { return at(want[3], l+1, i) }
		}
		for i := 0; i < n*n; i++ {
			require.InDelta(t, layer(prev, l, i)+at(want[1], l, i), at(want[3], l, i), 1e-5, "reverse layer %d", l)
		}
	}
	require.True(t, bytes.Equal(want[2].Data, want[3].Data[:n*n*4]), "final reverse carry is ys slice 0")

	for _, c := range []struct{ async, gbps string }{{"1", ""}, {"0", ""}, {"1", "0.02"}, {"0", "0.02"}, {"", "0.5"}} {
		got := runWith(t, e, args, c.async, c.gbps)
		for i := range want {
			require.True(t, got[i].Type.Equal(want[i].Type))
			require.True(t, bytes.Equal(got[i].Data, want[i].Data), "async=%q gbps=%q: result %d differs", c.async, c.gbps, i)
		}
	}
}

// copySteps counts the copy steps of g and its nested regions, and the
// double-buffered ones.
func copySteps(g *region) (copies, prefetched int) {
	for i, st := range g.steps {
		if st.kind == stepCopy {
			copies++
			if g.sched.Steps[i].Prefetched {
				prefetched++
			}
		}
		for _, s := range st.subs {
			c, p := copySteps(s)
			copies, prefetched = copies+c, prefetched+p
		}
	}
	return
}

// A copy's source buffer reused by a later value, and a copy nobody reads
// whose destination is reused: the executor waits for the copy before the
// step that overwrites either, and the results are eval's with a slow link.
func TestAsyncCopyBufferReuse(t *testing.T) {
	f := ir.NewFunc("reuse")
	vT := ir.TypeOf(ir.Float32, 512)
	a := f.Body.AddParam(vT)
	t1 := add1(t, f.Body, ir.Mul, nil, a, a)                                           // 0: device temp
	h := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, t1)           // 1: reads t1
	u := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, a)            // 2: nobody reads u
	t2 := add1(t, f.Body, ir.Add, nil, a, a)                                           // 3: over t1
	v := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, t2)           // 4: over u
	back := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.Device}, h)             // 5
	back2 := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.Device}, v)            // 6
	out := add1(t, f.Body, ir.Sub, nil, add1(t, f.Body, ir.Mul, nil, back, t2), back2) // 7, 8
	f.Body.Results = []*ir.Value{out}
	p := naivePlan(f, planOpts{})
	b := p.Plan.Values[t1]
	b2 := p.Plan.Values[t2]
	b2.Offset = b.Offset
	p.Plan.Values[t2] = b2
	bv := p.Plan.Values[v]
	bv.Offset = p.Plan.Values[u].Offset
	p.Plan.Values[v] = bv
	e, err := New(p)
	require.NoError(t, err)
	waits := func(i int) []int { return e.body.sched.Steps[i].Wait }
	require.Equal(t, []int{1}, waits(3), "t2 overwrites the source of copy 1")
	require.Equal(t, []int{3}, waits(4), "v's copy reads t2 (and writes over u after copy 2 on its queue)")
	require.Equal(t, []int{1}, waits(5), "back copies h back")
	require.Equal(t, []int{4}, waits(6), "back2 copies v back")
	require.Equal(t, []int{5}, waits(7), "back is read by step 7")
	require.Equal(t, []int{6}, waits(8), "back2 is read by step 8")
	_ = u
	args := randArgs(freshRand(t), f)
	want, err := eval.Run(f, cloneAll(args))
	require.NoError(t, err)
	for _, c := range []struct{ async, gbps string }{{"1", "0.005"}, {"0", ""}, {"1", ""}} {
		got := runWith(t, e, args, c.async, c.gbps)
		require.True(t, bytes.Equal(got[0].Data, want[0].Data), "async=%q gbps=%q", c.async, c.gbps)
	}
}

// Bad settings are errors that name the variable.
func TestAsyncCopySettings(t *testing.T) {
	f := ir.NewFunc("put")
	a := f.Body.AddParam(ir.TypeOf(ir.Float32, 4))
	f.Body.Results = []*ir.Value{add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, a)}
	e, err := New(naivePlan(f, planOpts{}))
	require.NoError(t, err)
	for _, c := range []struct{ name, val string }{{"FERRY_ASYNC_COPY", "maybe"}, {"FERRY_HOST_COPY_GBPS", "-1"}, {"FERRY_HOST_COPY_GBPS", "fast"}} {
		t.Setenv(c.name, c.val)
		_, _, err := e.Execute(randArgs(freshRand(t), f), &countAlloc{})
		require.ErrorContains(t, err, c.name)
		t.Setenv(c.name, "")
	}
}
