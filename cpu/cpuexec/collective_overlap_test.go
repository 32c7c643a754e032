package cpuexec

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
)

// overlapSrc is one device's program of an FSDP-style scan over 3 layers on
// a mesh axis "y" of 4 devices: each layer all-gathers its two weights
// (xs), computes h' = tanh(h @ W1) @ W2, reduce-scatters the layer's
// "gradient" h1ᵀ @ h' into a ys slice and offloads h1 = tanh(h @ W1) to
// pinned_host (a copy beside the collectives).
const overlapSrc = `func @fsdp(%0: f32[2,8], %1: f32[3,2,8], %2: f32[3,2,8]) -> (f32[2,8], f32[3,2,8], f32[3,2,8]{pinned_host}) {
  %20, %21, %22 = scan(%0, %1, %2) {length=3, num_carry=1, num_consts=0, reverse=REVERSE} (
    ^(%3: f32[2,8], %4: f32[2,8], %5: f32[2,8]) {
      %6 = all_gather(%4) {axis="y", dimension=0, size=4, tiled=true} : f32[8,8]
      %7 = dot_general(%3, %6) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]
      %8 = tanh(%7) : f32[2,8]
      %9 = all_gather(%5) {axis="y", dimension=0, size=4, tiled=true} : f32[8,8]
      %10 = dot_general(%8, %9) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]
      %11 = dot_general(%8, %10) {lhs_batch=[], lhs_contract=[0], rhs_batch=[], rhs_contract=[0]} : f32[8,8]
      %12 = reduce_scatter(%11) {axis="y", dimension=0, size=4, tiled=true} : f32[2,8]
      %13 = device_put(%8) {space=#pinned_host} : f32[2,8]{pinned_host}
      return %10, %12, %13
    }) : f32[2,8], f32[3,2,8], f32[3,2,8]{pinned_host}
  return %20, %21, %22
}`

// overlapRef computes overlapSrc's results for every device in float64.
func overlapRef(h0, w1, w2 [][]float64, reverse bool) (h, g, off [][]float64) {
	const L, B, K, n = 3, 2, 8, 4
	gather := func(w [][]float64, l int) []float64 {
		var out []float64
		for d := range n {
			out = append(out, w[d][l*B*K:(l+1)*B*K]...)
		}
		return out
	}
	matmul := func(a []float64, ar, ac int, b []float64, bc int, transA bool) []float64 {
		out := make([]float64, ar*bc)
		for i := range ar {
			for j := range bc {
				for k := range ac {
					x := a[i*ac+k]
					if transA {
						x = a[k*ar+i]
					}
					out[i*bc+j] += x * b[k*bc+j]
				}
			}
		}
		return out
	}
	h, g, off = make([][]float64, n), make([][]float64, n), make([][]float64, n)
	for d := range n {
		h[d] = h0[d]
		g[d], off[d] = make([]float64, L*B*K), make([]float64, L*B*K)
	}
	for it := range L {
		l := it
		if reverse {
			l = L - 1 - it
		}
		W1, W2 := gather(w1, l), gather(w2, l)
		grads := make([][]float64, n)
		for d := range n {
			h1 := matmul(h[d], B, K, W1, K, false)
			for i := range h1 {
				h1[i] = math.Tanh(h1[i])
			}
			copy(off[d][l*B*K:], h1)
			h[d] = matmul(h1, B, K, W2, K, false)
			grads[d] = matmul(h1, K, B, h[d], K, true) // h1ᵀ @ h'
		}
		for d := range n {
			for i := range B * K { // device d's rows [2d, 2d+2) of the sum
				for e := range n {
					g[d][l*B*K+i] += grads[e][d*B*K+i]
				}
			}
		}
	}
	return h, g, off
}

