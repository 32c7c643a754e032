//go:build linux && (amd64 || arm64)

package cuda

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// fakeRanks returns n backends over one fake driver that runs the kernels
// it launches and records stream operations, and a fake NCCL group of n
// ranks over its memory: rank r is backends[r].
func fakeRanks(t *testing.T, n int) (*fakeCUDA, []*Backend, *fakeNCCL) {
	t.Helper()
	fake, d := newFakeCUDA(t)
	fake.recordStreams()
	fake.executeKernels(t)
	t.Setenv(rt.EnvDeviceMemory, "8MiB")
	var bs []*Backend
	for range n {
		b, err := newBackend(d)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return fake, bs, newFakeNCCL(fake, n)
}

// runRanks compiles src (a per-device program with collectives over axis
// "x") on every rank's backend and runs it on all ranks at once, rank r
// with args[r] and the fake group's communicators (comms false: none).
func runRanks(t *testing.T, bs []*Backend, g *fakeNCCL, src string, args [][]*ir.Literal, ctx context.Context, comms bool) ([]*executable, [][]*ir.Literal, []error) {
	t.Helper()
	n := len(bs)
	exes := make([]*executable, n)
	for r, b := range bs {
		f, err := ir.Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		e, err := b.Compile(f, backend.CompileOptions{BoundAxes: []string{"x"}})
		if err != nil {
			t.Fatalf("rank %d: Compile: %v", r, err)
		}
		exes[r] = e.(*executable)
	}
	outs := make([][]*ir.Literal, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var in []trace.Buffer
			for _, l := range args[r] {
				buf, err := bs[r].FromLiteral(l)
				if err != nil {
					errs[r] = err
					return
				}
				in = append(in, buf)
			}
			opts := backend.ExecOptions{Context: ctx}
			if comms {
				opts.DeviceComms = g.comms(r, "x")
			}
			res, err := exes[r].Execute(in, opts)
			if err != nil {
				errs[r] = err
				return
			}
			for _, b := range res {
				l, err := b.Literal()
				if err != nil {
					errs[r] = err
					return
				}
				outs[r] = append(outs[r], l)
			}
		}()
	}
	wg.Wait()
	return exes, outs, errs
}

// blocks returns the n blocks of a (row-major, shape) along dimension d.
func blocks(a []float64, shape []int, d, n int) [][]float64 {
	outer, inner := ir.Shape(shape[:d]).Size(), ir.Shape(shape[d+1:]).Size()*shape[d]/n
	out := make([][]float64, n)
	for j := range n {
		for o := range outer {
			base := o*shape[d]*ir.Shape(shape[d+1:]).Size() + j*inner
			out[j] = append(out[j], a[base:base+inner]...)
		}
	}
	return out
}

// concat concatenates parts, each of shape, along dimension d.
func concat(parts [][]float64, shape []int, d int) []float64 {
	outer, inner := ir.Shape(shape[:d]).Size(), ir.Shape(shape[d:]).Size()
	var out []float64
	for o := range outer {
		for _, p := range parts {
			out = append(out, p[o*inner:(o+1)*inner]...)
		}
	}
	return out
}

func float64s(l *ir.Literal) []float64 {
	out := make([]float64, l.Type.Size())
	for i := range out {
		out[i] = l.Float64At(i)
	}
	return out
}

// collCase is a per-device program of two ranks: the square of its
// operand (a producer kernel), a collective over "x", and twice its result
// (a consumer kernel), with the reference of the collective's result on
// each rank computed from the ranks' squared operands.
type collCase struct {
	name       string
	in, out    []int // operand and result shapes
	collective string
	ref        func(sq [][]float64, in []int) [][]float64
}

