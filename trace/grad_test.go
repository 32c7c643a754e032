package trace_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// gtCatch runs f and returns the *trace.Error it panicked with (nil if none).
func gtCatch(t *testing.T, f func()) (e *trace.Error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			err, ok := r.(error)
			if !ok || !errors.As(err, &e) {
				t.Fatalf("panic with %T %v, want *trace.Error", r, r)
			}
		}
	}()
	f()
	return nil
}

func gtExpectClose(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(got[i] - want[i]); d > tol*(1+math.Abs(want[i])) || math.IsNaN(got[i]) {
			t.Errorf("%s[%d] = %.10g, want %.10g", what, i, got[i], want[i])
		}
	}
}

func gtRandData(r *rand.Rand, n int, lo, hi float64) []float64 {
	d := make([]float64, n)
	for i := range d {
		d[i] = lo + (hi-lo)*r.Float64()
	}
	return d
}

// gtMLP is a two-layer perceptron's parameters.
type gtMLP struct {
	W1, B1, W2, B2 *trace.Array
	Name           string // static: kept as is by the tree
}

func gtMLPLoss(p gtMLP, x, y *trace.Array) *trace.Array {
	h := trace.Tanh(trace.Add(trace.MatMul(x, p.W1), p.B1))
	out := trace.Add(trace.MatMul(h, p.W2), p.B2)
	d := trace.Sub(out, y)
	return trace.Mul(trace.Sum(trace.Mul(d, d)), trace.Scalar(0.5))
}

// TestGradMLP checks Grad of a two-layer MLP against the gradient derived by
// hand in float64 below.
func TestGradMLP(t *testing.T) {
	const B, D, H, O = 5, 4, 6, 3
	r := rand.New(rand.NewPCG(1, 2))
	xd, yd := gtRandData(r, B*D, -1, 1), gtRandData(r, B*O, -1, 1)
	w1, b1 := gtRandData(r, D*H, -0.7, 0.7), gtRandData(r, H, -0.2, 0.2)
	w2, b2 := gtRandData(r, H*O, -0.7, 0.7), gtRandData(r, O, -0.2, 0.2)
	p := gtMLP{W1: gtF(w1, D, H), B1: gtF(b1, H), W2: gtF(w2, H, O), B2: gtF(b2, O), Name: "mlp"}
	x, y := gtF(xd, B, D), gtF(yd, B, O)

	// By hand: h = tanh(x W1 + b1), out = h W2 + b2, loss = ½ Σ (out - y)².
	h := make([]float64, B*H)
	for b := 0; b < B; b++ {
		for j := 0; j < H; j++ {
			s := b1[j]
			for i := 0; i < D; i++ {
				s += xd[b*D+i] * w1[i*H+j]
			}
			h[b*H+j] = math.Tanh(s)
		}
	}
	dout := make([]float64, B*O)
	loss := 0.0
	for b := 0; b < B; b++ {
		for k := 0; k < O; k++ {
			s := b2[k]
			for j := 0; j < H; j++ {
				s += h[b*H+j] * w2[j*O+k]
			}
			dout[b*O+k] = s - yd[b*O+k]
			loss += 0.5 * dout[b*O+k] * dout[b*O+k]
		}
	}
	gw2, gb2 := make([]float64, H*O), make([]float64, O)
	dh := make([]float64, B*H)
	for b := 0; b < B; b++ {
		for k := 0; k < O; k++ {
			gb2[k] += dout[b*O+k]
			for j := 0; j < H; j++ {
				gw2[j*O+k] += h[b*H+j] * dout[b*O+k]
				dh[b*H+j] += w2[j*O+k] * dout[b*O+k]
			}
		}
	}
	gw1, gb1 := make([]float64, D*H), make([]float64, H)
	for b := 0; b < B; b++ {
		for j := 0; j < H; j++ {
			dz := dh[b*H+j] * (1 - h[b*H+j]*h[b*H+j])
			gb1[j] += dz
			for i := 0; i < D; i++ {
				gw1[i*H+j] += xd[b*D+i] * dz
			}
		}
	}

	check := func(name string, v *trace.Array, g gtMLP) {
		t.Helper()
		gtExpectClose(t, name+" loss", v.Float64s(), []float64{loss}, 1e-12)
		gtExpectClose(t, name+" dW1", g.W1.Float64s(), gw1, 1e-12)
		gtExpectClose(t, name+" dB1", g.B1.Float64s(), gb1, 1e-12)
		gtExpectClose(t, name+" dW2", g.W2.Float64s(), gw2, 1e-12)
		gtExpectClose(t, name+" dB2", g.B2.Float64s(), gb2, 1e-12)
		if g.Name != "mlp" {
			t.Errorf("%s: static field Name = %q, want it kept", name, g.Name)
		}
	}
	v, g := trace.ValueAndGrad(func(p gtMLP) *trace.Array { return gtMLPLoss(p, x, y) })(p)
	check("eager", v, g)
	gg := trace.Grad(func(p gtMLP) *trace.Array { return gtMLPLoss(p, x, y) })(p)
	check("Grad", v, gg)

	// Under rt.Jit, with the batch as a traced argument closed over by the loss.
	step := rt.Jit(func(p gtMLP, x, y *trace.Array) (*trace.Array, gtMLP) {
		return trace.ValueAndGrad(func(p gtMLP) *trace.Array { return gtMLPLoss(p, x, y) })(p)
	})
	jv, jg := step(p, x, y)
	check("jit", jv, jg)
	l, err := rt.Lower(func(p gtMLP, x, y *trace.Array) (*trace.Array, gtMLP) {
		return trace.ValueAndGrad(func(p gtMLP) *trace.Array { return gtMLPLoss(p, x, y) })(p)
	}, p, x, y)
	if err != nil {
		t.Fatal(err)
	}
	if err := ir.Verify(l.Func); err != nil {
		t.Errorf("jitted gradient IR does not verify: %v\n%s", err, l.IR())
	}
}

