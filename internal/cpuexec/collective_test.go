package cpuexec

import (
	"context"
	"fmt"
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
	p, err := passes.Compile(f, passes.Options{FusionInPlace: true, BoundAxes: bound})
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
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
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
