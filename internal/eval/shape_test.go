package eval

import (
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// expectMoved builds the expected result of a data-movement op: element i of
// the result comes from src(outIdx) = (literal, flat index), or is the pad
// element when the literal is nil.
func expectMoved(t ir.Type, padElem []byte, src func(out []int) (*ir.Literal, int)) *ir.Literal {
	want := lit(t)
	for i := 0; i < t.Size(); i++ {
		l, j := src(unravel(i, t.Shape))
		if l == nil {
			copy(elem(want, i), padElem)
		} else {
			copy(elem(want, i), elem(l, j))
		}
	}
	return want
}

func requireSameData(t *testing.T, want, got *ir.Literal, msg string, args ...any) {
	t.Helper()
	require.True(t, want.Type.Equal(got.Type), append([]any{"type %v, want %v: " + msg, got.Type, want.Type}, args...)...)
	require.Equal(t, want.Data, got.Data, append([]any{msg}, args...)...)
}

func testIota(t *testing.T) {
	cases := []struct {
		shape []int
		dim   int
	}{{[]int{5}, 0}, {[]int{3, 4}, 1}, {[]int{3, 4}, 0}, {[]int{2, 0, 3}, 2}, {[]int{1, 1}, 0}, {[]int{300}, 0}, {[]int{2, 2100}, 1}}
	dts := acceptedDTypes(ir.Iota, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return nil, ir.Attrs{"dtype": dt, "shape": []int{2}, "dim": 0}
	})
	require.Len(t, dts, len(ir.AllDTypes)-1)
	for _, dt := range dts {
		for _, c := range cases {
			res := runOp(t, ir.Iota, nil, ir.Attrs{"dtype": dt, "shape": c.shape, "dim": c.dim})[0]
			for i := 0; i < res.Type.Size(); i++ {
				v := int64(unravel(i, c.shape)[c.dim])
				if isFloat(dt) {
					want := roundBig(new(big.Float).SetInt64(v), formatOf(dt))
					require.Equal(t, want, getF(res, i), "iota %v%v [%d]", dt, c.shape, i)
				} else {
					require.Equal(t, wrapTo(dt, v), getI(res, i), "iota %v%v [%d]", dt, c.shape, i)
				}
			}
		}
	}
}

func testConstant(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, shape := range elemShapes {
			v := randLit(r, dt, shape, nil)
			res := runOp(t, ir.Constant, nil, ir.Attrs{"value": v})[0]
			require.Equal(t, v.Data, res.Data)
			require.False(t, overlap(v.Data, res.Data), "constant result aliases the attribute")
		}
	}
}

func testDevicePut(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, shape := range elemShapes {
			for _, from := range ir.AllSpaces {
				for _, to := range ir.AllSpaces {
					v := randLit(r, dt, shape, nil)
					v.Type.Space = from
					res := runOp(t, ir.DevicePut, []*ir.Literal{v}, ir.Attrs{"space": to})[0]
					require.Equal(t, to, res.Type.Space)
					require.Equal(t, v.Data, res.Data)
				}
			}
		}
	}
}

func testBroadcastInDim(t *testing.T) {
	r := newRand(t)
	cases := []struct{ in, out, dims []int }{
		{[]int{}, []int{3, 4}, []int{}},
		{[]int{}, []int{}, []int{}},
		{[]int{1}, []int{5}, []int{0}},
		{[]int{3}, []int{2, 3}, []int{1}},
		{[]int{3, 1}, []int{3, 4}, []int{0, 1}},
		{[]int{1, 4}, []int{2, 3, 4}, []int{1, 2}},
		{[]int{2}, []int{2, 0}, []int{0}},
		{[]int{0}, []int{0, 3}, []int{0}},
		{[]int{2, 3}, []int{2, 5, 3}, []int{0, 2}},
		{[]int{1, 1}, []int{4, 1, 6}, []int{1, 2}},
	}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			x := randLit(r, dt, c.in, nil)
			res := runOp(t, ir.BroadcastInDim, []*ir.Literal{x}, ir.Attrs{"shape": c.out, "dims": c.dims})[0]
			want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
				idx := make([]int, len(c.in))
				for i, d := range c.dims {
					if c.in[i] != 1 {
						idx[i] = o[d]
					}
				}
				return x, ravel(idx, c.in)
			})
			requireSameData(t, want, res, "broadcast %v %v→%v", dt, c.in, c.out)
		}
	}
}