// TestGradOfGradElementwise checks second derivatives of elementwise functions,
// Grad of Grad, against the analytic ones, eagerly and under rt.Jit.
func TestGradOfGradElementwise(t *testing.T) {
	type fcase struct {
		name   string
		f      func(x *trace.Array) *trace.Array
		d2     func(x float64) float64
		lo, hi float64
	}
	c3 := func(v float64) *trace.Array { return trace.ScalarAs(v, ir.Float64) }
	cases := []fcase{
		{"exp", trace.Exp, math.Exp, -1, 1},
		{"log", trace.Log, func(x float64) float64 { return -1 / (x * x) }, 0.5, 2},
		{"sin", trace.Sin, func(x float64) float64 { return -math.Sin(x) }, -3, 3},
		{"cos", trace.Cos, func(x float64) float64 { return -math.Cos(x) }, -3, 3},
		{"tanh", trace.Tanh, func(x float64) float64 { y := math.Tanh(x); return -2 * y * (1 - y*y) }, -2, 2},
		{"logistic", trace.Logistic, func(x float64) float64 {
			s := 1 / (1 + math.Exp(-x))
			return s * (1 - s) * (1 - 2*s)
		}, -3, 3},
		{"sqrt", trace.Sqrt, func(x float64) float64 { return -0.25 * math.Pow(x, -1.5) }, 0.5, 2},
		{"rsqrt", trace.Rsqrt, func(x float64) float64 { return 0.75 * math.Pow(x, -2.5) }, 0.5, 2},
		{"log1p", trace.Log1p, func(x float64) float64 { return -1 / ((1 + x) * (1 + x)) }, -0.5, 2},
		{"expm1", trace.Expm1, math.Exp, -1, 1},
		{"erf", trace.Erf, func(x float64) float64 { return -4 * x / math.Sqrt(math.Pi) * math.Exp(-x*x) }, -2, 2},
		{"cube", func(x *trace.Array) *trace.Array { return trace.Mul(trace.Mul(x, x), x) }, func(x float64) float64 { return 6 * x }, -2, 2},
		{"pow", func(x *trace.Array) *trace.Array { return trace.Pow(x, c3(2.5)) }, func(x float64) float64 { return 2.5 * 1.5 * math.Pow(x, 0.5) }, 0.5, 2},
		{"reciprocal", func(x *trace.Array) *trace.Array { return trace.Div(c3(1), x) }, func(x float64) float64 { return 2 / (x * x * x) }, 0.5, 2},
		{"abs", trace.Abs, func(float64) float64 { return 0 }, 0.5, 2},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		xd := gtRandData(r, 5, c.lo, c.hi)
		want := make([]float64, len(xd))
		for i, v := range xd {
			want[i] = c.d2(v)
		}
		d1 := trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(c.f(x)) })
		d2 := trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(d1(x)) })
		x := gtF(xd, 5)
		gtExpectClose(t, c.name+"''", d2(x).Float64s(), want, 1e-9)
		jd2 := rt.Jit(d2)
		gtExpectClose(t, c.name+"'' (jit)", jd2(x).Float64s(), want, 1e-9)
	}
}

