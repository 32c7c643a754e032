package passes_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/testkit/spmdref"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// ownBlock is the start of a per-device program over mesh x=4 whose
// parameter %0 is the device's partial sum, f32[8,12] (its block of a
// global f32[32,12]), and %2 = axis_index · 2 (the offset of the device's
// block of 8 rows) and %3 = 0.
const ownBlock = `  %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[8,12]
  %10 = axis_index() {axis="x", size=4} : i32[]
  %11 = constant() {value=dense<i32[], 2>} : i32[]
  %2 = mul(%10, %11) : i32[]
  %3 = constant() {value=dense<i32[], 0>} : i32[]
`

// scatterCase is a per-device program for the reduce-scatter pass, with the
// layouts of its parameters and results over its mesh.
type scatterCase struct {
	name            string
	ir              string
	params, results []string
	// scattered: the pass turns its all_reduce into a reduce_scatter.
	scattered bool
	// ref, for a scattered case, computes the global result from the
	// global arguments in float64.
	ref func(args []*ir.Literal) []float64
	tol float64
}

const (
	rows  = "sharding<mesh[x=4], [x,{}]>"
	cols  = "sharding<mesh[x=4], [{},x]>"
	whole = "sharding<mesh[x=4], []>"
)

// blockSum is Σ over the four row blocks of a (the global f32[32,12]
// partials): the f32[8,12] sum, as float64, at [i][j].
func blockSum(a *ir.Literal, off int) func(i, j int) float64 {
	return func(i, j int) float64 {
		s := 0.0
		for d := range 4 {
			s += a.Float64At(off + (d*8+i)*12 + j)
		}
		return s
	}
}

// grid lists fn over an n×m grid, row-major.
func grid(n, m int, fn func(i, j int) float64) []float64 {
	out := make([]float64, 0, n*m)
	for i := range n {
		for j := range m {
			out = append(out, fn(i, j))
		}
	}
	return out
}

