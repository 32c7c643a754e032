package eval

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// fusionCase builds the same computation twice: once with its ops inside a
// fusion op of the given kind (fused) and once as plain ops (plain).
type fusionCase struct {
	kind   string
	params []ir.Type
	// build adds the group's ops to r over the region parameters ps and
	// returns the group's results.
	build func(t *testing.T, r *ir.Region, ps []*ir.Value) []*ir.Value
}

func (c fusionCase) funcs(t *testing.T) (fused, plain *ir.Func) {
	t.Helper()
	plain = ir.NewFunc("plain_" + c.kind)
	var pps []*ir.Value
	for _, ty := range c.params {
		pps = append(pps, plain.Body.AddParam(ty))
	}
	plain.Body.Results = c.build(t, plain.Body, pps)

	fused = ir.NewFunc("fused_" + c.kind)
	var fps, rps []*ir.Value
	for _, ty := range c.params {
		fps = append(fps, fused.Body.AddParam(ty))
	}
	region := fused.NewRegion()
	for _, ty := range c.params {
		rps = append(rps, region.AddParam(ty))
	}
	region.Results = c.build(t, region, rps)
	op := addOp(t, fused.Body, ir.Fusion, fps, ir.Attrs{"kind": c.kind}, region)
	op.Loc = "fused.go:1"
	fused.Body.Results = op.Results
	return fused, plain
}

// testFusion checks that a fusion op computes exactly what its region's ops
// compute unfused, for the three kinds, and that the loop kind matches an
// independent float64 reference.
func testFusion(t *testing.T) {
	r := newRand(t)
	xT, vT, mT := ir.TypeOf(ir.Float32, 4, 5), ir.TypeOf(ir.Float32, 5), ir.TypeOf(ir.Float32, 5, 3)
	bcast := func(t *testing.T, rg *ir.Region, v *ir.Value, shape []int, dims []int) *ir.Value {
		return addOp(t, rg, ir.BroadcastInDim, []*ir.Value{v}, ir.Attrs{"shape": shape, "dims": dims}).Result()
	}
	cases := []fusionCase{
		{ // tanh(x*w + b), returning x itself and the result twice.
			kind: "loop", params: []ir.Type{xT, vT, vT},
			build: func(t *testing.T, rg *ir.Region, ps []*ir.Value) []*ir.Value {
				w, b := bcast(t, rg, ps[1], []int{4, 5}, []int{1}), bcast(t, rg, ps[2], []int{4, 5}, []int{1})
				m := addOp(t, rg, ir.Mul, []*ir.Value{ps[0], w}, nil).Result()
				a := addOp(t, rg, ir.Add, []*ir.Value{m, b}, nil).Result()
				y := addOp(t, rg, ir.Tanh, []*ir.Value{a}, nil).Result()
				return []*ir.Value{y, ps[0], y}
			},
		},
		{ // reduce_sum(exp(x) * w, axes 1)
			kind: "input", params: []ir.Type{xT, vT},
			build: func(t *testing.T, rg *ir.Region, ps []*ir.Value) []*ir.Value {
				e := addOp(t, rg, ir.Exp, []*ir.Value{ps[0]}, nil).Result()
				m := addOp(t, rg, ir.Mul, []*ir.Value{e, bcast(t, rg, ps[1], []int{4, 5}, []int{1})}, nil).Result()
				return addOp(t, rg, ir.ReduceSum, []*ir.Value{m}, ir.Attrs{"axes": []int{1}}).Results
			},
		},
		{ // max(x @ m + bias, 0)
			kind: "output", params: []ir.Type{xT, mT, ir.TypeOf(ir.Float32, 3)},
			build: func(t *testing.T, rg *ir.Region, ps []*ir.Value) []*ir.Value {
				d := addOp(t, rg, ir.DotGeneral, []*ir.Value{ps[0], ps[1]}, ir.Attrs{
					"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}}).Result()
				a := addOp(t, rg, ir.Add, []*ir.Value{d, bcast(t, rg, ps[2], []int{4, 3}, []int{1})}, nil).Result()
				z := addOp(t, rg, ir.BroadcastInDim, []*ir.Value{constOp(t, rg, float32(0))}, ir.Attrs{"shape": []int{4, 3}, "dims": []int{}}).Result()
				return addOp(t, rg, ir.Max, []*ir.Value{a, z}, nil).Results
			},
		},
	}
	for _, c := range cases {
		fused, plain := c.funcs(t)
		args := make([]*ir.Literal, len(c.params))
		for i, ty := range c.params {
			args[i] = randLit(r, ty.DType, ty.Shape, genUnit)
		}
		got := runFunc(t, fused, args)
		want, err := Run(plain, args)
		require.NoError(t, err)
		require.Len(t, got, len(want))
		for i := range want {
			require.Equal(t, want[i].Type, got[i].Type, "%s result %d", c.kind, i)
			require.Equal(t, want[i].Data, got[i].Data, "%s result %d", c.kind, i)
		}
		if c.kind == "loop" {
			x, w, b := args[0], args[1], args[2]
			for i := 0; i < 20; i++ {
				ref := math.Tanh(float64(float32(float32(getF(x, i)*getF(w, i%5)) + float32(getF(b, i%5)))))
				require.True(t, closeTo(getF(got[0], i), ref, ir.Float32, 2, false), "loop [%d]: got %g want %g", i, getF(got[0], i), ref)
			}
			require.Equal(t, x.Data, got[1].Data)
		}
	}

	// A malformed region reports the fusion op.
	fused, _ := cases[0].funcs(t)
	fused.Body.Ops[0].Regions[0].Results = []*ir.Value{nil, nil, nil}
	_, err := Run(fused, []*ir.Literal{lit(xT), lit(vT), lit(vT)})
	require.ErrorContains(t, err, "fusion (fused.go:1)")
}

// genUnit draws uniformly from [-1, 1).
func genUnit(r *rand.Rand) float64 { return r.Float64()*2 - 1 }
