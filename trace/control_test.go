package trace_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func TestScanForward(t *testing.T) {
	xs := gtF([]float64{1, 2, 3, 4}, 4)
	body := func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
		s := trace.Add(c[0], x[0])
		return []*trace.Array{s}, []*trace.Array{s, trace.Mul(x[0], x[0])}
	}
	init := []*trace.Array{trace.ScalarAs(10, ir.Float64)}
	c, ys := trace.Scan(body, init, []*trace.Array{xs})
	gtExpectClose(t, "carry", c[0].Float64s(), []float64{20}, 0)
	gtExpectClose(t, "cumsum", ys[0].Float64s(), []float64{11, 13, 16, 20}, 0)
	gtExpectClose(t, "squares", ys[1].Float64s(), []float64{1, 4, 9, 16}, 0)
	// Reverse: ys stay in xs order.
	_, ys = trace.Scan(body, init, []*trace.Array{xs}, trace.ScanReverse())
	gtExpectClose(t, "reverse cumsum", ys[0].Float64s(), []float64{20, 19, 17, 14}, 0)
	// Under rt.Jit, closing over a traced array.
	j := rt.Jit(func(xs, k *trace.Array) (*trace.Array, *trace.Array) {
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			s := trace.Add(c[0], trace.Mul(x[0], k))
			return []*trace.Array{s}, []*trace.Array{s}
		}, []*trace.Array{trace.ScalarAs(0, ir.Float64)}, []*trace.Array{xs})
		return c[0], ys[0]
	})
	jc, jys := j(xs, trace.ScalarAs(2, ir.Float64))
	gtExpectClose(t, "jit carry", jc.Float64s(), []float64{20}, 0)
	gtExpectClose(t, "jit ys", jys.Float64s(), []float64{2, 6, 12, 20}, 0)
	// No xs: ScanLength.
	c, ys = trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
		d := trace.Mul(c[0], trace.ScalarAs(2, ir.Float64))
		return []*trace.Array{d}, []*trace.Array{c[0]}
	}, []*trace.Array{trace.ScalarAs(1, ir.Float64)}, nil, trace.ScanLength(5))
	gtExpectClose(t, "powers", ys[0].Float64s(), []float64{1, 2, 4, 8, 16}, 0)
	gtExpectClose(t, "powers carry", c[0].Float64s(), []float64{32}, 0)
}

func TestScanTree(t *testing.T) {
	type State struct {
		Sum, Prod *trace.Array
	}
	type In struct{ A, B *trace.Array }
	xs := In{A: gtF([]float64{1, 2, 3}, 3), B: gtF([]float64{2, 2, 2, 3, 3, 3}, 3, 2)}
	st, ys := trace.ScanTree(func(s State, x In) (State, []*trace.Array) {
		n := State{Sum: trace.Add(s.Sum, x.A), Prod: trace.Mul(s.Prod, x.B)}
		return n, []*trace.Array{n.Sum}
	}, State{Sum: trace.ScalarAs(0, ir.Float64), Prod: gtF([]float64{1, 1}, 2)}, xs)
	gtExpectClose(t, "sum", st.Sum.Float64s(), []float64{6}, 0)
	gtExpectClose(t, "prod", st.Prod.Float64s(), []float64{12, 18}, 0)
	gtExpectClose(t, "ys", ys[0].Float64s(), []float64{1, 3, 6}, 0)
}

func TestScanErrors(t *testing.T) {
	xs := gtF([]float64{1, 2}, 2)
	e := gtCatch(t, func() {
		trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Convert(c[0], ir.Float32)}, nil
		}, []*trace.Array{trace.ScalarAs(0, ir.Float64)}, []*trace.Array{xs})
	})
	if e == nil || !strings.Contains(e.Msg, "carry[0] as f32[]") || !strings.Contains(e.Msg, "f64[]") || !strings.HasSuffix(e.File, "control_test.go") {
		t.Errorf("carry type change: got %v", e)
	}
	e = gtCatch(t, func() {
		trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) { return c, nil }, nil, nil)
	})
	if e == nil || !strings.Contains(e.Msg, "ScanLength") {
		t.Errorf("no xs: got %v", e)
	}
}

