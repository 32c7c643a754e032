package trace_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Tests of the batching rules of scan, cond, while and fusion: Vmap of a
// function against the function run on each example and stacked.

// bcExact turns the CPU backend's contraction of multiply-adds off for the
// test (see vmath.SetContract): whether a fused chain contracts a multiply
// depends on how the compiler groups the ops, which differs between a batched
// program and a per-example one, so that with it on the two may differ in the
// last bit. With it off they must agree bit for bit.
func bcExact(t *testing.T) {
	prev := vmath.SetContract(false)
	t.Cleanup(func() { vmath.SetContract(prev) })
}

type bcFn = func(args []*trace.Array) []*trace.Array

// bcFront returns x with axis ax moved to the front.
func bcFront(x *trace.Array, ax int) *trace.Array {
	perm := []int{ax}
	for i := 0; i < x.Rank(); i++ {
		if i != ax {
			perm = append(perm, i)
		}
	}
	return trace.Transpose(x, perm...)
}

// bcLoop runs f on each example (axes[i]: the mapped axis of args[i], or
// NotMapped) and stacks the results on axis 0.
func bcLoop(f bcFn, args []*trace.Array, axes []int, n int) []*trace.Array {
	var per [][]*trace.Array
	for b := 0; b < n; b++ {
		ex := make([]*trace.Array, len(args))
		for i, a := range args {
			if axes[i] == trace.NotMapped {
				ex[i] = a
			} else {
				ex[i] = trace.Index(bcFront(a, axes[i]), b)
			}
		}
		per = append(per, f(ex))
	}
	out := make([]*trace.Array, len(per[0]))
	for k := range out {
		col := make([]*trace.Array, n)
		for b := range col {
			col[b] = per[b][k]
		}
		out[k] = trace.Stack(0, col...)
	}
	return out
}

// bcSame checks that got is want bit for bit (dtype, shape and every value).
func bcSame(t *testing.T, what string, got, want *trace.Array) {
	t.Helper()
	if !got.Type().Equal(want.Type()) {
		t.Errorf("%s: type %v, want %v", what, got.Type(), want.Type())
		return
	}
	g, w := got.Float64s(), want.Float64s()
	for i := range w {
		if math.Float64bits(g[i]) != math.Float64bits(w[i]) {
			t.Errorf("%s: element %d is %v, want %v (of %d)", what, i, g[i], w[i], len(w))
			return
		}
	}
}

// bcClose checks got against want within a relative tolerance (for results
// whose sums run in another order than the reference's).
func bcClose(t *testing.T, what string, got, want *trace.Array, tol float64) {
	t.Helper()
	if !got.Type().Equal(want.Type()) {
		t.Errorf("%s: type %v, want %v", what, got.Type(), want.Type())
		return
	}
	g, w := got.Float64s(), want.Float64s()
	scale := 0.0
	for _, v := range w {
		scale = max(scale, math.Abs(v))
	}
	for i := range w {
		if math.Abs(g[i]-w[i]) > tol*max(scale, 1) || math.IsNaN(g[i]) != math.IsNaN(w[i]) {
			t.Errorf("%s: element %d is %v, want %v (tolerance %g)", what, i, g[i], w[i], tol)
			return
		}
	}
}

// bcCheck compares VmapFlat(f) with the per-example loop, eagerly and under
// rt.Jit, bit for bit.
func bcCheck(t *testing.T, name string, f bcFn, args []*trace.Array, axes []int, n int) {
	t.Helper()
	want := bcLoop(f, args, axes, n)
	got := trace.VmapFlat(f, args, trace.InAxes(axes...))
	jit := rt.Jit(func(xs []*trace.Array) []*trace.Array { return trace.VmapFlat(f, xs, trace.InAxes(axes...)) })(args)
	if len(got) != len(want) || len(jit) != len(want) {
		t.Fatalf("%s: %d and %d (jit) results, want %d", name, len(got), len(jit), len(want))
	}
	for k := range want {
		bcSame(t, fmt.Sprintf("%s: result %d", name, k), got[k], want[k])
		bcSame(t, fmt.Sprintf("%s: result %d (jit)", name, k), jit[k], want[k])
	}
}

// bcLower returns the IR of VmapFlat(f) traced on args.
func bcLower(t *testing.T, f bcFn, args []*trace.Array, axes []int) *ir.Func {
	t.Helper()
	l, err := rt.Lower(func(xs []*trace.Array) []*trace.Array { return trace.VmapFlat(f, xs, trace.InAxes(axes...)) }, args)
	if err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(l.Func); err != nil {
		t.Fatalf("IR does not verify: %v\n%s", err, l.IR())
	}
	return l.Func
}

// bcFind returns the first op with the code in f's top region.
func bcFind(t *testing.T, f *ir.Func, code ir.Code) *ir.Op {
	t.Helper()
	for _, op := range f.Body.Ops {
		if op.Code == code {
			return op
		}
	}
	t.Fatalf("no %v op in\n%s", code, f)
	return nil
}

const nM = trace.NotMapped

// bcStepScan is a scan of c = tanh(c*w + x), y = c*sin(x) over xs.
func bcStepScan(opts ...trace.ScanOption) bcFn {
	return func(a []*trace.Array) []*trace.Array {
		init, xs, w := a[0], a[1], a[2]
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Add(trace.Mul(c[0], w), x[0]))
			return []*trace.Array{h}, []*trace.Array{trace.Mul(h, trace.Sin(x[0]))}
		}, []*trace.Array{init}, []*trace.Array{xs}, opts...)
		return []*trace.Array{c[0], ys[0]}
	}
}

