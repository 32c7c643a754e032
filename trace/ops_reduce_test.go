package trace_test

import (
	"math"
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// otReduce is the reference reduction of x over axes (none = all): it groups
// the elements by their kept index and folds each group with f.
func otReduce(x otTensor, axes []int, f func(vals []float64) float64) otTensor {
	r := len(x.shape)
	red := make([]bool, r)
	if len(axes) == 0 {
		for i := range red {
			red[i] = true
		}
	}
	for _, a := range axes {
		red[(a+r)%r] = true
	}
	var outShape []int
	for i, d := range x.shape {
		if !red[i] {
			outShape = append(outShape, d)
		}
	}
	groups := make([][]float64, otNumel(outShape))
	for i, v := range x.data {
		idx := otUnravel(i, x.shape)
		var o []int
		for d, k := range idx {
			if !red[d] {
				o = append(o, k)
			}
		}
		j := otRavel(o, outShape)
		groups[j] = append(groups[j], v)
	}
	out := otNew(outShape...)
	for j, g := range groups {
		out.data[j] = f(g)
	}
	return out
}

func otSum(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s
}

func otProd(v []float64) float64 {
	p := 1.0
	for _, x := range v {
		p *= x
	}
	return p
}

func otMean(v []float64) float64 { return otSum(v) / float64(len(v)) }

func otVar(v []float64) float64 {
	m := otMean(v)
	s := 0.0
	for _, x := range v {
		s += (x - m) * (x - m)
	}
	return s / float64(len(v))
}

func otLSE(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = math.Max(m, x)
	}
	if math.IsInf(m, 0) {
		m = 0
	}
	s := 0.0
	for _, x := range v {
		s += math.Exp(x - m)
	}
	return m + math.Log(s)
}

var otReduceCases = []struct {
	shape []int
	axes  []int
}{
	{[]int{}, nil}, {[]int{5}, nil}, {[]int{5}, []int{0}}, {[]int{3, 4}, []int{1}}, {[]int{3, 4}, []int{0}},
	{[]int{3, 4}, nil}, {[]int{2, 3, 4}, []int{0, 2}}, {[]int{2, 3, 4}, []int{-1, -2}}, {[]int{2, 1, 3}, []int{1}},
	{[]int{2, 0, 3}, []int{1}}, {[]int{2, 0, 3}, []int{0, 2}}, {[]int{0}, nil},
}

func otHasEmptyAxis(shape, axes []int) bool {
	if len(axes) == 0 {
		return slices.Contains(shape, 0)
	}
	for _, a := range axes {
		if shape[(a+len(shape))%len(shape)] == 0 {
			return true
		}
	}
	return false
}

func TestOpsReductions(t *testing.T) {
	r := otRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.BFloat16, ir.Int32, ir.Int64} {
		for _, c := range otReduceCases {
			gen := otNormal
			if dt.IsInteger() {
				gen = otInts(-9, 9)
			}
			x, xr := otMake(r, dt, gen, c.shape...)
			name := func(op string) string { return otName(op, dt, ir.Shape(c.shape), c.axes) }
			tol := 4 * otTol(dt)
			otCheck(t, name("Sum"), trace.Sum(x, c.axes...), dt, otReduce(xr, c.axes, otSum), tol)
			pg := otUniform(0.5, 1.5)
			if dt.IsInteger() {
				pg = otInts(-2, 2)
			}
			p, pr := otMake(r, dt, pg, c.shape...)
			otCheck(t, name("Prod"), trace.Prod(p, c.axes...), dt, otReduce(pr, c.axes, otProd), tol)
			if !otHasEmptyAxis(c.shape, c.axes) {
				otCheck(t, name("Max"), trace.Max(x, c.axes...), dt, otReduce(xr, c.axes, func(v []float64) float64 { return slices.Max(v) }), 0)
				otCheck(t, name("Min"), trace.Min(x, c.axes...), dt, otReduce(xr, c.axes, func(v []float64) float64 { return slices.Min(v) }), 0)
			} else {
				otExpectError(t, "Max", func() { trace.Max(x, c.axes...) }, "is empty")
			}
			if dt.IsFloat() {
				otCheck(t, name("Mean"), trace.Mean(x, c.axes...), dt, otReduce(xr, c.axes, otMean), tol)
				otCheck(t, name("Var"), trace.Var(x, c.axes...), dt, otReduce(xr, c.axes, otVar), tol)
				otCheck(t, name("Std"), trace.Std(x, c.axes...), dt, otReduce(xr, c.axes, func(v []float64) float64 { return math.Sqrt(otVar(v)) }), tol)
				otCheck(t, name("LogSumExp"), trace.LogSumExp(x, c.axes...), dt, otReduce(xr, c.axes, otLSE), tol)
			} else {
				// Integers are promoted to f32 first, as jnp.mean does.
				ft := 4 * otTol(trace.DefaultFloat)
				otCheck(t, name("Mean"), trace.Mean(x, c.axes...), trace.DefaultFloat, otReduce(xr, c.axes, otMean), ft)
				otCheck(t, name("Var"), trace.Var(x, c.axes...), trace.DefaultFloat, otReduce(xr, c.axes, otVar), ft)
				otCheck(t, name("Std"), trace.Std(x, c.axes...), trace.DefaultFloat, otReduce(xr, c.axes, func(v []float64) float64 { return math.Sqrt(otVar(v)) }), ft)
				otCheck(t, name("LogSumExp"), trace.LogSumExp(x, c.axes...), trace.DefaultFloat, otReduce(xr, c.axes, otLSE), ft)
			}
		}
	}
	// LogSumExp is stable for large values and -inf.
	x := otFrom(ir.Float32, []float64{1000, 1000, math.Inf(-1), math.Inf(-1)}, 2, 2)
	otCheck(t, "LogSumExp/extreme", trace.LogSumExp(x, 1), ir.Float32, otTensor{[]int{2}, []float64{1000 + math.Log(2), math.Inf(-1)}}, 1e-6)
	// Bool reductions.
	b, br := otMake(r, ir.Bool, otInts(0, 1), 3, 4)
	otCheck(t, "Sum/bool", trace.Sum(b, 1), ir.Int32, otReduce(br, []int{1}, otSum), 0)
	otCheck(t, "Max/bool", trace.Max(b, 0), ir.Bool, otReduce(br, []int{0}, func(v []float64) float64 { return slices.Max(v) }), 0)
	otCheck(t, "Any", trace.Any(b, 1), ir.Bool, otReduce(br, []int{1}, func(v []float64) float64 { return slices.Max(v) }), 0)
	otCheck(t, "All", trace.All(b, 0), ir.Bool, otReduce(br, []int{0}, func(v []float64) float64 { return slices.Min(v) }), 0)
	e := otFrom(ir.Bool, nil, 2, 0)
	otCheck(t, "Any/empty", trace.Any(e, 1), ir.Bool, otTensor{[]int{2}, []float64{0, 0}}, 0)
	otCheck(t, "All/empty", trace.All(e, 1), ir.Bool, otTensor{[]int{2}, []float64{1, 1}}, 0)
	f := otFrom(ir.Float32, []float64{0, 2, 0, 0}, 2, 2)
	otCheck(t, "Any/f32", trace.Any(f), ir.Bool, otTensor{[]int{}, []float64{1}}, 0)

	otExpectError(t, "Sum", func() { trace.Sum(f, 2) }, "axis 2 out of range for f32[2,2]")
	otExpectError(t, "Sum", func() { trace.Sum(f, 0, -2) }, "repeated")
}

