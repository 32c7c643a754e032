package trace_test

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Tests of the batching rules of gather, scatter_add, dynamic_slice and
// dynamic_update_slice: Vmap of a function using the op must be bit for bit
// the op applied to each example and stacked, with the mapped axis of every
// input placed at random (or not mapped), indices and starts in and out of
// range, and batch sizes 0, 1 and more.

// bixGen makes a fresh per-example value of one input.
type bixGen func() *trace.Array

// bixCheck vmaps fn over inputs made by gens, each mapped at a random axis or
// not at all, and compares the result, eagerly (Vmap) and under rt.Jit
// (VmapFlat), with fn applied to each example and stacked.
func bixCheck(t *testing.T, r *rand.Rand, name string, size int, fn func(a []*trace.Array) *trace.Array, gens []bixGen) {
	t.Helper()
	n := len(gens)
	axes := make([]int, n)
	shared := make([]*trace.Array, n) // unmapped inputs, or an example's shape
	batched := make([]*trace.Array, n)
	per := make([][]*trace.Array, size)
	for b := range per {
		per[b] = make([]*trace.Array, n)
	}
	for i, g := range gens {
		shared[i] = g()
		if r.IntN(3) == 0 {
			axes[i] = trace.NotMapped
			batched[i] = shared[i]
			for b := range per {
				per[b][i] = shared[i]
			}
			continue
		}
		ax := r.IntN(shared[i].Rank() + 1)
		axes[i] = ax
		if size == 0 {
			s := shared[i].Shape()
			s = append(s[:ax], append(ir.Shape{0}, s[ax:]...)...)
			batched[i] = trace.Zeros(s, shared[i].DType())
			continue
		}
		ex := make([]*trace.Array, size)
		for b := range ex {
			ex[b] = g()
			per[b][i] = ex[b]
		}
		batched[i] = trace.Stack(ax, ex...)
	}
	var want *trace.Array
	if size == 0 {
		one := fn(shared)
		want = trace.Zeros(append(ir.Shape{0}, one.Shape()...), one.DType())
	} else {
		outs := make([]*trace.Array, size)
		for b := range outs {
			outs[b] = fn(per[b])
		}
		want = trace.Stack(0, outs...)
	}
	desc := fmt.Sprintf("%s B=%d in_axes=%v inputs=%v", name, size, bixAxes(axes), bixTypes(batched))
	opts := []trace.VmapOption{trace.InAxes(axes...), trace.AxisSize(size)}
	got := trace.Vmap(fn, opts...)(batched)
	bixSame(t, desc+" (eager)", got, want)
	jit := rt.Jit(func(a []*trace.Array) []*trace.Array {
		return trace.VmapFlat(func(a []*trace.Array) []*trace.Array { return []*trace.Array{fn(a)} }, a, opts...)
	})
	bixSame(t, desc+" (jit)", jit(batched)[0], want)
}

func bixAxes(axes []int) []string {
	out := make([]string, len(axes))
	for i, a := range axes {
		out[i] = fmt.Sprint(a)
		if a == trace.NotMapped {
			out[i] = "none"
		}
	}
	return out
}

func bixTypes(xs []*trace.Array) []ir.Type {
	out := make([]ir.Type, len(xs))
	for i, x := range xs {
		out[i] = x.Type()
	}
	return out
}

// bixSame fails unless got has want's type and bytes.
func bixSame(t *testing.T, name string, got, want *trace.Array) {
	t.Helper()
	if !got.Type().Equal(want.Type()) {
		t.Fatalf("%s: got %v, want %v", name, got.Type(), want.Type())
	}
	gl, err := got.Literal()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	wl, err := want.Literal()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !bytes.Equal(gl.Data, wl.Data) {
		t.Fatalf("%s:\ngot  %v\nwant %v", name, got.Float64s(), want.Float64s())
	}
}

// bixShape draws a shape of the given rank with dims in [0, hi].
func bixShape(r *rand.Rand, rank, hi int) ir.Shape {
	s := make(ir.Shape, rank)
	for i := range s {
		s[i] = r.IntN(hi + 1)
	}
	return s
}

var bixDTypes = []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16, ir.Int32, ir.Bool}

// bixValues makes random values of dtype dt (NaNs included for floats).
func bixValues(r *rand.Rand, dt ir.DType, shape ir.Shape) bixGen {
	return func() *trace.Array {
		l := ir.NewLiteral(ir.TypeOf(dt, shape...))
		for i := 0; i < shape.Size(); i++ {
			v := r.NormFloat64() * 4
			if dt.IsFloat() && r.IntN(50) == 0 {
				v = math.NaN()
			}
			l.SetFloat64At(i, v)
		}
		return trace.FromLiteral(l)
	}
}