var collCases = []collCase{
	{"all_reduce_sum", []int{3, 4}, []int{3, 4}, `all_reduce(%1) {axis="x", reduction="sum", size=2}`,
		func(sq [][]float64, _ []int) [][]float64 {
			s := make([]float64, len(sq[0]))
			for i := range s {
				s[i] = sq[0][i] + sq[1][i]
			}
			return [][]float64{s, s}
		}},
	{"all_reduce_max", []int{5}, []int{5}, `all_reduce(%1) {axis="x", reduction="max", size=2}`,
		func(sq [][]float64, _ []int) [][]float64 {
			s := make([]float64, len(sq[0]))
			for i := range s {
				s[i] = math.Max(sq[0][i], sq[1][i])
			}
			return [][]float64{s, s}
		}},
	{"all_gather_dim0_stacked", []int{4}, []int{2, 4}, `all_gather(%1) {axis="x", dimension=0, size=2}`,
		func(sq [][]float64, in []int) [][]float64 {
			g := concat(sq, []int{1, 4}, 0)
			return [][]float64{g, g}
		}},
	{"all_gather_dim1_tiled", []int{3, 4}, []int{3, 8}, `all_gather(%1) {axis="x", dimension=1, size=2, tiled=true}`,
		func(sq [][]float64, in []int) [][]float64 {
			g := concat(sq, in, 1)
			return [][]float64{g, g}
		}},
	{"all_gather_dim2_stacked", []int{2, 3}, []int{2, 3, 2}, `all_gather(%1) {axis="x", dimension=2, size=2}`,
		func(sq [][]float64, in []int) [][]float64 {
			g := concat(sq, []int{2, 3, 1}, 2)
			return [][]float64{g, g}
		}},
	{"reduce_scatter_dim0", []int{4, 3}, []int{2, 3}, `reduce_scatter(%1) {axis="x", dimension=0, size=2, tiled=true}`,
		func(sq [][]float64, in []int) [][]float64 { return sumBlocks(sq, in, 0) }},
	{"reduce_scatter_dim1", []int{3, 4}, []int{3, 2}, `reduce_scatter(%1) {axis="x", dimension=1, size=2, tiled=true}`,
		func(sq [][]float64, in []int) [][]float64 { return sumBlocks(sq, in, 1) }},
	{"reduce_scatter_dim1_stacked", []int{3, 2}, []int{3}, `reduce_scatter(%1) {axis="x", dimension=1, size=2}`,
		func(sq [][]float64, in []int) [][]float64 { return sumBlocks(sq, in, 1) }},
	{"all_to_all_split1_concat0", []int{3, 4}, []int{6, 2}, `all_to_all(%1) {axis="x", concat_dimension=0, size=2, split_dimension=1}`,
		func(sq [][]float64, in []int) [][]float64 { return allToAll(sq, in, 1, 0) }},
	{"all_to_all_split0_concat1", []int{4, 3}, []int{2, 6}, `all_to_all(%1) {axis="x", concat_dimension=1, size=2, split_dimension=0}`,
		func(sq [][]float64, in []int) [][]float64 { return allToAll(sq, in, 0, 1) }},
	{"collective_permute_swap", []int{6}, []int{6}, `collective_permute(%1) {axis="x", pairs=[0, 1, 1, 0], size=2}`,
		func(sq [][]float64, _ []int) [][]float64 { return [][]float64{sq[1], sq[0]} }},
	{"collective_permute_one_way", []int{6}, []int{6}, `collective_permute(%1) {axis="x", pairs=[0, 1], size=2}`,
		func(sq [][]float64, _ []int) [][]float64 { return [][]float64{make([]float64, 6), sq[0]} }},
	{"collective_permute_self", []int{6}, []int{6}, `collective_permute(%1) {axis="x", pairs=[0, 0, 1, 1], size=2}`,
		func(sq [][]float64, _ []int) [][]float64 { return sq }},
}

func sumBlocks(sq [][]float64, in []int, d int) [][]float64 {
	s := make([]float64, len(sq[0]))
	for i := range s {
		s[i] = sq[0][i] + sq[1][i]
	}
	return blocks(s, in, d, 2)
}

