package cpuexec

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
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// ---- a mesh of goroutines ----

// mesh is a device mesh of named axes; device d has the row-major
// coordinates of d.
type mesh struct {
	shape []int
	names []string
}

// axes returns the mesh axes of an axis string ("x", "x,y").
func (m mesh) axes(t testing.TB, axis string) []int {
	var out []int
	for _, name := range strings.Split(axis, ",") {
		i := slices.Index(m.names, name)
		require.GreaterOrEqual(t, i, 0, "axis %q of %v", name, m.names)
		out = append(out, i)
	}
	return out
}

func (m mesh) size() int {
	n := 1
	for _, d := range m.shape {
		n *= d
	}
	return n
}

func (m mesh) coords(d int) []int {
	c := make([]int, len(m.shape))
	for i := len(m.shape) - 1; i >= 0; i-- {
		c[i] = d % m.shape[i]
		d /= m.shape[i]
	}
	return c
}

// group returns the devices of d's group along axis, in group rank order
// (row-major over the listed axes), and d's rank in it: an independent
// reference for collective.MeshAxes.
func (m mesh) group(t testing.TB, axis string, d int) (members []int, rank int) {
	ax := m.axes(t, axis)
	cd := m.coords(d)
	for e := range m.size() {
		ce := m.coords(e)
		same := true
		for i := range cd {
			if !slices.Contains(ax, i) && ce[i] != cd[i] {
				same = false
			}
		}
		if same {
			members = append(members, e)
		}
	}
	key := func(e int) int {
		k, c := 0, m.coords(e)
		for _, a := range ax {
			k = k*m.shape[a] + c[a]
		}
		return k
	}
	slices.SortFunc(members, func(a, b int) int { return key(a) - key(b) })
	return members, slices.Index(members, d)
}

// compileColl parses src and compiles it as the CPU backend does, with the
// collective axes bound.
func compileColl(t testing.TB, src string, bound ...string) *Executable {
	t.Helper()
	f, err := ir.Parse(src)
	require.NoError(t, err)
	p, err := passes.Compile(f, passes.Options{FusionInPlace: true, PrefetchGathers: true, BoundAxes: bound})
	require.NoError(t, err)
	e, err := New(p)
	require.NoError(t, err)
	return e
}

// devRun configures runMesh.
type devRun struct {
	ctx time.Duration // the executions' context timeout (default 20 s: a hang fails)
	// comms, if set, edits device d's communicators before it runs.
	comms func(d int, c map[string]collective.Communicator)
	// alloc, if set, is device d's allocator.
	alloc func(d int) Allocator
	// skip, if set, says which devices do not run the program (after
	// making their communicators).
	skip func(d int) bool
}

// runMesh runs e on every device of m at once, one goroutine each, with
// the communicators of the axis strings bound (made by collective.NewLocal
// and collective.MeshAxes) and args(d) as device d's arguments. It returns
// each device's results and error.
func runMesh(t testing.TB, e *Executable, m mesh, bound []string, args func(d int) []*ir.Literal, o devRun) ([][]*ir.Literal, []error) {
	t.Helper()
	n := m.size()
	world, err := collective.NewLocal(n)
	require.NoError(t, err)
	if o.ctx == 0 {
		o.ctx = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.ctx)
	defer cancel()
	outs, errs := make([][]*ir.Literal, n), make([]error, n)
	in := make([][]*ir.Literal, n)
	for d := range n {
		in[d] = args(d)
	}
	var wg sync.WaitGroup
	for d := range n {
		wg.Go(func() {
			comms := map[string]collective.Communicator{}
			for _, axis := range bound {
				c, err := collective.MeshAxes(ctx, world[d], m.shape, m.axes(t, axis)...)
				if err != nil {
					errs[d] = fmt.Errorf("MeshAxes %q: %w", axis, err)
					return
				}
				comms[axis] = c
			}
			if o.comms != nil {
				o.comms(d, comms)
			}
			if o.skip != nil && o.skip(d) {
				return
			}
			var a Allocator = &countAlloc{}
			if o.alloc != nil {
				a = o.alloc(d)
			}
			outs[d], _, errs[d] = e.ExecuteWith(in[d], a, Options{Comms: comms, Context: ctx})
		})
	}
	wg.Wait()
	return outs, errs
}

