package trace_test

// Tests of ShardMap against a reference written here: the blocks of every
// mesh position are cut out of float64 tensors by explicit index arithmetic,
// each position's results (collectives included) computed by loops over the
// other positions, and the global results assembled from the blocks.

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// smMesh is a mesh with its shape and names for the reference.
type smMesh struct {
	shape []int
	names []string
	m     *ir.Mesh
}

func smNewMesh(t *testing.T, shape []int, names ...string) smMesh {
	t.Helper()
	m, err := ir.NewMesh(shape, names)
	if err != nil {
		t.Fatal(err)
	}
	return smMesh{shape: shape, names: names, m: m}
}

// positions lists the mesh coordinates row-major.
func (m smMesh) positions() [][]int {
	var out [][]int
	for i := range otNumel(m.shape) {
		out = append(out, otUnravel(i, m.shape))
	}
	return out
}

// bounds returns where the block of a global shape at pos starts and its
// shape: dimension d is cut into the product of its axes' sizes, block
// index the axes' coordinates, the first axis major.
func (m smMesh) bounds(shape []int, spec ir.PartitionSpec, pos []int) (start, local []int) {
	start, local = make([]int, len(shape)), slices.Clone(shape)
	for d := range shape {
		if d >= len(spec) {
			continue
		}
		b, ways := 0, 1
		for _, a := range spec[d] {
			k := slices.Index(m.names, a)
			b = b*m.shape[k] + pos[k]
			ways *= m.shape[k]
		}
		local[d] = shape[d] / ways
		start[d] = b * local[d]
	}
	return start, local
}

// block returns the block of g at pos.
func (m smMesh) block(g otTensor, spec ir.PartitionSpec, pos []int) otTensor {
	start, local := m.bounds(g.shape, spec, pos)
	out := otNew(local...)
	for i := range out.data {
		idx := otUnravel(i, local)
		for d := range idx {
			idx[d] += start[d]
		}
		out.data[i] = g.at(idx...)
	}
	return out
}

// assemble returns the global array of the given shape whose block at each
// position is local(pos), taking position 0 along the axes spec does not
// name.
func (m smMesh) assemble(shape []int, spec ir.PartitionSpec, local func(pos []int) otTensor) otTensor {
	named := map[string]bool{}
	for _, axes := range spec {
		for _, a := range axes {
			named[a] = true
		}
	}
	g := otNew(shape...)
	for _, pos := range m.positions() {
		first := true
		for k, c := range pos {
			first = first && (named[m.names[k]] || c == 0)
		}
		if !first {
			continue
		}
		blk := local(pos)
		start, lshape := m.bounds(shape, spec, pos)
		if !slices.Equal(lshape, blk.shape) {
			panic("assemble: block shape")
		}
		for i, v := range blk.data {
			idx := otUnravel(i, lshape)
			for d := range idx {
				idx[d] += start[d]
			}
			g.data[otRavel(idx, shape)] = v
		}
	}
	return g
}

// at returns the position pos with axis k set to c.
func smAt(pos []int, k, c int) []int {
	p := slices.Clone(pos)
	p[k] = c
	return p
}

func smRandT(r *rand.Rand, shape ...int) otTensor {
	t := otNew(shape...)
	for i := range t.data {
		t.data[i] = r.NormFloat64()
	}
	return t
}

func smArr(t otTensor) *trace.Array { return rt.FromSlice(slices.Clone(t.data), t.shape...) }

// smMap returns f applied to every element of a.
func smMap(a otTensor, f func(i int, v float64) float64) otTensor {
	out := otNew(a.shape...)
	for i, v := range a.data {
		out.data[i] = f(i, v)
	}
	return out
}

// smSumAll returns the sum of the tensors (of one shape).
func smSumAll(ts ...otTensor) otTensor {
	out := otNew(ts[0].shape...)
	for _, t := range ts {
		for i, v := range t.data {
			out.data[i] += v
		}
	}
	return out
}

func smCheck(t *testing.T, what string, got *trace.Array, want otTensor, tol float64) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: nil result", what)
		return
	}
	if !slices.Equal([]int(got.Shape()), want.shape) || got.DType() != ir.Float64 {
		t.Errorf("%s: got %v, want f64%v", what, got.Type(), want.shape)
		return
	}
	for i, v := range got.Float64s() {
		if math.Abs(v-want.data[i]) > tol*(1+math.Abs(want.data[i])) {
			t.Errorf("%s: element %v is %v, want %v", what, otUnravel(i, want.shape), v, want.data[i])
			return
		}
	}
}

