package trace_test

// Gradient checks of every differentiable op against central finite differences
// in float64: for random inputs away from kinks, the VJP of op with a random
// cotangent w must equal the finite-difference gradient of sum(op(x)·w). Each
// case is also checked under rt.Jit (same gradients) and at second order (the
// gradient function itself checked against finite differences), and a coverage
// test fails if an op the table marks Differentiable has no case here.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// gtCase is one gradient check.
type gtCase struct {
	name  string
	codes []ir.Code // the ops it checks
	make  func(r *rand.Rand) []*trace.Array
	fn    func(a []*trace.Array) *trace.Array
	tol   float64 // relative tolerance (default 1e-6)
	h     float64 // finite-difference step (default 1e-5)
	no2nd bool    // skip the second-order check
}

func gtOp(code ir.Code, attrs ir.Attrs, args ...*trace.Array) *trace.Array {
	return trace.Apply1(code, attrs, args...)
}

func gtF(data []float64, shape ...int) *trace.Array { return rt.FromSlice(data, shape...) }

func gtI(data []int32, shape ...int) *trace.Array { return rt.FromSlice(data, shape...) }

func gtSize(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// gtRand returns an f64 array with elements uniform in [lo, hi).
func gtRand(r *rand.Rand, lo, hi float64, shape ...int) *trace.Array {
	d := make([]float64, gtSize(shape))
	for i := range d {
		d[i] = lo + (hi-lo)*r.Float64()
	}
	return gtF(d, shape...)
}

// gtRandAway returns elements with |x| in [lo, hi) and a random sign.
func gtRandAway(r *rand.Rand, lo, hi float64, shape ...int) *trace.Array {
	d := make([]float64, gtSize(shape))
	for i := range d {
		d[i] = lo + (hi-lo)*r.Float64()
		if r.IntN(2) == 0 {
			d[i] = -d[i]
		}
	}
	return gtF(d, shape...)
}

// gtRandFrac returns values k + f with integer k in [-3, 3] and f in [0.1, 0.4]
// or [0.6, 0.9]: away from the kinks of floor, ceil and round.
func gtRandFrac(r *rand.Rand, shape ...int) *trace.Array {
	d := make([]float64, gtSize(shape))
	for i := range d {
		f := 0.1 + 0.3*r.Float64()
		if r.IntN(2) == 0 {
			f += 0.5
		}
		d[i] = float64(r.IntN(7)-3) + f
	}
	return gtF(d, shape...)
}

func gtDim(r *rand.Rand) int { return 1 + r.IntN(3) }

// gtLike builds an array of type t from float64 data.
func gtLike(data []float64, t ir.Type) *trace.Array {
	var a *trace.Array
	switch t.DType {
	case ir.Float32:
		d := make([]float32, len(data))
		for i, v := range data {
			d[i] = float32(v)
		}
		a = rt.FromSlice(d, t.Shape...)
	case ir.Float64:
		a = rt.FromSlice(data, t.Shape...)
	default:
		panic("gtLike: " + t.String())
	}
	if t.Space != ir.Device {
		a = gtOp(ir.DevicePut, ir.Attrs{"space": t.Space}, a)
	}
	return a
}

func gtDot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// gtFDCheck checks the VJP of fn at in (cotangent: a random w) against central
// differences, and returns the VJP's gradients and w.
func gtFDCheck(t *testing.T, name string, fn func([]*trace.Array) *trace.Array, in []*trace.Array, r *rand.Rand, tol, h float64) ([]*trace.Array, *trace.Array) {
	t.Helper()
	outs, pb := trace.VJP(func(a []*trace.Array) []*trace.Array { return []*trace.Array{fn(a)} }, in)
	out := outs[0]
	wt := out.Type().WithSpace(ir.Device)
	wd := make([]float64, out.Size())
	for i := range wd {
		wd[i] = 2*r.Float64() - 1
	}
	w := gtLike(wd, wt)
	g := pb([]*trace.Array{w})
	// The replayed forward must compute what fn computes.
	direct := fn(in).Float64s()
	if got := out.Float64s(); !gtAllClose(got, direct, 1e-12) {
		t.Errorf("%s: VJP's forward value %v, direct evaluation %v", name, got, direct)
	}
	loss := func(a []*trace.Array) float64 { return gtDot(fn(a).Float64s(), wd) }
	for i, x := range in {
		if !g[i].Type().Shape.Equal(x.Type().Shape) || g[i].DType() != x.DType() {
			t.Errorf("%s: gradient %d is %v, input is %v", name, i, g[i].Type(), x.Type())
			continue
		}
		if !x.DType().IsFloat() {
			continue
		}
		xv, gv := x.Float64s(), g[i].Float64s()
		a := append([]*trace.Array{}, in...)
		for j := range xv {
			xp := append([]float64{}, xv...)
			xp[j] = xv[j] + h
			a[i] = gtLike(xp, x.Type())
			lp := loss(a)
			xp[j] = xv[j] - h
			a[i] = gtLike(xp, x.Type())
			lm := loss(a)
			fd := (lp - lm) / (2 * h)
			if d := math.Abs(gv[j] - fd); d > tol*(1+math.Abs(fd)) || math.IsNaN(gv[j]) {
				t.Errorf("%s: d/dx%d[%d] = %.10g, finite differences %.10g (diff %.3g)", name, i, j, gv[j], fd, d)
			}
		}
	}
	return g, w
}

func gtAllClose(a, b []float64, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > tol*(1+math.Abs(b[i])) || math.IsNaN(a[i]) != math.IsNaN(b[i]) {
			return false
		}
	}
	return true
}