var bixIndexDTypes = []ir.DType{ir.Int32, ir.Int64, ir.Uint8, ir.Uint32}

// bixIndex draws an index for an axis of size n: mostly near [0, n) (negative
// ones too for signed dtypes), sometimes far out of range.
func bixIndex(r *rand.Rand, dt ir.DType, n int) float64 {
	signed := dt == ir.Int32 || dt == ir.Int64
	if r.IntN(10) == 0 {
		switch {
		case dt == ir.Uint8:
			return 255
		case dt == ir.Uint32:
			return 4e9
		case r.IntN(2) == 0:
			return 1e9
		default:
			return -1e9
		}
	}
	if signed {
		return float64(r.IntN(4*n+9) - 2*n - 4)
	}
	return float64(r.IntN(2*n + 5))
}

// bixIndices makes random index arrays of the given shape for an axis of size n.
func bixIndices(r *rand.Rand, dt ir.DType, shape ir.Shape, n int) bixGen {
	return func() *trace.Array {
		l := ir.NewLiteral(ir.TypeOf(dt, shape...))
		for i := 0; i < shape.Size(); i++ {
			l.SetFloat64At(i, bixIndex(r, dt, n))
		}
		return trace.FromLiteral(l)
	}
}

func bixPick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func bixSize(r *rand.Rand) int { return bixPick(r, []int{0, 1, 3, 3, 2}) }

// bixCase is a random use of one of the indexing ops: a per-example
// function and generators of its inputs.
type bixCase struct {
	name string
	fn   func(a []*trace.Array) *trace.Array
	gens []bixGen
}

func bixTake(r *rand.Rand) bixCase {
	shape := bixShape(r, 1+r.IntN(3), 3)
	axis := r.IntN(len(shape))
	shape[axis] = 1 + r.IntN(4)
	if r.IntN(8) == 0 {
		shape[axis] = 0
	}
	ishape := bixShape(r, r.IntN(3), 3)
	if shape[axis] == 0 {
		// Gathering from an empty axis is an error unless nothing is gathered.
		ishape = append(ishape, 0)
	}
	dt, it := bixPick(r, bixDTypes), bixPick(r, bixIndexDTypes)
	return bixCase{fmt.Sprintf("Take(axis %d)", axis),
		func(a []*trace.Array) *trace.Array { return trace.Take(a[0], a[1], axis) },
		[]bixGen{bixValues(r, dt, shape), bixIndices(r, it, ishape, shape[axis])}}
}

func bixScatterAdd(r *rand.Rand) bixCase {
	shape := bixShape(r, 1+r.IntN(3), 3)
	axis := r.IntN(len(shape))
	ishape := bixShape(r, r.IntN(3), 3)
	ushape := ir.GatherShape(shape, ishape, axis)
	dt, it := bixPick(r, bixDTypes), bixPick(r, bixIndexDTypes)
	return bixCase{fmt.Sprintf("ScatterAdd(axis %d)", axis),
		func(a []*trace.Array) *trace.Array { return trace.ScatterAdd(a[0], a[1], a[2], axis) },
		[]bixGen{bixValues(r, dt, shape), bixIndices(r, it, ishape, shape[axis]), bixValues(r, dt, ushape)}}
}

// bixStarts returns generators of one start scalar per dim of shape.
func bixStarts(r *rand.Rand, shape ir.Shape) []bixGen {
	gens := make([]bixGen, len(shape))
	for i, n := range shape {
		gens[i] = bixIndices(r, bixPick(r, bixIndexDTypes), nil, n)
	}
	return gens
}

func bixDynamicSlice(r *rand.Rand) bixCase {
	shape := bixShape(r, 1+r.IntN(3), 4)
	sizes := make([]int, len(shape))
	for i, n := range shape {
		sizes[i] = r.IntN(n + 1)
	}
	dt := bixPick(r, bixDTypes)
	return bixCase{fmt.Sprintf("DynamicSlice(sizes %v)", sizes),
		func(a []*trace.Array) *trace.Array { return trace.DynamicSlice(a[0], a[1:], sizes) },
		append([]bixGen{bixValues(r, dt, shape)}, bixStarts(r, shape)...)}
}

func bixDynamicUpdateSlice(r *rand.Rand) bixCase {
	shape := bixShape(r, 1+r.IntN(3), 4)
	ushape := make(ir.Shape, len(shape))
	for i, n := range shape {
		ushape[i] = r.IntN(n + 1)
		if n > 0 && r.IntN(3) > 0 {
			ushape[i] = max(ushape[i], 1) // mostly non-empty updates
		}
	}
	dt := bixPick(r, bixDTypes)
	return bixCase{"DynamicUpdateSlice",
		func(a []*trace.Array) *trace.Array { return trace.DynamicUpdateSlice(a[0], a[1], a[2:]) },
		append([]bixGen{bixValues(r, dt, shape), bixValues(r, dt, ushape)}, bixStarts(r, shape)...)}
}