func testReshape(t *testing.T) {
	r := newRand(t)
	cases := [][2][]int{{{2, 3, 4}, {4, 6}}, {{}, {1, 1}}, {{1, 1}, {}}, {{0, 3}, {3, 0}}, {{6}, {1, 6, 1}}, {{5, 7}, {35}}}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			x := randLit(r, dt, c[0], nil)
			res := runOp(t, ir.Reshape, []*ir.Literal{x}, ir.Attrs{"shape": c[1]})[0]
			require.Equal(t, ir.Shape(c[1]), res.Type.Shape)
			require.Equal(t, x.Data, res.Data)
		}
	}
}

func testTranspose(t *testing.T) {
	r := newRand(t)
	cases := []struct{ in, perm []int }{
		{[]int{2, 3, 4}, []int{2, 0, 1}}, {[]int{1, 5}, []int{1, 0}}, {[]int{}, []int{}}, {[]int{3, 0, 2}, []int{1, 2, 0}},
		{[]int{7, 9}, []int{1, 0}}, {[]int{2, 3, 4, 5}, []int{3, 1, 0, 2}}, {[]int{4, 3}, []int{0, 1}}, {[]int{33, 65}, []int{1, 0}},
	}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			x := randLit(r, dt, c.in, nil)
			res := runOp(t, ir.Transpose, []*ir.Literal{x}, ir.Attrs{"perm": c.perm})[0]
			want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
				idx := make([]int, len(c.in))
				for i, p := range c.perm {
					idx[p] = o[i]
				}
				return x, ravel(idx, c.in)
			})
			requireSameData(t, want, res, "transpose %v %v perm %v", dt, c.in, c.perm)
		}
	}
}

func testSlice(t *testing.T) {
	r := newRand(t)
	cases := []struct{ in, start, limit, strides []int }{
		{[]int{10}, []int{2}, []int{9}, []int{3}},
		{[]int{4, 5}, []int{1, 0}, []int{4, 5}, []int{2, 2}},
		{[]int{3, 4}, []int{1, 2}, []int{1, 4}, []int{1, 1}},
		{[]int{}, []int{}, []int{}, []int{}},
		{[]int{5, 6, 7}, []int{0, 1, 2}, []int{5, 6, 7}, []int{1, 2, 3}},
		{[]int{0, 3}, []int{0, 1}, []int{0, 3}, []int{1, 1}},
		{[]int{1, 8}, []int{0, 7}, []int{1, 8}, []int{1, 5}},
	}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			x := randLit(r, dt, c.in, nil)
			res := runOp(t, ir.Slice, []*ir.Literal{x}, ir.Attrs{"start": c.start, "limit": c.limit, "strides": c.strides})[0]
			want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
				idx := make([]int, len(c.in))
				for i := range idx {
					idx[i] = c.start[i] + o[i]*c.strides[i]
				}
				return x, ravel(idx, c.in)
			})
			requireSameData(t, want, res, "slice %v %+v", dt, c)
		}
	}
}

var intDTypes = []ir.DType{ir.Uint8, ir.Int32, ir.Int64, ir.Uint32}

// indexLit returns an integer scalar of a random integer dtype holding v
// (wrapped into the dtype).
func indexLit(r *rand.Rand, v int64) *ir.Literal {
	dt := intDTypes[r.IntN(len(intDTypes))]
	l := lit(ir.TypeOf(dt))
	setI(l, 0, wrapTo(dt, v))
	return l
}

func clampRef(v int64, hi int) int {
	if v < 0 {
		return 0
	}
	if v > int64(hi) {
		return hi
	}
	return int(v)
}

func randStart(r *rand.Rand, dim int) int64 {
	switch r.IntN(5) {
	case 0:
		return -int64(r.IntN(5)) - 1
	case 1:
		return int64(dim + r.IntN(5))
	}
	return int64(r.IntN(dim + 1))
}