func gtUnary(code ir.Code, gen func(r *rand.Rand, shape ...int) *trace.Array) gtCase {
	return gtCase{name: code.String(), codes: []ir.Code{code},
		make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gen(r, gtDim(r), gtDim(r)+1)} },
		fn:   func(a []*trace.Array) *trace.Array { return gtOp(code, nil, a[0]) }}
}

func gtRange(lo, hi float64) func(r *rand.Rand, shape ...int) *trace.Array {
	return func(r *rand.Rand, shape ...int) *trace.Array { return gtRand(r, lo, hi, shape...) }
}

func gtAway(lo, hi float64) func(r *rand.Rand, shape ...int) *trace.Array {
	return func(r *rand.Rand, shape ...int) *trace.Array { return gtRandAway(r, lo, hi, shape...) }
}

func gtBinary(code ir.Code, gx, gy func(r *rand.Rand, shape ...int) *trace.Array) gtCase {
	return gtCase{name: code.String(), codes: []ir.Code{code},
		make: func(r *rand.Rand) []*trace.Array {
			s := []int{gtDim(r), gtDim(r) + 1}
			return []*trace.Array{gx(r, s...), gy(r, s...)}
		},
		fn: func(a []*trace.Array) *trace.Array { return gtOp(code, nil, a[0], a[1]) }}
}

func gtDotCase(name string, ls, rs []int, lb, rb, lc, rc []int) gtCase {
	return gtCase{name: "dot_general/" + name, codes: []ir.Code{ir.DotGeneral},
		make: func(r *rand.Rand) []*trace.Array {
			return []*trace.Array{gtRand(r, -1, 1, ls...), gtRand(r, -1, 1, rs...)}
		},
		fn: func(a []*trace.Array) *trace.Array {
			return gtOp(ir.DotGeneral, ir.Attrs{"lhs_batch": lb, "rhs_batch": rb, "lhs_contract": lc, "rhs_contract": rc}, a[0], a[1])
		}}
}

func gtScalarI(v int32) *trace.Array { return rt.FromSlice([]int32{v}) }

func gtI32Scalar(v int32) *trace.Array {
	return gtOp(ir.Reshape, ir.Attrs{"shape": []int{}}, gtScalarI(v))
}

// gtCases lists the gradient checks; every differentiable op must appear.
func gtCases() []gtCase {
	var cs []gtCase
	cs = append(cs, gtElementwiseCases()...)
	cs = append(cs, gtShapeCases()...)
	cs = append(cs, gtReduceDotControlCases()...)
	return cs
}

