package trace_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// treeBuf is a host buffer, so that tree tests need no executor.
type treeBuf struct{ lit *ir.Literal }

func (b treeBuf) Type() ir.Type                 { return b.lit.Type }
func (b treeBuf) Literal() (*ir.Literal, error) { return b.lit, nil }

// treeArr makes a concrete f32 vector.
func treeArr(vals ...float32) *trace.Array {
	l, err := ir.LiteralOf(ir.Shape{len(vals)}, vals)
	if err != nil {
		panic(err)
	}
	return trace.FromBuffer(treeBuf{l})
}

// treeScale returns a new array: a's elements times k.
func treeScale(a *trace.Array, k float32) *trace.Array {
	v := a.Float32s()
	for i := range v {
		v[i] *= k
	}
	return treeArr(v...)
}

type treeLayer struct {
	W, B *trace.Array
	Name string
}

type treeModel struct {
	Layers  []treeLayer
	Embed   *treeLayer
	Extra   map[string]any
	Steps   int
	private float64
	hidden  *trace.Array
}

type treeNode struct {
	W    *trace.Array
	Next *treeNode
}

type treeHandle struct{ n int }

type treeWithHandle struct {
	H *treeHandle
	X *trace.Array
}

type treeEmbedded struct {
	treeLayer              // embedded through an exported type name? no: the name is unexported
	Bias      *trace.Array // walked
}

type TreeInner struct{ V *trace.Array }

type treeOuter struct {
	TreeInner // exported embedded field: walked as "TreeInner"
	U         *trace.Array
}

type treeGeneric[T any] struct {
	A T
	X *trace.Array
}

func treeCases() map[string]any {
	a, b, c := treeArr(1), treeArr(2, 3), treeArr(4, 5, 6)
	return map[string]any{
		"array":         a,
		"nil array":     (*trace.Array)(nil),
		"nil":           nil,
		"static":        42,
		"slice":         []*trace.Array{a, nil, b},
		"empty slice":   []*trace.Array{},
		"nil slice":     []*trace.Array(nil),
		"any slice":     []any{a, 3, "x", nil, b, []int{1, 2}, 2.5, true, (*trace.Array)(nil)},
		"map":           map[string]*trace.Array{"weight": a, "bias": b, "none": nil},
		"int map":       map[int]any{3: a, -1: b, 10: "s"},
		"nested maps":   map[string]map[string][]*trace.Array{"x": {"y": {a, b}}, "z": nil},
		"array value":   [2]*trace.Array{a, b},
		"array of any":  [3]any{a, 1, nil},
		"ptr to ptr":    func() ***trace.Array { p := &a; return &p }(),
		"ptr to slice":  &[]*trace.Array{a, c},
		"struct":        treeLayer{W: a, B: b, Name: "l"},
		"struct ptr":    &treeLayer{W: a, Name: "p"},
		"nil struct":    (*treeLayer)(nil),
		"ir.Type":       struct{ T ir.Type }{ir.TypeOf(ir.Float32, 2, 3)},
		"generic":       treeGeneric[[]float64]{A: []float64{1, 2}, X: c},
		"embedded":      treeOuter{TreeInner{a}, b},
		"bool keys":     map[bool]*trace.Array{true: a, false: b},
		"iface keys":    map[any]*trace.Array{"a": a, 1: b, 2.5: c},
		"struct keys":   map[struct{ I, J int }]*trace.Array{{1, 2}: a, {0, 5}: b},
		"float keys":    map[float64]*trace.Array{1.5: a, -2: b},
		"nested struct": treeModel{Layers: []treeLayer{{W: a, B: b}, {W: c, Name: "last"}}, Embed: &treeLayer{W: c}, Extra: map[string]any{"lr": 0.1, "w": a, "list": []any{b, nil}}, Steps: 7, private: 3.5, hidden: c},
	}
}