func testDynamicSlice(t *testing.T) {
	r := newRand(t)
	cases := []struct{ in, sizes []int }{{[]int{5, 6}, []int{2, 3}}, {[]int{}, []int{}}, {[]int{5, 6}, []int{0, 6}}, {[]int{4}, []int{4}}, {[]int{3, 1, 7}, []int{1, 1, 2}}}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			for rep := 0; rep < 4; rep++ {
				x := randLit(r, dt, c.in, nil)
				args := []*ir.Literal{x}
				st := make([]int, len(c.in))
				for i := range c.in {
					idx := indexLit(r, randStart(r, c.in[i]))
					args = append(args, idx)
					st[i] = clampRef(getI(idx, 0), c.in[i]-c.sizes[i])
				}
				res := runOp(t, ir.DynamicSlice, args, ir.Attrs{"sizes": c.sizes})[0]
				want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
					idx := make([]int, len(o))
					for i := range o {
						idx[i] = st[i] + o[i]
					}
					return x, ravel(idx, c.in)
				})
				requireSameData(t, want, res, "dynamic_slice %v %+v starts %v", dt, c, st)
			}
		}
	}
}

func testDynamicUpdateSlice(t *testing.T) {
	r := newRand(t)
	cases := []struct{ in, up []int }{{[]int{5, 6}, []int{2, 3}}, {[]int{}, []int{}}, {[]int{5, 6}, []int{0, 3}}, {[]int{4}, []int{4}}, {[]int{3, 1, 7}, []int{1, 1, 2}}}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			for rep := 0; rep < 4; rep++ {
				x := randLit(r, dt, c.in, nil)
				u := randLit(r, dt, c.up, nil)
				args := []*ir.Literal{x, u}
				st := make([]int, len(c.in))
				for i := range c.in {
					idx := indexLit(r, randStart(r, c.in[i]))
					args = append(args, idx)
					st[i] = clampRef(getI(idx, 0), c.in[i]-c.up[i])
				}
				res := runOp(t, ir.DynamicUpdateSlice, args, nil)[0]
				want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
					ui := make([]int, len(o))
					for i := range o {
						ui[i] = o[i] - st[i]
						if ui[i] < 0 || ui[i] >= c.up[i] {
							return x, ravel(o, c.in)
						}
					}
					return u, ravel(ui, c.up)
				})
				requireSameData(t, want, res, "dynamic_update_slice %v %+v starts %v", dt, c, st)
			}
		}
	}
}

func testConcatenate(t *testing.T) {
	r := newRand(t)
	cases := []struct {
		ins  [][]int
		axis int
	}{
		{[][]int{{2, 3}, {0, 3}, {4, 3}}, 0},
		{[][]int{{2, 1}, {2, 3}}, 1},
		{[][]int{{2, 3, 1}, {2, 3, 2}, {2, 3, 0}}, 2},
		{[][]int{{5}}, 0},
		{[][]int{{0, 2}, {0, 3}}, 1},
		{[][]int{{1, 2, 3}, {3, 2, 3}}, 0},
	}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			var args []*ir.Literal
			for _, s := range c.ins {
				args = append(args, randLit(r, dt, s, nil))
			}
			res := runOp(t, ir.Concatenate, args, ir.Attrs{"axis": c.axis})[0]
			want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
				k := o[c.axis]
				for i, s := range c.ins {
					if k < s[c.axis] {
						idx := append([]int(nil), o...)
						idx[c.axis] = k
						return args[i], ravel(idx, s)
					}
					k -= s[c.axis]
				}
				panic("out of range")
			})
			requireSameData(t, want, res, "concatenate %v %+v", dt, c)
		}
	}
}

func testPad(t *testing.T) {
	r := newRand(t)
	cases := []struct{ in, lo, hi, interior []int }{
		{[]int{3}, []int{1}, []int{2}, []int{1}},
		{[]int{2, 3}, []int{-1, 2}, []int{0, -2}, []int{0, 2}},
		{[]int{0, 2}, []int{1, 0}, []int{1, 0}, []int{3, 0}},
		{[]int{}, []int{}, []int{}, []int{}},
		{[]int{4}, []int{-3}, []int{-1}, []int{0}},
		{[]int{3, 3}, []int{-2, -5}, []int{1, 0}, []int{2, 2}},
		{[]int{1, 5}, []int{0, -4}, []int{2, 3}, []int{4, 0}},
		{[]int{5}, []int{-7}, []int{4}, []int{1}},
	}
	for _, dt := range ir.AllDTypes {
		for _, c := range cases {
			x := randLit(r, dt, c.in, nil)
			pv := randLit(r, dt, ir.Shape{}, nil)
			res := runOp(t, ir.Pad, []*ir.Literal{x, pv}, ir.Attrs{"low": c.lo, "high": c.hi, "interior": c.interior})[0]
			want := expectMoved(res.Type, pv.Data, func(o []int) (*ir.Literal, int) {
				idx := make([]int, len(o))
				for i := range o {
					p := o[i] - c.lo[i]
					step := c.interior[i] + 1
					if p < 0 || p%step != 0 || p/step >= c.in[i] {
						return nil, 0
					}
					idx[i] = p / step
				}
				return x, ravel(idx, c.in)
			})
			requireSameData(t, want, res, "pad %v %+v", dt, c)
		}
	}
}

