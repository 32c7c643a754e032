package eval

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

var reduceCases = []struct{ shape, axes []int }{
	{[]int{4, 5}, []int{1}},
	{[]int{4, 5}, []int{0}},
	{[]int{4, 5}, []int{0, 1}},
	{[]int{2, 3, 4}, []int{0, 2}},
	{[]int{2, 3, 4}, []int{1}},
	{[]int{}, []int{}},
	{[]int{3, 0, 2}, []int{1}},
	{[]int{3, 0, 2}, []int{0}},
	{[]int{1, 7}, []int{0}},
	{[]int{5}, []int{}},
	{[]int{6, 1, 3}, []int{2, 0}},
	{[]int{40, 50}, []int{1}},
}

// nearOne draws values around 1 (so products stay finite), with some specials.
func nearOne(r *rand.Rand) float64 {
	if r.IntN(30) == 0 {
		return genFloat(r)
	}
	v := 0.5 + r.Float64()*1.5
	if r.IntN(4) == 0 {
		v = -v
	}
	return v
}

// reduceGroups returns, for every output element, the flat input indices
// reduced into it, in row-major order of the (sorted) reduced axes.
func reduceGroups(shape, axes []int) (ir.Shape, [][]int) {
	red := slices.Sorted(slices.Values(axes))
	out := ir.RemoveAxes(shape, axes)
	var kept []int
	var rshape []int
	for i, d := range shape {
		if slices.Contains(red, i) {
			rshape = append(rshape, d)
		} else {
			kept = append(kept, i)
		}
	}
	groups := make([][]int, out.Size())
	for o := range groups {
		oi := unravel(o, out)
		for j := 0; j < ir.Shape(rshape).Size(); j++ {
			ri := unravel(j, rshape)
			idx := make([]int, len(shape))
			for k, a := range kept {
				idx[a] = oi[k]
			}
			for k, a := range red {
				idx[a] = ri[k]
			}
			groups[o] = append(groups[o], ravel(idx, shape))
		}
	}
	return out, groups
}

func intLimitsRef(dt ir.DType) (int64, int64) {
	switch dt {
	case ir.Uint8:
		return 0, 255
	case ir.Int32:
		return math.MinInt32, math.MaxInt32
	case ir.Uint32:
		return 0, math.MaxUint32
	}
	return math.MinInt64, math.MaxInt64
}

func testReduce(t *testing.T, code ir.Code) {
	r := newRand(t)
	dts := acceptedDTypes(code, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return []ir.Type{ir.TypeOf(dt, 2)}, ir.Attrs{"axes": []int{0}}
	})
	require.Len(t, dts, len(ir.AllDTypes)-1)
	for _, dt := range dts {
		for _, c := range reduceCases {
			var gen func(*rand.Rand) float64
			if code == ir.ReduceProd {
				gen = nearOne
			}
			x := randLit(r, dt, c.shape, gen)
			res := runOp(t, code, []*ir.Literal{x}, ir.Attrs{"axes": c.axes})[0]
			out, groups := reduceGroups(c.shape, c.axes)
			require.True(t, out.Equal(res.Type.Shape), "shape %v, want %v", res.Type.Shape, out)
			for o, g := range groups {
				if isFloat(dt) {
					var acc float64
					switch code {
					case ir.ReduceSum:
						for _, i := range g {
							acc += getF(x, i)
						}
					case ir.ReduceProd:
						acc = 1
						for _, i := range g {
							acc *= getF(x, i)
						}
					case ir.ReduceMax, ir.ReduceMin:
						acc = math.Inf(-1)
						if code == ir.ReduceMin {
							acc = math.Inf(1)
						}
						for _, i := range g {
							v := getF(x, i)
							if math.IsNaN(v) || math.IsNaN(acc) {
								acc = math.NaN()
							} else if (code == ir.ReduceMax) == (v > acc) && v != acc {
								acc = v
							}
						}
					}
					want := refRound(acc, dt)
					got := getF(res, o)
					require.True(t, closeTo(got, want, dt, 1, false), "%v %v %+v [%d]: got %g want %g", code, dt, c, o, got, want)
				} else {
					lo, hi := intLimitsRef(dt)
					var acc int64
					switch code {
					case ir.ReduceSum:
						for _, i := range g {
							acc += getI(x, i)
						}
					case ir.ReduceProd:
						acc = 1
						for _, i := range g {
							acc *= getI(x, i)
						}
					case ir.ReduceMax:
						acc = lo
						for _, i := range g {
							acc = max(acc, getI(x, i))
						}
					case ir.ReduceMin:
						acc = hi
						for _, i := range g {
							acc = min(acc, getI(x, i))
						}
					}
					require.Equal(t, wrapTo(dt, acc), getI(res, o), "%v %v %+v [%d]", code, dt, c, o)
				}
			}
		}
	}
}

var argCases = []struct {
	shape []int
	axis  int
}{{[]int{4, 5}, 1}, {[]int{4, 5}, 0}, {[]int{7}, 0}, {[]int{2, 0, 3}, 0}, {[]int{1, 1}, 1}, {[]int{3, 4, 5}, 1}, {[]int{2, 30}, 1}}