func allToAll(sq [][]float64, in []int, sd, cd int) [][]float64 {
	blk := append([]int{}, in...)
	blk[sd] /= 2
	out := make([][]float64, 2)
	for r := range 2 {
		var parts [][]float64
		for j := range 2 {
			parts = append(parts, blocks(sq[j], in, sd, 2)[r])
		}
		out[r] = concat(parts, blk, cd)
	}
	return out
}

func shapeText(s []int) string {
	return strings.Trim(strings.Join(strings.Fields(fmt.Sprint(s)), ","), "[]")
}

// src is the case's program: the operand arrives in pinned_host and is
// copied to the device (H2D stream), squared, run through the collective,
// doubled, and copied back to pinned_host (D2H stream), so that the
// collective sits between steps of three streams.
func (c collCase) src() string {
	in, out := shapeText(c.in), shapeText(c.out)
	return fmt.Sprintf(`func @%[1]s(%%0: f32[%[2]s]{pinned_host}) -> (f32[%[3]s]{pinned_host}) {
  %%5 = device_put(%%0) {space=#device} : f32[%[2]s]
  %%1 = mul(%%5, %%5) : f32[%[2]s]
  %%2 = %[4]s : f32[%[3]s] loc("coll.go:3")
  %%3 = add(%%2, %%2) : f32[%[3]s]
  %%4 = device_put(%%3) {space=#pinned_host} : f32[%[3]s]{pinned_host}
  return %%4
}`, c.name, in, out, c.collective)
}

// The CUDA backend runs each collective through the device communicators
// of ExecOptions.DeviceComms on the collective stream beside compute: with
// two ranks on the fake driver and the fake NCCL, the results match
// float64 references of the collectives' meaning, every NCCL call is on the
// rank's collective stream, the compute stream runs only the producer and
// consumer kernels, and the race check finds every conflicting pair of
// stream operations ordered (the collective waits for its producer, its
// consumer and the copy streams' steps for it).
func TestCollectivesOnDevice(t *testing.T) {
	for _, c := range collCases {
		t.Run(c.name, func(t *testing.T) {
			fake, bs, g := fakeRanks(t, 2)
			rng := testseed.Rand(t, 5)
			args := make([][]*ir.Literal, 2)
			sq := make([][]float64, 2)
			for r := range 2 {
				l := randomLiteral(rng, ir.TypeOf(ir.Float32, c.in...).WithSpace(ir.PinnedHost))
				args[r] = []*ir.Literal{l}
				for _, v := range float64s(l) {
					sq[r] = append(sq[r], float64(float32(v)*float32(v)))
				}
			}
			exes, outs, errs := runRanks(t, bs, g, c.src(), args, nil, true)
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			want := c.ref(sq, c.in)
			for r := range 2 {
				got := float64s(outs[r][0])
				if len(got) != len(want[r]) {
					t.Fatalf("rank %d: %d elements, want %d", r, len(got), len(want[r]))
				}
				for i := range got {
					// The reference reduces the ranks' squares in float64;
					// the fake NCCL (like NCCL's ring) adds f32 values in rank
					// order and the kernels round each step to f32: a few ulps
					// of Σ|x| over 2–3 ranks, inside mismatch's 1e-5.
					if w := 2 * want[r][i]; math.Abs(got[i]-w) > 1e-5*math.Max(1, math.Abs(w)) {
						t.Fatalf("rank %d: element %d is %v, want %v\ngot  %v\nwant %v", r, i, got[i], w, got, want[r])
					}
				}
			}
			checkCollectiveStreams(t, fake, bs, exes, g, !strings.HasSuffix(c.name, "_self"))
			checkComputeKernels(t, fake, bs)
		})
	}
}