// gtFracRem draws rem's operands as gtRandAway does, between 0.5 and 4 in
// magnitude.
func gtFracRem(r *rand.Rand, shape ...int) *trace.Array { return gtRandAway(r, 0.5, 4, shape...) }

// gtElementwiseCases are the cases of the elementwise ops.
func gtElementwiseCases() []gtCase {
	return []gtCase{
		gtUnary(ir.Neg, gtRange(-2, 2)),
		gtUnary(ir.Abs, gtAway(0.2, 2)),
		gtUnary(ir.Sign, gtAway(0.2, 2)),
		gtUnary(ir.Exp, gtRange(-1, 1)),
		gtUnary(ir.Log, gtRange(0.5, 2)),
		gtUnary(ir.Log1p, gtRange(-0.5, 2)),
		gtUnary(ir.Expm1, gtRange(-1, 1)),
		gtUnary(ir.Sqrt, gtRange(0.5, 2)),
		gtUnary(ir.Rsqrt, gtRange(0.5, 2)),
		gtUnary(ir.Tanh, gtRange(-2, 2)),
		gtUnary(ir.Logistic, gtRange(-3, 3)),
		gtUnary(ir.Sin, gtRange(-3, 3)),
		gtUnary(ir.Cos, gtRange(-3, 3)),
		gtUnary(ir.Erf, gtRange(-2, 2)),
		gtUnary(ir.Floor, gtRandFrac),
		gtUnary(ir.Ceil, gtRandFrac),
		gtUnary(ir.Round, gtRandFrac),
		gtBinary(ir.Add, gtRange(-2, 2), gtRange(-2, 2)),
		gtBinary(ir.Sub, gtRange(-2, 2), gtRange(-2, 2)),
		gtBinary(ir.Mul, gtRange(-2, 2), gtRange(-2, 2)),
		gtBinary(ir.Div, gtRange(-2, 2), gtAway(0.5, 2)),
		gtBinary(ir.Pow, gtRange(0.5, 2), gtRange(-2, 2)),
		gtBinary(ir.Max, gtRange(-2, 2), gtRange(-2, 2)),
		gtBinary(ir.Min, gtRange(-2, 2), gtRange(-2, 2)),
		{name: "rem", codes: []ir.Code{ir.Rem},
			make: func(r *rand.Rand) []*trace.Array {
				s := []int{gtDim(r), gtDim(r) + 1}
				y := gtFracRem(r, s...)
				yv := y.Float64s()
				xd := make([]float64, len(yv))
				for i := range xd {
					// x = y·(k + f) with f away from 0 and 1: away from rem's jumps.
					xd[i] = yv[i] * (float64(r.IntN(5)-2) + 0.2 + 0.6*r.Float64())
				}
				return []*trace.Array{gtF(xd, s...), y}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.Rem, nil, a[0], a[1]) }},
		{name: "select", codes: []ir.Code{ir.Select},
			make: func(r *rand.Rand) []*trace.Array {
				s := []int{gtDim(r), gtDim(r) + 1}
				p := make([]bool, gtSize(s))
				for i := range p {
					p[i] = r.IntN(2) == 0
				}
				return []*trace.Array{rt.FromSlice(p, s...), gtRand(r, -2, 2, s...), gtRand(r, -2, 2, s...)}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.Select, nil, a[0], a[1], a[2]) }},
		{name: "convert/f32-f64", codes: []ir.Code{ir.Convert}, tol: 2e-3, h: 1e-3,
			make: func(r *rand.Rand) []*trace.Array {
				x := gtRand(r, 0.5, 2, gtDim(r), 2)
				return []*trace.Array{gtOp(ir.Convert, ir.Attrs{"dtype": ir.Float32}, x)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				y := gtOp(ir.Convert, ir.Attrs{"dtype": ir.Float64}, a[0])
				return gtOp(ir.Mul, nil, y, y)
			}},
		{name: "convert/f64-i32", codes: []ir.Code{ir.Convert},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRandFrac(r, 2, 3)} },
			fn: func(a []*trace.Array) *trace.Array {
				i := gtOp(ir.Convert, ir.Attrs{"dtype": ir.Int32}, a[0])
				return gtOp(ir.Mul, nil, a[0], gtOp(ir.Convert, ir.Attrs{"dtype": ir.Float64}, i))
			}},
		{name: "broadcast_in_dim", codes: []ir.Code{ir.BroadcastInDim},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 1)} },
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.BroadcastInDim, ir.Attrs{"shape": []int{2, 3, 4}, "dims": []int{0, 2}}, a[0])
			}},
		{name: "broadcast_in_dim/scalar", codes: []ir.Code{ir.BroadcastInDim},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtOp(ir.Reshape, ir.Attrs{"shape": []int{}}, gtRand(r, -1, 1, 1))}
			},
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.BroadcastInDim, ir.Attrs{"shape": []int{3, 2}, "dims": []int{}}, a[0])
			}},
	}
}