// smAxisIndex is AxisIndex(name) as a float64 scalar.
func smAxisIndex(name string) *trace.Array {
	return trace.Convert(trace.AxisIndex(name), ir.Float64)
}

// ---- a 1-D mesh

// sm1D is a ShardMap over mesh [x=4] of a [8,3] sharded by rows and b [3]
// replicated, with every kind of result: sharded, replicated after a PSum,
// gathered, permuted, stacked.
type sm1D struct {
	mesh     smMesh
	in, out  []ir.PartitionSpec
	a, b     otTensor
	outShape [][]int
}

func newSm1D(t *testing.T, r *rand.Rand) *sm1D {
	return &sm1D{
		mesh:     smNewMesh(t, []int{4}, "x"),
		in:       []ir.PartitionSpec{ir.P("x"), nil},
		out:      []ir.PartitionSpec{ir.P("x"), nil, ir.P(), ir.P("x", ""), nil},
		a:        smRandT(r, 8, 3),
		b:        smRandT(r, 3),
		outShape: [][]int{{8, 3}, {3}, {8, 3}, {8, 3}, {4, 2}},
	}
}

func (*sm1D) fn(args []*trace.Array) []*trace.Array {
	a, b := args[0], args[1]
	y := trace.Add(trace.Mul(a, b), smAxisIndex("x"))
	return []*trace.Array{
		y,
		trace.PSum(trace.Sum(y, 0), "x"),
		trace.AllGather(a, "x", 0, true),
		trace.PPermute(a, "x", [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 0}}),
		trace.AllGather(trace.Sum(a, 1), "x", 0, false),
	}
}

// want computes the results position by position.
func (c *sm1D) want() []otTensor {
	m := c.mesh
	blk := func(pos []int) otTensor { return m.block(c.a, c.in[0], pos) }
	y := func(pos []int) otTensor {
		return smMap(blk(pos), func(i int, v float64) float64 { return v*c.b.data[i%3] + float64(pos[0]) })
	}
	var out []otTensor
	out = append(out, m.assemble(c.outShape[0], c.out[0], y))
	out = append(out, m.assemble(c.outShape[1], c.out[1], func([]int) otTensor {
		s := otNew(3)
		for x := range 4 {
			for i, v := range y([]int{x}).data {
				s.data[i%3] += v
			}
		}
		return s
	}))
	out = append(out, m.assemble(c.outShape[2], c.out[2], func([]int) otTensor {
		g := otNew(8, 3)
		for x := range 4 {
			copy(g.data[6*x:], blk([]int{x}).data)
		}
		return g
	}))
	out = append(out, m.assemble(c.outShape[3], c.out[3], func(pos []int) otTensor {
		return blk([]int{(pos[0] + 3) % 4}) // the ring sends x-1 to x
	}))
	out = append(out, m.assemble(c.outShape[4], c.out[4], func([]int) otTensor {
		h := otNew(4, 2)
		for x := range 4 {
			for i, v := range blk([]int{x}).data {
				h.data[2*x+i/3] += v
			}
		}
		return h
	}))
	return out
}

func TestShardMap1D(t *testing.T) {
	c := newSm1D(t, otRand(t))
	f := trace.ShardMapFlat(c.fn, c.mesh.m, c.in, c.out)
	want := c.want()
	args := []*trace.Array{smArr(c.a), smArr(c.b)}
	for mode, run := range map[string]func([]*trace.Array) []*trace.Array{"eager": f, "jit": rt.Jit(f)} {
		got := run(args)
		if len(got) != len(want) {
			t.Fatalf("%s: %d results, want %d", mode, len(got), len(want))
		}
		for i := range want {
			smCheck(t, mode+" result "+string(rune('0'+i)), got[i], want[i], 1e-12)
		}
	}
}

// ---- a 2-D mesh

// sm2DIn is the argument of the 2-D case, a tree.
type sm2DIn struct {
	A, C, E, W *trace.Array
}