// checkCollectiveStreams checks every NCCL call was made on its rank's
// collective stream and that no two stream operations race (so the
// collectives were ordered after their producers and before their
// consumers by events). nccl false: the case makes no NCCL call (a permute
// of every rank to itself is a device copy).
func checkCollectiveStreams(t *testing.T, fake *fakeCUDA, bs []*Backend, exes []*executable, g *fakeNCCL, nccl bool) {
	t.Helper()
	g.mu.Lock()
	calls := append([]fakeNCCLCall(nil), g.calls...)
	g.mu.Unlock()
	if nccl && len(calls) == 0 {
		t.Fatal("no NCCL call was made")
	}
	for _, c := range calls {
		if want := bs[c.rank].streams[Coll]; c.stream != want {
			t.Errorf("rank %d: %s on stream %#x, want the collective stream %#x", c.rank, c.fn, c.stream, want)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	kernels := map[string]*Kernel{}
	for _, e := range exes {
		for k, v := range kernelsOf(e) {
			kernels[k] = v
		}
	}
	if races := fake.streams.races(kernels); len(races) > 0 {
		t.Fatalf("unordered stream operations:\n%s", strings.Join(races, "\n"))
	}
	for r, b := range bs {
		if nccl && !slices.ContainsFunc(fake.streams.ops, func(op fakeOp) bool {
			return op.stream == fake.streams.index[b.streams[Coll]] && strings.HasPrefix(op.what, "nccl")
		}) {
			t.Errorf("rank %d: no NCCL call on the collective stream", r)
		}
	}
}

// checkComputeKernels checks that each rank's compute stream ran its
// producer and consumer kernels only (no NCCL call, no transpose).
func checkComputeKernels(t *testing.T, fake *fakeCUDA, bs []*Backend) {
	t.Helper()
	fake.mu.Lock()
	defer fake.mu.Unlock()
	for r, b := range bs {
		lane := fake.streams.index[b.streams[Compute]]
		var kernels []string
		for _, op := range fake.streams.ops {
			if op.stream == lane && (strings.HasPrefix(op.what, "ferry_") || strings.HasPrefix(op.what, "nccl")) {
				kernels = append(kernels, op.what)
			}
		}
		if len(kernels) != 2 || !strings.HasPrefix(kernels[0], "ferry_fusion") || !strings.HasPrefix(kernels[1], "ferry_fusion") {
			t.Errorf("rank %d: the compute stream runs %q, want the producer kernel and the consumer kernel only", r, kernels)
		}
	}
}

// axis_index writes each rank's index.
func TestAxisIndexOnDevice(t *testing.T) {
	_, bs, g := fakeRanks(t, 2)
	src := `func @ai(%0: f32[2]) -> (i32[]) {
  %1 = axis_index() {axis="x", size=2} : i32[]
  return %1
}`
	args := [][]*ir.Literal{{ir.NewLiteral(ir.TypeOf(ir.Float32, 2))}, {ir.NewLiteral(ir.TypeOf(ir.Float32, 2))}}
	_, outs, errs := runRanks(t, bs, g, src, args, nil, true)
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if got := outs[r][0].Float64At(0); got != float64(r) {
			t.Errorf("rank %d: axis_index = %v", r, got)
		}
	}
}

// Errors: no communicator for the axis, a communicator of the wrong size, an
// NCCL call that fails, an asynchronous NCCL error and a cancelled context
// each fail the execution with an error naming the collective (with its Go
// location) or the axis and the rank; every failure aborts the
// communicators, so no rank waits forever for another.
func TestCollectiveErrors(t *testing.T) {
	src := collCases[0].src()
	mk := func(rng *rand.Rand) [][]*ir.Literal {
		t32 := ir.TypeOf(ir.Float32, 3, 4).WithSpace(ir.PinnedHost)
		return [][]*ir.Literal{{randomLiteral(rng, t32)}, {randomLiteral(rng, t32)}}
	}
	rng := testseed.Rand(t, 9)

	t.Run("no communicator", func(t *testing.T) {
		_, bs, g := fakeRanks(t, 2)
		_, _, errs := runRanks(t, bs, g, src, mk(rng), nil, false)
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), `unbound axis name "x"`) || !strings.Contains(err.Error(), "coll.go:3") ||
				!strings.Contains(err.Error(), "DeviceComms") {
				t.Errorf("rank %d: got %v, want an unbound axis error naming the op's location and DeviceComms", r, err)
			}
		}
	})

	t.Run("wrong size", func(t *testing.T) {
		fake, bs, _ := fakeRanks(t, 2)
		g3 := newFakeNCCL(fake, 3)
		_, _, errs := runRanks(t, bs, g3, src, mk(rng), nil, true)
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), `axis "x" has size 2 in the program, but its communicator has 3 ranks`) || !strings.Contains(err.Error(), "coll.go:3") {
				t.Errorf("rank %d: got %v, want an error naming both sizes and the op's location", r, err)
			}
		}
	})

	t.Run("nccl call fails", func(t *testing.T) {
		_, bs, g := fakeRanks(t, 2)
		g.failCall = "ncclAllReduce"
		_, _, errs := runRanks(t, bs, g, src, mk(rng), nil, true)
		for r, err := range errs {
			want := fmt.Sprintf("rank %d of 2 on axis \"x\"", r)
			if err == nil || !strings.Contains(err.Error(), "ncclSystemError") || !strings.Contains(err.Error(), "all_reduce") ||
				!strings.Contains(err.Error(), "coll.go:3") || !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: got %v, want the NCCL error naming all_reduce, its location and %q", r, err, want)
			}
		}
		if g.aborts == 0 {
			t.Error("the communicators were not aborted")
		}
	})

	t.Run("async error", func(t *testing.T) {
		fake, bs, g := fakeRanks(t, 2)
		fake.notReady = true // the collective stays pending
		g.asyncErr = errors.New("nccl: remote process exited (ncclRemoteError)")
		_, _, errs := runRanks(t, bs, g, src, mk(rng), nil, true)
		for r, err := range errs {
			want := fmt.Sprintf("collectives on axis \"x\" failed on rank %d of 2", r)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "ncclRemoteError") || !strings.Contains(err.Error(), "coll.go:3") {
				t.Errorf("rank %d: got %v, want an error containing %q, the NCCL error and the last collective's location", r, err, want)
			}
		}
		if g.aborts == 0 {
			t.Error("the communicators were not aborted")
		}
	})

	t.Run("timeout", func(t *testing.T) {
		fake, bs, g := fakeRanks(t, 2)
		fake.notReady = true // a peer that hangs without an error
		t.Setenv(collective.TimeoutEnv, "1ms")
		_, _, errs := runRanks(t, bs, g, src, mk(rng), nil, true)
		for r, err := range errs {
			if !errors.Is(err, ErrCollectiveTimeout) || !strings.Contains(err.Error(), "coll.go:3") || !strings.Contains(err.Error(), fmt.Sprintf("rank %d", r)) {
				t.Errorf("rank %d: got %v, want a timeout naming the collective and the rank", r, err)
			}
		}
		if g.aborts == 0 {
			t.Error("the communicators were not aborted")
		}
		t.Setenv(collective.TimeoutEnv, "soon")
		_, _, errs = runRanks(t, bs, newFakeNCCL(fake, 2), src, mk(rng), nil, true)
		if errs[0] == nil || !strings.Contains(errs[0].Error(), collective.TimeoutEnv+`="soon": want a duration`) {
			t.Errorf("a bad timeout: %v", errs[0])
		}
	})

	t.Run("context cancelled", func(t *testing.T) {
		fake, bs, g := fakeRanks(t, 2)
		fake.notReady = true
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _, errs := runRanks(t, bs, g, src, mk(rng), ctx, true)
		for r, err := range errs {
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "aborted") || !strings.Contains(err.Error(), "coll.go:3") {
				t.Errorf("rank %d: got %v, want an error wrapping context.Canceled that names the collective and the abort", r, err)
			}
		}
		if g.aborts == 0 {
			t.Error("the communicators were not aborted")
		}
	})
}

