package trace_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// ctRef returns the row-major values of shape computed by f from each
// multi-index.
func ctRef(shape []int, f func(idx []int) float64) []float64 {
	n := 1
	for _, d := range shape {
		n *= d
	}
	out := make([]float64, n)
	idx := make([]int, len(shape))
	for k := range out {
		out[k] = f(idx)
		for d := len(shape) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out
}

// ctBatch is a batch of n examples of shape p, float64 with fresh values.
type ctBatch struct {
	n    int
	p    []int
	data []float64
}

func newCtBatch(r *rand.Rand, n int, p ...int) ctBatch {
	b := ctBatch{n: n, p: slices.Clone(p)}
	size := n
	for _, d := range p {
		size *= d
	}
	b.data = gtRandData(r, size, -2, 2)
	return b
}

func (b ctBatch) array() *trace.Array { return trace.Const(b.data, append([]int{b.n}, b.p...)...) }

// at returns example k's element e.
func (b ctBatch) at(k int, e []int) float64 {
	off := k
	for d, i := range e {
		off = off*b.p[d] + i
	}
	return b.data[off]
}

// ctCase is one collective under Vmap: the per-example function, the result
// shape per example, and the float64 reference of example k's element e.
type ctCase struct {
	code ir.Code
	desc string
	in   ctBatch
	fn   func(x *trace.Array) *trace.Array
	out  []int
	ref  func(k int, e []int) float64
}

func ctCases(r *rand.Rand) []ctCase {
	var cs []ctCase
	add := func(c ctCase) { cs = append(cs, c) }
	n := 1 + r.IntN(4)
	x := newCtBatch(r, n, 1+r.IntN(3), 1+r.IntN(3))
	p := x.p
	for _, red := range []string{"sum", "mean", "max", "min"} {
		fn := map[string]func(*trace.Array, string) *trace.Array{"sum": trace.PSum, "mean": trace.PMean, "max": trace.PMax, "min": trace.PMin}[red]
		add(ctCase{ir.AllReduce, "p" + red, x, func(a *trace.Array) *trace.Array { return fn(a, "i") }, p, func(_ int, e []int) float64 {
			v := x.at(0, e)
			s := 0.0
			for m := range n {
				y := x.at(m, e)
				s += y
				v = map[string]float64{"max": math.Max(v, y), "min": math.Min(v, y)}[red]
			}
			switch red {
			case "sum":
				return s
			case "mean":
				return s / float64(n)
			}
			return v
		}})
	}
	for g := 0; g <= len(p); g++ {
		add(ctCase{ir.AllGather, fmt.Sprint("all_gather stacked ", g), x, func(a *trace.Array) *trace.Array { return trace.AllGather(a, "i", g, false) },
			slices.Insert(slices.Clone(p), g, n), func(_ int, e []int) float64 {
				return x.at(e[g], slices.Delete(slices.Clone(e), g, g+1))
			}})
	}
	for g := range p {
		tp := slices.Clone(p)
		tp[g] *= n
		add(ctCase{ir.AllGather, fmt.Sprint("all_gather tiled ", g), x, func(a *trace.Array) *trace.Array { return trace.AllGather(a, "i", g-len(p), true) },
			tp, func(_ int, e []int) float64 {
				s := slices.Clone(e)
				s[g] = e[g] % p[g]
				return x.at(e[g]/p[g], s)
			}})
	}
	// Scatters and all_to_all need a dimension divisible by n.
	blk := 1 + r.IntN(2)
	for g := range 2 {
		q := slices.Clone(p)
		q[g] = n
		y := newCtBatch(r, n, q...)
		add(ctCase{ir.ReduceScatter, fmt.Sprint("psum_scatter ", g), y, func(a *trace.Array) *trace.Array { return trace.PSumScatter(a, "i", g, false) },
			slices.Delete(slices.Clone(q), g, g+1), func(k int, e []int) float64 {
				s := 0.0
				for m := range n {
					s += y.at(m, slices.Insert(slices.Clone(e), g, k))
				}
				return s
			}})
		q[g] = n * blk
		z := newCtBatch(r, n, q...)
		add(ctCase{ir.ReduceScatter, fmt.Sprint("psum_scatter tiled ", g), z, func(a *trace.Array) *trace.Array { return trace.ReduceScatter(a, "i", g, true) },
			slices.Replace(slices.Clone(q), g, g+1, blk), func(k int, e []int) float64 {
				s := 0.0
				for m := range n {
					f := slices.Clone(e)
					f[g] += k * blk
					s += z.at(m, f)
				}
				return s
			}})
		for c := range 2 {
			out := slices.Clone(q)
			out[g] /= n
			out[c] *= n
			inC := q[c] // size of concat dim before the exchange
			if c == g {
				inC = blk
			}
			add(ctCase{ir.AllToAll, fmt.Sprint("all_to_all split ", g, " concat ", c), z, func(a *trace.Array) *trace.Array { return trace.AllToAll(a, "i", g, c) },
				out, func(k int, e []int) float64 {
					f := slices.Clone(e)
					j := e[c] / inC
					f[c] = e[c] % inC
					f[g] += k * blk
					return z.at(j, f)
				}})
		}
	}
	// ppermute: a random partial permutation.
	perm := r.Perm(n)
	var pairs [][2]int
	src := map[int]int{}
	for s, t := range perm {
		if r.IntN(3) > 0 {
			pairs = append(pairs, [2]int{s, t})
			src[t] = s
		}
	}
	add(ctCase{ir.CollectivePermute, fmt.Sprint("ppermute ", pairs), x, func(a *trace.Array) *trace.Array { return trace.PPermute(a, "i", pairs) },
		p, func(k int, e []int) float64 {
			s, ok := src[k]
			if !ok {
				return 0
			}
			return x.at(s, e)
		}})
	add(ctCase{ir.AxisIndex, "axis_index", x, func(a *trace.Array) *trace.Array {
		return trace.Add(trace.Convert(trace.AxisIndex("i"), ir.Float64), trace.Mul(a, trace.Scalar(0.0)))
	}, p, func(k int, _ []int) float64 { return float64(k) }})
	for i := range cs {
		cs[i].desc = fmt.Sprintf("%s (n=%d, example %v)", cs[i].desc, n, p)
	}
	return cs
}

// TestVmapCollectives checks every collective under a Vmap with an axis name
// against float64 loops over the examples, with fresh shapes and sizes,
// eagerly and under rt.Jit. (TestVmapOps cannot: its reference runs the op
// once per example, where a collective's axis is unbound.)
func TestVmapCollectives(t *testing.T) {
	r := otRand(t)
	covered := map[ir.Code]bool{}
	for range 3 {
		for _, c := range ctCases(r) {
			covered[c.code] = true
			want := ctRef(append([]int{c.in.n}, c.out...), func(idx []int) float64 { return c.ref(idx[0], idx[1:]) })
			f := trace.Vmap(c.fn, trace.AxisName("i"))
			check := func(what string, got *trace.Array) {
				t.Helper()
				if !got.Shape().Equal(append(ir.Shape{c.in.n}, c.out...)) {
					t.Fatalf("%s %s: shape %v, want %v", c.desc, what, got.Shape(), append([]int{c.in.n}, c.out...))
				}
				gtExpectClose(t, c.desc+" "+what, got.Float64s(), want, 1e-12)
			}
			check("eager", f(c.in.array()))
			check("jit", rt.Jit(f)(c.in.array()))
		}
	}
	for _, code := range ir.AllCodes() {
		if code.IsCollective() && !covered[code] {
			t.Errorf("collective %v has no case in ctCases", code)
		}
	}
}

// TestCollectiveGradients checks the VJP rule of every differentiable
// collective through Vmap of Grad: example k's gradient is the gradient of
// the sum of every example's loss with respect to x_k (psum's transpose is
// psum, as in JAX), which Grad of the Vmap computes on another path (the
// batching rules turn the collectives into ordinary ops, whose VJPs run).
// That reference is itself checked against finite differences.
func TestCollectiveGradients(t *testing.T) {
	r := otRand(t)
	covered := map[ir.Code]bool{}
	cases := ctCases(r)
	cases = append(cases, ctCase{code: ir.AllReduce, desc: "loss normalised by psum", in: cases[0].in,
		fn: func(x *trace.Array) *trace.Array {
			sq := trace.Mul(x, x)
			return trace.Div(sq, trace.PSum(trace.Add(trace.Sum(sq), trace.Scalar(1.0)), "i"))
		}, out: cases[0].out})
	for _, c := range cases {
		if !c.code.Info().Differentiable {
			continue
		}
		covered[c.code] = true
		X := c.in.array()
		W := gtRand(r, -1, 1, append([]int{c.in.n}, c.out...)...)
		loss := func(x, w *trace.Array) *trace.Array { return trace.Sum(trace.Mul(w, trace.Tanh(c.fn(x)))) }
		perEx := trace.Vmap(func(x, w *trace.Array) *trace.Array {
			return trace.Grad(func(x *trace.Array) *trace.Array { return loss(x, w) })(x)
		}, trace.AxisName("i"))
		total := func(a []*trace.Array) *trace.Array { return trace.Sum(trace.Vmap(loss, trace.AxisName("i"))(a[0], W)) }
		gtFDCheck(t, c.desc, total, []*trace.Array{X}, r, 1e-6, 1e-5)
		g := trace.Grad(func(x *trace.Array) *trace.Array { return total([]*trace.Array{x}) })(X)
		gtExpectClose(t, c.desc+": Vmap of Grad", perEx(X, W).Float64s(), g.Float64s(), 1e-10)
		gtExpectClose(t, c.desc+": Vmap of Grad under jit", rt.Jit(perEx)(X, W).Float64s(), g.Float64s(), 1e-10)
	}
	for _, code := range ir.AllCodes() {
		if code.IsCollective() && code.Info().Differentiable && !covered[code] {
			t.Errorf("differentiable collective %v has no case in TestCollectiveGradients", code)
		}
	}
}