var bixCases = []struct {
	name string
	make func(r *rand.Rand) bixCase
}{
	{"Take", bixTake},
	{"ScatterAdd", bixScatterAdd},
	{"DynamicSlice", bixDynamicSlice},
	{"DynamicUpdateSlice", bixDynamicUpdateSlice},
}

// TestVmapIndexOps checks Vmap of each indexing op against the op applied
// per example and stacked.
func TestVmapIndexOps(t *testing.T) {
	r := otRand(t)
	for _, op := range bixCases {
		t.Run(op.name, func(t *testing.T) {
			for trial := 0; trial < 60; trial++ {
				c := op.make(r)
				bixCheck(t, r, c.name, bixSize(r), c.fn, c.gens)
			}
		})
	}
}

// TestVmapIndexNested checks Vmap of Vmap: the inner Vmap maps axis 0 of
// some inputs (size 2), the outer one a random axis of each; the ops the
// inner rules emit are batched again by the outer ones.
func TestVmapIndexNested(t *testing.T) {
	r := otRand(t)
	for _, op := range bixCases {
		t.Run(op.name, func(t *testing.T) {
			for trial := 0; trial < 15; trial++ {
				c := op.make(r)
				const inner = 2
				axes := make([]int, len(c.gens))
				gens := make([]bixGen, len(c.gens))
				for i, g := range c.gens {
					if r.IntN(3) == 0 {
						axes[i], gens[i] = trace.NotMapped, g
						continue
					}
					gens[i] = func() *trace.Array { return trace.Stack(0, g(), g()) }
				}
				fn := trace.Vmap(c.fn, trace.InAxes(axes...), trace.AxisSize(inner))
				bixCheck(t, r, fmt.Sprintf("Vmap(%s, in_axes=%v)", c.name, bixAxes(axes)), bixSize(r), fn, gens)
			}
		})
	}
}

// bixClose fails unless got and want have one type and values within a
// relative tolerance of 1e-12.
func bixClose(t *testing.T, name string, got, want *trace.Array) {
	t.Helper()
	if !got.Type().Equal(want.Type()) {
		t.Fatalf("%s: got %v, want %v", name, got.Type(), want.Type())
	}
	g, w := got.Float64s(), want.Float64s()
	for i := range g {
		if math.Abs(g[i]-w[i]) > 1e-12*max(1, math.Abs(w[i])) {
			t.Fatalf("%s: element %d = %v, want %v\ngot  %v\nwant %v", name, i, g[i], w[i], g, w)
		}
	}
}