// Collectives inside control flow: of a constant operand, in the branches
// of a cond (both ranks take the same one), and in both regions of a while
// loop whose trip count an all_reduce decides (so the predicate is read
// back while the execution holds communicators), with a collective_permute
// in its body; two ranks.
func TestCollectivesInControlFlowOnDevice(t *testing.T) {
	const src = `func @ctl(%0: f32[4], %1: bool[]) -> (f32[4], i32[], f32[4], i32[], f32[4]) {
  %2 = constant() {value=dense<f32[4], [1, 2, 3, 4]>} : f32[4]
  %3 = all_reduce(%2) {axis="x", reduction="sum", size=2} : f32[4]
  %4 = axis_index() {axis="x", size=2} : i32[]
  %5 = cond(%1, %0) (
    ^(%6: f32[4]) {
      %7 = all_reduce(%6) {axis="x", reduction="max", size=2} : f32[4]
      return %7
    },
    ^(%8: f32[4]) {
      %9 = all_reduce(%8) {axis="x", reduction="min", size=2} : f32[4]
      return %9
    }) : f32[4]
  %10 = constant() {value=dense<i32[], 0>} : i32[]
  %20, %21 = while(%10, %0) {num_consts=0} (
    ^(%11: i32[], %12: f32[4]) {
      %13 = all_reduce(%11) {axis="x", reduction="sum", size=2} : i32[]
      %14 = constant() {value=dense<i32[], 6>} : i32[]
      %15 = lt(%13, %14) : bool[]
      return %15
    },
    ^(%16: i32[], %17: f32[4]) {
      %18 = constant() {value=dense<i32[], 1>} : i32[]
      %19 = add(%16, %18) : i32[]
      %22 = collective_permute(%17) {axis="x", pairs=[0, 1, 1, 0], size=2} : f32[4]
      return %19, %22
    }) : i32[], f32[4]
  return %3, %4, %5, %20, %21
}`
	rng := testseed.Rand(t, 17)
	for _, pred := range []bool{true, false} {
		t.Run(fmt.Sprint(pred), func(t *testing.T) { runControlFlowRanks(t, src, pred, rng) })
	}
}