// sm2D is a ShardMap over mesh [x=2, y=4]: a [4,8] split over both axes, c
// [8,6] with rows split over all 8 devices (x major), e [8] split over y
// major then x, w [6,4] replicated; collectives over either axis and both.
type sm2D struct {
	mesh       smMesh
	in, out    []ir.PartitionSpec
	a, c, e, w otTensor
	outShape   [][]int
}

func newSm2D(t *testing.T, r *rand.Rand) *sm2D {
	return &sm2D{
		mesh: smNewMesh(t, []int{2, 4}, "x", "y"),
		in:   []ir.PartitionSpec{ir.P("x", "y"), {{"x", "y"}, nil}, {{"y", "x"}}, nil},
		out: []ir.PartitionSpec{
			nil,                // r1 = sum of a, psum over x then y
			ir.P("x"),          // r2 = a's rows of x, all-gathered along y
			ir.P("x", "y"),     // r3 = a scaled by the position
			{{"x", "y"}},       // r4 = c shifted along y plus the psum over x
			{{"y", "x"}},       // r5 = e + x
			ir.P("x"),          // r6 = psum over y of c·w
			nil,                // r7 = the block of (0, 0)
			ir.P(),             // r8 = a gathered over both axes
			{nil, {"y", "x"}}}, // r9 = tanh(r3), columns over y major
		a: smRandT(r, 4, 8), c: smRandT(r, 8, 6), e: smRandT(r, 8), w: smRandT(r, 6, 4),
		outShape: [][]int{{}, {4, 8}, {4, 8}, {8, 6}, {8}, {2, 4}, {2, 2}, {4, 8}, {2, 16}},
	}
}

func (*sm2D) fn(in sm2DIn) []*trace.Array {
	a, c, e, w := in.A, in.C, in.E, in.W
	scale := trace.Add(trace.Mul(smAxisIndex("x"), trace.ScalarAs(10, ir.Float64)), smAxisIndex("y"))
	r3 := trace.Mul(a, scale)
	return []*trace.Array{
		trace.PSum(trace.PSum(trace.Sum(a), "x"), "y"),
		trace.AllGather(a, "y", 1, true),
		r3,
		trace.Add(trace.PPermute(c, "y", [][2]int{{0, 1}, {1, 2}, {2, 3}}), trace.PSum(c, "x")),
		trace.Add(e, smAxisIndex("x")),
		trace.PSum(trace.MatMul(c, w), "y"),
		a,
		trace.AllGather(trace.AllGather(a, "y", 1, true), "x", 0, true),
		trace.Tanh(r3),
	}
}

func (c *sm2D) args() sm2DIn {
	return sm2DIn{A: smArr(c.a), C: smArr(c.c), E: smArr(c.e), W: smArr(c.w)}
}

func (c *sm2D) want() []otTensor {
	m := c.mesh
	aB := func(pos []int) otTensor { return m.block(c.a, c.in[0], pos) }
	cB := func(pos []int) otTensor { return m.block(c.c, c.in[1], pos) }
	eB := func(pos []int) otTensor { return m.block(c.e, c.in[2], pos) }
	r3 := func(pos []int) otTensor {
		return smMap(aB(pos), func(_ int, v float64) float64 { return v * float64(10*pos[0]+pos[1]) })
	}
	locals := []func(pos []int) otTensor{
		func([]int) otTensor {
			s := otNew()
			for _, p := range m.positions() {
				for _, v := range aB(p).data {
					s.data[0] += v
				}
			}
			return s
		},
		func(pos []int) otTensor {
			g := otNew(2, 8)
			for y := range 4 {
				for i, v := range aB(smAt(pos, 1, y)).data {
					g.data[8*(i/2)+2*y+i%2] = v
				}
			}
			return g
		},
		r3,
		func(pos []int) otTensor {
			s := smSumAll(cB(smAt(pos, 0, 0)), cB(smAt(pos, 0, 1)))
			if pos[1] > 0 {
				s = smSumAll(s, cB(smAt(pos, 1, pos[1]-1)))
			}
			return s
		},
		func(pos []int) otTensor {
			return smMap(eB(pos), func(_ int, v float64) float64 { return v + float64(pos[0]) })
		},
		func(pos []int) otTensor {
			s := otNew(1, 4)
			for y := range 4 {
				row := cB(smAt(pos, 1, y))
				for j := range 4 {
					for k := range 6 {
						s.data[j] += row.data[k] * c.w.at(k, j)
					}
				}
			}
			return s
		},
		aB,
		func([]int) otTensor { return c.a },
		func(pos []int) otTensor {
			return smMap(r3(pos), func(_ int, v float64) float64 { return math.Tanh(v) })
		},
	}
	out := make([]otTensor, len(locals))
	for i, l := range locals {
		out[i] = m.assemble(c.outShape[i], c.out[i], l)
	}
	return out
}

