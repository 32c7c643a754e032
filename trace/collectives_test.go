package trace_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
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

// TestVmapCollectivesNested calls collectives over the outer axis from inside
// an inner Vmap (the inner Vmap passes them through with its batch dimension,
// the outer one computes them) and over the inner axis, against float64
// loops, eagerly and under rt.Jit.
func TestVmapCollectivesNested(t *testing.T) {
	r := otRand(t)
	n1, n2, blk := 2+r.IntN(3), 1+r.IntN(3), 1+r.IntN(2)
	a := n1 * blk
	x := newCtBatch(r, n1, n2, a)
	at := func(u, v, e int) float64 { return x.at(u, []int{v, e}) }
	f := func(x *trace.Array) []*trace.Array {
		var shift [][2]int
		for s := range n1 {
			shift = append(shift, [2]int{s, (s + 1) % n1})
		}
		idx := trace.Add(trace.AxisIndex("i"), trace.Mul(trace.AxisIndex("j"), trace.ScalarAs(10, ir.Int32)))
		return []*trace.Array{
			trace.PSum(x, "i"), trace.PSum(x, "j"), trace.AllGather(x, "i", 1, false),
			idx, trace.PPermute(x, "i", shift), trace.PSumScatter(x, "i", 0, true), trace.AllToAll(x, "i", 0, 0),
		}
	}
	g := trace.Vmap(trace.Vmap(f, trace.AxisName("j")), trace.AxisName("i"))
	refs := []struct {
		shape []int
		f     func(u, v int, e []int) float64
	}{
		{[]int{a}, func(u, v int, e []int) float64 {
			s := 0.0
			for m := range n1 {
				s += at(m, v, e[0])
			}
			return s
		}},
		{[]int{a}, func(u, v int, e []int) float64 {
			s := 0.0
			for m := range n2 {
				s += at(u, m, e[0])
			}
			return s
		}},
		{[]int{a, n1}, func(u, v int, e []int) float64 { return at(e[1], v, e[0]) }},
		{nil, func(u, v int, _ []int) float64 { return float64(u + 10*v) }},
		{[]int{a}, func(u, v int, e []int) float64 { return at((u+n1-1)%n1, v, e[0]) }},
		{[]int{blk}, func(u, v int, e []int) float64 {
			s := 0.0
			for m := range n1 {
				s += at(m, v, u*blk+e[0])
			}
			return s
		}},
		{[]int{a}, func(u, v int, e []int) float64 { return at(e[0]/blk, v, u*blk+e[0]%blk) }},
	}
	for _, mode := range []string{"eager", "jit"} {
		h := g
		if mode == "jit" {
			h = rt.Jit(g)
		}
		got := h(x.array())
		for i, ref := range refs {
			want := ctRef(append([]int{n1, n2}, ref.shape...), func(idx []int) float64 { return ref.f(idx[0], idx[1], idx[2:]) })
			gtExpectClose(t, fmt.Sprintf("%s output %d (n1=%d n2=%d blk=%d)", mode, i, n1, n2, blk), got[i].Float64s(), want, 1e-12)
		}
	}
}

// TestVmapCollectivesUnbatched gives collectives over the Vmap's axis
// operands that do not depend on the example (closed over, or a scan that
// reads none of the mapped inputs): psum scales by the axis size, ppermute
// and axis_index make them depend on it.
func TestVmapCollectivesUnbatched(t *testing.T) {
	r := otRand(t)
	n := 1 + r.IntN(4)
	w := gtRand(r, -1, 1, 3)
	wd := w.Float64s()
	f := trace.Vmap(func(x *trace.Array) []*trace.Array {
		counted, _ := trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Add(c[0], trace.Convert(trace.AxisIndex("i"), ir.Float64))}, nil
		}, []*trace.Array{trace.ScalarAs(0, ir.Float64)}, nil, trace.ScanLength(3))
		return []*trace.Array{trace.PSum(w, "i"), trace.PPermute(w, "i", [][2]int{{0, n - 1}}), counted[0], trace.Add(x, trace.PMax(w, "i"))}
	}, trace.AxisName("i"))
	x := gtRand(r, -1, 1, n, 3)
	for _, mode := range []string{"eager", "jit"} {
		h := f
		if mode == "jit" {
			h = rt.Jit(f)
		}
		got := h(x)
		want := [][]float64{ctRef([]int{n, 3}, func(i []int) float64 { return float64(n) * wd[i[1]] }),
			ctRef([]int{n, 3}, func(i []int) float64 {
				if i[0] == n-1 {
					return wd[i[1]]
				}
				return 0
			}),
			ctRef([]int{n}, func(i []int) float64 { return 3 * float64(i[0]) }),
			ctRef([]int{n, 3}, func(i []int) float64 { return x.Float64s()[i[0]*3+i[1]] + wd[i[1]] }),
		}
		for i := range want {
			gtExpectClose(t, fmt.Sprintf("%s output %d (n=%d)", mode, i, n), got[i].Float64s(), want[i], 1e-12)
		}
	}
}