// TestGradOfGradDot checks second derivatives through dot_general: for
// L(A, B) = ½‖A·B‖², ∂L/∂A = A·B·Bᵀ; the gradient of ⟨∂L/∂A, V⟩ is V·B·Bᵀ with
// respect to A and (M + Mᵀ)·B with M = Vᵀ·A with respect to B.
func TestGradOfGradDot(t *testing.T) {
	const m, k, n = 3, 4, 2
	r := rand.New(rand.NewPCG(5, 6))
	ad, bd, vd := gtRandData(r, m*k, -1, 1), gtRandData(r, k*n, -1, 1), gtRandData(r, m*k, -1, 1)
	A, B, V := gtF(ad, m, k), gtF(bd, k, n), gtF(vd, m, k)
	type AB struct{ A, B *trace.Array }
	loss := func(p AB) *trace.Array {
		y := trace.MatMul(p.A, p.B)
		return trace.Mul(trace.Sum(trace.Mul(y, y)), trace.Scalar(0.5))
	}
	inner := func(p AB) *trace.Array {
		g := trace.Grad(loss)(p)
		return trace.Sum(trace.Mul(g.A, V))
	}
	g2 := trace.Grad(inner)(AB{A, B})

	bbt := make([]float64, k*k) // B·Bᵀ
	for i := 0; i < k; i++ {
		for j := 0; j < k; j++ {
			for q := 0; q < n; q++ {
				bbt[i*k+j] += bd[i*n+q] * bd[j*n+q]
			}
		}
	}
	wantA := make([]float64, m*k) // V·B·Bᵀ
	for i := 0; i < m; i++ {
		for j := 0; j < k; j++ {
			for q := 0; q < k; q++ {
				wantA[i*k+j] += vd[i*k+q] * bbt[q*k+j]
			}
		}
	}
	M := make([]float64, k*k) // Vᵀ·A
	for i := 0; i < k; i++ {
		for j := 0; j < k; j++ {
			for q := 0; q < m; q++ {
				M[i*k+j] += vd[q*k+i] * ad[q*k+j]
			}
		}
	}
	wantB := make([]float64, k*n) // (M + Mᵀ)·B
	for i := 0; i < k; i++ {
		for j := 0; j < n; j++ {
			for q := 0; q < k; q++ {
				wantB[i*n+j] += (M[i*k+q] + M[q*k+i]) * bd[q*n+j]
			}
		}
	}
	gtExpectClose(t, "d²/dA", g2.A.Float64s(), wantA, 1e-12)
	gtExpectClose(t, "d²/dB", g2.B.Float64s(), wantB, 1e-12)
	j := rt.Jit(trace.Grad(inner))(AB{A, B})
	gtExpectClose(t, "d²/dA (jit)", j.A.Float64s(), wantA, 1e-12)
	gtExpectClose(t, "d²/dB (jit)", j.B.Float64s(), wantB, 1e-12)
}