func TestShardMap2D(t *testing.T) {
	c := newSm2D(t, otRand(t))
	f := trace.ShardMap(c.fn, c.mesh.m, c.in, c.out)
	want := c.want()
	for mode, run := range map[string]func(sm2DIn) []*trace.Array{"eager": f, "jit": rt.Jit(f)} {
		got := run(c.args())
		if len(got) != len(want) {
			t.Fatalf("%s: %d results, want %d", mode, len(got), len(want))
		}
		for i := range want {
			smCheck(t, mode+" r"+string(rune('1'+i)), got[i], want[i], 1e-12)
		}
	}
}

// TestShardMapGrad differentiates a weighted sum of the results of both
// cases and compares with central differences of the (jitted) loss.
func TestShardMapGrad(t *testing.T) {
	r := otRand(t)
	c1, c2 := newSm1D(t, r), newSm2D(t, r)
	f1 := trace.ShardMapFlat(c1.fn, c1.mesh.m, c1.in, c1.out)
	f2 := trace.ShardMap(c2.fn, c2.mesh.m, c2.in, c2.out)
	cases := []struct {
		name   string
		fn     func([]*trace.Array) []*trace.Array
		inputs []otTensor
		shapes [][]int
	}{
		{"1-D", f1, []otTensor{c1.a, c1.b}, c1.outShape},
		{"2-D", func(a []*trace.Array) []*trace.Array { return f2(sm2DIn{a[0], a[1], a[2], a[3]}) },
			[]otTensor{c2.a, c2.c, c2.e, c2.w}, c2.outShape},
	}
	for _, tc := range cases {
		var weights []*trace.Array
		for _, s := range tc.shapes {
			weights = append(weights, smArr(smRandT(r, s...)))
		}
		loss := func(xs []*trace.Array) *trace.Array {
			var l *trace.Array
			for i, y := range tc.fn(xs) {
				term := trace.Sum(trace.Mul(y, weights[i]))
				if l == nil {
					l = term
				} else {
					l = trace.Add(l, term)
				}
			}
			return l
		}
		args := func(ins []otTensor) []*trace.Array {
			var out []*trace.Array
			for _, x := range ins {
				out = append(out, smArr(x))
			}
			return out
		}
		jl := rt.Jit(loss)
		const eps = 1e-5
		for mode, grad := range map[string]func([]*trace.Array) []*trace.Array{
			"eager": trace.Grad(loss), "jit": rt.Jit(trace.Grad(loss)),
		} {
			g := grad(args(tc.inputs))
			for k, x := range tc.inputs {
				fd := otNew(x.shape...)
				for i := range x.data {
					at := func(d float64) float64 {
						ins := slices.Clone(tc.inputs)
						ins[k] = smMap(x, func(j int, v float64) float64 {
							if j == i {
								return v + d
							}
							return v
						})
						return jl(args(ins)).Item()
					}
					fd.data[i] = (at(eps) - at(-eps)) / (2 * eps)
				}
				smCheck(t, tc.name+" "+mode+" gradient of input "+string(rune('0'+k)), g[k], fd, 1e-6)
			}
		}
	}
}

// TestShardMapUnderVmap maps the 1-D case over a batch of a (b shared) and
// compares with a loop over the examples.
func TestShardMapUnderVmap(t *testing.T) {
	r := otRand(t)
	c := newSm1D(t, r)
	f := trace.ShardMapFlat(c.fn, c.mesh.m, c.in, c.out)
	as := smRandT(r, 3, 8, 3)
	g := trace.Vmap(func(a, b *trace.Array) []*trace.Array { return f([]*trace.Array{a, b}) },
		trace.InAxes(0, trace.NotMapped))
	got := g(smArr(as), smArr(c.b))
	for ex := range 3 {
		c.a = otTensor{shape: []int{8, 3}, data: as.data[24*ex : 24*(ex+1)]}
		for i, w := range c.want() {
			y := trace.Index(got[i], ex)
			smCheck(t, "example "+string(rune('0'+ex))+" result "+string(rune('0'+i)), y, w, 1e-12)
		}
	}
}