func TestVmapScan(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 4, 5, 3
	init, binit := gtF32(r, 1, D), gtF32(r, 1, B, D)
	xs, bxs, bxs1 := gtF32(r, 1, N, D), gtF32(r, 1, B, N, D), gtF32(r, 1, N, B, D)
	w, bw := gtF32(r, 1, D), gtF32(r, 1, B, D)
	f := bcStepScan()
	bcCheck(t, "batched xs", f, []*trace.Array{init, bxs, w}, []int{nM, 0, nM}, B)
	bcCheck(t, "xs batched on axis 1", f, []*trace.Array{init, bxs1, w}, []int{nM, 1, nM}, B)
	bcCheck(t, "batched init", f, []*trace.Array{binit, xs, w}, []int{0, nM, nM}, B)
	bcCheck(t, "batched const", f, []*trace.Array{init, xs, bw}, []int{nM, nM, 0}, B)
	bcCheck(t, "all batched", f, []*trace.Array{binit, bxs, bw}, []int{0, 0, 0}, B)
	bcCheck(t, "init and const batched on axis 1", f, []*trace.Array{gtF32(r, 1, D, B), xs, gtF32(r, 1, D, B)}, []int{1, nM, 1}, B)
	bcCheck(t, "zero length", f, []*trace.Array{binit, gtF32(r, 1, B, 0, D), w}, []int{0, 0, nM}, B)
	bcCheck(t, "reverse", bcStepScan(trace.ScanReverse()), []*trace.Array{binit, bxs, w}, []int{0, 0, nM}, B)

	// The carry of an unbatched init is batched in the scan, the ys too.
	fn := bcLower(t, f, []*trace.Array{init, xs, bw}, []int{nM, nM, 0})
	sc := bcFind(t, fn, ir.Scan)
	if got := sc.Results[0].Type.Shape; !got.Equal(ir.Shape{B, D}) {
		t.Errorf("carry of the batched scan is %v, want [%d %d]", got, B, D)
	}

	// No xs: ScanLength.
	powers := func(a []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Mul(c[0], a[1])}, []*trace.Array{c[0]}
		}, []*trace.Array{a[0]}, nil, trace.ScanLength(4))
		return []*trace.Array{c[0], ys[0]}
	}
	bcCheck(t, "no xs", powers, []*trace.Array{binit, w}, []int{0, nM}, B)
	bcCheck(t, "no xs, batched const", powers, []*trace.Array{init, bw}, []int{nM, 0}, B)
}

// TestVmapScanCarryFixedPoint: a carry batched only through another carry
// (two rounds of the fixed point), and a counter that stays unbatched.
func TestVmapScanCarryFixedPoint(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 3, 6, 2
	f := func(a []*trace.Array) []*trace.Array {
		init := []*trace.Array{trace.ZerosLike(a[1]), trace.OnesLike(a[1]), trace.ScalarAs(0, ir.Int32)}
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			acc := trace.Add(c[0], c[1])                      // batched once c[1] is
			prod := trace.Mul(c[1], trace.Cos(x[0]))          // batched through x
			k := trace.Add(c[2], trace.ScalarAs(1, ir.Int32)) // never batched
			return []*trace.Array{acc, prod, k}, []*trace.Array{trace.Mul(acc, trace.Convert(k, ir.Float32))}
		}, init, []*trace.Array{a[0]})
		return append(c, ys...)
	}
	xs := gtF32(r, 2, B, N, D)
	args := []*trace.Array{xs, gtF32(r, 1, D)}
	axes := []int{0, nM}
	bcCheck(t, "fixed point", f, args, axes, B)
	sc := bcFind(t, bcLower(t, f, args, axes), ir.Scan)
	want := []ir.Shape{{B, D}, {B, D}, {}}
	for j, s := range want {
		if got := sc.Results[j].Type.Shape; !got.Equal(s) {
			t.Errorf("carry %d of the batched scan is %v, want %v", j, got, s)
		}
	}
}

// TestVmapScanNesting: Vmap inside a scan's body, Vmap of Vmap of a scan, and
// ForLoop under Vmap.
func TestVmapScanNesting(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, B2, N, D = 3, 2, 4, 5
	// A scan whose body maps over the examples of each slice.
	inner := func(c, x *trace.Array) *trace.Array { return trace.Tanh(trace.Add(trace.Mul(x, c), trace.Sin(c))) }
	vmapInScan := func(c0, xs *trace.Array, vm bool) []*trace.Array {
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			var y *trace.Array
			if vm {
				y = trace.Vmap(func(x *trace.Array) *trace.Array { return inner(c[0], x) })(x[0])
			} else {
				rows := make([]*trace.Array, B)
				for b := range rows {
					rows[b] = inner(c[0], trace.Index(x[0], b))
				}
				y = trace.Stack(0, rows...)
			}
			return []*trace.Array{trace.Add(c[0], trace.Sum(y, 0))}, []*trace.Array{y}
		}, []*trace.Array{c0}, []*trace.Array{xs})
		return append(c, ys...)
	}
	c0, xs := gtF32(r, 1, D), gtF32(r, 1, N, B, D)
	want := vmapInScan(c0, xs, false)
	got := vmapInScan(c0, xs, true)
	jit := rt.Jit(func(c0, xs *trace.Array) []*trace.Array { return vmapInScan(c0, xs, true) })(c0, xs)
	for k := range want {
		bcSame(t, fmt.Sprintf("vmap in scan: result %d", k), got[k], want[k])
		bcSame(t, fmt.Sprintf("vmap in scan: result %d (jit)", k), jit[k], want[k])
	}

	// Vmap of Vmap of a scan, per outer example against the inner Vmap.
	f := bcStepScan()
	vf := func(a []*trace.Array) []*trace.Array { return trace.VmapFlat(f, a, trace.InAxes(0, 0, nM)) }
	bcCheck(t, "vmap of vmap of scan", vf, []*trace.Array{gtF32(r, 1, B2, B, D), gtF32(r, 1, B2, B, N, D), gtF32(r, 1, D)}, []int{0, 0, nM}, B2)

	// ForLoop: a scan over the indices.
	loop := func(a []*trace.Array) []*trace.Array {
		return trace.ForLoop(1, 5, func(i *trace.Array, s []*trace.Array) []*trace.Array {
			fi := trace.Convert(i, ir.Float32)
			return []*trace.Array{trace.Add(trace.Mul(trace.Sin(s[0]), a[1]), fi), trace.Add(s[1], i)}
		}, a[0], trace.ScalarAs(0, ir.Int32))
	}
	bcCheck(t, "ForLoop, batched state", loop, []*trace.Array{gtF32(r, 1, B, D), gtF32(r, 1, D)}, []int{0, nM}, B)
	bcCheck(t, "ForLoop, batched closure", loop, []*trace.Array{gtF32(r, 1, D), gtF32(r, 1, B, D)}, []int{nM, 0}, B)
}