// gtStep is the body used by the scan-versus-unrolled checks.
func gtStep(c, x, w *trace.Array) (*trace.Array, *trace.Array) {
	h := trace.Tanh(trace.Add(trace.Mul(c, w), x))
	return h, trace.Mul(h, trace.Sin(x))
}

func TestScanGradMatchesUnrolled(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	type P struct{ Init, Xs, W *trace.Array }
	p := P{Init: gtF(gtRandData(r, 3, -1, 1), 3), Xs: gtF(gtRandData(r, 15, -1, 1), 5, 3), W: gtF(gtRandData(r, 3, -1, 1), 3)}
	for _, reverse := range []bool{false, true} {
		scanned := func(p P) *trace.Array {
			var opts []trace.ScanOption
			if reverse {
				opts = append(opts, trace.ScanReverse())
			}
			c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
				h, y := gtStep(c[0], x[0], p.W)
				return []*trace.Array{h}, []*trace.Array{y}
			}, []*trace.Array{p.Init}, []*trace.Array{p.Xs}, opts...)
			return trace.Add(trace.Sum(trace.Mul(ys[0], ys[0])), trace.Sum(c[0]))
		}
		unrolled := func(p P) *trace.Array {
			c := p.Init
			var ys []*trace.Array
			for k := 0; k < 5; k++ {
				i := k
				if reverse {
					i = 4 - k
				}
				var y *trace.Array
				c, y = gtStep(c, trace.Index(p.Xs, i), p.W)
				ys = append(ys, trace.Sum(trace.Mul(y, y)))
			}
			s := trace.Sum(c)
			for _, y := range ys {
				s = trace.Add(s, y)
			}
			return s
		}
		gs, gu := trace.Grad(scanned)(p), trace.Grad(unrolled)(p)
		name := map[bool]string{false: "forward", true: "reverse"}[reverse]
		gtExpectClose(t, name+" dInit", gs.Init.Float64s(), gu.Init.Float64s(), 1e-12)
		gtExpectClose(t, name+" dXs", gs.Xs.Float64s(), gu.Xs.Float64s(), 1e-12)
		gtExpectClose(t, name+" dW", gs.W.Float64s(), gu.W.Float64s(), 1e-12)
		gj := rt.Jit(trace.Grad(scanned))(p)
		gtExpectClose(t, name+" dW (jit)", gj.W.Float64s(), gu.W.Float64s(), 1e-12)
		gtExpectClose(t, name+" dXs (jit)", gj.Xs.Float64s(), gu.Xs.Float64s(), 1e-12)
		// Second order through the scan: the Hessian-vector product of the loss.
		hv := func(f func(P) *trace.Array) P {
			return trace.Grad(func(p P) *trace.Array { return trace.Sum(trace.Grad(f)(p).W) })(p)
		}
		hs, hu := hv(scanned), hv(unrolled)
		gtExpectClose(t, name+" d²/dW·dXs", hs.Xs.Float64s(), hu.Xs.Float64s(), 1e-11)
		gtExpectClose(t, name+" d²/dW²", hs.W.Float64s(), hu.W.Float64s(), 1e-11)
	}
}

func TestNestedScanGrad(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	xs := gtF(gtRandData(r, 12, -1, 1), 3, 4)
	w := gtF(gtRandData(r, 1, -1, 1), 1)
	nested := func(w *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, row []*trace.Array) ([]*trace.Array, []*trace.Array) {
			inner, _ := trace.Scan(func(d, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
				return []*trace.Array{trace.Sin(trace.Add(trace.Mul(d[0], w), x[0]))}, nil
			}, c, []*trace.Array{trace.Reshape(row[0], 4, 1)})
			return inner, nil
		}, []*trace.Array{gtF([]float64{0.3}, 1)}, []*trace.Array{xs})
		return trace.Sum(c[0])
	}
	unrolled := func(w *trace.Array) *trace.Array {
		c := gtF([]float64{0.3}, 1)
		for i := 0; i < 3; i++ {
			row := trace.Index(xs, i)
			for j := 0; j < 4; j++ {
				c = trace.Sin(trace.Add(trace.Mul(c, w), trace.Reshape(trace.Index(row, j), 1)))
			}
		}
		return trace.Sum(c)
	}
	want := trace.Grad(unrolled)(w).Float64s()
	gtExpectClose(t, "nested scan", trace.Grad(nested)(w).Float64s(), want, 1e-12)
	gtExpectClose(t, "nested scan (jit)", rt.Jit(trace.Grad(nested))(w).Float64s(), want, 1e-12)
}