func TestOpsKeepDims(t *testing.T) {
	r := otRand(t)
	x, xr := otMake(r, ir.Float32, otNormal, 2, 3, 4)
	s := trace.KeepDims(trace.Sum(x, 0, -1), x.Shape(), 0, -1)
	otCheck(t, "KeepDims", s, ir.Float32, otTensor{[]int{1, 3, 1}, otReduce(xr, []int{0, 2}, otSum).data}, 1e-5)
	all := trace.KeepDims(trace.Max(x), x.Shape())
	otCheck(t, "KeepDims/all", all, ir.Float32, otTensor{[]int{1, 1, 1}, []float64{slices.Max(xr.data)}}, 0)
	otExpectError(t, "KeepDims", func() { trace.KeepDims(trace.Sum(x, 0), x.Shape(), 1) }, "is not the reduction")
}

func TestOpsArgMaxMin(t *testing.T) {
	r := otRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Int32, ir.BFloat16, ir.Uint8} {
		for _, c := range []struct {
			shape []int
			axis  int
		}{{[]int{7}, 0}, {[]int{3, 4}, 1}, {[]int{3, 4}, 0}, {[]int{2, 3, 4}, -2}, {[]int{0, 3}, 1}, {[]int{3, 1}, 1}} {
			x, xr := otMake(r, dt, otInts(0, 3), c.shape...) // many ties: the first wins
			arg := func(better func(a, b float64) bool) func([]float64) float64 {
				return func(v []float64) float64 {
					best := 0
					for i := range v {
						if better(v[i], v[best]) {
							best = i
						}
					}
					return float64(best)
				}
			}
			name := otName(dt, ir.Shape(c.shape), c.axis)
			otCheck(t, "ArgMax/"+name, trace.ArgMax(x, c.axis), ir.Int32, otReduce(xr, []int{c.axis}, arg(func(a, b float64) bool { return a > b })), 0)
			otCheck(t, "ArgMin/"+name, trace.ArgMin(x, c.axis), ir.Int32, otReduce(xr, []int{c.axis}, arg(func(a, b float64) bool { return a < b })), 0)
		}
	}
	x := otFrom(ir.Float32, []float64{1, math.NaN(), 3}, 3)
	if got := trace.ArgMax(x, 0).Item(); got != 1 {
		t.Errorf("ArgMax with NaN = %v, want 1 (NaN wins)", got)
	}
	otExpectError(t, "ArgMax", func() { trace.ArgMax(otFrom(ir.Float32, nil, 2, 0), 1) }, "is empty")
	otExpectError(t, "ArgMin", func() { trace.ArgMin(trace.Scalar(1), 0) }, "rank ≥ 1")
}

func TestOpsReduceTraced(t *testing.T) {
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Sub(trace.LogSumExp(a[0], -1), trace.Mean(a[0], 1))
	}, ir.TypeOf(ir.BFloat16, 4, 8))
	codes := otCodes(ops)
	if codes[ir.ReduceMax] != 1 || codes[ir.ReduceSum] != 2 || codes[ir.Convert] < 2 {
		t.Errorf("recorded %v", codes)
	}
	if !out.Type().Equal(ir.TypeOf(ir.BFloat16, 4)) {
		t.Errorf("result %v", out.Type())
	}
}