// bcCondFn: cond(p, x*k, x-k) on the predicate p, the operand x and the
// closure k, and a second result that is k in one branch and x in the other.
func bcCondFn(a []*trace.Array) []*trace.Array {
	p, x, k := a[0], a[1], a[2]
	return trace.Cond(p, func(o []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Mul(o[0], k), k}
	}, func(o []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Sub(o[0], k), trace.Exp(o[0])}
	}, x)
}

func TestVmapCond(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, D = 6, 3
	x, bx := gtF32(r, 1, D), gtF32(r, 1, B, D)
	k, bk := gtF32(r, 1, D), gtF32(r, 1, B, D)
	bp := make([]bool, B)
	for i := range bp {
		bp[i] = i%2 == 0 || r.IntN(2) == 0
	}
	bp[1] = false
	bpred := rt.FromSlice(bp, B)
	for _, p := range []bool{true, false} {
		pred := trace.Reshape(rt.FromSlice([]bool{p}, 1))
		bcCheck(t, fmt.Sprintf("pred %v, batched operand", p), bcCondFn, []*trace.Array{pred, bx, k}, []int{nM, 0, nM}, B)
		bcCheck(t, fmt.Sprintf("pred %v, batched closure", p), bcCondFn, []*trace.Array{pred, x, bk}, []int{nM, nM, 0}, B)
	}
	bcCheck(t, "batched pred", bcCondFn, []*trace.Array{bpred, x, k}, []int{0, nM, nM}, B)
	bcCheck(t, "batched pred and operand", bcCondFn, []*trace.Array{bpred, bx, bk}, []int{0, 0, 0}, B)
	bcCheck(t, "unbatched pred, operand batched on axis 1", bcCondFn, []*trace.Array{trace.Reshape(rt.FromSlice([]bool{false}, 1)), gtF32(r, 1, D, B), k}, []int{nM, 1, nM}, B)
	bcCheck(t, "batched pred, operand batched on axis 1", bcCondFn, []*trace.Array{bpred, gtF32(r, 1, D, B), bk}, []int{0, 1, 0}, B)
	// A numeric predicate computed from the example.
	dataPred := func(a []*trace.Array) []*trace.Array {
		return bcCondFn([]*trace.Array{trace.Sum(a[0]), a[0], a[1]})
	}
	bcCheck(t, "predicate from the data", dataPred, []*trace.Array{bx, k}, []int{0, nM}, B)

	// An unbatched predicate keeps one cond.
	fn := bcLower(t, bcCondFn, []*trace.Array{trace.Reshape(rt.FromSlice([]bool{true}, 1)), bx, k}, []int{nM, 0, nM})
	c := bcFind(t, fn, ir.Cond)
	if s := c.Results[1].Type.Shape; !s.Equal(ir.Shape{B, D}) {
		t.Errorf("second result of the cond is %v, want batched [%d %d]", s, B, D)
	}
}

// bcGrowLoop runs x = x*1.5 + 1 until x >= limit, counting the steps.
func bcGrowLoop(a []*trace.Array) []*trace.Array {
	x, limit := a[0], a[1]
	return trace.While(func(s []*trace.Array) *trace.Array {
		return trace.Less(s[0], limit)
	}, func(s []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Add(trace.Mul(s[0], trace.ScalarAs(1.5, ir.Float32)), trace.ScalarAs(1, ir.Float32)),
			trace.Add(s[1], trace.ScalarAs(1, ir.Int32))}
	}, x, trace.ScalarAs(0, ir.Int32))
}

func TestVmapWhile(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B = 7
	xs := make([]float32, B)
	for i := range xs {
		xs[i] = float32(r.Float64() * 30)
	}
	xs[0] = 100 // no iteration at all in lane 0
	bx := rt.FromSlice(xs, B)
	limit := trace.ScalarAs(40, ir.Float32)
	blimit := rt.FromSlice([]float32{10, 50, 80, 5, 40, 20, 60}, B)
	bcCheck(t, "batched state", bcGrowLoop, []*trace.Array{bx, limit}, []int{0, nM}, B)
	bcCheck(t, "batched limit", bcGrowLoop, []*trace.Array{trace.ScalarAs(1, ir.Float32), blimit}, []int{nM, 0}, B)
	trips := trace.VmapFlat(bcGrowLoop, []*trace.Array{bx, limit}, trace.InAxes(0, nM))[1].Int32s()
	distinct := map[int32]bool{}
	for _, n := range trips {
		distinct[n] = true
	}
	if len(distinct) < 2 {
		t.Errorf("trip counts %v: want lanes with different counts", trips)
	}

	// An unbatched predicate (a step counter) keeps one while with an
	// unbatched counter.
	counted := func(a []*trace.Array) []*trace.Array {
		return trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Less(s[0], trace.ScalarAs(5, ir.Int32))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(s[0], trace.ScalarAs(1, ir.Int32)), trace.Sin(trace.Add(s[1], a[1]))}
		}, trace.ScalarAs(0, ir.Int32), a[0])
	}
	args := []*trace.Array{gtF32(r, 1, B, 3), gtF32(r, 1, 3)}
	bcCheck(t, "unbatched predicate", counted, args, []int{0, nM}, B)
	bcCheck(t, "unbatched predicate, state batched on axis 1", counted, []*trace.Array{gtF32(r, 1, 3, B), gtF32(r, 1, 3)}, []int{1, nM}, B)
	bcCheck(t, "unbatched predicate, batched closure", counted, []*trace.Array{gtF32(r, 1, 3), gtF32(r, 1, B, 3)}, []int{nM, 0}, B)
	w := bcFind(t, bcLower(t, counted, args, []int{0, nM}), ir.While)
	if s := w.Results[0].Type.Shape; len(s) != 0 {
		t.Errorf("the counter of the batched while is %v, want a scalar", s)
	}

	// A predicate batched only through the state the body batches: the
	// counter steps by a batched amount.
	stepped := func(a []*trace.Array) []*trace.Array {
		return trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Less(s[0], trace.ScalarAs(20, ir.Int32))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(s[0], a[0]), trace.Add(s[1], trace.Convert(s[0], ir.Float32))}
		}, trace.ScalarAs(0, ir.Int32), trace.ScalarAs(0, ir.Float32))
	}
	bcCheck(t, "predicate batched through the body", stepped, []*trace.Array{rt.FromSlice([]int32{1, 2, 3, 5, 7, 9, 30}, B)}, []int{0}, B)
}