// gtShapeCases are the cases of the shape, indexing and sort ops.
func gtShapeCases() []gtCase {
	return []gtCase{
		{name: "reshape", codes: []ir.Code{ir.Reshape},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 3, 2)} },
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.Reshape, ir.Attrs{"shape": []int{3, 4}}, a[0])
			}},
		{name: "transpose", codes: []ir.Code{ir.Transpose},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 3, 4)} },
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.Transpose, ir.Attrs{"perm": []int{2, 0, 1}}, a[0])
			}},
		{name: "slice", codes: []ir.Code{ir.Slice},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 5, 7)} },
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.Slice, ir.Attrs{"start": []int{1, 0}, "limit": []int{5, 6}, "strides": []int{2, 3}}, a[0])
			}},
		{name: "dynamic_slice", codes: []ir.Code{ir.DynamicSlice},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 4, 5), gtI32Scalar(1), gtI32Scalar(4)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.DynamicSlice, ir.Attrs{"sizes": []int{2, 3}}, a...)
			}},
		{name: "dynamic_update_slice", codes: []ir.Code{ir.DynamicUpdateSlice},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 4, 5), gtRand(r, -1, 1, 2, 2), gtI32Scalar(3), gtI32Scalar(-1)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				y := gtOp(ir.DynamicUpdateSlice, nil, a...)
				return gtOp(ir.Mul, nil, y, y)
			}},
		{name: "concatenate", codes: []ir.Code{ir.Concatenate},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 2, 3), gtRand(r, -1, 1, 2, 1), gtRand(r, -1, 1, 2, 2)}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.Concatenate, ir.Attrs{"axis": 1}, a...) }},
		{name: "pad", codes: []ir.Code{ir.Pad},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 3, 4), gtOp(ir.Reshape, ir.Attrs{"shape": []int{}}, gtRand(r, -1, 1, 1))}
			},
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.Pad, ir.Attrs{"low": []int{1, -1}, "high": []int{-1, 2}, "interior": []int{1, 0}}, a[0], a[1])
			}},
		{name: "pad/interior-both", codes: []ir.Code{ir.Pad},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 2, 3), gtOp(ir.Reshape, ir.Attrs{"shape": []int{}}, gtRand(r, -1, 1, 1))}
			},
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.Pad, ir.Attrs{"low": []int{-2, 0}, "high": []int{0, -3}, "interior": []int{2, 1}}, a[0], a[1])
			}},
		{name: "gather", codes: []ir.Code{ir.Gather},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 4, 3), gtI([]int32{0, 3, -1, 5, 2, 2}, 3, 2)}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.Gather, ir.Attrs{"axis": 0}, a[0], a[1]) }},
		{name: "gather/axis1", codes: []ir.Code{ir.Gather},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 2, 4, 3), gtI([]int32{1, 1, 3}, 3)}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.Gather, ir.Attrs{"axis": 1}, a[0], a[1]) }},
		{name: "sort", codes: []ir.Code{ir.Sort},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 3, 5)} },
			fn:   func(a []*trace.Array) *trace.Array { return trace.Sort(a[0], 1) }},
		{name: "sort/axis0-weighted", codes: []ir.Code{ir.Sort},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 4, 2, 3)} },
			fn: func(a []*trace.Array) *trace.Array {
				// Weights by position make the result depend on where each element lands.
				return trace.Mul(trace.Sort(a[0], 0), trace.Iota(ir.Float64, ir.Shape{4, 2, 3}, 0))
			}},
		{name: "sort/multi-key-and-payload", codes: []ir.Code{ir.Sort},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtI([]int32{2, 0, 1, 0, 2, 1, 0, 2}, 2, 4), gtRand(r, -1, 1, 2, 4), gtRand(r, -1, 1, 2, 4)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				s := trace.SortMulti([]*trace.Array{a[0], a[1], a[2]}, 1, 2)
				w := trace.Iota(ir.Float64, ir.Shape{2, 4}, 1)
				return trace.Add(trace.Mul(s[1], w), trace.Mul(trace.Mul(s[2], s[2]), w))
			}},
		{name: "scatter_add", codes: []ir.Code{ir.ScatterAdd},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 4, 3), gtI([]int32{1, 1, 7, -1, 0}, 5), gtRand(r, -1, 1, 5, 3)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				y := gtOp(ir.ScatterAdd, ir.Attrs{"axis": 0}, a...)
				return gtOp(ir.Mul, nil, y, y)
			}},
		{name: "scatter_add/axis1", codes: []ir.Code{ir.ScatterAdd},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 2, 4), gtI([]int32{3, 0, 3, 2}, 2, 2), gtRand(r, -1, 1, 2, 2, 2)}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.ScatterAdd, ir.Attrs{"axis": 1}, a...) }},
		{name: "reduce_sum", codes: []ir.Code{ir.ReduceSum},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 3, gtDim(r))} },
			fn:   func(a []*trace.Array) *trace.Array { return gtOp(ir.ReduceSum, ir.Attrs{"axes": []int{0, 2}}, a[0]) }},
		{name: "reduce_max", codes: []ir.Code{ir.ReduceMax},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 4, 3)} },
			fn:   func(a []*trace.Array) *trace.Array { return gtOp(ir.ReduceMax, ir.Attrs{"axes": []int{1}}, a[0]) }},
		{name: "reduce_min", codes: []ir.Code{ir.ReduceMin},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 4, 3)} },
			fn:   func(a []*trace.Array) *trace.Array { return gtOp(ir.ReduceMin, ir.Attrs{"axes": []int{0, 2}}, a[0]) }},
	}
}