// TestGradClosures: closed-over arrays are constants of the inner
// differentiation but still differentiated by an outer one.
func TestGradClosures(t *testing.T) {
	c := gtF([]float64{1, 2, 3}, 3)
	g := trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(x, c)) })(gtF([]float64{5, 6, 7}, 3))
	gtExpectClose(t, "d/dx Σ x·c", g.Float64s(), []float64{1, 2, 3}, 0)

	// f(x) = Σ ∂/∂y Σ x·y² at y0 = Σ 2·x·y0, so df/dx = 2·y0.
	y0 := gtF([]float64{0.5, -1, 2}, 3)
	f := func(x *trace.Array) *trace.Array {
		gy := trace.Grad(func(y *trace.Array) *trace.Array { return trace.Sum(trace.Mul(x, trace.Mul(y, y))) })(y0)
		return trace.Sum(gy)
	}
	x := gtF([]float64{1, 2, 3}, 3)
	gtExpectClose(t, "nested closure", trace.Grad(f)(x).Float64s(), []float64{1, -2, 4}, 1e-15)
	gtExpectClose(t, "nested closure (jit)", rt.Jit(trace.Grad(f))(x).Float64s(), []float64{1, -2, 4}, 1e-15)
}

// TestGradIntegerLeaves: a gradient with respect to a tree with an integer
// leaf is refused, as jax.grad refuses it (zeros would hide the mistake);
// closing over the integer leaf differentiates the rest.
func TestGradIntegerLeaves(t *testing.T) {
	type P struct {
		W    *trace.Array
		Step *trace.Array
	}
	p := P{W: gtF([]float64{1, 2}, 2), Step: rt.FromSlice([]int32{3}, 1)}
	loss := func(w, step *trace.Array) *trace.Array {
		s := trace.Convert(step, ir.Float64)
		return trace.Sum(trace.Mul(trace.Mul(w, w), s))
	}
	func() {
		defer func() {
			e, ok := recover().(*trace.Error)
			if !ok || !strings.Contains(e.Error(), "the argument Step is i32[1]") {
				t.Errorf("Grad over an integer leaf: %v, want an error naming Step", e)
			}
		}()
		trace.Grad(func(p P) *trace.Array { return loss(p.W, p.Step) })(p)
	}()
	g := trace.Grad(func(w *trace.Array) *trace.Array { return loss(w, p.Step) })(p.W)
	gtExpectClose(t, "dW", g.Float64s(), []float64{6, 12}, 0)
}

