package trace_test

import (
	"fmt"
	"strings"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

type pxLayer struct {
	W    *trace.Array
	Name string // static: no arrays
}

type pxParams struct {
	W      *trace.Array
	B      *trace.Array
	Layers []pxLayer
	Steps  int // static
}

func pxDef(t *testing.T, tree any) *trace.TreeDef {
	t.Helper()
	d, err := trace.Structure(tree)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// BroadcastPrefix gives each leaf the value of the prefix node above it,
// whatever containers mirror the tree.
func TestBroadcastPrefix(t *testing.T) {
	a := gtF([]float64{1}, 1)
	p := pxParams{W: a, B: a, Layers: []pxLayer{{W: a, Name: "l0"}, {W: a, Name: "l1"}}, Steps: 3}
	d := pxDef(t, &p) // through a pointer
	// Leaves in Flatten's order: W, B, Layers[0].W, Layers[1].W.
	for _, c := range []struct {
		prefix any
		want   []int
	}{
		{7, []int{7, 7, 7, 7}},
		{nil, []int{-1, -1, -1, -1}},
		{map[string]any{"W": 0, "B": nil, "Layers": 2}, []int{0, -1, 2, 2}},
		{map[string]any{"W": 0, "B": 1, "Layers": []any{3, map[string]int{"W": 4}}}, []int{0, 1, 3, 4}},
		{struct {
			W, B   any
			Layers []int
		}{W: 5, B: (*int)(nil), Layers: []int{6, 7}}, []int{5, -1, 6, 7}},
		{&map[string]any{"W": 1, "B": 2, "Layers": []any{nil, 3}, "Steps": "ignored"}, []int{1, 2, -1, 3}},
	} {
		got, err := trace.BroadcastPrefix(c.prefix, d, -1)
		if err != nil {
			t.Errorf("BroadcastPrefix(%#v): %v", c.prefix, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("BroadcastPrefix(%#v) = %v, want %v", c.prefix, got, c.want)
		}
	}
	m := map[string][]*trace.Array{"a": {a, a}, "b": {a}}
	got, err := trace.BroadcastPrefix(map[string]any{"a": []int{1, 2}, "b": 3}, pxDef(t, m), 0)
	if err != nil || fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("map prefix: %v %v, want [1 2 3]", got, err)
	}

	for _, c := range []struct {
		prefix any
		want   string
	}{
		{map[string]any{"W": 0, "B": 0}, "at the top: the prefix (map[string]interface {}) has no field Layers"},
		{map[string]any{"W": 0, "B": 0, "Layers": 0, "C": 0}, "has a field C the tree's struct"},
		{map[string]any{"W": 0, "B": 0, "Layers": []int{1}}, "at Layers: the prefix has 1 elements where the tree has 2"},
		{map[string]any{"W": 0, "B": 0, "Layers": []any{0, []int{1}}}, "at Layers[1]: the prefix has a []int where the tree has a struct"},
		{map[string]any{"W": []int{0}, "B": 0, "Layers": 0}, "at W: the prefix has a []int where the tree has an array"},
		{"0", "at the top: the prefix has a string where the tree has a struct"},
	} {
		_, err := trace.BroadcastPrefix(c.prefix, d, -1)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("BroadcastPrefix(%#v): error %v, want it to say %q", c.prefix, err, c.want)
		}
	}
}

// pxForward is a function of a params tree and an input.
func pxForward(p pxParams, x *trace.Array) *trace.Array {
	y := trace.Add(trace.MatMul(x, p.W), p.B)
	for _, l := range p.Layers {
		y = trace.Tanh(trace.Mul(y, l.W))
	}
	return y
}

// Vmap with InAxesTree mapping parts of a params tree, checked against a
// loop over the examples; InAxes with one value per argument against the
// flat one per leaf.
func TestVmapInAxesTree(t *testing.T) {
	r := otRand(t)
	const n = 3
	rnd := func(shape ...int) *trace.Array {
		size := 1
		for _, s := range shape {
			size *= s
		}
		return gtF(gtRandData(r, size, -1, 1), shape...)
	}
	// W mapped on axis 0 (an ensemble), B shared, Layers[0].W mapped on
	// axis 1, Layers[1].W shared; x mapped on axis 0.
	p := pxParams{W: rnd(n, 4, 2), B: rnd(2), Layers: []pxLayer{{W: rnd(2, n), Name: "a"}, {W: rnd(2), Name: "b"}}, Steps: 1}
	x := rnd(n, 5, 4)
	prefix := map[string]any{"W": 0, "B": nil, "Layers": []any{map[string]any{"W": 1}, trace.NotMapped}}
	got := trace.Vmap(pxForward, trace.InAxesTree(prefix, 0))(p, x)
	jitted := rt.Jit(trace.Vmap(pxForward, trace.InAxesTree(prefix, 0)))(p, x)
	flat := trace.Vmap(pxForward, trace.InAxes(0, trace.NotMapped, 1, trace.NotMapped, 0))(p, x)
	var want []*trace.Array
	for i := range n {
		pi := pxParams{W: trace.Index(p.W, i), B: p.B, Layers: []pxLayer{
			{W: trace.Squeeze(trace.SliceAxis(p.Layers[0].W, 1, i, i+1), 1)}, p.Layers[1]}}
		want = append(want, pxForward(pi, trace.Index(x, i)))
	}
	w := trace.Stack(0, want...)
	for name, g := range map[string]*trace.Array{"InAxesTree": got, "jitted InAxesTree": jitted, "flat InAxes": flat} {
		gtExpectClose(t, name, g.Float64s(), w.Float64s(), 1e-12)
		if !g.Shape().Equal(w.Shape()) {
			t.Errorf("%s: shape %v, want %v", name, g.Shape(), w.Shape())
		}
	}

	// One value per argument applies to all of its leaves: the params
	// whole, x mapped on axis 0.
	shared := pxParams{W: rnd(4, 2), B: rnd(2), Layers: []pxLayer{{W: rnd(2)}, {W: rnd(2)}}}
	perArg := trace.Vmap(pxForward, trace.InAxes(trace.NotMapped, 0))(shared, x)
	perLeaf := trace.Vmap(pxForward, trace.InAxes(trace.NotMapped, trace.NotMapped, trace.NotMapped, trace.NotMapped, 0))(shared, x)
	tree := trace.Vmap(pxForward, trace.InAxesTree(nil, 0))(shared, x)
	ref := pxForward(shared, x) // the matmul broadcasts over the leading axis
	for name, g := range map[string]*trace.Array{"per argument": perArg, "per leaf": perLeaf, "tree with nil": tree} {
		gtExpectClose(t, name, g.Float64s(), ref.Float64s(), 1e-12)
	}

	// OutAxesTree places each result's mapped axis.
	type out struct{ A, B *trace.Array }
	two := func(x *trace.Array) out { return out{A: trace.Neg(x), B: trace.Sum(x)} }
	xs := rnd(n, 2)
	o := trace.Vmap(two, trace.OutAxesTree(map[string]any{"A": 1, "B": 0}))(xs)
	o2 := trace.Vmap(two, trace.OutAxes(1, 0))(xs)
	if !o.A.Shape().Equal(o2.A.Shape()) || o.A.Shape()[1] != n || o.B.Shape()[0] != n {
		t.Errorf("OutAxesTree: shapes %v %v, want [2 %d] [%d]", o.A.Shape(), o.B.Shape(), n, n)
	}
	gtExpectClose(t, "OutAxesTree A", o.A.Float64s(), trace.Transpose(trace.Neg(xs), 1, 0).Float64s(), 0)
	gtExpectClose(t, "OutAxesTree B", o.B.Float64s(), trace.Sum(xs, 1).Float64s(), 1e-15)
}

// A prefix that does not fit is an error naming the option, the argument
// and the path, at the caller's line.
func TestVmapInAxesTreeErrors(t *testing.T) {
	a := gtF([]float64{1, 2, 3, 4}, 2, 2)
	p := pxParams{W: a, B: a, Layers: []pxLayer{{W: a}}}
	for _, c := range []struct {
		opt  trace.VmapOption
		want string
	}{
		{trace.InAxesTree(map[string]any{"W": 0, "B": 0, "Layers": []int{0, 0}}, 0), "InAxesTree: argument 0: at Layers: the prefix has 2 elements where the tree has 1"},
		{trace.InAxesTree(0, 0, 0), "InAxesTree has 3 entries for 2 arguments"},
		{trace.InAxes(0, 0, 0), "InAxes has 3 entries for 2 arguments (with 3, 1 leaves)"},
		{trace.OutAxesTree(map[string]any{"X": 0}), "OutAxesTree: result 0: at the top: the prefix (map[string]interface {}) has no field W"},
	} {
		e := gtCatch(t, func() {
			trace.Vmap(func(p pxParams, x *trace.Array) pxParams { return p }, c.opt)(p, a)
		})
		if e == nil || !strings.Contains(e.Error(), c.want) || !strings.Contains(e.Error(), "prefix_test.go") {
			t.Errorf("error %v, want it to say %q at this file's line", e, c.want)
		}
	}
	// As many values as arguments and as leaves, read differently: an error.
	e := gtCatch(t, func() {
		trace.Vmap(func(p struct{ A, B *trace.Array }, none struct{}) *trace.Array { return p.A }, trace.InAxes(0, 1))(struct{ A, B *trace.Array }{a, a}, struct{}{})
	})
	if e == nil || !strings.Contains(e.Error(), "the two readings differ") {
		t.Errorf("ambiguous InAxes: %v", e)
	}
}

// Per-example predictions of an ensemble: the params' W is mapped (one per
// member), their bias shared, as jax.vmap's in_axes=({"W": 0, "B": None}, None).
func ExampleInAxesTree() {
	type Params struct{ W, B *trace.Array }
	predict := func(p Params, x *trace.Array) *trace.Array { return trace.Add(trace.MatMul(x, p.W), p.B) }
	p := Params{
		W: rt.FromSlice([]float32{1, 0, 0, 1, 2, 0, 0, 2}, 2, 2, 2), // two members
		B: rt.FromSlice([]float32{10, 20}),
	}
	x := rt.FromSlice([]float32{1, 2}, 1, 2)
	ensemble := trace.Vmap(predict, trace.InAxesTree(map[string]any{"W": 0, "B": nil}, nil))
	fmt.Println(ensemble(p, x))
	// One value per argument applies to every leaf of it: the whole params
	// are shared, x is mapped.
	batched := trace.Vmap(predict, trace.InAxes(trace.NotMapped, 0))
	fmt.Println(batched(Params{W: trace.Index(p.W, 0), B: p.B}, rt.FromSlice([]float32{1, 2, 3, 4}, 2, 1, 2)))
	// Output:
	// f32[2,1,2] [[[11 22]] [[12 24]]]
	// f32[2,1,2] [[[11 22]] [[13 24]]]
}