// ---- references ----

// index helpers over row-major shapes.
func strides(s []int) []int {
	st := make([]int, len(s))
	k := 1
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = k
		k *= s[i]
	}
	return st
}

func flat(idx, s []int) int {
	k := 0
	for i, st := range strides(s) {
		k += idx[i] * st
	}
	return k
}

func unflat(k int, s []int) []int {
	idx := make([]int, len(s))
	for i := len(s) - 1; i >= 0; i-- {
		idx[i] = k % s[i]
		k /= s[i]
	}
	return idx
}

// collRef computes, in float64, the result of a collective op for the
// member of rank me of a group whose operands are xs (in rank order, of
// shape s); the result has shape out.
type collRef func(me int, xs [][]float64, s, out []int) []float64

func reduceRef(red string) collRef {
	return func(_ int, xs [][]float64, _, _ []int) []float64 {
		out := slices.Clone(xs[0])
		for _, x := range xs[1:] {
			for i, v := range x {
				switch red {
				case "sum":
					out[i] += v
				case "max":
					out[i] = math.Max(out[i], v)
				case "min":
					out[i] = math.Min(out[i], v)
				}
			}
		}
		return out
	}
}

// mapRef is a reference where every result element is one element of one
// member's operand (src gives which), or zero (src returns m < 0).
func mapRef(src func(me int, o, s []int, n int) (m int, i []int)) collRef {
	return func(me int, xs [][]float64, s, out []int) []float64 {
		res := make([]float64, prod(out))
		for k := range res {
			if m, i := src(me, unflat(k, out), s, len(xs)); m >= 0 {
				res[k] = xs[m][flat(i, s)]
			}
		}
		return res
	}
}