// TestCollectiveErrors: a collective over an axis no Vmap binds is an
// *Error naming the axis at the caller's line (eagerly, in a Vmap of another
// name, under rt.Jit), as is a bad dimension or pair list; a collective op
// applied directly outside any binding is refused the same way.
func TestCollectiveErrors(t *testing.T) {
	x := trace.Const([]float64{1, 2, 3, 4, 5, 6}, 2, 3)
	expect := func(what, want string, f func()) {
		t.Helper()
		e := gtCatch(t, f)
		if e == nil {
			t.Fatalf("%s: no error", what)
		}
		if !strings.Contains(e.Error(), want) || !strings.HasSuffix(e.File, "collectives_test.go") {
			t.Errorf("%s: error %q (at %s:%d), want one containing %q at this file", what, e.Error(), e.File, e.Line, want)
		}
	}
	unbound := `unbound axis name "i"`
	expect("eager PSum", unbound, func() { trace.PSum(x, "i") })
	expect("eager AxisIndex", unbound, func() { trace.AxisIndex("i") })
	expect("Vmap of another name", unbound, func() {
		trace.Vmap(func(x *trace.Array) *trace.Array { return trace.AllGather(x, "i", 0, false) }, trace.AxisName("j"))(x)
	})
	expect("Vmap without a name", unbound, func() {
		trace.Vmap(func(x *trace.Array) *trace.Array { return trace.PMean(x, "i") })(x)
	})
	expect("rt.Jit", unbound, func() {
		rt.Jit(func(x *trace.Array) *trace.Array { return trace.PSum(x, "i") })(x)
	})
	expect("direct all_reduce op", unbound, func() {
		trace.Apply(ir.AllReduce, ir.Attrs{"axis": "i", "size": 2, "reduction": "sum"}, nil, x)
	})
	in := func(f func(x *trace.Array) *trace.Array) func() {
		return func() { trace.Vmap(f, trace.AxisName("i"))(x) }
	}
	expect("all_to_all split", "not divisible by the axis size 2", in(func(x *trace.Array) *trace.Array { return trace.AllToAll(x, "i", 0, 0) }))
	expect("psum_scatter size", "is not the axis size 2", in(func(x *trace.Array) *trace.Array { return trace.PSumScatter(x, "i", 0, false) }))
	expect("all_gather dimension", "dimension 2 is out of range", in(func(x *trace.Array) *trace.Array { return trace.AllGather(x, "i", 2, false) }))
	expect("ppermute pairs", "repeats a source or a target", in(func(x *trace.Array) *trace.Array {
		return trace.PPermute(x, "i", [][2]int{{0, 1}, {1, 1}})
	}))
	expect("ppermute range", "out of range for axis size 2", in(func(x *trace.Array) *trace.Array {
		return trace.PPermute(x, "i", [][2]int{{0, 2}})
	}))
	expect("pmean of ints", "needs a float dtype", in(func(x *trace.Array) *trace.Array { return trace.PMean(trace.Convert(x, ir.Int32), "i") }))
}

// TestCollectivesRematScan: collectives inside Remat and inside a Scan body,
// under Vmap of Grad and Grad of Vmap, agree with the same function written
// without Remat and Scan.
func TestCollectivesRematScan(t *testing.T) {
	r := otRand(t)
	n := 2 + r.IntN(3)
	X := gtRand(r, -1, 1, n, 3)
	step := func(y *trace.Array) *trace.Array {
		return trace.Tanh(trace.Add(y, trace.PMean(trace.Mul(y, y), "i")))
	}
	loss := func(y *trace.Array) *trace.Array {
		return trace.Sum(trace.Mul(y, trace.PPermute(y, "i", [][2]int{{0, n - 1}, {n - 1, 0}})))
	}
	plain := func(x *trace.Array) *trace.Array { return loss(step(step(x))) }
	remat := func(x *trace.Array) *trace.Array {
		f := trace.Remat(func(y *trace.Array) *trace.Array { return step(step(y)) }, trace.NothingSaveable)
		return loss(f(x))
	}
	scan := func(x *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{step(c[0])}, nil
		}, []*trace.Array{x}, nil, trace.ScanLength(2))
		return loss(c[0])
	}
	vg := func(f func(*trace.Array) *trace.Array) *trace.Array {
		return trace.Vmap(trace.Grad(f), trace.AxisName("i"))(X)
	}
	gv := func(f func(*trace.Array) *trace.Array) *trace.Array {
		return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Vmap(f, trace.AxisName("i"))(x)) })(X)
	}
	want := gv(plain).Float64s()
	gtExpectClose(t, "Vmap of Grad", vg(plain).Float64s(), want, 1e-12)
	for name, f := range map[string]func(*trace.Array) *trace.Array{"remat": remat, "scan": scan} {
		gtExpectClose(t, name+": Grad of Vmap", gv(f).Float64s(), want, 1e-12)
		gtExpectClose(t, name+": Vmap of Grad", vg(f).Float64s(), want, 1e-12)
	}
}