// gtReduceDotControlCases are the cases of reductions, products and control flow.
func gtReduceDotControlCases() []gtCase {
	return []gtCase{
		{name: "reduce_prod", codes: []ir.Code{ir.ReduceProd},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRandAway(r, 0.5, 1.5, 2, 3, 2)} },
			fn:   func(a []*trace.Array) *trace.Array { return gtOp(ir.ReduceProd, ir.Attrs{"axes": []int{1, 2}}, a[0]) }},
		{name: "reduce_prod/zeros", codes: []ir.Code{ir.ReduceProd},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtF([]float64{0, 2, 3, 0, 0, 4, 1, -2, 3, 0.5, 0, 1.5}, 4, 3)}
			},
			fn: func(a []*trace.Array) *trace.Array { return gtOp(ir.ReduceProd, ir.Attrs{"axes": []int{1}}, a[0]) }},
		gtDotCase("matmul", []int{2, 3}, []int{3, 4}, []int{}, []int{}, []int{1}, []int{0}),
		gtDotCase("batched", []int{2, 3, 4}, []int{2, 4, 2}, []int{0}, []int{0}, []int{2}, []int{1}),
		gtDotCase("multi", []int{2, 3, 2, 3}, []int{3, 2, 3, 2}, []int{1}, []int{2}, []int{0, 3}, []int{3, 0}),
		gtDotCase("outer", []int{3}, []int{2}, []int{}, []int{}, []int{}, []int{}),
		gtDotCase("lhs-transposed", []int{3, 2}, []int{3, 4}, []int{}, []int{}, []int{0}, []int{0}),
		{name: "device_put", codes: []ir.Code{ir.DevicePut},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 3)} },
			fn: func(a []*trace.Array) *trace.Array {
				p := gtOp(ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, a[0])
				q := gtOp(ir.DevicePut, ir.Attrs{"space": ir.Device}, p)
				return gtOp(ir.Mul, nil, q, a[0])
			}},
		{name: "device_put/pinned-input", codes: []ir.Code{ir.DevicePut},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtOp(ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, gtRand(r, -1, 1, 3))}
			},
			fn: func(a []*trace.Array) *trace.Array {
				q := gtOp(ir.DevicePut, ir.Attrs{"space": ir.Device}, a[0])
				return gtOp(ir.Sin, nil, q)
			}},
		{name: "checkpoint_name", codes: []ir.Code{ir.CheckpointName},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 3)} },
			fn: func(a []*trace.Array) *trace.Array {
				return gtOp(ir.Mul, nil, gtOp(ir.CheckpointName, ir.Attrs{"name": "x"}, a[0]), gtOp(ir.Sin, nil, a[0]))
			}},
		{name: "sharding_constraint", codes: []ir.Code{ir.ShardingConstraint},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, -1, 1, 2, 3)} },
			fn: func(a []*trace.Array) *trace.Array {
				mesh, err := ir.NewMesh([]int{1}, []string{"x"})
				if err != nil {
					panic(err)
				}
				s, err := ir.NewNamedSharding(mesh, ir.P("", "x"))
				if err != nil {
					panic(err)
				}
				return gtOp(ir.Mul, nil, trace.WithShardingConstraint(a[0], s), gtOp(ir.Sin, nil, a[0]))
			}},
		{name: "optimization_barrier", codes: []ir.Code{ir.OptimizationBarrier},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 2, 3), gtRand(r, -1, 1, 2, 3)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				b := trace.Apply(ir.OptimizationBarrier, nil, nil, a[0], a[1])
				return gtOp(ir.Mul, nil, gtOp(ir.Sin, nil, b[0]), b[1])
			}},
		{name: "scan", codes: []ir.Code{ir.Scan},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 3), gtRand(r, -1, 1, 4, 3), gtRand(r, -1, 1, 3)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				w := a[2] // closed over: a const of the scan
				c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
					h := gtOp(ir.Tanh, nil, gtOp(ir.Add, nil, gtOp(ir.Mul, nil, c[0], w), x[0]))
					return []*trace.Array{h}, []*trace.Array{gtOp(ir.Mul, nil, h, x[0])}
				}, []*trace.Array{a[0]}, []*trace.Array{a[1]})
				return gtOp(ir.Add, nil, ys[0], gtOp(ir.BroadcastInDim, ir.Attrs{"shape": []int{4, 3}, "dims": []int{1}}, c[0]))
			}},
		{name: "scan/reverse", codes: []ir.Code{ir.Scan},
			make: func(r *rand.Rand) []*trace.Array {
				return []*trace.Array{gtRand(r, -1, 1, 2), gtRand(r, -1, 1, 3, 2)}
			},
			fn: func(a []*trace.Array) *trace.Array {
				_, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
					h := gtOp(ir.Sin, nil, gtOp(ir.Mul, nil, c[0], x[0]))
					return []*trace.Array{gtOp(ir.Add, nil, h, x[0])}, []*trace.Array{h}
				}, []*trace.Array{a[0]}, []*trace.Array{a[1]}, trace.ScanReverse())
				return ys[0]
			}},
		{name: "cond/true", codes: []ir.Code{ir.Cond},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, 0.5, 2, 3), gtRand(r, 0.5, 2, 3)} },
			fn:   func(a []*trace.Array) *trace.Array { return gtCondFn(true, a) }},
		{name: "cond/false", codes: []ir.Code{ir.Cond},
			make: func(r *rand.Rand) []*trace.Array { return []*trace.Array{gtRand(r, 0.5, 2, 3), gtRand(r, 0.5, 2, 3)} },
			fn:   func(a []*trace.Array) *trace.Array { return gtCondFn(false, a) }},
	}
}