var scatterCases = []scatterCase{
	{name: "rows", scattered: true, tol: 1e-5, params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12]) {
` + ownBlock + `  %4 = dynamic_slice(%1, %2, %3) {sizes=[2,12]} : f32[2,12]
  return %4
}`,
		ref: func(a []*ir.Literal) []float64 { return grid(8, 12, blockSum(a[0], 0)) }},
	// The FSDP weight gradient: the product's transpose, in bf16, split by rows.
	{name: "transposed and converted", scattered: true, tol: 1e-2, params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (bf16[3,8]) {
` + ownBlock + `  %4 = transpose(%1) {perm=[1,0]} : f32[12,8]
  %5 = convert(%4) {dtype=bf16} : bf16[12,8]
  %6 = constant() {value=dense<i32[], 3>} : i32[]
  %7 = mul(%6, %10) : i32[]
  %8 = dynamic_slice(%5, %7, %3) {sizes=[3,8]} : bf16[3,8]
  return %8
}`,
		ref: func(a []*ir.Literal) []float64 {
			s := blockSum(a[0], 0)
			return grid(12, 8, func(i, j int) float64 { return s(j, i) })
		}},
	{name: "columns", scattered: true, tol: 1e-5, params: []string{rows}, results: []string{cols},
		ir: `func @g(%0: f32[8,12]) -> (f32[8,3]) {
` + ownBlock + `  %6 = constant() {value=dense<i32[], 3>} : i32[]
  %7 = mul(%10, %6) : i32[]
  %4 = dynamic_slice(%1, %3, %7) {sizes=[8,3]} : f32[8,3]
  return %4
}`,
		ref: func(a []*ir.Literal) []float64 { return grid(8, 12, blockSum(a[0], 0)) }},
	// A layer scan: the body's gradient goes to the carry and to the ys.
	{name: "scan body", scattered: true, tol: 1e-5, params: []string{rows, "sharding<mesh[x=4], [{},x,{}]>"},
		results: []string{rows, "sharding<mesh[x=4], [{},x,{}]>"},
		ir: `func @g(%20: f32[2,12], %21: f32[3,8,12]) -> (f32[2,12], f32[3,2,12]) {
  %30, %31 = scan(%20, %21) {length=3, num_carry=1, num_consts=0, reverse=true} (
    ^(%22: f32[2,12], %0: f32[8,12]) {
` + ownBlock + `      %4 = dynamic_slice(%1, %2, %3) {sizes=[2,12]} : f32[2,12]
      %5 = add(%22, %4) : f32[2,12]
      return %5, %4
    }) : f32[2,12], f32[3,2,12]
  return %30, %31
}`,
		ref: func(a []*ir.Literal) []float64 {
			var carry, ys []float64
			for i := range 8 {
				for j := range 12 {
					c := a[0].Float64At(i*12 + j)
					for l := range 3 {
						c += blockSum(a[1], l*32*12)(i, j)
					}
					carry = append(carry, c)
				}
			}
			for l := range 3 {
				ys = append(ys, grid(8, 12, blockSum(a[1], l*32*12))...)
			}
			return append(carry, ys...)
		}},
	// The body returns the whole sum as ys, the device's block of the stack is sliced after the scan.
	{name: "scan ys", scattered: true, tol: 1e-5, params: []string{"sharding<mesh[x=4], [{},x,{}]>"},
		results: []string{"sharding<mesh[x=4], [{},{},x]>"},
		ir: `func @g(%21: f32[3,8,12]) -> (f32[3,12,2]) {
  %31 = scan(%21) {length=3, num_carry=0, num_consts=0, reverse=true} (
    ^(%0: f32[8,12]) {
      %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[8,12]
      %4 = transpose(%1) {perm=[1,0]} : f32[12,8]
      return %4
    }) : f32[3,12,8]
  %10 = axis_index() {axis="x", size=4} : i32[]
  %11 = constant() {value=dense<i32[], 2>} : i32[]
  %2 = mul(%10, %11) : i32[]
  %3 = constant() {value=dense<i32[], 0>} : i32[]
  %5 = dynamic_slice(%31, %3, %3, %2) {sizes=[3,12,2]} : f32[3,12,2]
  return %5
}`,
		ref: func(a []*ir.Literal) []float64 {
			var ys []float64
			for l := range 3 {
				s := blockSum(a[0], l*32*12)
				ys = append(ys, grid(12, 8, func(i, j int) float64 { return s(j, i) })...)
			}
			return ys
		}},
	// Near misses: the all_reduce stays.
	{name: "another device's block", params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12]) {
` + ownBlock + `  %5 = constant() {value=dense<i32[], 3>} : i32[]
  %6 = sub(%5, %10) : i32[]
  %7 = mul(%6, %11) : i32[]
  %4 = dynamic_slice(%1, %7, %3) {sizes=[2,12]} : f32[2,12]
  return %4
}`},
	{name: "a fixed block", params: []string{rows}, results: []string{whole},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12]) {
` + ownBlock + `  %4 = dynamic_slice(%1, %11, %3) {sizes=[2,12]} : f32[2,12]
  return %4
}`},
	{name: "another block size", params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12]) {
` + ownBlock + `  %4 = dynamic_slice(%1, %10, %3) {sizes=[2,12]} : f32[2,12]
  return %4
}`},
	{name: "another stride", params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12]) {
` + ownBlock + `  %5 = constant() {value=dense<i32[], 1>} : i32[]
  %7 = mul(%10, %5) : i32[]
  %4 = dynamic_slice(%1, %7, %3) {sizes=[2,12]} : f32[2,12]
  return %4
}`},
	{name: "scan ys sliced along the stack", params: []string{"sharding<mesh[x=4], [{},x,{}]>"},
		results: []string{"sharding<mesh[x=4], [x,{},{}]>"},
		ir: `func @g(%21: f32[4,8,12]) -> (f32[1,8,12]) {
  %31 = scan(%21) {length=4, num_carry=0, num_consts=0, reverse=false} (
    ^(%0: f32[8,12]) {
      %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[8,12]
      return %1
    }) : f32[4,8,12]
  %10 = axis_index() {axis="x", size=4} : i32[]
  %3 = constant() {value=dense<i32[], 0>} : i32[]
  %5 = dynamic_slice(%31, %10, %3, %3) {sizes=[1,8,12]} : f32[1,8,12]
  return %5
}`},
	{name: "second use", params: []string{rows}, results: []string{rows, whole},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12], f32[8,12]) {
` + ownBlock + `  %4 = dynamic_slice(%1, %2, %3) {sizes=[2,12]} : f32[2,12]
  return %4, %1
}`},
	{name: "second use of the chain", params: []string{rows}, results: []string{rows, whole},
		ir: `func @g(%0: f32[8,12]) -> (bf16[2,12], bf16[8,12]) {
` + ownBlock + `  %5 = convert(%1) {dtype=bf16} : bf16[8,12]
  %4 = dynamic_slice(%5, %2, %3) {sizes=[2,12]} : bf16[2,12]
  return %4, %5
}`},
	{name: "max", params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,12]) {
` + strings.Replace(ownBlock, `"sum"`, `"max"`, 1) + `  %4 = dynamic_slice(%1, %2, %3) {sizes=[2,12]} : f32[2,12]
  return %4
}`},
	{name: "two dimensions", params: []string{rows}, results: []string{rows},
		ir: `func @g(%0: f32[8,12]) -> (f32[2,3]) {
` + ownBlock + `  %4 = dynamic_slice(%1, %2, %3) {sizes=[2,3]} : f32[2,3]
  return %4
}`},
}