func TestTreeRoundTrip(t *testing.T) {
	for name, tree := range treeCases() {
		t.Run(name, func(t *testing.T) {
			leaves, def, err := trace.Flatten(tree)
			if err != nil {
				t.Fatal(err)
			}
			if def.NumLeaves() != len(leaves) {
				t.Fatalf("NumLeaves %d, %d leaves", def.NumLeaves(), len(leaves))
			}
			if len(def.Paths()) != len(leaves) {
				t.Fatalf("%d paths for %d leaves: %q", len(def.Paths()), len(leaves), def.Paths())
			}
			for _, l := range leaves {
				if l == nil {
					t.Fatal("nil leaf")
				}
			}
			got, err := def.Unflatten(leaves)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tree) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, tree)
			}
			if tree != nil && reflect.TypeOf(got) != reflect.TypeOf(tree) {
				t.Fatalf("type %T, want %T", got, tree)
			}
			leaves2, def2, err := trace.Flatten(got)
			if err != nil {
				t.Fatal(err)
			}
			if !def.Equal(def2) || def.String() != def2.String() {
				t.Fatalf("structure changed:\n%v\n%v\n%s", def, def2, def.Diff(def2))
			}
			if !slices.Equal(leaves, leaves2) {
				t.Fatal("leaves changed")
			}
			if !slices.Equal(trace.Leaves(tree), leaves) {
				t.Fatal("Leaves differs from Flatten")
			}
			// New leaves land in the same places.
			repl := make([]*trace.Array, len(leaves))
			for i, l := range leaves {
				repl[i] = treeScale(l, 10)
			}
			got, err = def.Unflatten(repl)
			if err != nil {
				t.Fatal(err)
			}
			leaves3, def3, err := trace.Flatten(got)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(leaves3, repl) || !def3.Equal(def) {
				t.Fatalf("replaced leaves not in place")
			}
		})
	}
}

func TestTreeLeafOrderAndPaths(t *testing.T) {
	a, b, c, d := treeArr(1), treeArr(2), treeArr(3), treeArr(4)
	m := treeModel{
		Layers: []treeLayer{{W: a, B: b}, {W: c}},
		Embed:  &treeLayer{B: d},
		Extra:  map[string]any{"z": a, "a": []any{b, nil, c}, "n": 1},
		hidden: d,
	}
	leaves, def, err := trace.Flatten(m)
	if err != nil {
		t.Fatal(err)
	}
	wantPaths := []string{"Layers[0].W", "Layers[0].B", "Layers[1].W", "Embed.B", `Extra["a"][0]`, `Extra["a"][2]`, `Extra["z"]`}
	if got := def.Paths(); !slices.Equal(got, wantPaths) {
		t.Fatalf("paths %q, want %q", got, wantPaths)
	}
	if want := []*trace.Array{a, b, c, d, b, c, a}; !slices.Equal(leaves, want) {
		t.Fatalf("leaf order wrong")
	}

	_, def, _ = trace.Flatten(a)
	if p := def.Paths(); len(p) != 1 || p[0] != "" {
		t.Fatalf("single array path %q", p)
	}
	_, def, _ = trace.Flatten(map[int][]*trace.Array{10: {a}, 2: {b, c}})
	if p := def.Paths(); !slices.Equal(p, []string{"[2][0]", "[2][1]", "[10][0]"}) {
		t.Fatalf("int map paths %q", p)
	}
	_, def, _ = trace.Flatten(treeOuter{TreeInner{a}, b})
	if p := def.Paths(); !slices.Equal(p, []string{"TreeInner.V", "U"}) {
		t.Fatalf("embedded paths %q", p)
	}
}

func TestTreeMapOrderDeterministic(t *testing.T) {
	m := map[string]*trace.Array{}
	var want []string
	for _, k := range []string{"q", "b", "zz", "a", "m", "c1", "c0", "B"} {
		m[k] = treeArr(float32(len(k)))
	}
	_, def, _ := trace.Flatten(m)
	want = def.Paths()
	if !slices.IsSorted(want) {
		t.Fatalf("paths not sorted: %q", want)
	}
	for range 20 {
		_, d2, _ := trace.Flatten(m)
		if !slices.Equal(d2.Paths(), want) || d2.String() != def.String() {
			t.Fatal("map flatten order varies")
		}
	}
}

func TestTreeUnexportedFields(t *testing.T) {
	h := treeArr(9)
	m := treeModel{Steps: 3, private: 2.5, hidden: h, Layers: []treeLayer{{W: treeArr(1)}}}
	got, err := trace.MapAs(m, func(a *trace.Array) *trace.Array { return treeScale(a, 2) })
	if err != nil {
		t.Fatal(err)
	}
	if got.private != 2.5 || got.hidden != h || got.Steps != 3 {
		t.Fatalf("unexported fields not kept: %+v", got)
	}
	if v := got.Layers[0].W.Float32s(); v[0] != 2 {
		t.Fatalf("leaf not mapped: %v", v)
	}
	if n := len(trace.Leaves(m)); n != 1 {
		t.Fatalf("array in unexported field counted as a leaf: %d leaves", n)
	}
	// An unexported embedded struct is not walked either.
	e := treeEmbedded{treeLayer: treeLayer{W: h}, Bias: treeArr(1)}
	leaves, def, _ := trace.Flatten(e)
	if len(leaves) != 1 || def.Paths()[0] != "Bias" {
		t.Fatalf("embedded unexported: %q", def.Paths())
	}
	back, _ := trace.UnflattenAs[treeEmbedded](def, []*trace.Array{treeArr(5)})
	if back.W != h || back.Bias.Float32s()[0] != 5 {
		t.Fatal("embedded unexported field not copied")
	}
	// Unexported fields are not part of the structure.
	m2 := m
	m2.private = -1
	if d1, d2 := mustDef(t, m), mustDef(t, m2); !d1.Equal(d2) || d1.String() != d2.String() {
		t.Fatal("unexported field changed the structure")
	}
}