// gtLayers is the stacked weights of the reference model (REFERENCES.md §1).
type gtLayers struct{ W1, W2 *trace.Array }

func gtLayerScan(x *trace.Array) func(l gtLayers) *trace.Array {
	return func(l gtLayers) *trace.Array {
		out, _ := trace.ScanTree(func(x *trace.Array, l gtLayers) (*trace.Array, struct{}) {
			y := trace.MatMul(x, l.W1)
			return trace.MatMul(y, l.W2), struct{}{}
		}, x, l)
		return trace.Sum(out)
	}
}

func gtLayerUnrolled(x *trace.Array, n int) func(l gtLayers) *trace.Array {
	return func(l gtLayers) *trace.Array {
		for i := 0; i < n; i++ {
			x = trace.MatMul(trace.MatMul(x, trace.Index(l.W1, i)), trace.Index(l.W2, i))
		}
		return trace.Sum(x)
	}
}

func gtF32(r *rand.Rand, scale float64, shape ...int) *trace.Array {
	d := make([]float32, gtSize(shape))
	for i := range d {
		d[i] = float32(scale * (2*r.Float64() - 1))
	}
	return rt.FromSlice(d, shape...)
}

// gtMaxRel returns max|a-b| / max|b|.
func gtMaxRel(a, b []float32) float64 {
	var d, m float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		m = max(m, math.Abs(float64(b[i])))
	}
	return d / m
}