// TestReduceScatterPass: an all_reduce whose sum each device reads only
// its own block of (rows, columns, through a transpose and a convert, in a
// scan body) becomes one reduce_scatter, and the program's results over
// four devices stay those of the all_reduce and equal a float64
// reference; near misses (another device's block, a fixed block, another
// block size, a second use of the sum or of a value between, a max, a
// slice along two dimensions) keep their all_reduce and their results.
func TestReduceScatterPass(t *testing.T) {
	rng := testseed.Rand(t, 41)
	for _, c := range scatterCases {
		t.Run(c.name, func(t *testing.T) {
			f := parse(t, c.ir)
			part := scatterPartitioned(t, f, c)
			opts := only("reduce-scatter", "dce")
			opts.BoundAxes = []string{"x"}
			p := compile(t, f, opts)
			counts := collectiveCounts(p.Func.Body)
			if c.scattered {
				require.Equal(t, map[string]int{"reduce_scatter": 1}, counts, "no all_reduce, no axis_index left:\n%s", p.Func)
			} else {
				require.Equal(t, [2]int{1, 0}, [2]int{counts["all_reduce"], counts["reduce_scatter"]}, "the all_reduce stays:\n%s", p.Func)
			}
			global := make([]ir.Type, len(f.Body.Results))
			for i, s := range part.Results {
				lt := f.Body.Results[i].Type
				global[i] = lt.WithShape(globalShape(lt.Shape, s))
			}
			args := make([]*ir.Literal, len(f.Body.Params))
			for i, s := range part.Params {
				lt := f.Body.Params[i].Type
				args[i] = randomLiteral(rng, lt.WithShape(globalShape(lt.Shape, s)))
			}
			want, err := spmdref.Eval(part, global, args, time.Minute)
			require.NoError(t, err)
			after := *part
			after.Func = p.Func
			got, err := spmdref.Eval(&after, global, args, time.Minute)
			require.NoError(t, err, "%s", p.Func)
			var flat, ref []float64
			for i := range got {
				for j := range got[i].Type.Size() {
					flat = append(flat, got[i].Float64At(j))
					require.InDelta(t, want[i].Float64At(j), got[i].Float64At(j), c.tol*(1+math.Abs(want[i].Float64At(j))),
						"result %d element %d\n%s", i, j, p.Func)
				}
			}
			if c.ref != nil {
				ref = c.ref(args)
				require.Len(t, flat, len(ref))
				for j := range ref {
					require.InDelta(t, ref[j], flat[j], c.tol*(1+math.Abs(ref[j])), "element %d against float64\n%s", j, p.Func)
				}
			}
		})
	}
}

// scatterPartitioned wraps the per-device program f of c as a partitioned
// program over c's mesh.
func scatterPartitioned(t *testing.T, f *ir.Func, c scatterCase) *passes.Partitioned {
	t.Helper()
	parse := func(texts []string) []*ir.NamedSharding {
		var out []*ir.NamedSharding
		for _, s := range texts {
			ns, err := ir.ParseSharding(s)
			require.NoError(t, err)
			out = append(out, ns)
		}
		return out
	}
	part := &passes.Partitioned{Func: f, Params: parse(c.params), Results: parse(c.results), Axes: []string{"x"}}
	part.Mesh = part.Params[0].Mesh
	return part
}

// globalShape is the shape whose block under s is local.
func globalShape(local ir.Shape, s *ir.NamedSharding) ir.Shape {
	g := local.Clone()
	for d, axes := range s.Spec {
		for _, a := range axes {
			g[d] *= s.Mesh.AxisSize(a)
		}
	}
	return g
}

// randomLiteral is a literal of type t with normal entries.
func randomLiteral(rng *rand.Rand, t ir.Type) *ir.Literal {
	l := ir.NewLiteral(t)
	for i := range t.Size() {
		l.SetFloat64At(i, rng.NormFloat64())
	}
	return l
}

// collectiveCounts counts the collective ops of r and its nested regions
// by name.
func collectiveCounts(r *ir.Region) map[string]int {
	out := map[string]int{}
	r.Walk(func(op *ir.Op) {
		if op.Code.IsCollective() {
			out[op.Code.String()]++
		}
	})
	return out
}