// bcScanLoss is a scan over the examples' xs with weights w, reduced to a
// scalar.
func bcScanLoss(xs, w *trace.Array) *trace.Array {
	c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
		h := trace.Tanh(trace.Add(trace.Mul(c[0], w), x[0]))
		return []*trace.Array{h}, []*trace.Array{trace.Mul(h, h)}
	}, []*trace.Array{trace.ZerosLike(w)}, []*trace.Array{xs})
	return trace.Add(trace.Sum(ys[0]), trace.Sum(c[0]))
}

// bcCondLoss is a cond on the sign of the example's sum.
func bcCondLoss(x, w *trace.Array) *trace.Array {
	y := trace.Cond(trace.Sum(x), func(o []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Sin(trace.Mul(o[0], w))}
	}, func(o []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Mul(trace.Mul(o[0], o[0]), w)}
	}, x)[0]
	return trace.Sum(y)
}

type bcP struct{ X, W *trace.Array }

// TestVmapGradControl: Grad of a Vmap'd scan, and per-example gradients
// (Vmap of Grad) through Scan and Cond, against the per-example loop.
func TestVmapGradControl(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 4, 5, 3
	X, w := gtF32(r, 1, B, N, D), gtF32(r, 1, D)

	// Grad (w.r.t. the batch and the shared weights) of a Vmap'd scan.
	vl := func(p bcP) *trace.Array {
		return trace.Sum(trace.Vmap(bcScanLoss, trace.InAxes(0, nM))(p.X, p.W))
	}
	ll := func(p bcP) *trace.Array {
		s := bcScanLoss(trace.Index(p.X, 0), p.W)
		for b := 1; b < B; b++ {
			s = trace.Add(s, bcScanLoss(trace.Index(p.X, b), p.W))
		}
		return s
	}
	p := bcP{X, w}
	want := trace.Grad(ll)(p)
	for name, g := range map[string]bcP{"eager": trace.Grad(vl)(p), "jit": rt.Jit(trace.Grad(vl))(p)} {
		bcSame(t, "grad of vmap of scan, dX ("+name+")", g.X, want.X)
		bcClose(t, "grad of vmap of scan, dW ("+name+")", g.W, want.W, 1e-6)
	}

	// Per-example gradients through a scan and a cond.
	for name, loss := range map[string]func(x, w *trace.Array) *trace.Array{"scan": bcScanLoss, "cond": bcCondLoss} {
		x := X
		if name == "cond" {
			x = gtF32(r, 1, B, D)
		}
		per := func(a []*trace.Array) []*trace.Array {
			g := trace.Grad(func(p bcP) *trace.Array { return loss(p.X, p.W) })(bcP{a[0], a[1]})
			return []*trace.Array{g.X, g.W}
		}
		bcCheck(t, "vmap of grad through "+name, per, []*trace.Array{x, w}, []int{0, nM}, B)
	}

	// Per-example Jacobian-vector products through a scan, with per-example
	// tangents of the xs and a shared tangent of the weights.
	jvp := func(a []*trace.Array) []*trace.Array {
		_, tout := trace.JVP(func(p []*trace.Array) []*trace.Array { return []*trace.Array{bcScanLoss(p[0], p[1])} },
			[]*trace.Array{a[0], a[1]}, []*trace.Array{a[2], a[3]})
		return tout
	}
	bcCheck(t, "vmap of jvp through scan", jvp, []*trace.Array{X, w, gtF32(r, 1, B, N, D), gtF32(r, 1, D)}, []int{0, nM, 0, nM}, B)
}

// bcScaled is x*w with a custom VJP that scales both cotangents by 3 (so the
// custom backward is visibly the one that runs), and a second output 2*w
// that does not depend on x.
var bcScaled = trace.CustomVJP(func(a []*trace.Array) ([]*trace.Array, []*trace.Array) {
	return []*trace.Array{trace.Mul(a[0], a[1]), trace.Mul(a[1], trace.ScalarAs(2, ir.Float32))}, a
}, func(res, ct []*trace.Array) []*trace.Array {
	three := trace.ScalarAs(3, ir.Float32)
	dx := trace.Mul(trace.Mul(ct[0], res[1]), three)
	dw := trace.Mul(trace.Add(trace.Mul(ct[0], res[0]), trace.Mul(ct[1], trace.ScalarAs(2, ir.Float32))), three)
	return []*trace.Array{dx, dw}
})

func bcScaledLoss(x, w *trace.Array) *trace.Array {
	o := bcScaled(x, w)
	return trace.Add(trace.Sum(trace.Sin(o[0])), trace.Sum(o[1]))
}

