package trace_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// keptShape is shape with the given axes (none = all, negative from the end)
// set to 1.
func keptShape(shape, axes []int) []int {
	s := slices.Clone(shape)
	if len(axes) == 0 {
		for i := range s {
			s[i] = 1
		}
	}
	for _, a := range axes {
		s[(a+len(s))%len(s)] = 1
	}
	return s
}

// The keepdims reductions equal the float64 reductions written in the test,
// with size-1 dimensions where the axes were, for f32 and bf16 inputs; their
// gradients equal those of the plain reductions.
func TestKeepDimsReductions(t *testing.T) {
	r := otRand(t)
	shape := []int{2 + r.IntN(3), 3, 1 + r.IntN(4)}
	mean := func(v []float64) float64 { return otSum(v) / float64(len(v)) }
	variance := func(v []float64) float64 {
		m, s := mean(v), 0.0
		for _, e := range v {
			s += (e - m) * (e - m)
		}
		return s / float64(len(v))
	}
	lse := func(v []float64) float64 {
		m := slices.Max(v)
		s := 0.0
		for _, e := range v {
			s += math.Exp(e - m)
		}
		return m + math.Log(s)
	}
	ops := []struct {
		name string
		f    func(*trace.Array, ...int) *trace.Array
		ref  func([]float64) float64
	}{
		{"SumKeepDims", trace.SumKeepDims, otSum},
		{"MeanKeepDims", trace.MeanKeepDims, mean},
		{"MaxKeepDims", trace.MaxKeepDims, func(v []float64) float64 { return slices.Max(v) }},
		{"MinKeepDims", trace.MinKeepDims, func(v []float64) float64 { return slices.Min(v) }},
		{"VarKeepDims", trace.VarKeepDims, variance},
		{"LogSumExpKeepDims", trace.LogSumExpKeepDims, lse},
	}
	for _, dt := range []ir.DType{ir.Float32, ir.BFloat16} {
		x, xr := otMake(r, dt, otUniform(-2, 2), shape...)
		for _, axes := range [][]int{nil, {-1}, {0}, {0, 2}, {1, -1}} {
			for _, op := range ops {
				name := otName(op.name, dt, fmt.Sprint(axes))
				want := otReduce(xr, axes, op.ref)
				want.shape = keptShape(shape, axes)
				otCheck(t, name, op.f(x, axes...), dt, want, 4*otTol(dt))
			}
		}
	}
	// The gradient of sum(w·MeanKeepDims(x)) is w broadcast over the axis,
	// divided by its length.
	x, _ := otMake(r, ir.Float32, otUniform(-1, 1), shape...)
	w, wr := otMake(r, ir.Float32, otUniform(-1, 1), shape[0], shape[1], 1)
	g := trace.Grad(func(x *trace.Array) *trace.Array {
		return trace.Sum(trace.Mul(trace.MeanKeepDims(x, -1), w))
	})(x)
	want := otNew(shape...)
	for i := range want.data {
		idx := otUnravel(i, shape)
		want.data[i] = wr.at(idx[0], idx[1], 0) / float64(shape[2])
	}
	otCheck(t, "grad MeanKeepDims", g, ir.Float32, want, otTol(ir.Float32))

	otExpectError(t, "SumKeepDims", func() { trace.SumKeepDims(x, 3) }, "axis 3")
	otExpectError(t, "MaxKeepDims", func() { trace.MaxKeepDims(nil) }, "nil array")
}

func ExampleMeanKeepDims() {
	x := trace.Const([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	mu := trace.MeanKeepDims(x, -1)
	fmt.Println(mu.Type(), mu.Float32s())
	fmt.Println(trace.Sub(x, mu).Float32s())
	// Output:
	// f32[2,1] [2 5]
	// [-1 0 1 -1 0 1]
}