// gtLayerModel checks grad of the scanned 10-layer model against the unrolled
// one, eagerly and under rt.Jit, and the structure of the jitted program.
func gtLayerModel(t *testing.T, L, D, H int) {
	r := rand.New(rand.NewPCG(21, 22))
	x := gtF32(r, 1, D, D)
	l := gtLayers{W1: gtF32(r, 1/math.Sqrt(float64(D)), L, D, H), W2: gtF32(r, 1/math.Sqrt(float64(H)), L, H, D)}
	start := time.Now()
	gu := trace.Grad(gtLayerUnrolled(x, L))(l)
	gs := trace.Grad(gtLayerScan(x))(l)
	jitted := rt.Jit(func(x *trace.Array, l gtLayers) gtLayers { return trace.Grad(gtLayerScan(x))(l) })
	gj := jitted(x, l)
	for _, c := range []struct {
		name      string
		got, want *trace.Array
	}{{"dW1", gs.W1, gu.W1}, {"dW2", gs.W2, gu.W2}, {"dW1 (jit)", gj.W1, gu.W1}, {"dW2 (jit)", gj.W2, gu.W2}} {
		if !c.got.Type().Equal(c.want.Type()) {
			t.Fatalf("%s: %v, want %v", c.name, c.got.Type(), c.want.Type())
		}
		if rel := gtMaxRel(c.got.Float32s(), c.want.Float32s()); rel > 1e-5 || math.IsNaN(rel) {
			t.Errorf("%s: scan gradient differs from the unrolled one by %.3g (relative)", c.name, rel)
		}
	}
	t.Logf("L=%d D=%d H=%d: three gradients in %v", L, D, H, time.Since(start))

	// The jitted program: one forward scan that stacks the residuals (the carry
	// x and the intermediate y; the weights' slices are not copied) and one
	// reverse scan.
	lw, err := rt.Lower(func(x *trace.Array, l gtLayers) gtLayers { return trace.Grad(gtLayerScan(x))(l) }, x, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(lw.Func); err != nil {
		t.Fatalf("IR does not verify: %v", err)
	}
	var scans []*ir.Op
	lw.Func.Body.Walk(func(op *ir.Op) {
		if op.Code == ir.Scan {
			scans = append(scans, op)
		}
	})
	if len(scans) != 2 || scans[0].Attrs.Bool("reverse") || !scans[1].Attrs.Bool("reverse") {
		t.Fatalf("want a forward and a reverse scan, got %d scans:\n%s", len(scans), lw.IR())
	}
	fwd := scans[0]
	var res []string
	for _, v := range fwd.Results[1:] {
		res = append(res, v.Type.String())
	}
	want := []string{ir.TypeOf(ir.Float32, L, D, D).String(), ir.TypeOf(ir.Float32, L, D, H).String()}
	slices.Sort(res)
	slices.Sort(want)
	if !slices.Equal(res, want) {
		t.Errorf("forward scan residuals %v, want %v (x and y stacked)\n%s", res, want, lw.IR())
	}
}

func TestScanLayerModel(t *testing.T) {
	gtLayerModel(t, 10, 16, 64)
}

// TestScanLayerModelFullSize runs the model at the size of REFERENCES.md §1
// (x f32[256,256], w1 f32[10,256,1024], w2 f32[10,1024,256]): about 6 s on the
// reference executor, skipped with -short.
func TestScanLayerModelFullSize(t *testing.T) {
	if testing.Short() {
		t.Skip("full-size model skipped in -short mode")
	}
	gtLayerModel(t, 10, 256, 1024)
}

func TestCond(t *testing.T) {
	k := gtF([]float64{10, 20}, 2)
	f := func(p *trace.Array, x *trace.Array) *trace.Array {
		return trace.Cond(p, func(o []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Mul(o[0], k)}
		}, func(o []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Sub(o[0], k)}
		}, x)[0]
	}
	x := gtF([]float64{1, 2}, 2)
	yes, no := rt.FromSlice([]bool{true}, 1), rt.FromSlice([]bool{false}, 1)
	yes, no = trace.Reshape(yes), trace.Reshape(no)
	gtExpectClose(t, "true", f(yes, x).Float64s(), []float64{10, 40}, 0)
	gtExpectClose(t, "false", f(no, x).Float64s(), []float64{-9, -18}, 0)
	jf := rt.Jit(f)
	gtExpectClose(t, "true (jit)", jf(yes, x).Float64s(), []float64{10, 40}, 0)
	gtExpectClose(t, "false (jit)", jf(no, x).Float64s(), []float64{-9, -18}, 0)
	// A numeric predicate is compared with zero.
	gtExpectClose(t, "int pred", f(trace.ScalarAs(3, ir.Int32), x).Float64s(), []float64{10, 40}, 0)
	// Gradients through both branches and their closures, eagerly and jitted.
	g := func(p *trace.Array) func(x *trace.Array) *trace.Array {
		return trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(f(p, x), x)) })
	}
	gtExpectClose(t, "grad true", g(yes)(x).Float64s(), []float64{20, 80}, 0)
	gtExpectClose(t, "grad false", g(no)(x).Float64s(), []float64{2 - 10, 4 - 20}, 0)
	jg := rt.Jit(func(p, x *trace.Array) *trace.Array { return g(p)(x) })
	gtExpectClose(t, "grad true (jit)", jg(yes, x).Float64s(), []float64{20, 80}, 0)
	gtExpectClose(t, "grad false (jit)", jg(no, x).Float64s(), []float64{2 - 10, 4 - 20}, 0)
	l, err := rt.Lower(func(p, x *trace.Array) *trace.Array { return g(p)(x) }, yes, x)
	if err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(l.Func); err != nil {
		t.Errorf("IR does not verify: %v\n%s", err, l.IR())
	}
	e := gtCatch(t, func() {
		trace.Cond(yes, func(o []*trace.Array) []*trace.Array { return o },
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Convert(o[0], ir.Float32)} }, x)
	})
	if e == nil || !strings.Contains(e.Msg, "different types") {
		t.Errorf("mismatched branches: got %v", e)
	}
}