// TestVmapIndexGrad checks that the rules compose with Grad both ways: the
// gradient of a loss over a vmapped Take or DynamicSlice is the gradient of
// the per-example loop, and per-example gradients (Vmap of Grad, whose
// backward passes scatter and update with batched indices) are each
// example's gradient.
func TestVmapIndexGrad(t *testing.T) {
	r := otRand(t)
	const b, n, d = 3, 5, 4
	x := bixValues(r, ir.Float64, ir.Shape{n, d})()
	xs := bixValues(r, ir.Float64, ir.Shape{b, n, d})()
	idx := bixIndices(r, ir.Int32, ir.Shape{b, 6}, n)()
	w := bixValues(r, ir.Float64, ir.Shape{b, 6, d})()
	starts := bixIndices(r, ir.Int64, ir.Shape{b}, n)()
	zero := trace.ScalarAs(0, ir.Int32)
	sizes := []int{2, d}
	wd := bixValues(r, ir.Float64, ir.Shape{b, 2, d})()

	// Grad of a vmapped Take of a closed-over table, and of a vmapped
	// DynamicSlice of a mapped operand.
	take := func(x, i *trace.Array) *trace.Array { return trace.Take(x, i, 0) }
	slice := func(x, s *trace.Array) *trace.Array { return trace.DynamicSlice(x, []*trace.Array{s, zero}, sizes) }
	lossTake := func(x *trace.Array) *trace.Array {
		g := trace.Vmap(func(i *trace.Array) *trace.Array { return take(x, i) })(idx)
		return trace.Sum(trace.Mul(g, w))
	}
	loopTake := func(x *trace.Array) *trace.Array {
		var s *trace.Array
		for k := 0; k < b; k++ {
			v := trace.Sum(trace.Mul(take(x, trace.Index(idx, k)), trace.Index(w, k)))
			if s == nil {
				s = v
			} else {
				s = trace.Add(s, v)
			}
		}
		return s
	}
	lossSlice := func(xs *trace.Array) *trace.Array {
		return trace.Sum(trace.Mul(trace.Vmap(slice)(xs, starts), wd))
	}
	loopSlice := func(xs *trace.Array) *trace.Array {
		var s *trace.Array
		for k := 0; k < b; k++ {
			v := trace.Sum(trace.Mul(slice(trace.Index(xs, k), trace.Index(starts, k)), trace.Index(wd, k)))
			if s == nil {
				s = v
			} else {
				s = trace.Add(s, v)
			}
		}
		return s
	}
	bixClose(t, "Grad(Vmap(Take))", trace.Grad(lossTake)(x), trace.Grad(loopTake)(x))
	bixClose(t, "Jit(Grad(Vmap(Take)))", rt.Jit(trace.Grad(lossTake))(x), trace.Grad(loopTake)(x))
	bixClose(t, "Grad(Vmap(DynamicSlice))", trace.Grad(lossSlice)(xs), trace.Grad(loopSlice)(xs))
	bixClose(t, "Jit(Grad(Vmap(DynamicSlice)))", rt.Jit(trace.Grad(lossSlice))(xs), trace.Grad(loopSlice)(xs))

	// Per-example gradients: Vmap of Grad.
	perTake := func(x, i, w *trace.Array) *trace.Array {
		return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(take(x, i), w)) })(x)
	}
	perSlice := func(x, s, w *trace.Array) *trace.Array {
		return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(slice(x, s), w)) })(x)
	}
	for _, c := range []struct {
		name string
		fn   func(x, i, w *trace.Array) *trace.Array
		i, w *trace.Array
	}{{"Take", perTake, idx, w}, {"DynamicSlice", perSlice, starts, wd}} {
		for _, xin := range []struct {
			x    *trace.Array
			axis int
		}{{x, trace.NotMapped}, {xs, 0}} {
			f := trace.Vmap(c.fn, trace.InAxes(xin.axis, 0, 0))
			outs := make([]*trace.Array, b)
			for k := range outs {
				xk := xin.x
				if xin.axis == 0 {
					xk = trace.Index(xin.x, k)
				}
				outs[k] = c.fn(xk, trace.Index(c.i, k), trace.Index(c.w, k))
			}
			want := trace.Stack(0, outs...)
			name := fmt.Sprintf("Vmap(Grad(%s)) x axis %s", c.name, bixAxes([]int{xin.axis})[0])
			bixSame(t, name, f(xin.x, c.i, c.w), want)
			bixSame(t, "Jit "+name, rt.Jit(f)(xin.x, c.i, c.w), want)
		}
	}
}

// TestVmapIndexOneOp checks that the batched program is one set of ops
// whatever the batch size: one gather, scatter_add or dynamic_slice for the
// batch, and the same ops for batch sizes 3 and 50.
func TestVmapIndexOneOp(t *testing.T) {
	for _, c := range []struct {
		name  string
		code  ir.Code
		fn    func(a ...*trace.Array) *trace.Array
		types func(b int) []ir.Type
	}{
		{"Take", ir.Gather, func(a ...*trace.Array) *trace.Array {
			return trace.Vmap(func(x, i *trace.Array) *trace.Array { return trace.Take(x, i, 1) }, trace.InAxes(2, 0))(a[0], a[1])
		}, func(b int) []ir.Type { return []ir.Type{ir.TypeOf(ir.Float32, 4, 5, b), ir.TypeOf(ir.Int32, b, 7)} }},
		{"ScatterAdd", ir.ScatterAdd, func(a ...*trace.Array) *trace.Array {
			return trace.Vmap(func(x, i, u *trace.Array) *trace.Array { return trace.ScatterAdd(x, i, u, 0) })(a[0], a[1], a[2])
		}, func(b int) []ir.Type {
			return []ir.Type{ir.TypeOf(ir.Float32, b, 5, 3), ir.TypeOf(ir.Int64, b, 7), ir.TypeOf(ir.Float32, b, 7, 3)}
		}},
		{"DynamicSlice", ir.Gather, func(a ...*trace.Array) *trace.Array {
			return trace.Vmap(func(x, s *trace.Array) *trace.Array {
				return trace.DynamicSlice(x, []*trace.Array{s, trace.ScalarAs(0, ir.Int32)}, []int{2, 3})
			})(a[0], a[1])
		}, func(b int) []ir.Type { return []ir.Type{ir.TypeOf(ir.Float32, b, 6, 3), ir.TypeOf(ir.Int32, b)} }},
	} {
		var counts []map[ir.Code]int
		for _, b := range []int{3, 50} {
			ops, _ := otTrace(c.fn, c.types(b)...)
			counts = append(counts, otCodes(ops))
		}
		if counts[0][c.code] != 1 || !maps.Equal(counts[0], counts[1]) {
			t.Errorf("%s: ops for batch 3: %v, for batch 50: %v (want one %v, the same ops)", c.name, counts[0], counts[1], c.code)
		}
	}
}