// TestVmapCustomVJP: a custom VJP inside Vmap, differentiated both ways,
// against the per-example loop and the float64 formula of the scaled
// gradient: d/dx = 3*cos(x*w)*w, d/dw = 3*(cos(x*w)*x + 2).
func TestVmapCustomVJP(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, D = 5, 4
	X, w := gtF32(r, 1, B, D), gtF32(r, 1, D)
	xs, ws := X.Float64s(), w.Float64s()
	wantDX := make([]float64, B*D)
	wantDW := make([]float64, B*D) // per example
	for b := 0; b < B; b++ {
		for i := 0; i < D; i++ {
			x, wi := float64(float32(xs[b*D+i])), ws[i]
			c := math.Cos(float64(float32(x * wi)))
			wantDX[b*D+i] = 3 * c * wi
			wantDW[b*D+i] = 3 * (c*x + 2)
		}
	}
	sumDW := make([]float64, D)
	for b := 0; b < B; b++ {
		for i := range sumDW {
			sumDW[i] += wantDW[b*D+i]
		}
	}

	// Vmap of Grad: per-example gradients.
	per := func(a []*trace.Array) []*trace.Array {
		g := trace.Grad(func(p bcP) *trace.Array { return bcScaledLoss(p.X, p.W) })(bcP{a[0], a[1]})
		return []*trace.Array{g.X, g.W}
	}
	bcCheck(t, "vmap of grad of custom_vjp", per, []*trace.Array{X, w}, []int{0, nM}, B)
	g := trace.VmapFlat(per, []*trace.Array{X, w}, trace.InAxes(0, nM))
	gtExpectClose(t, "vmap of grad: dx = 3 cos(xw) w", g[0].Float64s(), wantDX, 1e-5)
	gtExpectClose(t, "vmap of grad: dw = 3 (cos(xw) x + 2)", g[1].Float64s(), wantDW, 1e-5)

	// Grad of Vmap: the cotangent of the shared w sums over the batch.
	vl := func(p bcP) *trace.Array { return trace.Sum(trace.Vmap(bcScaledLoss, trace.InAxes(0, nM))(p.X, p.W)) }
	for name, gv := range map[string]bcP{"eager": trace.Grad(vl)(bcP{X, w}), "jit": rt.Jit(trace.Grad(vl))(bcP{X, w})} {
		gtExpectClose(t, "grad of vmap: dx ("+name+")", gv.X.Float64s(), wantDX, 1e-5)
		gtExpectClose(t, "grad of vmap: dw ("+name+")", gv.W.Float64s(), sumDW, 1e-5)
	}

	// Vmap of Vmap: the batched backward of the batched backward.
	X2 := gtF32(r, 1, 2, B, D)
	vvl := func(p bcP) *trace.Array {
		inner := func(x, w *trace.Array) *trace.Array {
			return trace.Sum(trace.Vmap(bcScaledLoss, trace.InAxes(0, nM))(x, w))
		}
		return trace.Sum(trace.Vmap(inner, trace.InAxes(0, nM))(p.X, p.W))
	}
	sl := func(p bcP) *trace.Array {
		return trace.Add(vl(bcP{trace.Index(p.X, 0), p.W}), vl(bcP{trace.Index(p.X, 1), p.W}))
	}
	wantVV := trace.Grad(sl)(bcP{X2, w})
	for name, gv := range map[string]bcP{"eager": trace.Grad(vvl)(bcP{X2, w}), "jit": rt.Jit(trace.Grad(vvl))(bcP{X2, w})} {
		bcSame(t, "grad of vmap of vmap: dx ("+name+")", gv.X, wantVV.X)
		bcClose(t, "grad of vmap of vmap: dw ("+name+")", gv.W, wantVV.W, 1e-6)
	}

	// The output that does not depend on x, returned once (NotMapped): its
	// cotangent counts once in dw.
	once := func(p bcP) *trace.Array {
		o := trace.VmapFlat(func(a []*trace.Array) []*trace.Array { return bcScaled(a[0], a[1]) },
			[]*trace.Array{p.X, p.W}, trace.InAxes(0, nM), trace.OutAxes(0, nM))
		return trace.Add(trace.Sum(trace.Sin(o[0])), trace.Sum(o[1]))
	}
	onceDW := make([]float64, D)
	for i := range onceDW {
		onceDW[i] = sumDW[i] - 6*(B-1)
	}
	for name, gv := range map[string]bcP{"eager": trace.Grad(once)(bcP{X, w}), "jit": rt.Jit(trace.Grad(once))(bcP{X, w})} {
		gtExpectClose(t, "grad of vmap, unmapped output: dx ("+name+")", gv.X.Float64s(), wantDX, 1e-5)
		gtExpectClose(t, "grad of vmap, unmapped output: dw ("+name+")", gv.W.Float64s(), onceDW, 1e-5)
	}
}

// bcRematLayer is a layer under Remat with a policy that saves nothing.
var bcRematLayer = trace.Remat(func(x, w *trace.Array) *trace.Array {
	return trace.Tanh(trace.Mul(trace.Sin(trace.Mul(x, w)), w))
}, trace.NothingSaveable)

func bcPlainLayer(x, w *trace.Array) *trace.Array {
	return trace.Tanh(trace.Mul(trace.Sin(trace.Mul(x, w)), w))
}