func TestWhile(t *testing.T) {
	step := gtF([]float64{3}, 1)
	f := func(x *trace.Array) []*trace.Array {
		return trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Reshape(trace.Less(s[0], gtF([]float64{10}, 1)))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(s[0], step), trace.Add(s[1], trace.ScalarAs(1, ir.Int32))}
		}, x, trace.ScalarAs(0, ir.Int32))
	}
	x := gtF([]float64{1}, 1)
	out := f(x)
	gtExpectClose(t, "while", out[0].Float64s(), []float64{10}, 0)
	if n := out[1].Int32s()[0]; n != 3 {
		t.Errorf("iterations = %d, want 3", n)
	}
	jout := rt.Jit(f)(gtF([]float64{2}, 1))
	gtExpectClose(t, "while (jit)", jout[0].Float64s(), []float64{11}, 0)
	e := gtCatch(t, func() { trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(f(x)[0]) })(x) })
	if e == nil || !strings.Contains(e.Msg, "reverse-mode differentiation of While is not supported; use Scan or ForLoop with static bounds") {
		t.Errorf("grad of While: got %v", e)
	}
	// Not differentiating through it is fine.
	g := trace.Grad(func(y *trace.Array) *trace.Array {
		return trace.Sum(trace.Mul(y, f(x)[0]))
	})(gtF([]float64{2}, 1))
	gtExpectClose(t, "while as a constant", g.Float64s(), []float64{10}, 0)
}

func TestForLoop(t *testing.T) {
	w := gtF([]float64{0.7, -0.4}, 2)
	looped := func(w *trace.Array) *trace.Array {
		s := trace.ForLoop(2, 6, func(i *trace.Array, s []*trace.Array) []*trace.Array {
			fi := trace.Convert(i, ir.Float64)
			return []*trace.Array{trace.Add(trace.Mul(trace.Sin(s[0]), w), trace.Mul(fi, w))}
		}, gtF([]float64{0.1, 0.2}, 2))
		return trace.Sum(s[0])
	}
	unrolled := func(w *trace.Array) *trace.Array {
		s := gtF([]float64{0.1, 0.2}, 2)
		for i := 2; i < 6; i++ {
			s = trace.Add(trace.Mul(trace.Sin(s), w), trace.Mul(trace.ScalarAs(float64(i), ir.Float64), w))
		}
		return trace.Sum(s)
	}
	gtExpectClose(t, "forward", looped(w).Float64s(), unrolled(w).Float64s(), 1e-15)
	want := trace.Grad(unrolled)(w).Float64s()
	gtExpectClose(t, "grad", trace.Grad(looped)(w).Float64s(), want, 1e-13)
	gtExpectClose(t, "grad (jit)", rt.Jit(trace.Grad(looped))(w).Float64s(), want, 1e-13)
	if s := trace.ForLoop(3, 3, nil2, w); s[0] != w {
		t.Errorf("empty loop should return the state")
	}
}

func nil2(i *trace.Array, s []*trace.Array) []*trace.Array { return s }