// TestShardMapTrivialMeshes checks a mesh axis of size 1 and a mesh with
// no axes: the function runs once on the whole arrays.
func TestShardMapTrivialMeshes(t *testing.T) {
	r := otRand(t)
	a := smRandT(r, 3, 4)
	for _, shape := range [][]int{{1}, {}} {
		names := []string{"x"}[:len(shape)]
		m := smNewMesh(t, shape, names...)
		spec := ir.PartitionSpec{names}
		if len(shape) == 0 {
			spec = nil
		}
		f := trace.ShardMap(func(x *trace.Array) *trace.Array { return trace.Exp(x) }, m.m,
			[]ir.PartitionSpec{spec}, []ir.PartitionSpec{spec})
		smCheck(t, m.m.String(), f(smArr(a)), smMap(a, func(_ int, v float64) float64 { return math.Exp(v) }), 1e-14)
	}
}

// TestShardMapProgram checks the program ShardMap traces: no loop over the
// devices and no collective op left (they become ordinary ops).
func TestShardMapProgram(t *testing.T) {
	m := smNewMesh(t, []int{2, 4}, "x", "y")
	f := trace.ShardMap(func(a, w *trace.Array) *trace.Array {
		return trace.PSum(trace.MatMul(a, w), "y")
	}, m.m, []ir.PartitionSpec{ir.P("x", "y"), ir.P("y")}, []ir.PartitionSpec{ir.P("x")})
	l, err := rt.Lower(f, rt.FromSlice(make([]float32, 4*8), 4, 8), rt.FromSlice(make([]float32, 8*3), 8, 3))
	if err != nil {
		t.Fatal(err)
	}
	fn := l.Func
	n := vtCountOps(fn)
	for code, k := range n {
		if code.IsCollective() || code == ir.Scan || code == ir.While {
			t.Errorf("the program has %d %v ops:\n%v", k, code, fn)
		}
	}
	if n[ir.DotGeneral] != 1 {
		t.Errorf("the program has %d dot_general ops, want 1:\n%v", n[ir.DotGeneral], fn)
	}
}

// smCheckError is vtCheckError for this file.
func smCheckError(t *testing.T, err *trace.Error, line int, op string, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("no error, want %s: %q", op, fragments)
		return
	}
	if err.Op != op {
		t.Errorf("error %v: op %q, want %q", err, err.Op, op)
	}
	if err.Line != line || !strings.HasSuffix(err.File, "shardmap_test.go") {
		t.Errorf("error %v at %s:%d, want shardmap_test.go:%d (the caller's line)", err, err.File, err.Line, line)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Msg, f) {
			t.Errorf("error %q does not say %q", err.Msg, f)
		}
	}
}

