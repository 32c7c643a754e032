//go:build linux && (amd64 || arm64)

package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// fsdpSrc is one device's program of an FSDP-style scan over 3 layers on a
// mesh axis "x" of 2 devices: each layer all-gathers its weight (an xs
// slice, f32[2,4] per device), computes h' = tanh(h @ W), and
// reduce-scatters the layer's "gradient" h'ᵀ h' into a ys slice.
const fsdpSrc = `func @fsdp(%0: f32[2,4], %1: f32[3,2,4]) -> (f32[2,4], f32[3,2,4]) {
  %20, %21 = scan(%0, %1) {length=3, num_carry=1, num_consts=0, reverse=false} (
    ^(%3: f32[2,4], %4: f32[2,4]) {
      %6 = all_gather(%4) {axis="x", dimension=0, size=2, tiled=true} : f32[4,4]
      %7 = dot_general(%3, %6) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,4]
      %8 = tanh(%7) : f32[2,4]
      %11 = dot_general(%8, %8) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[4,4]
      %12 = reduce_scatter(%11) {axis="x", dimension=0, size=2, tiled=true} : f32[2,4]
      return %8, %12
    }) : f32[2,4], f32[3,2,4]
  return %20, %21
}`

// fsdpRef computes fsdpSrc's results for every rank in float64.
func fsdpRef(h0, w [][]float64) (h, g [][]float64) {
	const L, B, K, n = 3, 2, 4, 2
	h, g = make([][]float64, n), make([][]float64, n)
	for r := range n {
		h[r], g[r] = h0[r], make([]float64, L*B*K)
	}
	for l := range L {
		var W []float64 // [n·B, K]: the ranks' slices, rank-major
		for r := range n {
			W = append(W, w[r][l*B*K:(l+1)*B*K]...)
		}
		sum := make([]float64, K*K)
		for r := range n {
			h1 := make([]float64, B*K)
			for i := range B {
				for j := range K {
					for k := range K {
						h1[i*K+j] += h[r][i*K+k] * W[k*K+j]
					}
					h1[i*K+j] = math.Tanh(h1[i*K+j])
				}
			}
			for i := range K {
				for j := range K {
					for b := range B {
						sum[i*K+j] += h1[b*K+i] * h1[b*K+j]
					}
				}
			}
			h[r] = h1
		}
		for r := range n {
			copy(g[r][l*B*K:(l+1)*B*K], sum[r*B*K:(r+1)*B*K])
		}
	}
	return h, g
}

// The collectives of an FSDP scan run on the collective stream beside
// compute: with two ranks on the fake driver and the fake NCCL, the results
// match a float64 reference; every NCCL call is on its rank's collective
// stream; the race check finds every conflicting pair of stream operations
// ordered by events; the next layer's all_gather (prefetched) is issued
// during the previous iteration, beside compute kernels of it, and each layer's reduce_scatter but the last is not ordered
// before the whole next iteration's compute (it runs on into it).
func TestFSDPCollectivesOverlapOnDevice(t *testing.T) {
	fake, bs, g := fakeRanks(t, 2)
	rng := testseed.Rand(t, 29)
	args := make([][]*ir.Literal, 2)
	h0, w := make([][]float64, 2), make([][]float64, 2)
	for r := range 2 {
		h := randomLiteral(rng, ir.TypeOf(ir.Float32, 2, 4))
		x := randomLiteral(rng, ir.TypeOf(ir.Float32, 3, 2, 4))
		args[r] = []*ir.Literal{h, x}
		h0[r], w[r] = float64s(h), float64s(x)
	}
	exes, outs, errs := runRanks(t, bs, g, fsdpSrc, args, nil, true)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	body := exes[0].steps[0].subs[0]
	if len(body.sched.Prefetch) != 1 || len(body.sched.Carried) != 1 {
		t.Fatalf("the body's schedule prefetches %v and carries %v, want the all_gather and the reduce_scatter", body.sched.Prefetch, body.sched.Carried)
	}
	wantH, wantG := fsdpRef(h0, w)
	for r := range 2 {
		for k, want := range [][]float64{wantH[r], wantG[r]} {
			got := float64s(outs[r][k])
			for i := range got {
				if math.Abs(got[i]-want[i]) > 1e-5*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("rank %d: result %d, element %d is %v, want %v\ngot  %v\nwant %v", r, k, i, got[i], want[i], got, want)
				}
			}
		}
	}
	checkCollectiveStreams(t, fake, bs, exes, g, true)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	ops := fake.streams.ops
	// before reports that op a completes before op b starts.
	before := func(a, b fakeOp) bool { return a.stream < len(b.clock) && b.clock[a.stream] >= a.clock[a.stream] }
	for r, b := range bs {
		compute, coll := fake.streams.index[b.streams[Compute]], fake.streams.index[b.streams[Coll]]
		var gathers, scatters []int
		for i, op := range ops {
			switch {
			case op.stream == coll && strings.HasPrefix(op.what, "ncclAllGather"):
				gathers = append(gathers, i)
			case op.stream == coll && strings.HasPrefix(op.what, "ncclReduceScatter"):
				scatters = append(scatters, i)
			}
		}
		if len(gathers) != 3 || len(scatters) != 3 {
			t.Fatalf("rank %d: %d all_gathers and %d reduce_scatters on the collective stream, want 3 and 3", r, len(gathers), len(scatters))
		}
		// The gather of layer l+1 is issued during iteration l, before
		// compute kernels of that iteration it does not wait for.
		for l, k := range gathers[1:] {
			early := false
			for _, c := range ops[k+1 : max(k+1, scatters[l])] {
				early = early || c.stream == compute && strings.HasPrefix(c.what, "ferry_") && !before(c, ops[k])
			}
			if !early {
				t.Errorf("rank %d: the prefetched all_gather (op %d) is not issued beside iteration %d's compute", r, k, l)
			}
		}
		for _, k := range scatters[:2] {
			late := false
			for _, c := range ops[k+1:] {
				late = late || c.stream == compute && strings.HasPrefix(c.what, "ferry_") && !before(ops[k], c)
			}
			if !late {
				t.Errorf("rank %d: every later compute kernel waits for the reduce_scatter (op %d)", r, k)
			}
		}
	}
}