func TestTreePointers(t *testing.T) {
	a := treeArr(1)
	shared := &treeLayer{W: a}
	tree := struct{ P, Q *treeLayer }{shared, shared}
	leaves, def, _ := trace.Flatten(tree)
	if len(leaves) != 2 {
		t.Fatalf("shared pointer: %d leaves, want 2", len(leaves))
	}
	got, _ := trace.UnflattenAs[struct{ P, Q *treeLayer }](def, leaves)
	if got.P == shared || got.P == got.Q {
		t.Fatal("rebuilt pointers should be new and distinct")
	}
	if got.P.W != a || got.Q.W != a {
		t.Fatal("leaves not placed")
	}

	// Handles (pointers to structs without exported fields) are kept by identity.
	h := &treeHandle{n: 1}
	wh := treeWithHandle{H: h, X: a}
	leaves, def, _ = trace.Flatten(wh)
	if len(leaves) != 1 {
		t.Fatal("handle counted as leaves")
	}
	back, _ := trace.UnflattenAs[treeWithHandle](def, leaves)
	if back.H != h {
		t.Fatal("handle not kept by identity")
	}
	if mustDef(t, wh).String() == mustDef(t, treeWithHandle{H: &treeHandle{n: 1}, X: a}).String() {
		t.Fatal("different handles should give different structures")
	}
	var mu sync.Mutex
	if _, _, err := trace.Flatten(struct {
		M *sync.Mutex
		X *trace.Array
	}{&mu, a}); err != nil {
		t.Fatal(err)
	}
}

func TestTreeStaticValues(t *testing.T) {
	f1 := func(x int) int { return x + 1 }
	f2 := func(x int) int { return x * 2 }
	type withFn struct {
		F func(int) int
		X *trace.Array
	}
	a := treeArr(1)
	leaves, def, _ := trace.Flatten(withFn{f1, a})
	got, _ := trace.UnflattenAs[withFn](def, leaves)
	if got.F(3) != 4 || got.X != a {
		t.Fatal("func not restored")
	}
	if mustDef(t, withFn{f1, a}).String() != def.String() {
		t.Fatal("same func, different structure")
	}
	if mustDef(t, withFn{f2, a}).Equal(def) {
		t.Fatal("different funcs, same structure")
	}

	// Static slices are copied: changing the original later changes nothing.
	s := []int{1, 2, 3}
	tree := struct {
		S []int
		X *trace.Array
	}{s, a}
	_, def, _ = trace.Flatten(tree)
	before := def.String()
	s[0] = 100
	back, _ := def.Unflatten([]*trace.Array{a})
	if back.(struct {
		S []int
		X *trace.Array
	}).S[0] != 1 || def.String() != before {
		t.Fatal("static slice aliased the flattened tree")
	}

	// Long static slices are hashed in String but still compared.
	big := make([]float64, 1000)
	_, d1, _ := trace.Flatten(big)
	big2 := slices.Clone(big)
	big2[999] = 1
	_, d2, _ := trace.Flatten(big2)
	if d1.Equal(d2) || d1.String() == d2.String() || len(d1.String()) > 200 {
		t.Fatalf("big static slices: %s vs %s", d1, d2)
	}
	got2, err := d1.Unflatten(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got2, big) {
		t.Fatal("big static slice not restored")
	}
}