func prod(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

func gatherRef(d int, tiled bool) collRef {
	return mapRef(func(_ int, o, s []int, _ int) (int, []int) {
		if tiled {
			i := slices.Clone(o)
			i[d] = o[d] % s[d]
			return o[d] / s[d], i
		}
		return o[d], slices.Delete(slices.Clone(o), d, d+1)
	})
}

func scatterRef(d int, tiled bool) collRef {
	return func(me int, xs [][]float64, s, out []int) []float64 {
		res := make([]float64, prod(out))
		for k := range res {
			o := unflat(k, out)
			var i []int
			if tiled {
				i = slices.Clone(o)
				i[d] += me * (s[d] / len(xs))
			} else {
				i = slices.Insert(slices.Clone(o), d, me)
			}
			for _, x := range xs {
				res[k] += x[flat(i, s)]
			}
		}
		return res
	}
}

func allToAllRef(sd, cd int) collRef {
	return mapRef(func(me int, o, s []int, n int) (int, []int) {
		b := s[cd] // the block each member sends, along cd
		if cd == sd {
			b = s[sd] / n
		}
		i := slices.Clone(o)
		i[cd] = o[cd] % b
		i[sd] += me * (s[sd] / n)
		return o[cd] / b, i
	})
}

func permuteRef(pairs []int) collRef {
	return mapRef(func(me int, o, _ []int, _ int) (int, []int) {
		for k := 0; k < len(pairs); k += 2 {
			if pairs[k+1] == me {
				return pairs[k], o
			}
		}
		return -1, nil
	})
}

// ---- tests ----

// TestCollectiveOps runs each collective op, compiled through the whole
// pipeline, on meshes of 2, 4 and 8 goroutine devices over every kind of
// axis string ("x"; "y" of a 2×4 mesh; "x,y"), each device with its own
// random operand, and compares every device's result with a float64
// reference over its group's operands in group rank order.
func TestCollectiveOps(t *testing.T) {
	type opCase struct {
		name  string
		dt    string
		in    func(n int) []int // operand shape for a group of n
		attrs string            // the op and its attributes but axis and size
		out   func(n int) []int
		ref   collRef
		tol   float64
	}
	sh := func(s ...int) func(int) []int { return func(int) []int { return s } }
	ops := []opCase{
		{"all_reduce sum f32", "f32", sh(8, 3), `all_reduce {reduction="sum"}`, sh(8, 3), reduceRef("sum"), 1e-5},
		{"all_reduce max f32", "f32", sh(5), `all_reduce {reduction="max"}`, sh(5), reduceRef("max"), 0},
		{"all_reduce min f32", "f32", sh(2, 2), `all_reduce {reduction="min"}`, sh(2, 2), reduceRef("min"), 0},
		{"all_reduce sum i32", "i32", sh(7), `all_reduce {reduction="sum"}`, sh(7), reduceRef("sum"), 0},
		{"all_reduce sum bf16", "bf16", sh(6), `all_reduce {reduction="sum"}`, sh(6), reduceRef("sum"), 1.0 / 64},
		{"all_gather stacked", "f32", sh(3, 5), `all_gather {dimension=1}`, func(n int) []int { return []int{3, n, 5} }, gatherRef(1, false), 0},
		{"all_gather tiled", "f32", sh(3, 5), `all_gather {dimension=0, tiled=true}`, func(n int) []int { return []int{3 * n, 5} }, gatherRef(0, true), 0},
		{"reduce_scatter stacked", "f32", func(n int) []int { return []int{4, n} }, `reduce_scatter {dimension=1}`, sh(4), scatterRef(1, false), 1e-5},
		{"reduce_scatter tiled", "f32", func(n int) []int { return []int{2 * n, 3} }, `reduce_scatter {dimension=0, tiled=true}`, sh(2, 3), scatterRef(0, true), 1e-5},
		{"all_to_all", "f32", func(n int) []int { return []int{2 * n, 3} }, `all_to_all {split_dimension=0, concat_dimension=1}`, func(n int) []int { return []int{2, 3 * n} }, allToAllRef(0, 1), 0},
		{"all_reduce empty", "f32", sh(0, 3), `all_reduce {reduction="sum"}`, sh(0, 3), reduceRef("sum"), 0},
		{"all_gather scalars", "f32", sh(), `all_gather {dimension=0}`, func(n int) []int { return []int{n} }, gatherRef(0, false), 0},
		{"all_to_all same dim", "f32", func(n int) []int { return []int{3, 2 * n} }, `all_to_all {split_dimension=1, concat_dimension=1}`, func(n int) []int { return []int{3, 2 * n} }, allToAllRef(1, 1), 0},
	}
	meshes := []struct {
		m    mesh
		axis string
	}{
		{mesh{[]int{2}, []string{"x"}}, "x"},
		{mesh{[]int{4}, []string{"x"}}, "x"},
		{mesh{[]int{8}, []string{"x"}}, "x"},
		{mesh{[]int{2, 4}, []string{"x", "y"}}, "y"},
		{mesh{[]int{2, 4}, []string{"x", "y"}}, "x"},
		{mesh{[]int{2, 4}, []string{"x", "y"}}, "x,y"},
	}
	rng := testseed.Rand(t, 5)
	dims := func(s []int) string { return strings.Trim(strings.ReplaceAll(fmt.Sprint(s), " ", ","), "[]") }
	for _, mc := range meshes {
		n := 1
		for _, a := range mc.m.axes(t, mc.axis) {
			n *= mc.m.shape[a]
		}
		// Permutation: a shift by one along the group, the last member
		// sending nowhere (member 0 gets zeros).
		var pairs []int
		for i := 0; i+1 < n; i++ {
			pairs = append(pairs, i, i+1)
		}
		cases := append(slices.Clone(ops), opCase{"collective_permute", "f32", sh(3, 2),
			fmt.Sprintf("collective_permute {pairs=%v}", strings.ReplaceAll(fmt.Sprint(pairs), " ", ", ")), sh(3, 2), permuteRef(pairs), 0})
		for _, oc := range cases {
			t.Run(fmt.Sprintf("%s/mesh%v/%s", oc.name, mc.m.shape, mc.axis), func(t *testing.T) {
				in, out := oc.in(n), oc.out(n)
				code, attrs, _ := strings.Cut(oc.attrs, " {")
				src := fmt.Sprintf("func @f(%%0: %s[%s]) -> (%s[%s]) {\n  %%1 = %s(%%0) {axis=%q, size=%d, %s : %s[%s]\n  return %%1\n}",
					oc.dt, dims(in), oc.dt, dims(out), code, mc.axis, n, attrs, oc.dt, dims(out))
				e := compileColl(t, src, mc.axis)
				typ := e.params[0]
				args := make([]*ir.Literal, mc.m.size())
				for d := range args {
					args[d] = randLit(rng, typ)
				}
				outs, errs := runMesh(t, e, mc.m, []string{mc.axis}, func(d int) []*ir.Literal { return []*ir.Literal{args[d].Clone()} }, devRun{})
				for d := range args {
					require.NoError(t, errs[d], "device %d", d)
					members, me := mc.m.group(t, mc.axis, d)
					xs := make([][]float64, len(members))
					for i, m := range members {
						xs[i] = args[m].Float64s()
					}
					want := oc.ref(me, xs, in, out)
					got := outs[d][0]
					require.Equal(t, out, []int(got.Type.Shape), "device %d", d)
					for k, w := range want {
						g := got.Float64At(k)
						require.LessOrEqual(t, math.Abs(g-w), oc.tol*(1+math.Abs(w)), "device %d (rank %d of %v) element %d: got %v, want %v", d, me, members, k, g, w)
					}
				}
			})
		}
	}
}

// codesIn lists the codes of r's ops, and of the ops of nested regions
// (fusion regions included) as "outer>inner".
func codesIn(r *ir.Region, prefix string) []string {
	var out []string
	for _, op := range r.Ops {
		out = append(out, prefix+op.Code.String())
		for _, sub := range op.Regions {
			out = append(out, codesIn(sub, prefix+op.Code.String()+">")...)
		}
	}
	return out
}

// TestCollectiveInScan: the FSDP pattern. Each device holds a shard (rows
// split over "y") of every layer's weight; a scan over the layers gathers
// one layer's full weight per iteration (all_gather over "y" in the body),
// multiplies, and sums the products over "x" (all_reduce) before the
// nonlinearity. Every device's carry and stacked ys match a float64
// simulation of the whole 2×4 mesh.
func TestCollectiveInScan(t *testing.T) {
	const src = `func @fsdp(%0: f32[2,8], %1: f32[3,2,8]) -> (f32[2,8], f32[3,2,8]) {
  %9, %10 = scan(%0, %1) {length=3, num_carry=1, num_consts=0, reverse=false} (
    ^(%2: f32[2,8], %3: f32[2,8]) {
      %4 = all_gather(%3) {axis="y", dimension=0, size=4, tiled=true} : f32[8,8]
      %5 = dot_general(%2, %4) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]
      %6 = all_reduce(%5) {axis="x", reduction="sum", size=2} : f32[2,8]
      %7 = tanh(%6) : f32[2,8]
      return %7, %7
    }) : f32[2,8], f32[3,2,8]
  return %9, %10
}`
	const L, B, K, rows = 3, 2, 8, 2
	m := mesh{[]int{2, 4}, []string{"x", "y"}}
	bound := []string{"x", "y"}
	e := compileColl(t, src, bound...)
	codes := codesIn(e.prog.Func.Body, "")
	require.Contains(t, codes, "scan>all_gather", "the gather stays in the body: %s", e.prog.Func)
	require.Contains(t, codes, "scan>all_reduce", "%s", e.prog.Func)
	rng := testseed.Rand(t, 6)
	n := m.size()
	args := make([][]*ir.Literal, n)
	for d := range args {
		args[d] = []*ir.Literal{randLit(rng, e.params[0]), randLit(rng, e.params[1])}
	}
	for range 2 { // a second run reuses the frames
		outs, errs := runMesh(t, e, m, bound, func(d int) []*ir.Literal { return cloneAll(args[d]) }, devRun{})

		// The reference: h[d] per device, layer by layer.
		h := make([][]float64, n)
		for d := range h {
			h[d] = args[d][0].Float64s()
		}
		ys := make([][]float64, n)
		for l := range L {
			// prod[d] = h[d] @ W(d, l), W gathered over d's y group.
			prod := make([][]float64, n)
			for d := range n {
				members, _ := m.group(t, "y", d)
				w := make([]float64, K*K)
				for i, mb := range members {
					shard := args[mb][1].Float64s()[l*rows*K : (l+1)*rows*K]
					copy(w[i*rows*K:], shard)
				}
				prod[d] = make([]float64, B*K)
				for b := range B {
					for j := range K {
						for k := range K {
							prod[d][b*K+j] += h[d][b*K+k] * w[k*K+j]
						}
					}
				}
			}
			next := make([][]float64, n)
			for d := range n {
				members, _ := m.group(t, "x", d)
				next[d] = make([]float64, B*K)
				for i := range next[d] {
					for _, mb := range members {
						next[d][i] += prod[mb][i]
					}
					next[d][i] = math.Tanh(next[d][i])
				}
				ys[d] = append(ys[d], next[d]...)
			}
			h = next
		}
		for d := range n {
			require.NoError(t, errs[d], "device %d", d)
			for r, want := range [][]float64{h[d], ys[d]} {
				got := outs[d][r].Float64s()
				require.Len(t, got, len(want))
				for i := range want {
					require.InDelta(t, want[i], got[i], 1e-4, "device %d result %d element %d", d, r, i)
				}
			}
		}
	}
}

// TestCollectiveWithFusion: elementwise chains before and after collectives
// are fused (the collectives stay plain top-level ops between the fusions)
// and every device's results match a float64 reference.
func TestCollectiveWithFusion(t *testing.T) {
	const src = `func @mix(%0: f32[16], %1: f32[16]) -> (f32[16], f32[4]) {
  %2 = exp(%0) : f32[16]
  %3 = mul(%2, %1) : f32[16]
  %4 = all_reduce(%3) {axis="x,y", reduction="sum", size=8} : f32[16]
  %5 = tanh(%4) : f32[16]
  %6 = add(%5, %0) : f32[16]
  %7 = reduce_scatter(%6) {axis="y", dimension=0, size=4, tiled=true} : f32[4]
  %8 = mul(%7, %7) : f32[4]
  %9 = neg(%8) : f32[4]
  return %6, %9
}`
	m := mesh{[]int{2, 4}, []string{"x", "y"}}
	bound := []string{"x,y", "y"}
	e := compileColl(t, src, bound...)
	codes := codesIn(e.prog.Func.Body, "")
	require.Contains(t, codes, "fusion", "%s", e.prog.Func)
	var colls []string
	for _, c := range codes {
		if strings.Contains(c, "all_reduce") || strings.Contains(c, "reduce_scatter") {
			colls = append(colls, c)
		}
	}
	require.Equal(t, []string{"all_reduce", "reduce_scatter"}, colls, "one of each, at top level: %s", e.prog.Func)
	rng := testseed.Rand(t, 7)
	n := m.size()
	args := make([][]*ir.Literal, n)
	for d := range args {
		args[d] = []*ir.Literal{randLit(rng, e.params[0]), randLit(rng, e.params[1])}
	}
	outs, errs := runMesh(t, e, m, bound, func(d int) []*ir.Literal { return cloneAll(args[d]) }, devRun{})
	six := make([][]float64, n)
	for d := range n {
		x := args[d][0].Float64s()
		members, _ := m.group(t, "x,y", d)
		six[d] = make([]float64, 16)
		for i := range 16 {
			var s float64
			for _, mb := range members {
				s += math.Exp(args[mb][0].Float64s()[i]) * args[mb][1].Float64s()[i]
			}
			six[d][i] = math.Tanh(s) + x[i]
		}
	}
	for d := range n {
		require.NoError(t, errs[d], "device %d", d)
		members, me := m.group(t, "y", d)
		for i := range 16 {
			require.InDelta(t, six[d][i], outs[d][0].Float64At(i), 1e-4, "device %d result 0 element %d", d, i)
		}
		for i := range 4 {
			var s float64
			for _, mb := range members {
				s += six[mb][me*4+i]
			}
			require.InDelta(t, -s*s, outs[d][1].Float64At(i), 1e-3*(1+s*s), "device %d result 1 element %d", d, i)
		}
	}
}

// twoAxes is a program with a collective over "x" and then one over "y".
const twoAxes = `func @two(%0: f32[6]) -> (f32[6]) {
  %1 = all_reduce(%0) {axis="x", reduction="sum", size=2} : f32[6] loc("step.go:3")
  %2 = exp(%1) : f32[6]
  %3 = all_reduce(%2) {axis="y", reduction="max", size=4} : f32[6] loc("step.go:5")
  return %3
}`

// TestCollectiveMissingAxis: a device without a communicator for an axis
// fails at that collective with an unbound axis error naming the axis and
// the op; the others of its group, waiting for it there, return an abort
// error instead of hanging (and so do the other groups unless they are
// done first: the abort is the whole world's). Without any Comms, the first collective fails.
func TestCollectiveMissingAxis(t *testing.T) {
	m := mesh{[]int{2, 4}, []string{"x", "y"}}
	bound := []string{"x", "y"}
	e := compileColl(t, twoAxes, bound...)
	require.True(t, e.HasCollectives())
	rng := testseed.Rand(t, 8)
	const bad = 5
	_, errs := runMesh(t, e, m, bound, func(int) []*ir.Literal { return []*ir.Literal{randLit(rng, e.params[0])} },
		devRun{comms: func(d int, c map[string]collective.Communicator) {
			if d == bad {
				delete(c, "y")
			}
		}})
	peers, _ := m.group(t, "y", bad)
	for d, err := range errs {
		if d == bad {
			require.ErrorContains(t, err, `unbound axis name "y"`)
			require.ErrorContains(t, err, "step.go:5")
			continue
		}
		if err == nil && !slices.Contains(peers, d) {
			continue // another "y" group may be done before the abort
		}
		require.ErrorIs(t, err, collective.ErrAborted, "device %d", d)
		require.ErrorContains(t, err, `unbound axis name "y"`, "device %d: the abort says why", d)
	}

	// No communicators at all.
	_, _, err := e.ExecuteWith([]*ir.Literal{randLit(rng, e.params[0])}, &countAlloc{}, Options{})
	require.ErrorContains(t, err, `unbound axis name "x"`)
	require.ErrorContains(t, err, "step.go:3")
}

// TestCollectiveSizeMismatch: a collective whose "size" is not its
// communicator's Size() fails on every device, naming the op, the axis and
// both sizes.
func TestCollectiveSizeMismatch(t *testing.T) {
	m := mesh{[]int{4, 2}, []string{"x", "y"}} // "y" has 2 members, the program says 4
	bound := []string{"x", "y"}
	e := compileColl(t, twoAxes, bound...)
	rng := testseed.Rand(t, 9)
	_, errs := runMesh(t, e, m, bound, func(int) []*ir.Literal { return []*ir.Literal{randLit(rng, e.params[0])} }, devRun{})
	for d, err := range errs {
		require.Error(t, err, "device %d", d)
		require.ErrorContains(t, err, "step.go:3", "device %d", d) // "x" has 4 members, the program says 2
		require.ErrorContains(t, err, `axis "x" has size 2 in the program, but its communicator has 4 ranks`, "device %d", d)
	}
}

// TestCollectiveAbortOnError: a device whose execution fails before its
// first collective (its allocator fails) aborts the communicators, so that
// the other devices' executions return errors saying why instead of
// hanging; the communicators stay aborted. A device that never runs makes
// the others give up when their context ends.
func TestCollectiveAbortOnError(t *testing.T) {
	m := mesh{[]int{4}, []string{"x"}}
	e := compileColl(t, `func @f(%0: f32[6]) -> (f32[6]) {
  %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[6]
  %2 = tanh(%1) : f32[6]
  return %2
}`, "x")
	rng := testseed.Rand(t, 10)
	args := func(int) []*ir.Literal { return []*ir.Literal{randLit(rng, e.params[0])} }
	const bad = 2
	_, errs := runMesh(t, e, m, []string{"x"}, args, devRun{alloc: func(d int) Allocator {
		if d == bad {
			return &countAlloc{failAt: 1}
		}
		return &countAlloc{}
	}})
	for d, err := range errs {
		require.Error(t, err, "device %d", d)
		require.ErrorContains(t, err, "out of memory (test)", "device %d", d)
		if d != bad {
			require.ErrorIs(t, err, collective.ErrAborted, "device %d", d)
		}
	}

	_, errs = runMesh(t, e, m, []string{"x"}, args, devRun{ctx: 200 * time.Millisecond, skip: func(d int) bool { return d == bad }})
	for d, err := range errs {
		if d == bad {
			continue
		}
		require.ErrorIs(t, err, collective.ErrAborted, "device %d", d)
		require.True(t, errors.Is(err, context.DeadlineExceeded), "device %d: %v", d, err)
	}
}

// TestCollectiveInControlFlow: collectives of a constant operand, an
// axis_index, collectives in cond branches (every device takes the same
// branch) and in both regions of a while loop whose trip count is decided
// by an all_reduce, on four devices.
func TestCollectiveInControlFlow(t *testing.T) {
	const src = `func @ctl(%0: f32[4], %1: bool[]) -> (f32[4], i32[], f32[4], i32[], f32[4]) {
  %2 = constant() {value=dense<f32[4], [1, 2, 3, 4]>} : f32[4]
  %3 = all_reduce(%2) {axis="x", reduction="sum", size=4} : f32[4]
  %4 = axis_index() {axis="x", size=4} : i32[]
  %5 = cond(%1, %0) (
    ^(%6: f32[4]) {
      %7 = all_reduce(%6) {axis="x", reduction="max", size=4} : f32[4]
      return %7
    },
    ^(%8: f32[4]) {
      %9 = all_reduce(%8) {axis="x", reduction="min", size=4} : f32[4]
      return %9
    }) : f32[4]
  %10 = constant() {value=dense<i32[], 0>} : i32[]
  %20, %21 = while(%10, %0) {num_consts=0} (
    ^(%11: i32[], %12: f32[4]) {
      %13 = all_reduce(%11) {axis="x", reduction="sum", size=4} : i32[]
      %14 = constant() {value=dense<i32[], 12>} : i32[]
      %15 = lt(%13, %14) : bool[]
      return %15
    },
    ^(%16: i32[], %17: f32[4]) {
      %18 = constant() {value=dense<i32[], 1>} : i32[]
      %19 = add(%16, %18) : i32[]
      %22 = collective_permute(%17) {axis="x", pairs=[0, 1, 1, 2, 2, 3, 3, 0], size=4} : f32[4]
      return %19, %22
    }) : i32[], f32[4]
  return %3, %4, %5, %20, %21
}`
	m := mesh{[]int{4}, []string{"x"}}
	e := compileColl(t, src, "x")
	rng := testseed.Rand(t, 13)
	xs := make([]*ir.Literal, 4)
	for d := range xs {
		xs[d] = randLit(rng, e.params[0])
	}
	for _, pred := range []bool{true, false} {
		outs, errs := runMesh(t, e, m, []string{"x"}, func(d int) []*ir.Literal {
			return []*ir.Literal{xs[d].Clone(), ir.Scalar(pred)}
		}, devRun{})
		for d := range 4 {
			require.NoError(t, errs[d], "device %d", d)
			o := outs[d]
			require.Equal(t, []float32{4, 8, 12, 16}, ir.View[float32](o[0]), "device %d", d)
			require.Equal(t, int32(d), ir.View[int32](o[1])[0], "device %d: axis_index", d)
			for i := range 4 {
				want := xs[0].Float64At(i)
				for _, x := range xs[1:] {
					if pred {
						want = math.Max(want, x.Float64At(i))
					} else {
						want = math.Min(want, x.Float64At(i))
					}
				}
				require.Equal(t, want, o[2].Float64At(i), "device %d: cond element %d", d, i)
			}
			require.Equal(t, int32(3), ir.View[int32](o[3])[0], "device %d: while iterations", d)
			require.Equal(t, xs[(d+1)%4].Data, o[4].Data, "device %d: three ring shifts", d)
		}
	}
}

// TestCollectiveOverlappingPlan: the executor stays correct under a plan
// (not one passes makes) that puts a collective's result over part of its
// operand, which the communicators refuse: it sends a copy of the operand.
func TestCollectiveOverlappingPlan(t *testing.T) {
	f, err := ir.Parse(`func @f(%0: f32[8]) -> (f32[8]) {
  %1 = exp(%0) : f32[8]
  %2 = all_reduce(%1) {axis="x", reduction="sum", size=2} : f32[8]
  %3 = neg(%2) : f32[8]
  return %3
}`)
	require.NoError(t, err)
	p := naivePlan(f, planOpts{})
	ops := f.Body.Ops
	b1, b2 := p.Plan.Values[ops[1].Args[0]], p.Plan.Values[ops[1].Result()]
	require.Equal(t, passes.BufTemp, b1.Kind)
	b2.Offset = b1.Offset + 16 // the result's first half is the operand's second half
	p.Plan.Values[ops[1].Result()] = b2
	e, err := New(p)
	require.NoError(t, err)
	rng := testseed.Rand(t, 14)
	xs := []*ir.Literal{randLit(rng, e.params[0]), randLit(rng, e.params[0])}
	outs, errs := runMesh(t, e, mesh{[]int{2}, []string{"x"}}, []string{"x"}, func(d int) []*ir.Literal { return []*ir.Literal{xs[d].Clone()} }, devRun{})
	for d := range 2 {
		require.NoError(t, errs[d], "device %d", d)
		for i := range 8 {
			want := -(math.Exp(xs[0].Float64At(i)) + math.Exp(xs[1].Float64At(i)))
			require.InDelta(t, want, outs[d][0].Float64At(i), 1e-5*(1+math.Abs(want)), "device %d element %d", d, i)
		}
	}
}

// BenchmarkCollectiveExec measures an execution of a program that is one
// f32 sum all_reduce on 4 goroutine devices (exec), against the same
// AllReduce called on the communicators directly (direct): the difference
// is the executor's overhead per execution. 16 B shows the latency, 4 MiB
// the bandwidth.
func BenchmarkCollectiveExec(b *testing.B) {
	const n = 4
	for _, elems := range []int{4, 1 << 20} {
		src := fmt.Sprintf(`func @f(%%0: f32[%d]) -> (f32[%d]) {
  %%1 = all_reduce(%%0) {axis="x", reduction="sum", size=%d} : f32[%d]
  return %%1
}`, elems, elems, n, elems)
		e := compileColl(b, src, "x")
		rng := rand.New(rand.NewPCG(1, 2))
		for _, mode := range []string{"exec", "direct"} {
			b.Run(fmt.Sprintf("%s/bytes=%d", mode, 4*elems), func(b *testing.B) {
				world, err := collective.NewLocal(n)
				require.NoError(b, err)
				args := make([]*ir.Literal, n)
				for d := range args {
					args[d] = randLit(rng, e.params[0])
				}
				b.SetBytes(int64(4 * elems))
				b.ReportAllocs()
				b.ResetTimer()
				errs := make([]error, n)
				var wg sync.WaitGroup
				for d := range n {
					wg.Go(func() {
						a := &reuseAlloc{}
						outs, rels := make([]*ir.Literal, 1), make([]func(), 1)
						recv := alignedBytes(4 * elems)
						opts := Options{Comms: map[string]collective.Communicator{"x": world[d]}}
						for range b.N {
							if mode == "exec" {
								outs[0] = nil
								errs[d] = e.ExecuteIntoWith(args[d:d+1], a, outs, rels, opts)
							} else {
								errs[d] = world[d].AllReduce(context.Background(), collective.Sum, ir.Float32, args[d].Data, recv)
							}
							if errs[d] != nil {
								return
							}
						}
					})
				}
				wg.Wait()
				for _, err := range errs {
					require.NoError(b, err)
				}
			})
		}
	}
}