type gatherCase struct {
	in   []int
	idx  []int
	axis int
}

var gatherCases = []gatherCase{
	{[]int{5, 3}, []int{4}, 0},
	{[]int{5, 3}, []int{2, 2}, 1},
	{[]int{4}, []int{}, 0},
	{[]int{2, 6, 3}, []int{3, 2}, 1},
	{[]int{2, 6, 3}, []int{0}, 1},
	{[]int{3, 4}, []int{7}, 1},
	{[]int{1}, []int{3}, 0},
	{[]int{0, 4}, []int{2}, 1},
}

func randIndices(r *rand.Rand, shape []int, n int) *ir.Literal {
	dt := intDTypes[r.IntN(len(intDTypes))]
	l := lit(ir.Type{DType: dt, Shape: shape})
	for i := 0; i < l.Type.Size(); i++ {
		v := int64(r.IntN(n+4)) - 2 // some negative, some past the end
		if r.IntN(10) == 0 {
			v = genInt(r, dt)
		}
		setI(l, i, wrapTo(dt, v))
	}
	return l
}

// splitGather splits a gather-result index into (outer, index position, inner).
func splitGather(o []int, axis, nIdx int) (pre, mid, post []int) {
	return o[:axis], o[axis : axis+nIdx], o[axis+nIdx:]
}

func testGather(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, c := range gatherCases {
			x := randLit(r, dt, c.in, nil)
			ind := randIndices(r, c.idx, c.in[c.axis])
			res := runOp(t, ir.Gather, []*ir.Literal{x, ind}, ir.Attrs{"axis": c.axis})[0]
			want := expectMoved(res.Type, nil, func(o []int) (*ir.Literal, int) {
				pre, mid, post := splitGather(o, c.axis, len(c.idx))
				k := clampRef(getI(ind, ravel(mid, c.idx)), c.in[c.axis]-1)
				src := append(append(append([]int(nil), pre...), k), post...)
				return x, ravel(src, c.in)
			})
			requireSameData(t, want, res, "gather %v %+v indices %v", dt, c, ind.Data)
		}
	}
}

func testScatterAdd(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, c := range gatherCases {
			x := randLit(r, dt, c.in, nil)
			ind := randIndices(r, c.idx, c.in[c.axis])
			ushape := ir.GatherShape(c.in, c.idx, c.axis)
			u := randLit(r, dt, ushape, nil)
			res := runOp(t, ir.ScatterAdd, []*ir.Literal{x, ind, u}, ir.Attrs{"axis": c.axis})[0]
			// Reference: apply the updates one by one, in order, in dt's arithmetic.
			n := ir.Shape(c.in).Size()
			fv := make([]float64, n)
			iv := make([]int64, n)
			for i := 0; i < n; i++ {
				if isFloat(dt) {
					fv[i] = getF(x, i)
				} else {
					iv[i] = getI(x, i)
				}
			}
			for j := 0; j < ushape.Size(); j++ {
				pre, mid, post := splitGather(unravel(j, ushape), c.axis, len(c.idx))
				k := getI(ind, ravel(mid, c.idx))
				if k < 0 || k >= int64(c.in[c.axis]) {
					continue
				}
				d := ravel(append(append(append([]int(nil), pre...), int(k)), post...), c.in)
				switch {
				case isFloat(dt):
					fv[d] = refRound(fv[d]+getF(u, j), dt)
				case dt == ir.Bool:
					iv[d] |= getI(u, j)
				default:
					iv[d] = wrapTo(dt, iv[d]+getI(u, j))
				}
			}
			for i := 0; i < n; i++ {
				if isFloat(dt) {
					require.True(t, closeTo(getF(res, i), fv[i], dt, 0, true), "scatter_add %v %+v [%d]: got %g want %g", dt, c, i, getF(res, i), fv[i])
				} else {
					require.Equal(t, iv[i], getI(res, i), "scatter_add %v %+v [%d]", dt, c, i)
				}
			}
		}
	}
}