// fewValues draws from a small set (many ties) with some NaNs and infinities.
func fewValues(r *rand.Rand) float64 {
	switch r.IntN(25) {
	case 0:
		return math.NaN()
	case 1:
		return math.Inf(1)
	case 2:
		return math.Inf(-1)
	}
	return float64(r.IntN(5) - 2)
}

func testArg(t *testing.T, code ir.Code) {
	r := newRand(t)
	dts := acceptedDTypes(code, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return []ir.Type{ir.TypeOf(dt, 2)}, ir.Attrs{"axis": 0, "dtype": ir.Int32}
	})
	require.NotEmpty(t, dts)
	isMax := code == ir.ArgMax
	for _, dt := range dts {
		for _, c := range argCases {
			for _, idt := range []ir.DType{ir.Int32, ir.Int64} {
				x := lit(ir.Type{DType: dt, Shape: c.shape})
				for i := 0; i < x.Type.Size(); i++ {
					switch {
					case isFloat(dt):
						setF(x, i, refRound(fewValues(r), dt))
					case dt == ir.Bool:
						setI(x, i, int64(r.IntN(2)))
					case r.IntN(4) == 0:
						setI(x, i, genInt(r, dt))
					default:
						setI(x, i, wrapTo(dt, int64(r.IntN(5)-2)))
					}
				}
				res := runOp(t, code, []*ir.Literal{x}, ir.Attrs{"axis": c.axis, "dtype": idt})[0]
				require.Equal(t, idt, res.Type.DType)
				out, groups := reduceGroups(c.shape, []int{c.axis})
				require.True(t, out.Equal(res.Type.Shape), "shape %v, want %v", res.Type.Shape, out)
				for o, g := range groups {
					best := 0
					for j := 1; j < len(g); j++ {
						if isFloat(dt) {
							b, v := getF(x, g[best]), getF(x, g[j])
							if math.IsNaN(b) {
								break
							}
							if math.IsNaN(v) || (isMax && v > b) || (!isMax && v < b) {
								best = j
							}
						} else if b, v := getI(x, g[best]), getI(x, g[j]); (isMax && v > b) || (!isMax && v < b) {
							best = j
						}
					}
					require.Equal(t, int64(best), getI(res, o), "%v %v %+v [%d]", code, dt, c, o)
				}
			}
		}
	}
}

// TestReduceSumOrder pins down the order of float reduce_sum, which the
// CPU executor's fused reductions reproduce bit for bit: f32 over trailing
// axes (TrailingReduce) in eight float64 lanes, element q of the run in
// lane q mod 8, added pairwise at the end; f32 over other axes, and f64,
// one float64 sum per output in row-major order of the reduced axes, read
// where the elements lie. Fresh
// random f32 and f64 operands, results compared bit for bit with sums
// written here.
func TestReduceSumOrder(t *testing.T) {
	r := newRand(t)
	cases := []struct{ shape, axes []int }{
		{[]int{3, 129}, []int{1}},        // rows: lanes
		{[]int{2, 5, 37}, []int{1, 2}},   // trailing pair
		{[]int{4, 1, 7}, []int{2, 1}},    // unit axis among the reduced
		{[]int{6, 1}, []int{0}},          // trailing once the unit axis is dropped
		{[]int{64, 33}, []int{0}},        // columns: sequential, in place
		{[]int{8, 4, 16}, []int{0, 1}},   // bias gradient
		{[]int{5, 6, 7}, []int{1}},       // middle axis
		{[]int{3, 4, 5, 6}, []int{0, 2}}, // mixed
		{[]int{1000}, []int{0}},          // long run
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64} {
		for _, c := range cases {
			x := randLit(r, dt, c.shape, func(r *rand.Rand) float64 { return r.NormFloat64() * math.Exp2(float64(r.IntN(20)-10)) })
			res := runOp(t, ir.ReduceSum, []*ir.Literal{x}, ir.Attrs{"axes": c.axes})[0]
			_, groups := reduceGroups(c.shape, c.axes)
			trailing := TrailingReduce(c.shape, c.axes)
			for o, g := range groups {
				var want float64
				if trailing && dt != ir.Float64 {
					var l [8]float64
					for q, i := range g {
						l[q%8] += getF(x, i)
					}
					want = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
				} else {
					for _, i := range g {
						want += getF(x, i)
					}
				}
				if dt == ir.Float32 {
					want = float64(float32(want))
				}
				require.Equal(t, math.Float64bits(want), math.Float64bits(getF(res, o)), "%v %+v output %d (trailing %v)", dt, c, o, trailing)
			}
		}
	}
	require.True(t, TrailingReduce([]int{2, 1, 3}, []int{1, 2}))
	require.False(t, TrailingReduce([]int{2, 3}, []int{0}))
	require.True(t, TrailingReduce([]int{1, 3}, []int{0}))
}