// TestVmapRemat: Remat inside Vmap, differentiated both ways, against the
// same layer without Remat (the recomputation is the same arithmetic) and
// the per-example loop.
func TestVmapRemat(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, D = 4, 6
	X, w := gtF32(r, 1, B, D), gtF32(r, 1, D)
	for name, layer := range map[string]func(x, w *trace.Array) *trace.Array{"remat": bcRematLayer, "plain": bcPlainLayer} {
		per := func(a []*trace.Array) []*trace.Array {
			g := trace.Grad(func(p bcP) *trace.Array { return trace.Sum(layer(p.X, p.W)) })(bcP{a[0], a[1]})
			return []*trace.Array{g.X, g.W}
		}
		bcCheck(t, "vmap of grad, "+name, per, []*trace.Array{X, w}, []int{0, nM}, B)
	}
	vl := func(layer func(x, w *trace.Array) *trace.Array) func(p bcP) *trace.Array {
		return func(p bcP) *trace.Array { return trace.Sum(trace.Vmap(layer, trace.InAxes(0, nM))(p.X, p.W)) }
	}
	want := trace.Grad(vl(bcPlainLayer))(bcP{X, w})
	for name, g := range map[string]bcP{"eager": trace.Grad(vl(bcRematLayer))(bcP{X, w}), "jit": rt.Jit(trace.Grad(vl(bcRematLayer)))(bcP{X, w})} {
		bcSame(t, "grad of vmap of remat, dx ("+name+")", g.X, want.X)
		bcClose(t, "grad of vmap of remat, dw ("+name+")", g.W, want.W, 1e-6)
	}
	// The remat's backward is what runs: its recomputation goes through
	// optimization barriers.
	l, err := rt.Lower(trace.Grad(vl(bcRematLayer)), bcP{X, w})
	if err != nil {
		t.Fatal(err)
	}
	if n := otCodes(l.Func.Body.Ops)[ir.OptimizationBarrier]; n == 0 {
		t.Errorf("grad of vmap of remat has no optimization_barrier: the remat backward did not run\n%s", l.IR())
	}
}

// bcFused applies, as one compiler-style fusion op, exp(a*b) - b and a*b.
func bcFused(a []*trace.Array) []*trace.Array {
	f := ir.NewFunc("fusion")
	if t := trace.Current(); t != nil {
		f = t.Func()
	}
	r := f.NewRegion()
	x, y := r.AddParam(a[0].Type()), r.AddParam(a[1].Type())
	must := func(op *ir.Op, err error) *ir.Value {
		if err != nil {
			panic(err)
		}
		return op.Results[0]
	}
	m := must(r.AddOp(ir.Mul, []*ir.Value{x, y}, nil))
	e := must(r.AddOp(ir.Exp, []*ir.Value{m}, nil))
	r.Results = []*ir.Value{must(r.AddOp(ir.Sub, []*ir.Value{e, y}, nil)), m}
	return trace.Apply(ir.Fusion, ir.Attrs{"kind": "loop"}, []*ir.Region{r}, a...)
}

// TestVmapFusion: a fusion op is interpreted batched, inline.
func TestVmapFusion(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, D = 3, 4
	bcCheck(t, "both batched", bcFused, []*trace.Array{gtF32(r, 1, B, D), gtF32(r, 1, B, D)}, []int{0, 0}, B)
	bcCheck(t, "one batched on axis 1", bcFused, []*trace.Array{gtF32(r, 1, D, B), gtF32(r, 1, D)}, []int{1, nM}, B)
}

// bcRematAux is a remat'd layer with a second output, a penalty of the
// weights alone (unbatched under Vmap).
func bcRematAux(remat bool) func(x, w *trace.Array) (*trace.Array, *trace.Array) {
	f := func(x, w *trace.Array) (*trace.Array, *trace.Array) {
		return bcPlainLayer(x, w), trace.Sum(trace.Mul(w, w))
	}
	if remat {
		return trace.Remat(f, trace.NothingSaveable)
	}
	return f
}

// bcScanLayers runs the layer over stacked weights ws with a scan, adding the
// penalties.
func bcScanLayers(layer func(x, w *trace.Array) (*trace.Array, *trace.Array)) func(x, ws *trace.Array) *trace.Array {
	return func(x, ws *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, w []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h, pen := layer(c[0], w[0])
			return []*trace.Array{h, trace.Add(c[1], pen)}, nil
		}, []*trace.Array{x, trace.ScalarAs(0, ir.Float32)}, []*trace.Array{ws})
		return trace.Add(trace.Sum(c[0]), c[1])
	}
}

// TestVmapRematInScan: a scan over remat'd layers with an unbatched output,
// under Vmap, differentiated both ways, against the same layers without
// Remat.
func TestVmapRematInScan(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, L, D = 3, 4, 5
	X, ws := gtF32(r, 1, B, D), gtF32(r, 1, L, D)
	vl := func(remat bool) func(p bcP) *trace.Array {
		return func(p bcP) *trace.Array {
			return trace.Sum(trace.Vmap(bcScanLayers(bcRematAux(remat)), trace.InAxes(0, nM))(p.X, p.W))
		}
	}
	want := trace.Grad(vl(false))(bcP{X, ws})
	for name, g := range map[string]bcP{"eager": trace.Grad(vl(true))(bcP{X, ws}), "jit": rt.Jit(trace.Grad(vl(true)))(bcP{X, ws})} {
		bcClose(t, "grad of vmap, dx ("+name+")", g.X, want.X, 1e-6)
		bcClose(t, "grad of vmap, dw ("+name+")", g.W, want.W, 1e-6)
	}
	per := func(remat bool) bcFn {
		return func(a []*trace.Array) []*trace.Array {
			g := trace.Grad(func(p bcP) *trace.Array { return bcScanLayers(bcRematAux(remat))(p.X, p.W) })(bcP{a[0], a[1]})
			return []*trace.Array{g.X, g.W}
		}
	}
	bcCheck(t, "vmap of grad", per(true), []*trace.Array{X, ws}, []int{0, nM}, B)
	plain := trace.VmapFlat(per(false), []*trace.Array{X, ws}, trace.InAxes(0, nM))
	got := trace.VmapFlat(per(true), []*trace.Array{X, ws}, trace.InAxes(0, nM))
	for k := range plain {
		bcClose(t, fmt.Sprintf("vmap of grad, remat against plain, result %d", k), got[k], plain[k], 1e-6)
	}
}

