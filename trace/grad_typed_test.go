package trace_test

import (
	"fmt"
	"strings"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The typed gradients' trees: a struct with a slice, a single array, a map.
type gtLayer struct {
	W    *trace.Array
	Bias []*trace.Array
	Name string // static
}

type gtInputs map[string]*trace.Array

// gtTypedLoss mixes the three arguments so that every leaf's gradient
// depends on the others.
func gtTypedLoss(l gtLayer, s *trace.Array, in gtInputs) *trace.Array {
	h := trace.Tanh(trace.Add(trace.MatMul(in["x"], l.W), l.Bias[0]))
	y := trace.Mul(trace.Sum(trace.Mul(h, in["k"])), s)
	return trace.Add(y, trace.Mul(trace.Sum(trace.Mul(l.Bias[1], l.Bias[1])), trace.Sum(in["k"])))
}

// gtLeafFD returns the central finite-difference gradient of f at the
// float64 leaf x, one entry per element (f rebuilds its arguments with the
// perturbed leaf put in by set).
func gtLeafFD(x *trace.Array, set func(*trace.Array), f func() float64) []float64 {
	const h = 1e-6
	base := x.Float64s()
	out := make([]float64, len(base))
	for j := range base {
		p := append([]float64(nil), base...)
		p[j] = base[j] + h
		set(gtF(p, x.Shape()...))
		fp := f()
		p[j] = base[j] - h
		set(gtF(p, x.Shape()...))
		fm := f()
		out[j] = (fp - fm) / (2 * h)
	}
	set(x)
	return out
}

// Grad3, ValueAndGrad3, Grad2 and GradFirst against central finite
// differences in float64, eagerly and under rt.Jit, with the same random
// inputs.
func TestTypedGradsFiniteDifferences(t *testing.T) {
	r := otRand(t)
	l := gtLayer{
		W:    gtF(gtRandData(r, 6, -1, 1), 3, 2),
		Bias: []*trace.Array{gtF(gtRandData(r, 2, -1, 1), 2), gtF(gtRandData(r, 3, -1, 1), 3)},
		Name: "dense",
	}
	s := gtF(gtRandData(r, 1, 0.5, 2))
	s = trace.Reshape(s)
	in := gtInputs{"x": gtF(gtRandData(r, 12, -1, 1), 4, 3), "k": gtF(gtRandData(r, 8, -1, 1), 4, 2)}
	eval := func() float64 { return gtTypedLoss(l, s, in).Item() }

	// Each leaf with a setter, and the gradient leaf the typed forms return.
	type leaf struct {
		name string
		x    *trace.Array
		set  func(*trace.Array)
		got  func(gl gtLayer, gs *trace.Array, gi gtInputs) *trace.Array
	}
	leaves := []leaf{
		{"W", l.W, func(a *trace.Array) { l.W = a }, func(gl gtLayer, _ *trace.Array, _ gtInputs) *trace.Array { return gl.W }},
		{"Bias[0]", l.Bias[0], func(a *trace.Array) { l.Bias[0] = a }, func(gl gtLayer, _ *trace.Array, _ gtInputs) *trace.Array { return gl.Bias[0] }},
		{"Bias[1]", l.Bias[1], func(a *trace.Array) { l.Bias[1] = a }, func(gl gtLayer, _ *trace.Array, _ gtInputs) *trace.Array { return gl.Bias[1] }},
		{"s", s, func(a *trace.Array) { s = a }, func(_ gtLayer, gs *trace.Array, _ gtInputs) *trace.Array { return gs }},
		{`["k"]`, in["k"], func(a *trace.Array) { in["k"] = a }, func(_ gtLayer, _ *trace.Array, gi gtInputs) *trace.Array { return gi["k"] }},
		{`["x"]`, in["x"], func(a *trace.Array) { in["x"] = a }, func(_ gtLayer, _ *trace.Array, gi gtInputs) *trace.Array { return gi["x"] }},
	}
	fd := make([][]float64, len(leaves))
	for i, lf := range leaves {
		fd[i] = gtLeafFD(lf.x, lf.set, eval)
	}

	v, gl, gs, gi := trace.ValueAndGrad3(gtTypedLoss)(l, s, in)
	gtExpectClose(t, "ValueAndGrad3 value", v.Float64s(), []float64{eval()}, 1e-12)
	if gl.Name != "dense" || len(gl.Bias) != 2 || len(gi) != 2 {
		t.Fatalf("ValueAndGrad3: gradient trees %+v, %v do not have the arguments' structure", gl, gi)
	}
	jl, js, ji := rt.Jit(trace.Grad3(gtTypedLoss))(l, s, in)
	for i, lf := range leaves {
		gtExpectClose(t, "Grad3 d"+lf.name, lf.got(gl, gs, gi).Float64s(), fd[i], 1e-6)
		gtExpectClose(t, "jitted Grad3 d"+lf.name, lf.got(jl, js, ji).Float64s(), fd[i], 1e-6)
	}

	// Grad2: the layer and the scale, the inputs closed over.
	g2l, g2s := trace.Grad2(func(l gtLayer, s *trace.Array) *trace.Array { return gtTypedLoss(l, s, in) })(l, s)
	for i, lf := range leaves[:4] {
		gtExpectClose(t, "Grad2 d"+lf.name, lf.got(g2l, g2s, nil).Float64s(), fd[i], 1e-6)
	}
	v2, _, _ := trace.ValueAndGrad2(func(l gtLayer, s *trace.Array) *trace.Array { return gtTypedLoss(l, s, in) })(l, s)
	gtExpectClose(t, "ValueAndGrad2 value", v2.Float64s(), []float64{eval()}, 1e-12)

	// GradFirst: the layer only, the rest passed through, with an integer
	// array and a static value among it (they get no gradient, and no error).
	type batch struct {
		S     *trace.Array
		In    gtInputs
		Steps *trace.Array // i32
		Tag   string
	}
	b := batch{S: s, In: in, Steps: gtI([]int32{7}, 1), Tag: "b0"}
	first := func(l gtLayer, b batch) *trace.Array {
		if b.Tag != "b0" || b.Steps.DType().String() != "i32" {
			panic("the batch was not passed through")
		}
		return gtTypedLoss(l, b.S, b.In)
	}
	vf, gf := trace.ValueAndGradFirst(first)(l, b)
	gtExpectClose(t, "ValueAndGradFirst value", vf.Float64s(), []float64{eval()}, 1e-12)
	jf := rt.Jit(trace.GradFirst(first))(l, b)
	for i, lf := range leaves[:3] {
		gtExpectClose(t, "GradFirst d"+lf.name, lf.got(gf, nil, nil).Float64s(), fd[i], 1e-6)
		gtExpectClose(t, "jitted GradFirst d"+lf.name, lf.got(jf, nil, nil).Float64s(), fd[i], 1e-6)
	}

	// The same gradients as the untyped GradN with argnums (0, 1, 2).
	n := trace.GradN(gtTypedLoss, 0, 1, 2).(func(gtLayer, *trace.Array, gtInputs) (gtLayer, *trace.Array, gtInputs))
	nl, ns, ni := n(l, s, in)
	for _, lf := range leaves {
		gtExpectClose(t, "GradN d"+lf.name, lf.got(nl, ns, ni).Float64s(), lf.got(gl, gs, gi).Float64s(), 1e-15)
	}
}

// The typed gradients' errors name the argument and the leaf.
func TestTypedGradsErrors(t *testing.T) {
	w := gtF([]float64{1, 2}, 2)
	k := gtI([]int32{1, 2}, 2)
	e := gtCatch(t, func() {
		trace.Grad2(func(w, k *trace.Array) *trace.Array { return trace.Sum(trace.Mul(w, trace.Convert(k, w.DType()))) })(w, k)
	})
	if e == nil || !strings.Contains(e.Error(), "Grad2") || !strings.Contains(e.Error(), "argument 1 is i32[2]") {
		t.Errorf("Grad2 over an integer argument: %v, want an error naming argument 1", e)
	}
	type P struct{ W, Step *trace.Array }
	e = gtCatch(t, func() {
		trace.Grad3(func(a *trace.Array, p P, c *trace.Array) *trace.Array { return trace.Sum(a) })(w, P{W: w, Step: k}, w)
	})
	if e == nil || !strings.Contains(e.Error(), "argument 1 Step is i32[2]") {
		t.Errorf("Grad3 over an integer leaf: %v, want an error naming argument 1 Step", e)
	}
	e = gtCatch(t, func() { trace.GradFirst(func(w, x *trace.Array) *trace.Array { return trace.Mul(w, x) })(w, w) })
	if e == nil || !strings.Contains(e.Error(), "float scalar") {
		t.Errorf("GradFirst of a non-scalar: %v, want an error asking for a scalar", e)
	}
	e = gtCatch(t, func() { trace.Grad2[*trace.Array, *trace.Array](nil) })
	if e == nil || !strings.Contains(e.Error(), "nil function") {
		t.Errorf("Grad2(nil): %v", e)
	}
}

// The gradients of a loss with respect to weights and bias, each of its own
// type, as jax.grad(loss, argnums=(0, 1)).
func ExampleGrad2() {
	x := rt.FromSlice([]float32{1, 2, 3})
	y := rt.FromSlice([]float32{3, 5, 7})
	loss := func(w, b *trace.Array) *trace.Array {
		d := trace.Sub(trace.Add(trace.Mul(w, x), b), y)
		return trace.Mean(trace.Mul(d, d))
	}
	gw, gb := trace.Grad2(loss)(rt.FromScalar(float32(1)), rt.FromScalar(float32(0)))
	fmt.Println(gw, gb)
	// Output:
	// f32[] -13.333333 f32[] -6
}

// The gradient with respect to the parameters of a loss of parameters and a
// batch, as jax.grad(loss)(params, batch): the batch (here with integer
// labels) is passed through.
func ExampleGradFirst() {
	type Params struct{ W *trace.Array }
	type Batch struct {
		X      *trace.Array
		Labels *trace.Array // i32
	}
	loss := func(p Params, b Batch) *trace.Array {
		logits := trace.MatMul(b.X, p.W)
		pick := trace.OneHot(b.Labels, 2, logits.DType())
		return trace.Neg(trace.Mean(trace.Sum(trace.Mul(trace.LogSoftmax(logits, -1), pick), -1)))
	}
	p := Params{W: rt.FromSlice([]float32{0, 0, 0, 0}, 2, 2)}
	b := Batch{X: rt.FromSlice([]float32{1, 0, 0, 1}, 2, 2), Labels: rt.FromSlice([]int32{0, 1})}
	step := rt.Jit(func(p Params, b Batch) Params {
		g := trace.GradFirst(loss)(p, b)
		return Params{W: trace.Sub(p.W, trace.Mul(trace.Scalar(0.5), g.W))}
	})
	fmt.Println(trace.GradFirst(loss)(p, b).W)
	fmt.Println(step(p, b).W)
	// Output:
	// f32[2,2] [[-0.25 0.25] [0.25 -0.25]]
	// f32[2,2] [[0.125 -0.125] [-0.125 0.125]]
}