func TestGradNAndAux(t *testing.T) {
	w1, w2 := gtF([]float64{1, 2}, 2), gtF([]float64{3, 4}, 2)
	x := gtF([]float64{0.5, -1}, 2)
	loss := func(w1, w2 *trace.Array, x *trace.Array) *trace.Array {
		return trace.Sum(trace.Mul(trace.Mul(w1, w2), x))
	}
	g := trace.GradN(loss, 0, 1).(func(w1, w2, x *trace.Array) (*trace.Array, *trace.Array))
	g1, g2 := g(w1, w2, x)
	gtExpectClose(t, "dw1", g1.Float64s(), []float64{1.5, -4}, 0)
	gtExpectClose(t, "dw2", g2.Float64s(), []float64{0.5, -2}, 0)
	vg := trace.ValueAndGradN(loss, 2).(func(w1, w2, x *trace.Array) (*trace.Array, *trace.Array))
	v, gx := vg(w1, w2, x)
	gtExpectClose(t, "value", v.Float64s(), []float64{1.5 - 8}, 0)
	gtExpectClose(t, "dx", gx.Float64s(), []float64{3, 8}, 0)
	d0 := trace.GradN(loss).(func(w1, w2, x *trace.Array) *trace.Array)
	gtExpectClose(t, "default argnums", d0(w1, w2, x).Float64s(), []float64{1.5, -4}, 0)

	type Aux struct{ Pred, Count *trace.Array }
	v2, aux, gw := trace.ValueAndGradAux(func(w *trace.Array) (*trace.Array, Aux) {
		pred := trace.Mul(w, x)
		return trace.Sum(trace.Mul(pred, pred)), Aux{Pred: pred, Count: rt.FromSlice([]int32{2}, 1)}
	})(w1)
	gtExpectClose(t, "aux value", v2.Float64s(), []float64{0.25 + 4}, 1e-15)
	gtExpectClose(t, "aux pred", aux.Pred.Float64s(), []float64{0.5, -2}, 0)
	gtExpectClose(t, "aux grad", gw.Float64s(), []float64{2 * 0.5 * 0.5, 2 * -2 * -1}, 1e-15)
	if aux.Count.Int32s()[0] != 2 {
		t.Errorf("aux count = %v", aux.Count)
	}
}

func TestStopGradient(t *testing.T) {
	x := gtF([]float64{1, -2, 3}, 3)
	f := func(x *trace.Array) *trace.Array { return trace.Sum(trace.Mul(x, trace.StopGradient(x))) }
	gtExpectClose(t, "d/dx Σ x·sg(x)", trace.Grad(f)(x).Float64s(), []float64{1, -2, 3}, 0)
	gtExpectClose(t, "jit", rt.Jit(trace.Grad(f))(x).Float64s(), []float64{1, -2, 3}, 0)
	// Through a scan body, and at second order: d²/dx² Σ x²·sg(x) = 2·x.
	h := func(x *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, _ []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Add(c[0], trace.Mul(trace.Mul(x, x), trace.StopGradient(x)))}, nil
		}, []*trace.Array{trace.ZerosLike(x)}, nil, trace.ScanLength(1))
		return trace.Sum(c[0])
	}
	d1 := trace.Grad(h)
	gtExpectClose(t, "scan", d1(x).Float64s(), []float64{2, 8, 18}, 0)
	d2 := trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(d1(x)) })
	gtExpectClose(t, "second order", d2(x).Float64s(), []float64{2, -4, 6}, 0)
	if StopEager := trace.StopGradient(x); StopEager != x {
		t.Errorf("eager StopGradient should return its argument")
	}
}

func TestCustomVJP(t *testing.T) {
	// sin with a deliberately scaled derivative, so that we can tell it is used.
	sin3 := trace.CustomVJP(func(a []*trace.Array) ([]*trace.Array, []*trace.Array) {
		return []*trace.Array{trace.Sin(a[0])}, []*trace.Array{trace.Cos(a[0])}
	}, func(res, ct []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Mul(trace.Mul(ct[0], res[0]), trace.ScalarAs(3, ir.Float64))}
	})
	xd := []float64{0.3, -1.2, 2}
	x := gtF(xd, 3)
	if got := sin3(x)[0].Float64s(); math.Abs(got[0]-math.Sin(0.3)) > 1e-15 {
		t.Errorf("eager forward = %v", got)
	}
	f := func(x *trace.Array) *trace.Array { return trace.Sum(sin3(x)[0]) }
	want1, want2 := make([]float64, 3), make([]float64, 3)
	for i, v := range xd {
		want1[i], want2[i] = 3*math.Cos(v), -3*math.Sin(v)
	}
	gtExpectClose(t, "custom grad", trace.Grad(f)(x).Float64s(), want1, 1e-15)
	gtExpectClose(t, "custom grad (jit)", rt.Jit(trace.Grad(f))(x).Float64s(), want1, 1e-15)
	d2 := trace.Grad(func(x *trace.Array) *trace.Array { return trace.Sum(trace.Grad(f)(x)) })
	gtExpectClose(t, "custom grad of grad", d2(x).Float64s(), want2, 1e-15)
	// Inside a scan body.
	g := trace.Grad(func(x *trace.Array) *trace.Array {
		_, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return c, sin3(xs[0])
		}, nil, []*trace.Array{x})
		return trace.Sum(ys[0])
	})
	gtExpectClose(t, "custom grad in scan", g(x).Float64s(), want1, 1e-15)
	gtExpectClose(t, "custom grad in scan (jit)", rt.Jit(g)(x).Float64s(), want1, 1e-15)
}