// TestShardMapErrors checks the errors of bad ShardMap input: a *trace.Error
// naming the problem, located at the caller's line.
func TestShardMapErrors(t *testing.T) {
	m := smNewMesh(t, []int{2, 4}, "x", "y").m
	x := rt.FromSlice(make([]float32, 24), 4, 6)
	id := func(a *trace.Array) *trace.Array { return a }
	add := func(a, b *trace.Array) *trace.Array { return trace.Add(a, b) }
	ps := func(specs ...ir.PartitionSpec) []ir.PartitionSpec { return specs }
	rep := ps(nil)

	err, line := otCatchLine(func() { trace.ShardMap(id, nil, rep, rep) })
	smCheckError(t, err, line, "ShardMap", "nil mesh")
	err, line = otCatchLine(func() { trace.ShardMap(id, &ir.Mesh{}, rep, rep) })
	smCheckError(t, err, line, "ShardMap", "mesh is not initialised")
	err, line = otCatchLine(func() { trace.ShardMapFlat(nil, m, rep, rep) })
	smCheckError(t, err, line, "ShardMapFlat", "nil function")
	err, line = otCatchLine(func() { trace.ShardMap(add, m, ps(nil, nil, nil), rep)(x, x) })
	smCheckError(t, err, line, "ShardMap", "3 in specs for 2 argument leaves")
	err, line = otCatchLine(func() { trace.ShardMap(add, m, ps(), rep)(x, x) })
	smCheckError(t, err, line, "ShardMap", "0 in specs for 2 argument leaves")
	err, line = otCatchLine(func() { trace.ShardMap(add, m, rep, ps(nil, nil))(x, x) })
	smCheckError(t, err, line, "ShardMap", "2 out specs for 1 result leaves")
	err, line = otCatchLine(func() { trace.ShardMap(add, m, ps(nil, ir.P("z")), rep)(x, x) })
	smCheckError(t, err, line, "ShardMap", "argument leaf 1 (f32[4,6])", `mesh axis "z"`)
	err, line = otCatchLine(func() { trace.ShardMap(id, m, ps(ir.P("x", "x")), rep)(x) })
	smCheckError(t, err, line, "ShardMap", "argument leaf 0", `mesh axis "x" is used by dimensions 0 and 1`)
	err, line = otCatchLine(func() { trace.ShardMap(id, m, ps(ir.PartitionSpec{{"y", "y"}}), rep)(x) })
	smCheckError(t, err, line, "ShardMap", "argument leaf 0", `mesh axis "y" is used twice in dimension 0`)
	err, line = otCatchLine(func() { trace.ShardMap(id, m, ps(ir.P("x", "", "")), rep)(x) })
	smCheckError(t, err, line, "ShardMap", "argument leaf 0 (f32[4,6])", "3 entries, more than the 2 dimensions")
	err, line = otCatchLine(func() { trace.ShardMap(id, m, ps(ir.P("", "y")), rep)(x) })
	smCheckError(t, err, line, "ShardMap", "argument leaf 0 (f32[4,6])", "dimension 1", "has size 6", "mesh axis y (size 4)")
	err, line = otCatchLine(func() { trace.ShardMap(id, m, ps(ir.PartitionSpec{{"x", "y"}}), rep)(x) })
	smCheckError(t, err, line, "ShardMap", "dimension 0", "has size 4", "mesh axes {x,y} (2×4 = 8 devices)")
	err, line = otCatchLine(func() { trace.ShardMap(id, m, rep, ps(ir.P("w")))(x) })
	smCheckError(t, err, line, "ShardMap", "result leaf 0 (f32[4,6] per device)", `mesh axis "w"`)
	err, line = otCatchLine(func() { trace.ShardMap(id, m, rep, ps(ir.P("x", "y", "")))(x) })
	smCheckError(t, err, line, "ShardMap", "result leaf 0 (f32[4,6] per device)", "3 entries, more than its 2 dimensions")
	err, line = otCatchLine(func() { trace.ShardMap(id, m, rep, ps(ir.P("x", "x")))(x) })
	smCheckError(t, err, line, "ShardMap", "result leaf 0", `mesh axis "x" is used by dimensions 0 and 1`)
	err, line = otCatchLine(func() {
		trace.ShardMapFlat(func(a []*trace.Array) []*trace.Array { return []*trace.Array{nil} }, m, rep, rep)([]*trace.Array{x})
	})
	smCheckError(t, err, line+1, "ShardMapFlat", "nil array as result leaf 0")
	err, line = otCatchLine(func() { trace.ShardMapFlat(id1, m, rep, rep)([]*trace.Array{nil}) })
	smCheckError(t, err, line, "ShardMapFlat", "argument leaf 0 is nil")
	// A collective over an axis the mesh does not have is unbound.
	err, line = otCatchLine(func() {
		trace.ShardMap(func(a *trace.Array) *trace.Array { return trace.PSum(a, "z") }, m, rep, rep)(x)
	})
	smCheckError(t, err, line+1, "PSum", `unbound axis name "z"`, "ShardMap over a mesh with that axis")
	// The block shape is what fn sees: an error inside it names the block.
	err, line = otCatchLine(func() {
		trace.ShardMap(func(a *trace.Array) *trace.Array { return trace.Reshape(a, 24) }, m, ps(ir.P("x", "")), rep)(x)
	})
	smCheckError(t, err, line+1, "Reshape", "f32[2,6]")
	// And rt.Jit's error-returning entry point returns them.
	j := rt.NewJitted(trace.ShardMap(id, m, ps(ir.P("", "y")), rep))
	if _, e := j.Call(x); e == nil || !strings.Contains(e.Error(), "does not divide") {
		t.Errorf("jitted ShardMap with a bad spec: error %v, want one saying does not divide", e)
	}
}

func id1(a []*trace.Array) []*trace.Array { return a }