// TestVmapAxisIndexInScan: the lane index used inside a scan's body makes
// the carry batched.
func TestVmapAxisIndexInScan(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N = 4, 3
	f := func(xs, lane *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Add(trace.Mul(c[0], x[0]), trace.Convert(lane, ir.Float32))}, nil
		}, []*trace.Array{trace.ScalarAs(1, ir.Float32)}, []*trace.Array{xs})
		return c[0]
	}
	xs := gtF32(r, 1, N)
	got := trace.Vmap(func(xs *trace.Array) *trace.Array { return f(xs, trace.AxisIndex("i")) },
		trace.InAxes(nM), trace.AxisSize(B), trace.AxisName("i"))(xs)
	rows := make([]*trace.Array, B)
	for b := range rows {
		rows[b] = f(xs, trace.ScalarAs(float64(b), ir.Int32))
	}
	bcSame(t, "axis index in a scan", got, trace.Stack(0, rows...))
}

// BenchmarkVmapScanGrad: per-example gradients of a tanh RNN (a scan over 16
// steps of 64 features, 32 examples), jitted, as one Vmap of Grad against a
// loop of the jitted per-example gradient.
func BenchmarkVmapScanGrad(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const B, N, D = 32, 16, 64
	X, w := gtF32(r, 1, B, N, D), gtF32(r, 1, D)
	grad := func(x, w *trace.Array) *trace.Array {
		return trace.Grad(func(x *trace.Array) *trace.Array { return bcScanLoss(x, w) })(x)
	}
	b.Run("vmap", func(b *testing.B) {
		f := rt.Jit(trace.Vmap(grad, trace.InAxes(0, nM)))
		f(X, w)
		for b.Loop() {
			f(X, w)
		}
	})
	b.Run("loop", func(b *testing.B) {
		f := rt.Jit(grad)
		xs := make([]*trace.Array, B)
		for i := range xs {
			xs[i] = trace.Index(X, i)
		}
		f(xs[0], w)
		for b.Loop() {
			for _, x := range xs {
				f(x, w)
			}
		}
	})
}

// TestVmapOffloadScan: per-example gradients (Vmap of Grad) and Grad of Vmap
// through a scan of remat'd cells whose policy offloads the named values to
// pinned_host, against the cell without Remat.
func TestVmapOffloadScan(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 3, 4, 3
	pol := trace.SaveAndOffloadOnlyTheseNames(nil, []string{"c", "x"}, ir.Device, ir.PinnedHost)
	cell := func(c, x, w *trace.Array) *trace.Array {
		c = trace.CheckpointName(c, "c")
		x = trace.CheckpointName(x, "x")
		return trace.Tanh(trace.Add(trace.MatMul(w, c), trace.Mul(x, c)))
	}
	loss := func(cell func(c, x, w *trace.Array) *trace.Array) func(p []*trace.Array) *trace.Array {
		return func(p []*trace.Array) *trace.Array {
			c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
				n := cell(c[0], x[0], x[1])
				return []*trace.Array{n}, []*trace.Array{trace.Mul(n, x[0])}
			}, []*trace.Array{p[0]}, []*trace.Array{p[1], p[2]})
			return trace.Add(trace.Sum(c[0]), trace.Sum(trace.Mul(ys[0], ys[0])))
		}
	}
	args := []*trace.Array{gtF32(r, 1, B, D), gtF32(r, 1, B, N, D), gtF32(r, 0.5, N, D, D)}
	axes := []int{0, 0, nM}
	per := func(cell func(c, x, w *trace.Array) *trace.Array) bcFn {
		return func(p []*trace.Array) []*trace.Array { return trace.Grad(loss(cell))(p) }
	}
	remat := trace.Remat(cell, pol)
	bcCheck(t, "vmap of grad, offloading remat", per(remat), args, axes, B)
	want := trace.VmapFlat(per(cell), args, trace.InAxes(axes...))
	got := rt.Jit(func(a []*trace.Array) []*trace.Array { return trace.VmapFlat(per(remat), a, trace.InAxes(axes...)) })(args)
	for i := range want {
		bcClose(t, fmt.Sprintf("vmap of grad, offloading remat against plain, gradient %d", i), got[i], want[i], 1e-6)
	}

	// The batched forward scan still offloads: a scan whose ys include a
	// pinned_host value.
	offloaded := false
	bcLower(t, per(remat), args, axes).Body.Walk(func(op *ir.Op) {
		if op.Code != ir.Scan {
			return
		}
		for _, v := range op.Results {
			offloaded = offloaded || v.Type.Space == ir.PinnedHost
		}
	})
	if !offloaded {
		t.Errorf("vmap of grad of an offloading remat: no scan result is in pinned_host")
	}

	vl := func(cell func(c, x, w *trace.Array) *trace.Array) func(p []*trace.Array) *trace.Array {
		return func(p []*trace.Array) *trace.Array {
			l := func(a []*trace.Array) []*trace.Array { return []*trace.Array{loss(cell)(a)} }
			return trace.Sum(trace.VmapFlat(l, p, trace.InAxes(axes...))[0])
		}
	}
	wantG := trace.Grad(vl(cell))(args)
	for name, g := range map[string][]*trace.Array{"eager": trace.Grad(vl(remat))(args), "jit": rt.Jit(trace.Grad(vl(remat)))(args)} {
		for i := range wantG {
			bcClose(t, fmt.Sprintf("grad of vmap, offloading remat, gradient %d (%s)", i, name), g[i], wantG[i], 1e-6)
		}
	}
}