func TestJVP(t *testing.T) {
	xd := []float64{0.5, -1, 2}
	x, v := gtF(xd, 3), gtF([]float64{1, 2, -1}, 3)
	fn := func(a []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Mul(trace.Sin(a[0]), a[0]), trace.Sum(trace.Exp(a[0]))}
	}
	outs, tans := trace.JVP(fn, []*trace.Array{x}, []*trace.Array{v})
	vd := v.Float64s()
	want0 := make([]float64, 3)
	want1 := 0.0
	for i, xi := range xd {
		want0[i] = (math.Cos(xi)*xi + math.Sin(xi)) * vd[i]
		want1 += math.Exp(xi) * vd[i]
	}
	gtExpectClose(t, "jvp out", outs[0].Float64s(), []float64{math.Sin(0.5) * 0.5, math.Sin(-1) * -1, math.Sin(2) * 2}, 1e-15)
	gtExpectClose(t, "jvp tangent 0", tans[0].Float64s(), want0, 1e-14)
	gtExpectClose(t, "jvp tangent 1", tans[1].Float64s(), []float64{want1}, 1e-14)
}

func TestGradErrors(t *testing.T) {
	x := gtF([]float64{1, 2}, 2)
	e := gtCatch(t, func() { trace.Grad(func(x *trace.Array) *trace.Array { return trace.Mul(x, x) })(x) })
	if e == nil || !strings.Contains(e.Msg, "float scalar") || !strings.HasSuffix(e.File, "grad_test.go") {
		t.Errorf("non-scalar loss: got %v", e)
	}
	e = gtCatch(t, func() {
		_, pb := trace.VJP(func(a []*trace.Array) []*trace.Array { return a }, []*trace.Array{x})
		pb([]*trace.Array{gtF([]float64{1, 2, 3}, 3)})
	})
	if e == nil || !strings.Contains(e.Msg, "cotangent 0") {
		t.Errorf("bad cotangent: got %v", e)
	}
	e = gtCatch(t, func() { trace.GradN(func(x *trace.Array) float64 { return 0 }) })
	if e == nil {
		t.Errorf("GradN of a function not returning *Array: no error")
	}
}

// TestGradAbsAtZero checks the derivative of Abs where it is not defined: as
// jax.lax.abs (select(x >= 0, g, -g)), 1 at +0 and -0; elsewhere sign(x).
func TestGradAbsAtZero(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float32, ir.Float64} {
		x := trace.Convert(rt.FromSlice([]float64{0, math.Copysign(0, -1), 2.5, -0.75}, 4), dt)
		_, pull := trace.VJP(func(p []*trace.Array) []*trace.Array { return []*trace.Array{trace.Abs(p[0])} }, []*trace.Array{x})
		ct := trace.Convert(rt.FromSlice([]float64{3, 5, 7, 11}, 4), dt)
		got := trace.Convert(pull([]*trace.Array{ct})[0], ir.Float64).Float64s()
		want := []float64{3, 5, 7, -11}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%v: d|x|/dx·ct at x[%d]: got %v, want %v (all: %v)", dt, i, got[i], want[i], got)
			}
		}
	}
}