// TestControlComposition differentiates a scan whose body holds a cond and an
// integer counter carry used as a dynamic index into a closed-over table, a
// zero-length scan, and a scan inside a cond, against unrolled versions.
func TestControlComposition(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	xs := gtF([]float64{0.5, -0.3, 0.8, -1.1, 0.2}, 5)
	type P struct{ Table, S *trace.Array }
	p := P{Table: gtF(gtRandData(r, 6, -1, 1), 6), S: gtF([]float64{0.4}, 1)}
	zero := trace.ScalarAs(0, ir.Float64)
	scanned := func(p P) *trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			i, s := c[0], c[1]
			w := trace.DynamicSlice(p.Table, []*trace.Array{i}, []int{1})
			s = trace.Cond(trace.Greater(x[0], zero), func(o []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Sin(trace.Mul(o[0], w))}
			}, func(o []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Add(trace.Mul(o[0], x[0]), w)}
			}, s)[0]
			return []*trace.Array{trace.Add(i, trace.ScalarAs(1, ir.Int32)), s}, nil
		}, []*trace.Array{trace.ScalarAs(0, ir.Int32), p.S}, []*trace.Array{xs})
		return trace.Sum(c[1])
	}
	unrolled := func(p P) *trace.Array {
		s := p.S
		xv := xs.Float64s()
		for k := 0; k < 5; k++ {
			w := trace.SliceAxis(p.Table, 0, k, k+1)
			x := trace.ScalarAs(xv[k], ir.Float64)
			if xv[k] > 0 {
				s = trace.Sin(trace.Mul(s, w))
			} else {
				s = trace.Add(trace.Mul(s, x), w)
			}
		}
		return trace.Sum(s)
	}
	gs, gu := trace.Grad(scanned)(p), trace.Grad(unrolled)(p)
	gtExpectClose(t, "dTable", gs.Table.Float64s(), gu.Table.Float64s(), 1e-12)
	gtExpectClose(t, "dS", gs.S.Float64s(), gu.S.Float64s(), 1e-12)
	gj := rt.Jit(trace.Grad(scanned))(p)
	gtExpectClose(t, "dTable (jit)", gj.Table.Float64s(), gu.Table.Float64s(), 1e-12)

	// Zero iterations: the carry passes through.
	g0 := trace.Grad(func(s *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Mul(c[0], x[0])}, nil
		}, []*trace.Array{s}, []*trace.Array{gtF(nil, 0, 2)})
		return trace.Sum(trace.Mul(c[0], c[0]))
	})(gtF([]float64{1, 2}, 2))
	gtExpectClose(t, "zero-length scan", g0.Float64s(), []float64{2, 4}, 0)

	// A scan inside a cond branch.
	inCond := func(pred bool) func(w *trace.Array) *trace.Array {
		return func(w *trace.Array) *trace.Array {
			pa := trace.Reshape(rt.FromSlice([]bool{pred}, 1))
			return trace.Sum(trace.Cond(pa, func(o []*trace.Array) []*trace.Array {
				c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
					return []*trace.Array{trace.Tanh(trace.Add(trace.Mul(c[0], o[0]), x[0]))}, nil
				}, []*trace.Array{o[0]}, []*trace.Array{trace.Reshape(xs, 5, 1)})
				return c
			}, func(o []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Mul(o[0], o[0])}
			}, w)[0])
		}
	}
	w := gtF([]float64{0.7}, 1)
	want := func() float64 { // d/dw of c5 where c0 = w, c_{k+1} = tanh(c_k·w + x_k)
		xv := xs.Float64s()
		c, dc := 0.7, 1.0
		for k := 0; k < 5; k++ {
			z := c*0.7 + xv[k]
			th := math.Tanh(z)
			dc = (1 - th*th) * (dc*0.7 + c)
			c = th
		}
		return dc
	}()
	gtExpectClose(t, "scan in cond (true)", trace.Grad(inCond(true))(w).Float64s(), []float64{want}, 1e-12)
	gtExpectClose(t, "scan in cond (false)", trace.Grad(inCond(false))(w).Float64s(), []float64{1.4}, 1e-15)
	gtExpectClose(t, "scan in cond (jit)", rt.Jit(trace.Grad(inCond(true)))(w).Float64s(), []float64{want}, 1e-12)
}