// TestVmapScanPinnedHost: xs kept in pinned_host and streamed to the body are
// mapped on the axis after the steps; mapped on the steps' axis, they are a
// clear error.
func TestVmapScanPinnedHost(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 3, 4, 2
	f := func(a []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Add(trace.Mul(c[0], a[2]), trace.DevicePut(x[0], ir.Device)))
			return []*trace.Array{h}, []*trace.Array{h}
		}, []*trace.Array{a[0]}, []*trace.Array{a[1]})
		return []*trace.Array{c[0], ys[0]}
	}
	xs := gtF32(r, 1, N, B, D)
	args := []*trace.Array{gtF32(r, 1, D), trace.DevicePut(xs, ir.PinnedHost), gtF32(r, 1, D)}
	var per [][]*trace.Array
	for b := 0; b < B; b++ {
		x := trace.DevicePut(trace.Index(bcFront(xs, 1), b), ir.PinnedHost)
		per = append(per, f([]*trace.Array{args[0], x, args[2]}))
	}
	got := trace.VmapFlat(f, args, trace.InAxes(nM, 1, nM))
	jit := rt.Jit(func(a []*trace.Array) []*trace.Array { return trace.VmapFlat(f, a, trace.InAxes(nM, 1, nM)) })(args)
	for k := range got {
		want := trace.Stack(0, per[0][k], per[1][k], per[2][k])
		bcSame(t, fmt.Sprintf("pinned_host xs mapped on axis 1, result %d", k), got[k], want)
		bcSame(t, fmt.Sprintf("pinned_host xs mapped on axis 1, result %d (jit)", k), jit[k], want)
	}
	otExpectError(t, "Vmap", func() {
		trace.VmapFlat(f, []*trace.Array{args[0], trace.DevicePut(gtF32(r, 1, B, N, D), ir.PinnedHost), args[2]}, trace.InAxes(nM, 0, nM))
	}, "xs[0] (f32[3,4,2]{pinned_host}) is mapped on axis 0", "map it on axis 1")
}

// TestVmapPinnedHostOutputs: outputs kept in pinned_host come back there,
// with the mapped axis where OutAxes puts it.
func TestVmapPinnedHostOutputs(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 3, 4, 2
	f := func(a []*trace.Array) []*trace.Array {
		_, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Add(c[0], x[0]))
			return []*trace.Array{h}, []*trace.Array{trace.DevicePut(h, ir.PinnedHost)}
		}, []*trace.Array{a[0]}, []*trace.Array{a[1]})
		return []*trace.Array{ys[0], trace.DevicePut(a[0], ir.PinnedHost)}
	}
	args := []*trace.Array{gtF32(r, 1, D), gtF32(r, 1, B, N, D)}
	// The ys are stacked on the steps' axis, so the examples' axis is 1.
	got := trace.VmapFlat(f, args, trace.InAxes(nM, 0), trace.OutAxes(1, nM))
	var rows []*trace.Array
	for b := 0; b < B; b++ {
		rows = append(rows, trace.DevicePut(f([]*trace.Array{args[0], trace.Index(args[1], b)})[0], ir.Device))
	}
	bcSame(t, "pinned_host ys", trace.DevicePut(got[0], ir.Device), trace.Stack(1, rows...))
	if got[0].Space() != ir.PinnedHost || got[1].Space() != ir.PinnedHost {
		t.Errorf("outputs in %v and %v, want pinned_host", got[0].Space(), got[1].Space())
	}
	// Another axis, or a broadcast of the unmapped one, takes a round trip
	// through device memory and comes back to pinned_host.
	moved := trace.VmapFlat(f, args, trace.InAxes(nM, 0), trace.OutAxes(0, 0))
	bcSame(t, "pinned_ys moved to axis 0", trace.DevicePut(moved[0], ir.Device), trace.Stack(0, rows...))
	bcSame(t, "pinned_host broadcast", trace.DevicePut(moved[1], ir.Device), trace.Stack(0, args[0], args[0], args[0]))
	if moved[0].Space() != ir.PinnedHost || moved[1].Space() != ir.PinnedHost {
		t.Errorf("moved outputs in %v and %v, want pinned_host", moved[0].Space(), moved[1].Space())
	}
}

// TestVmapNestedLoopCounters: a counter carried through an outer scan and an
// inner ForLoop and While next to batched state stays unbatched: batchDeps
// looks into the inner loops instead of taking all their results as batched.
func TestVmapNestedLoopCounters(t *testing.T) {
	bcExact(t)
	r := otRand(t)
	const B, N, D = 3, 4, 2
	one := trace.ScalarAs(1, ir.Int32)
	f := func(a []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			in := trace.ForLoop(0, 2, func(_ *trace.Array, s []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Add(s[0], one), trace.Tanh(trace.Mul(s[1], x[0]))}
			}, c[0], c[1])
			w := trace.While(func(s []*trace.Array) *trace.Array { return trace.Less(s[0], trace.ScalarAs(3, ir.Int32)) },
				func(s []*trace.Array) []*trace.Array {
					return []*trace.Array{trace.Add(s[0], one), trace.Sin(trace.Add(s[1], in[1]))}
				}, trace.ScalarAs(0, ir.Int32), in[1])
			k := trace.Add(in[0], w[0])
			return []*trace.Array{k, w[1]}, []*trace.Array{trace.Mul(w[1], trace.Convert(k, ir.Float32))}
		}, []*trace.Array{trace.ScalarAs(0, ir.Int32), a[0]}, []*trace.Array{a[1]})
		return append(c, ys...)
	}
	args := []*trace.Array{gtF32(r, 1, D), gtF32(r, 1, B, N, D)}
	axes := []int{nM, 0}
	bcCheck(t, "nested loops", f, args, axes, B)
	sc := bcFind(t, bcLower(t, f, args, axes), ir.Scan)
	if s := sc.Results[0].Type.Shape; len(s) != 0 {
		t.Errorf("the counter carry of the batched scan is %v, want a scalar", s)
	}
	var whiles []*ir.Op
	sc.Regions[0].Walk(func(op *ir.Op) {
		if op.Code == ir.While {
			whiles = append(whiles, op)
		}
	})
	if len(whiles) != 1 || len(whiles[0].Results[0].Type.Shape) != 0 {
		t.Errorf("want one while in the scan with an unbatched counter, got %d", len(whiles))
	}
}