// gtCondFn is cond(pred, x, y) with branches that differ and one that closes
// over y.
func gtCondFn(pred bool, a []*trace.Array) *trace.Array {
	x, y := a[0], a[1]
	p := gtOp(ir.Reshape, ir.Attrs{"shape": []int{}}, rt.FromSlice([]bool{pred}))
	return trace.Cond(p, func(o []*trace.Array) []*trace.Array {
		return []*trace.Array{gtOp(ir.Mul, nil, gtOp(ir.Log, nil, o[0]), y)}
	}, func(o []*trace.Array) []*trace.Array {
		return []*trace.Array{gtOp(ir.Exp, nil, gtOp(ir.Sub, nil, o[0], o[1]))}
	}, x, y)[0]
}

func (c gtCase) params() (tol, h float64) {
	tol, h = c.tol, c.h
	if tol == 0 {
		tol = 1e-6
	}
	if h == 0 {
		h = 1e-5
	}
	return tol, h
}

func TestVJPFiniteDifferences(t *testing.T) {
	for k, c := range gtCases() {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(k)+1, 7))
			tol, h := c.params()
			in := c.make(r)
			g, w := gtFDCheck(t, c.name, c.fn, in, r, tol, h)

			// Under rt.Jit: the same gradients, and IR that verifies.
			gradFn := func(in []*trace.Array, w *trace.Array) []*trace.Array {
				_, pb := trace.VJP(func(a []*trace.Array) []*trace.Array { return []*trace.Array{c.fn(a)} }, in)
				return pb([]*trace.Array{w})
			}
			jg := rt.Jit(gradFn)(in, w)
			if l, err := rt.Lower(gradFn, in, w); err != nil {
				t.Errorf("lowering the gradient: %v", err)
			} else if err := ir.Verify(l.Func); err != nil {
				t.Errorf("gradient IR does not verify: %v\n%s", err, l.IR())
			}
			for i := range g {
				if got, want := jg[i].Float64s(), g[i].Float64s(); !gtAllClose(got, want, 1e-12) {
					t.Errorf("under rt.Jit: gradient %d = %v, eager %v", i, got, want)
				}
			}
		})
	}
}