// TestCollectiveOverlap runs an FSDP-style scan, forward and reverse, with
// asynchronous collectives (the next layer's all-gathers prefetched on the
// collective worker, the reduce-scatter running on beside the next
// iteration, the offload copy beside the compute) and without: both match a float64 reference and each other bit
// for bit, the gathers are prefetched, and the allocations stay within the
// memory analysis.
func TestCollectiveOverlap(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		t.Run(fmt.Sprintf("reverse=%v", reverse), func(t *testing.T) {
			m := mesh{[]int{4}, []string{"y"}}
			bound := []string{"y"}
			e := compileColl(t, strings.Replace(overlapSrc, "REVERSE", fmt.Sprint(reverse), 1), bound...)
			var gathers int
			for _, st := range e.body.steps {
				for _, sub := range st.subs {
					for _, p := range sub.sched.Prefetch {
						if sub.steps[p.Step].op.Code == ir.AllGather {
							gathers++
						}
					}
				}
			}
			require.Equal(t, 2, gathers, "both layer gathers are prefetched:\n%s", e.prog.Func)
			var carried []string
			for _, st := range e.body.steps {
				for _, sub := range st.subs {
					for _, c := range sub.sched.Carried {
						carried = append(carried, sub.steps[c.Step].op.Code.String())
					}
				}
			}
			require.Equal(t, []string{"reduce_scatter"}, carried, "the reduce-scatter runs on into the next iteration:\n%s", e.prog.Func)
			rng := testseed.Rand(t, 11)
			n := m.size()
			args := make([][]*ir.Literal, n)
			h0, w1, w2 := make([][]float64, n), make([][]float64, n), make([][]float64, n)
			for d := range args {
				args[d] = []*ir.Literal{randLit(rng, e.params[0]), randLit(rng, e.params[1]), randLit(rng, e.params[2])}
				h0[d], w1[d], w2[d] = args[d][0].Float64s(), args[d][1].Float64s(), args[d][2].Float64s()
			}
			want := [3][][]float64{}
			want[0], want[1], want[2] = overlapRef(h0, w1, w2, reverse)
			limit := e.prog.Analysis.TempBytes + e.prog.Analysis.OutputBytes + e.prog.Analysis.HostTempBytes + e.prog.Analysis.HostOutputBytes
			// Asynchronous, in turn, and asynchronous over a simulated
			// interconnect (FERRY_COLLECTIVE_GBPS).
			configs := [][2]string{{"1", ""}, {"0", ""}, {"1", "20"}}
			runs := make([][][]*ir.Literal, len(configs))
			for k, cfg := range configs {
				async := cfg[0]
				t.Setenv(settings.AsyncCollectives.Name, async)
				t.Setenv(settings.CollectiveGBPS.Name, cfg[1])
				allocs := make([]*countAlloc, n)
				for d := range allocs {
					allocs[d] = &countAlloc{}
				}
				for range 2 { // a second run reuses the frames
					outs, errs := runMesh(t, e, m, bound, func(d int) []*ir.Literal { return cloneAll(args[d]) },
						devRun{alloc: func(d int) Allocator { return allocs[d] }})
					for d := range n {
						require.NoError(t, errs[d], "device %d", d)
						for r := range want {
							got := outs[d][r].Float64s()
							for i := range want[r][d] {
								require.InDelta(t, want[r][d][i], got[i], 1e-4*(1+math.Abs(want[r][d][i])), "async=%s device %d result %d element %d", async, d, r, i)
							}
						}
					}
					runs[k] = outs
				}
				for d := range n {
					require.LessOrEqual(t, allocs[d].bytes, 2*limit, "device %d: two runs allocate their analysis each", d)
				}
			}
			for k := range configs[1:] {
				for d := range n {
					for r := range runs[0][d] {
						require.Equal(t, runs[0][d][r].Data, runs[k+1][d][r].Data, "device %d result %d: %v and %v differ", d, r, configs[0], configs[k+1])
					}
				}
			}
		})
	}
}

// TestCollectiveSettingsErrors: a bad FERRY_ASYNC_COLLECTIVES or
// FERRY_COLLECTIVE_GBPS fails the execution, naming the variable.
func TestCollectiveSettingsErrors(t *testing.T) {
	m := mesh{[]int{4}, []string{"y"}}
	e := compileColl(t, strings.Replace(overlapSrc, "REVERSE", "false", 1), "y")
	rng := testseed.Rand(t, 12)
	args := make([][]*ir.Literal, m.size())
	for d := range args {
		args[d] = []*ir.Literal{randLit(rng, e.params[0]), randLit(rng, e.params[1]), randLit(rng, e.params[2])}
	}
	for _, bad := range [][2]string{{settings.AsyncCollectives.Name, "maybe"}, {settings.CollectiveGBPS.Name, "fast"}, {settings.CollectiveGBPS.Name, "-1"}} {
		t.Setenv(bad[0], bad[1])
		_, errs := runMesh(t, e, m, []string{"y"}, func(d int) []*ir.Literal { return cloneAll(args[d]) }, devRun{})
		for d, err := range errs {
			require.ErrorContains(t, err, bad[0], "device %d", d)
		}
		t.Setenv(bad[0], "")
	}
}
