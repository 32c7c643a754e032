package cpuexec

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// groupGen builds random fused groups: expressions over parameters read
// through chains of broadcasts, transposes, slices and reshapes.
type groupGen struct {
	t   *testing.T
	r   *rand.Rand
	f   *ir.Func
	rg  *ir.Region
	dt  ir.DType
	out []*ir.Value // operands of the fusion op (function parameters)
}

func (g *groupGen) param(shape []int) *ir.Value {
	ty := ir.TypeOf(g.dt, shape...)
	g.out = append(g.out, g.f.Body.AddParam(ty))
	return g.rg.AddParam(ty)
}

func (g *groupGen) op(code ir.Code, attrs ir.Attrs, args ...*ir.Value) *ir.Value {
	return add1(g.t, g.rg, code, attrs, args...)
}

// expr returns a random value of the given shape.
func (g *groupGen) expr(shape []int, depth int) *ir.Value {
	r := g.r
	if depth <= 0 || r.IntN(5) == 0 {
		switch r.IntN(4) {
		case 0:
			c := g.op(ir.Convert, ir.Attrs{"dtype": g.dt}, constant(g.t, g.rg, float32(r.IntN(7)-3)))
			return bcast(g.t, g.rg, c, shape)
		case 1:
			if len(shape) > 0 {
				return g.op(ir.Iota, ir.Attrs{"dtype": g.dt, "shape": shape, "dim": r.IntN(len(shape))})
			}
		}
		return g.param(shape)
	}
	switch r.IntN(9) {
	case 0:
		return g.op([]ir.Code{ir.Neg, ir.Abs, ir.Sign}[r.IntN(3)], nil, g.expr(shape, depth-1))
	case 1, 2:
		return g.op([]ir.Code{ir.Add, ir.Sub, ir.Mul, ir.Max, ir.Min}[r.IntN(5)], nil, g.expr(shape, depth-1), g.expr(shape, depth-1))
	case 3: // broadcast from a subset of the dims, some of size 1
		var in, dims []int
		for d, n := range shape {
			switch r.IntN(3) {
			case 0:
				in, dims = append(in, n), append(dims, d)
			case 1:
				in, dims = append(in, 1), append(dims, d)
			}
		}
		return bcast(g.t, g.rg, g.expr(in, depth-1), shape, dims...)
	case 4: // transpose
		perm := r.Perm(len(shape))
		in := make([]int, len(shape))
		for i, p := range perm {
			in[p] = shape[i]
		}
		return g.op(ir.Transpose, ir.Attrs{"perm": perm}, g.expr(in, depth-1))
	case 5: // slice of something larger
		in := make([]int, len(shape))
		start, limit, strides := make([]int, len(shape)), make([]int, len(shape)), make([]int, len(shape))
		for d, n := range shape {
			strides[d] = 1 + r.IntN(2)
			start[d] = r.IntN(3)
			limit[d] = start[d] + (n-1)*strides[d] + 1
			if n == 0 {
				limit[d] = start[d]
			}
			in[d] = limit[d] + r.IntN(2)
		}
		return g.op(ir.Slice, ir.Attrs{"start": start, "limit": limit, "strides": strides}, g.expr(in, depth-1))
	case 6: // reshape from a reversed or flattened shape
		in := []int{ir.Shape(shape).Size()}
		if r.IntN(2) == 0 {
			in = append([]int(nil), shape...)
			for i, j := 0, len(in)-1; i < j; i, j = i+1, j-1 {
				in[i], in[j] = in[j], in[i]
			}
		}
		return g.op(ir.Reshape, ir.Attrs{"shape": shape}, g.expr(in, depth-1))
	case 7:
		c := g.op(ir.Gt, nil, g.expr(shape, depth-1), g.expr(shape, depth-1))
		return g.op(ir.Select, nil, c, g.expr(shape, depth-1), g.expr(shape, depth-1))
	default: // a round trip through another dtype
		other := map[ir.DType]ir.DType{ir.Float32: ir.Float16, ir.Float64: ir.Float32, ir.Int32: ir.Float64, ir.Float16: ir.Int32}[g.dt]
		return g.op(ir.Convert, ir.Attrs{"dtype": g.dt}, g.op(ir.Convert, ir.Attrs{"dtype": other}, g.expr(shape, depth-1)))
	}
}

func randShape(r *rand.Rand) []int {
	s := make([]int, 1+r.IntN(3))
	for i := range s {
		s[i] = 1 + r.IntN(6)
		if r.IntN(12) == 0 {
			s[i] = 40 + r.IntN(60)
		}
	}
	return s
}

// TestRandomFusedGroups compares random loop and input groups with eval.
func TestRandomFusedGroups(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	dts := []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.Int32}
	for it := range 300 {
		dt := dts[it%len(dts)]
		f := ir.NewFunc(fmt.Sprintf("random%d", it))
		g := &groupGen{t: t, r: r, f: f, rg: f.NewRegion(), dt: dt}
		shape := randShape(r)
		kind := "loop"
		var res []*ir.Value
		if it%3 == 0 {
			kind = "input"
			var axes []int
			for d := range shape {
				if r.IntN(2) == 0 {
					axes = append(axes, d)
				}
			}
			e := g.expr(shape, 4)
			res = append(res, g.op([]ir.Code{ir.ReduceSum, ir.ReduceMax, ir.ReduceMin}[r.IntN(3)], ir.Attrs{"axes": axes}, e))
			if r.IntN(2) == 0 {
				res = append(res, e)
			}
		} else {
			res = append(res, g.expr(shape, 5))
			if r.IntN(2) == 0 {
				res = append(res, g.op(ir.Reshape, ir.Attrs{"shape": []int{ir.Shape(shape).Size()}}, g.expr(shape, 3)))
			}
		}
		g.rg.Results = res
		op := addOp(t, f.Body, ir.Fusion, g.out, ir.Attrs{"kind": kind}, g.rg)
		f.Body.Results = op.Results
		p := naivePlan(f, planOpts{})
		e, err := New(p)
		require.NoError(t, err)
		k := e.body.steps[0].fused
		require.NotEqual(t, modeFallback, k.mode, "%s: %s\n%v", f.Name, k.why, f)
		args := randArgs(r, f)
		t.Run(f.Name, func(t *testing.T) { runBoth(t, p, args) })
		if t.Failed() {
			t.Logf("%v", f)
			return
		}
	}
}