func mustDef(t *testing.T, tree any) *trace.TreeDef {
	t.Helper()
	_, d, err := trace.Flatten(tree)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestTreeStringEquality(t *testing.T) {
	a, b := treeArr(1), treeArr(2, 3, 4)
	tr := trace.NewFuncTracer("t")
	tr.Push()
	defer tr.Pop()
	p := tr.Param(ir.TypeOf(ir.BFloat16, 7, 7))

	same := [][2]any{
		{treeLayer{W: a, Name: "x"}, treeLayer{W: b, Name: "x"}},
		{treeLayer{W: a, Name: "x"}, treeLayer{W: p, Name: "x"}}, // shapes, dtypes, traced or not: not structure
		{map[string]any{"k": a, "s": 1}, map[string]any{"s": 1, "k": b}},
		{[]any{a, nil}, []any{b, nil}},
		{a, p},
	}
	for i, c := range same {
		d1, d2 := mustDef(t, c[0]), mustDef(t, c[1])
		if !d1.Equal(d2) || d1.String() != d2.String() || d1.Diff(d2) != "" {
			t.Errorf("case %d: want equal structures:\n%v\n%v", i, d1, d2)
		}
	}
	differ := [][2]any{
		{treeLayer{W: a, Name: "x"}, treeLayer{W: a, Name: "y"}},           // static field
		{treeLayer{W: a, B: b}, treeLayer{W: a}},                           // leaf vs None
		{[]*trace.Array{}, []*trace.Array(nil)},                            // empty vs nil
		{[]*trace.Array{a}, []*trace.Array{a, b}},                          // length
		{map[string]*trace.Array{"a": a}, map[string]*trace.Array{"b": a}}, // keys
		{[]any{1}, []any{int64(1)}},                                        // static type
		{[]any{1.0}, []any{1.5}},                                           // static value
		{[]any{nil}, []any{(*trace.Array)(nil)}},                           // nil interface vs None
		{[]any{a}, [1]any{a}},                                              // slice vs array
		{&treeLayer{W: a}, treeLayer{W: a}},                                // pointer vs value
		{(*treeLayer)(nil), &treeLayer{}},                                  // nil pointer
		{struct{ X *trace.Array }{a}, struct{ Y *trace.Array }{a}},         // field names
		{treeGeneric[int]{A: 1, X: a}, treeGeneric[int64]{A: 1, X: a}},
		{map[string]any{"x": []any{a, 1}}, map[string]any{"x": []any{a, 2}}},
	}
	for i, c := range differ {
		d1, d2 := mustDef(t, c[0]), mustDef(t, c[1])
		if d1.Equal(d2) || d1.String() == d2.String() || d1.Diff(d2) == "" {
			t.Errorf("case %d: want different structures:\n%v\n%v", i, d1, d2)
		}
	}
	if d := mustDef(t, treeLayer{W: a, Name: "x"}).Diff(mustDef(t, treeLayer{W: a, Name: "y"})); !strings.Contains(d, "Name") || !strings.Contains(d, `"x"`) {
		t.Errorf("diff does not name the field: %s", d)
	}

	want := `github.com/ferryml/ferry/trace_test.treeLayer{W: *, B: None, Name: string("l")}`
	if s := mustDef(t, treeLayer{W: a, Name: "l"}).String(); s != want {
		t.Errorf("String:\n got %s\nwant %s", s, want)
	}
	want = `map[string]interface {}{"a": []int{1, 2}, "b": &*, "c": (*int)(nil), "d": []*github.com/ferryml/ferry/trace.Array(nil)}`
	if s := mustDef(t, map[string]any{"a": []int{1, 2}, "b": &a, "c": (*int)(nil), "d": []*trace.Array(nil)}).String(); s != want {
		t.Errorf("String:\n got %s\nwant %s", s, want)
	}
}

func TestTreeErrors(t *testing.T) {
	a, b := treeArr(1), treeArr(2)
	_, def, _ := trace.Flatten([]*trace.Array{a, b})
	for _, n := range []int{0, 1, 3} {
		if _, err := def.Unflatten(make([]*trace.Array, n)); err == nil || !strings.Contains(err.Error(), "2 leaves") {
			t.Errorf("Unflatten of %d leaves: %v", n, err)
		}
	}
	if _, err := trace.UnflattenAs[map[string]*trace.Array](def, []*trace.Array{a, b}); err == nil {
		t.Error("UnflattenAs to the wrong type succeeded")
	}

	// Cycles.
	n := &treeNode{W: a}
	n.Next = &treeNode{W: b, Next: n}
	if _, _, err := trace.Flatten(n); err == nil || !strings.Contains(err.Error(), "cycle") || !strings.Contains(err.Error(), "Next.Next") {
		t.Errorf("pointer cycle: %v", err)
	}
	s := []any{a, nil}
	s[1] = s
	if _, _, err := trace.Flatten(s); err == nil || !strings.Contains(err.Error(), "[1]") {
		t.Errorf("slice cycle: %v", err)
	}
	m := map[string]any{"a": a}
	m["self"] = []any{m}
	if _, _, err := trace.Flatten(m); err == nil || !strings.Contains(err.Error(), `["self"][0]`) {
		t.Errorf("map cycle: %v", err)
	}
	func() {
		defer func() {
			r := recover()
			var te *trace.Error
			if e, ok := r.(error); !ok || !errors.As(e, &te) {
				t.Errorf("Leaves of a cycle: panic %v, want *trace.Error", r)
			}
		}()
		trace.Leaves(n)
	}()
	// Shared but acyclic pointers are fine.
	shared := &treeNode{W: a}
	if got := trace.Leaves([]*treeNode{shared, shared, {Next: shared}}); len(got) != 3 {
		t.Errorf("shared pointers: %d leaves", len(got))
	}

	// Map2 of different structures.
	_, err := trace.Map2(treeLayer{W: a, B: b}, treeLayer{W: a}, func(x, y *trace.Array) *trace.Array { return x })
	if err == nil || !strings.Contains(err.Error(), "at B") {
		t.Errorf("Map2 mismatch: %v", err)
	}
	_, err = trace.Map2([]*trace.Array{a}, []*trace.Array{a, b}, func(x, y *trace.Array) *trace.Array { return x })
	if err == nil || !strings.Contains(err.Error(), "length 1 vs 2") {
		t.Errorf("Map2 length mismatch: %v", err)
	}
	_, err = trace.Map2(n, n, func(x, y *trace.Array) *trace.Array { return x })
	if err == nil {
		t.Error("Map2 of a cycle succeeded")
	}
	if _, err := trace.Map(n, func(x *trace.Array) *trace.Array { return x }); err == nil {
		t.Error("Map of a cycle succeeded")
	}
}

func TestTreeMap(t *testing.T) {
	a, b := treeArr(1, 2), treeArr(3)
	tree := map[string]any{"x": a, "y": []*trace.Array{b, nil}, "lr": 0.5}
	calls := 0
	got, err := trace.Map(tree, func(x *trace.Array) *trace.Array { calls++; return treeScale(x, 2) })
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("fn called %d times, want 2 (None leaves are skipped)", calls)
	}
	m := got.(map[string]any)
	if v := m["x"].(*trace.Array).Float32s(); !slices.Equal(v, []float32{2, 4}) {
		t.Errorf("x = %v", v)
	}
	if y := m["y"].([]*trace.Array); y[1] != nil || y[0].Float32s()[0] != 6 {
		t.Errorf("y = %v", y)
	}
	if m["lr"] != 0.5 {
		t.Errorf("lr = %v", m["lr"])
	}
	if a.Float32s()[0] != 1 {
		t.Error("input changed")
	}

	type params struct{ W, B *trace.Array }
	p, g := params{a, b}, params{treeArr(10, 20), treeArr(30)}
	sum, err := trace.Map2As(p, g, func(x, y *trace.Array) *trace.Array {
		xs, ys := x.Float32s(), y.Float32s()
		for i := range xs {
			xs[i] += ys[i]
		}
		return treeArr(xs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sum.W.Float32s(), []float32{11, 22}) || sum.B.Float32s()[0] != 33 {
		t.Errorf("Map2As: %v %v", sum.W, sum.B)
	}
	anySum, err := trace.Map2(p, g, func(x, y *trace.Array) *trace.Array { return y })
	if err != nil || anySum.(params).W != g.W {
		t.Errorf("Map2: %v %v", anySum, err)
	}

	// MapAs on an interface-typed tree and on nil.
	var iface any = []*trace.Array{a}
	if r, err := trace.MapAs(iface, func(x *trace.Array) *trace.Array { return b }); err != nil || r.([]*trace.Array)[0] != b {
		t.Errorf("MapAs(any): %v %v", r, err)
	}
	if r, err := trace.MapAs[any](nil, func(x *trace.Array) *trace.Array { return b }); err != nil || r != nil {
		t.Errorf("MapAs(nil): %v %v", r, err)
	}
}

func TestTreeTracedLeaves(t *testing.T) {
	tr := trace.NewFuncTracer("t")
	tr.Push()
	defer tr.Pop()
	x := tr.Param(ir.TypeOf(ir.Float32, 2, 3))
	y := tr.Param(ir.TypeOf(ir.Int32))
	leaves, def, err := trace.Flatten(map[string]*trace.Array{"x": x, "y": y})
	if err != nil || len(leaves) != 2 || leaves[0] != x || leaves[1] != y {
		t.Fatalf("%v %v", leaves, err)
	}
	if p := def.Paths(); !slices.Equal(p, []string{`["x"]`, `["y"]`}) {
		t.Fatalf("paths %q", p)
	}
}

func TestTreeConcurrentString(t *testing.T) {
	_, def, _ := trace.Flatten(treeCases()["nested struct"])
	want := def.String()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if def.String() != want {
				t.Error("String varies")
			}
		}()
	}
	wg.Wait()
}