// runControlFlowRanks runs the control-flow program on two fake ranks with
// predicate pred and checks its results.
func runControlFlowRanks(t *testing.T, src string, pred bool, rng *rand.Rand) {
	_, bs, g := fakeRanks(t, 2)
	xs := make([][]float64, 2)
	args := make([][]*ir.Literal, 2)
	for r := range 2 {
		l := randomLiteral(rng, ir.TypeOf(ir.Float32, 4))
		xs[r] = float64s(l)
		args[r] = []*ir.Literal{l, ir.Scalar(pred)}
	}
	_, outs, errs := runRanks(t, bs, g, src, args, nil, true)
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("pred %v, rank %d: %v", pred, r, errs[r])
		}
		o := outs[r]
		for i, w := range []float64{2, 4, 6, 8} {
			if got := o[0].Float64At(i); got != w {
				t.Errorf("pred %v, rank %d: all_reduce of the constant: element %d is %v, want %v", pred, r, i, got, w)
			}
		}
		if got := o[1].Float64At(0); got != float64(r) {
			t.Errorf("pred %v, rank %d: axis_index %v", pred, r, got)
		}
		for i := range 4 {
			w := math.Min(xs[0][i], xs[1][i])
			if pred {
				w = math.Max(xs[0][i], xs[1][i])
			}
			if got := o[2].Float64At(i); got != w {
				t.Errorf("pred %v, rank %d: cond: element %d is %v, want %v", pred, r, i, got, w)
			}
			// Three swaps: each rank ends with the other's operand.
			if got := o[4].Float64At(i); got != xs[1-r][i] {
				t.Errorf("pred %v, rank %d: while: element %d is %v, want %v", pred, r, i, got, xs[1-r][i])
			}
		}
		if got := o[3].Float64At(0); got != 3 {
			t.Errorf("pred %v, rank %d: while ran %v times, want 3", pred, r, got)
		}
	}
}