// TestVJPSecondOrder checks the gradient functions themselves against finite
// differences: grad of grad for every case.
func TestVJPSecondOrder(t *testing.T) {
	for k, c := range gtCases() {
		if c.no2nd || c.tol > 1e-6 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(k)+100, 9))
			in := c.make(r)
			// A fixed cotangent for the first-order pullback.
			out := c.fn(in)
			wd := make([]float64, out.Size())
			for i := range wd {
				wd[i] = 2*r.Float64() - 1
			}
			w := gtLike(wd, out.Type().WithSpace(ir.Device))
			for i, x := range in {
				if !x.DType().IsFloat() {
					continue
				}
				gradFn := func(a []*trace.Array) *trace.Array {
					_, pb := trace.VJP(func(a []*trace.Array) []*trace.Array { return []*trace.Array{c.fn(a)} }, a)
					return pb([]*trace.Array{w})[i]
				}
				gtFDCheck(t, fmt.Sprintf("%s d/dx%d", c.name, i), gradFn, in, r, 1e-5, 1e-5)
			}
		})
	}
}

// TestVJPCoverage fails when an op marked Differentiable in the op table has
// no rule or no gradient check above, or an op it marks not differentiable
// (its explicit "no VJP" marker) has a rule.
func TestVJPCoverage(t *testing.T) {
	checked := map[ir.Code]bool{}
	for _, c := range gtCases() {
		for _, code := range c.codes {
			checked[code] = true
		}
	}
	for _, code := range ir.AllCodes() {
		if !code.Info().Differentiable {
			if trace.HasVJPRule(code) {
				t.Errorf("op %v has a VJP rule, but the op table says it is not Differentiable", code)
			}
			continue
		}
		if !trace.HasVJPRule(code) {
			t.Errorf("op %v is Differentiable but has no VJP rule", code)
		}
		if code.IsCollective() {
			// A collective runs only under a Vmap binding its axis, and
			// gtFDCheck's function is differentiated outside any:
			// TestCollectiveGradients checks every differentiable
			// collective's rule (and fails on one without a case).
			continue
		}
		if !checked[code] {
			t.Errorf("op %v is Differentiable but has no gradient check in gtCases", code)
		}
	}
}