// TestScanResidualPolicy checks which values the forward scan stacks for the
// backward pass: the values the VJP rules use (here tanh's output and the
// carry), but not the xs (read from the forward's own xs), not the consts and
// not values the body derives from them by shape ops (a broadcast scale),
// which the backward body recomputes.
func TestScanResidualPolicy(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	s := gtF(gtRandData(r, 3, 0.5, 1.5), 3)
	xs := gtF(gtRandData(r, 4*2*3, -1, 1), 4, 2, 3)
	c0 := gtF(gtRandData(r, 6, -1, 1), 2, 3)
	type P struct{ S, C0, Xs *trace.Array }
	scanned := func(p P) *trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Mul(c[0], p.S)) // p.S broadcast to [2,3]
			return []*trace.Array{trace.Add(h, trace.Mul(x[0], x[0]))}, nil
		}, []*trace.Array{p.C0}, []*trace.Array{p.Xs})
		return trace.Sum(c[0])
	}
	unrolled := func(p P) *trace.Array {
		c := p.C0
		for i := 0; i < 4; i++ {
			x := trace.Index(p.Xs, i)
			c = trace.Add(trace.Tanh(trace.Mul(c, p.S)), trace.Mul(x, x))
		}
		return trace.Sum(c)
	}
	p := P{S: s, C0: c0, Xs: xs}
	gs, gu := trace.Grad(scanned)(p), trace.Grad(unrolled)(p)
	gtExpectClose(t, "dS", gs.S.Float64s(), gu.S.Float64s(), 1e-12)
	gtExpectClose(t, "dC0", gs.C0.Float64s(), gu.C0.Float64s(), 1e-12)
	gtExpectClose(t, "dXs", gs.Xs.Float64s(), gu.Xs.Float64s(), 1e-12)
	gj := rt.Jit(trace.Grad(scanned))(p)
	gtExpectClose(t, "dS (jit)", gj.S.Float64s(), gu.S.Float64s(), 1e-12)

	l, err := rt.Lower(trace.Grad(scanned), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(l.Func); err != nil {
		t.Fatalf("IR does not verify: %v\n%s", err, l.IR())
	}
	var scans []*ir.Op
	l.Func.Body.Walk(func(op *ir.Op) {
		if op.Code == ir.Scan {
			scans = append(scans, op)
		}
	})
	if len(scans) != 2 {
		t.Fatalf("want 2 scans, got %d:\n%s", len(scans), l.IR())
	}
	var res []string
	for _, v := range scans[0].Results[1:] {
		res = append(res, v.Type.String())
	}
	if want := []string{"f64[4,2,3]", "f64[4,2,3]"}; !slices.Equal(res, want) {
		t.Errorf("forward scan stacks %v, want %v (tanh's output and the carry)\n%s", res, want, l.IR())
	}
	bwd := scans[1]
	nc := bwd.Attrs.Int("num_consts")
	var consts []string
	for _, v := range bwd.Args[:nc] {
		consts = append(consts, v.Type.String())
	}
	if !slices.Equal(consts, []string{"f64[3]"}) {
		t.Errorf("backward scan consts %v, want the scale f64[3] only\n%s", consts, l.IR())
	}
}

// TestGradThroughInnerOptimization differentiates through three gradient
// descent steps taken inside a ForLoop (Grad inside a scan body, differentiated
// again from outside), against the same steps unrolled.
func TestGradThroughInnerOptimization(t *testing.T) {
	x := gtF([]float64{0.5, -1, 2}, 3)
	target := gtF([]float64{1, 0, -1}, 3)
	inner := func(w *trace.Array) *trace.Array {
		d := trace.Sub(trace.Tanh(trace.Mul(w, x)), target)
		return trace.Sum(trace.Mul(d, d))
	}
	lr := trace.ScalarAs(0.3, ir.Float64)
	sgd := func(w *trace.Array) *trace.Array { return trace.Sub(w, trace.Mul(lr, trace.Grad(inner)(w))) }
	looped := func(w *trace.Array) *trace.Array {
		s := trace.ForLoop(0, 3, func(_ *trace.Array, s []*trace.Array) []*trace.Array {
			return []*trace.Array{sgd(s[0])}
		}, w)
		return inner(s[0])
	}
	unrolled := func(w *trace.Array) *trace.Array {
		for i := 0; i < 3; i++ {
			w = sgd(w)
		}
		return inner(w)
	}
	w := gtF([]float64{0.2, 0.4, -0.3}, 3)
	want := trace.Grad(unrolled)(w).Float64s()
	gtExpectClose(t, "meta-gradient", trace.Grad(looped)(w).Float64s(), want, 1e-12)
	gtExpectClose(t, "meta-gradient (jit)", rt.Jit(trace.Grad(looped))(w).Float64s(), want, 1e-12)
	// And against finite differences of the unrolled loss.
	r := rand.New(rand.NewPCG(51, 52))
	gtFDCheck(t, "meta-gradient", func(a []*trace.Array) *trace.Array { return looped(a[0]) }, []*trace.Array{w}, r, 1e-6, 1e-5)
}
