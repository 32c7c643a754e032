package trace_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

var otShapeDTypes = []ir.DType{ir.Float32, ir.Int64, ir.BFloat16, ir.Bool}

func otGenFor(dt ir.DType) otGen {
	if dt == ir.Bool {
		return otInts(0, 1)
	}
	return otInts(-100, 100)
}

// otIndexMap builds the reference of a pure data-movement op: out[idx] =
// x[src(idx)], or pad where src returns nil.
func otIndexMap(x otTensor, shape []int, pad float64, src func(idx []int) []int) otTensor {
	out := otNew(shape...)
	for i := range out.data {
		if s := src(otUnravel(i, shape)); s != nil {
			out.data[i] = x.at(s...)
		} else {
			out.data[i] = pad
		}
	}
	return out
}

func TestOpsReshapeFamily(t *testing.T) {
	r := otRand(t)
	for _, dt := range otShapeDTypes {
		x, xr := otMake(r, dt, otGenFor(dt), 2, 3, 4)
		same := func(shape ...int) otTensor { return otTensor{shape, xr.data} }
		otCheck(t, otName("Reshape", dt), trace.Reshape(x, 4, 6), dt, same(4, 6), 0)
		otCheck(t, otName("Reshape/-1", dt), trace.Reshape(x, 3, -1, 2), dt, same(3, 4, 2), 0)
		otCheck(t, otName("Ravel", dt), trace.Ravel(x), dt, same(24), 0)
		otCheck(t, otName("ExpandDims/0", dt), trace.ExpandDims(x, 0), dt, same(1, 2, 3, 4), 0)
		otCheck(t, otName("ExpandDims/-1", dt), trace.ExpandDims(x, -1), dt, same(2, 3, 4, 1), 0)
		otCheck(t, otName("ExpandDims/2", dt), trace.ExpandDims(x, 2), dt, same(2, 3, 1, 4), 0)
		y := trace.Reshape(x, 1, 2, 1, 12, 1)
		otCheck(t, otName("Squeeze/all", dt), trace.Squeeze(y), dt, same(2, 12), 0)
		otCheck(t, otName("Squeeze/axes", dt), trace.Squeeze(y, 0, -1), dt, same(2, 1, 12), 0)
		s, sr := otMake(r, dt, otGenFor(dt))
		otCheck(t, otName("Reshape/scalar", dt), trace.Reshape(s, 1, 1), dt, otTensor{[]int{1, 1}, sr.data}, 0)
		e, _ := otMake(r, dt, otGenFor(dt), 0, 3)
		otCheck(t, otName("Reshape/empty", dt), trace.Reshape(e, 3, 0, 1), dt, otNew(3, 0, 1), 0)
		otCheck(t, otName("Reshape/empty-1", dt), trace.Reshape(e, -1, 3), dt, otNew(0, 3), 0)
		otExpectError(t, "Reshape", func() { trace.Reshape(e, 3, 0, -1) }, "cannot reshape", "[3,0,-1]")
	}
	x, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	if trace.Reshape(x, 2, 3) != x {
		t.Errorf("Reshape to the same shape should return its operand")
	}
	otExpectError(t, "Reshape", func() { trace.Reshape(x, 4, 2) }, "cannot reshape f32[2,3] (6 elements) to [4,2]")
	otExpectError(t, "Reshape", func() { trace.Reshape(x, -1, -1) }, "more than one -1")
	otExpectError(t, "Reshape", func() { trace.Reshape(x, 4, -1) }, "cannot reshape")
	otExpectError(t, "ExpandDims", func() { trace.ExpandDims(x, 3) }, "axis 3 out of range")
	otExpectError(t, "Squeeze", func() { trace.Squeeze(x, 1) }, "axis 1 of f32[2,3] has size 3, not 1")
}

func TestOpsTranspose(t *testing.T) {
	r := otRand(t)
	for _, dt := range otShapeDTypes {
		x, xr := otMake(r, dt, otGenFor(dt), 2, 3, 4)
		for _, perm := range [][]int{{1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {-1, 0, 1}, nil} {
			p := perm
			if p == nil {
				p = []int{2, 1, 0}
			}
			np := make([]int, 3)
			for i, a := range p {
				np[i] = (a + 3) % 3
			}
			shape := []int{xr.shape[np[0]], xr.shape[np[1]], xr.shape[np[2]]}
			want := otIndexMap(xr, shape, 0, func(idx []int) []int {
				src := make([]int, 3)
				for i, a := range np {
					src[a] = idx[i]
				}
				return src
			})
			otCheck(t, otName("Transpose", dt, perm), trace.Transpose(x, perm...), dt, want, 0)
		}
	}
	e, _ := otMake(r, ir.Float32, otNormal, 0, 3)
	otCheck(t, "Transpose/empty", trace.Transpose(e), ir.Float32, otNew(3, 0), 0)
	x, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	otExpectError(t, "Transpose", func() { trace.Transpose(x, 0, 0) }, "not a permutation")
	otExpectError(t, "Transpose", func() { trace.Transpose(x, 0, 2) }, "axis 2 out of range")
	otExpectError(t, "Transpose", func() { trace.Transpose(x, 0) }, "1 entries")
}

func TestOpsBroadcast(t *testing.T) {
	r := otRand(t)
	cases := []struct{ from, to []int }{
		{[]int{}, []int{2, 3}}, {[]int{3}, []int{2, 3}}, {[]int{2, 1}, []int{2, 4}}, {[]int{1, 3}, []int{4, 2, 3}},
		{[]int{1}, []int{0}}, {[]int{2, 3}, []int{2, 3}}, {[]int{1, 1}, []int{5, 1, 3}},
	}
	for _, dt := range otShapeDTypes {
		for _, c := range cases {
			x, xr := otMake(r, dt, otGenFor(dt), c.from...)
			want := otNew(c.to...)
			for i := range want.data {
				want.data[i] = xr.bcastAt(otUnravel(i, c.to))
			}
			otCheck(t, otName("BroadcastTo", dt, ir.Shape(c.from), ir.Shape(c.to)), trace.BroadcastTo(x, c.to...), dt, want, 0)
		}
		// BroadcastInDim: x [3] to [3,2] along dim 0.
		x, xr := otMake(r, dt, otGenFor(dt), 3)
		want := otIndexMap(xr, []int{3, 2}, 0, func(idx []int) []int { return []int{idx[0]} })
		otCheck(t, otName("BroadcastInDim", dt), trace.BroadcastInDim(x, ir.Shape{3, 2}, []int{0}), dt, want, 0)
	}
	x, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	otExpectError(t, "BroadcastTo", func() { trace.BroadcastTo(x, 3, 3) }, "cannot broadcast f32[2,3] to shape [3,3]")
	otExpectError(t, "BroadcastTo", func() { trace.BroadcastTo(x, 3) }, "lower rank")
	otExpectError(t, "BroadcastInDim", func() { trace.BroadcastInDim(x, ir.Shape{3, 2}, []int{1, 0}) }, "increasing")
	otExpectError(t, "BroadcastInDim", func() { trace.BroadcastInDim(x, ir.Shape{2, 4}, []int{0, 1}) }, "cannot broadcast to size 4")
}

func TestOpsSlice(t *testing.T) {
	r := otRand(t)
	for _, dt := range otShapeDTypes {
		x, xr := otMake(r, dt, otGenFor(dt), 5, 6)
		cases := []struct{ start, limit, strides []int }{
			{[]int{1, 0}, []int{4, 6}, nil},
			{[]int{0, 1}, []int{5, 6}, []int{2, 3}},
			{[]int{2, 2}, []int{2, 5}, []int{1, 1}},
			{[]int{4, 5}, []int{5, 6}, []int{3, 1}},
		}
		for _, c := range cases {
			st := c.strides
			if st == nil {
				st = []int{1, 1}
			}
			shape := []int{(c.limit[0] - c.start[0] + st[0] - 1) / st[0], (c.limit[1] - c.start[1] + st[1] - 1) / st[1]}
			want := otIndexMap(xr, shape, 0, func(idx []int) []int {
				return []int{c.start[0] + idx[0]*st[0], c.start[1] + idx[1]*st[1]}
			})
			otCheck(t, otName("Slice", dt, c.start, c.limit, c.strides), trace.Slice(x, c.start, c.limit, c.strides), dt, want, 0)
		}
		for _, c := range [][4]int{{0, 1, 4}, {1, -4, -1}, {-1, 2, 100}, {1, -100, 3}, {0, 4, 2}, {1, 5, 5}} {
			axis, s, e := c[0], c[1], c[2]
			a := (axis + 2) % 2
			n := xr.shape[a]
			norm := func(i int) int {
				if i < 0 {
					i += n
				}
				return min(max(i, 0), n)
			}
			lo, hi := norm(s), max(norm(e), norm(s))
			shape := append([]int{}, xr.shape...)
			shape[a] = hi - lo
			want := otIndexMap(xr, shape, 0, func(idx []int) []int {
				src := append([]int{}, idx...)
				src[a] += lo
				return src
			})
			otCheck(t, otName("SliceAxis", dt, c), trace.SliceAxis(x, axis, s, e), dt, want, 0)
		}
	}
	x, _ := otMake(r, ir.Float32, otNormal, 5, 6)
	otExpectError(t, "Slice", func() { trace.Slice(x, []int{0, 0}, []int{6, 6}, nil) }, "bad range [0:6:1] on axis 0 of f32[5,6]")
	otExpectError(t, "Slice", func() { trace.Slice(x, []int{0}, []int{6}, nil) }, "need 2 entries")
	otExpectError(t, "SliceAxis", func() { trace.SliceAxis(x, 2, 0, 1) }, "axis 2 out of range")
}

func TestOpsConcatStackSplit(t *testing.T) {
	r := otRand(t)
	for _, dt := range otShapeDTypes {
		a, ar := otMake(r, dt, otGenFor(dt), 2, 3)
		b, br := otMake(r, dt, otGenFor(dt), 2, 1)
		c, cr := otMake(r, dt, otGenFor(dt), 2, 0)
		want := otIndexMap(ar, []int{2, 4}, 0, func(idx []int) []int { return nil })
		for i := range want.data {
			idx := otUnravel(i, want.shape)
			if idx[1] < 3 {
				want.data[i] = ar.at(idx...)
			} else {
				want.data[i] = br.at(idx[0], idx[1]-3)
			}
		}
		otCheck(t, otName("Concatenate", dt), trace.Concatenate(-1, a, c, b), dt, want, 0)
		_ = cr

		d, dr := otMake(r, dt, otGenFor(dt), 1, 3)
		want = otNew(3, 3)
		for i := range want.data {
			idx := otUnravel(i, want.shape)
			if idx[0] < 2 {
				want.data[i] = ar.at(idx...)
			} else {
				want.data[i] = dr.at(0, idx[1])
			}
		}
		otCheck(t, otName("Concatenate/0", dt), trace.Concatenate(0, a, d), dt, want, 0)

		a2, a2r := otMake(r, dt, otGenFor(dt), 2, 3)
		for _, axis := range []int{0, 1, 2, -1, -3} {
			ax := (axis + 3) % 3
			shape := []int{2, 3}
			shape = append(shape[:ax], append([]int{2}, shape[ax:]...)...)
			want := otNew(shape...)
			for i := range want.data {
				idx := otUnravel(i, shape)
				k := idx[ax]
				rest := append(append([]int{}, idx[:ax]...), idx[ax+1:]...)
				if k == 0 {
					want.data[i] = ar.at(rest...)
				} else {
					want.data[i] = a2r.at(rest...)
				}
			}
			otCheck(t, otName("Stack", dt, axis), trace.Stack(axis, a, a2), dt, want, 0)
		}

		x, xr := otMake(r, dt, otGenFor(dt), 3, 7)
		parts := trace.Split(x, -1, 2, 0, 5)
		off := 0
		for i, sz := range []int{2, 0, 5} {
			o := off
			want := otIndexMap(xr, []int{3, sz}, 0, func(idx []int) []int { return []int{idx[0], idx[1] + o} })
			otCheck(t, otName("Split", dt, i), parts[i], dt, want, 0)
			off += sz
		}
	}
	// Mixed dtypes promote.
	i := otFrom(ir.Int32, []float64{1, 2}, 2)
	f := otFrom(ir.Float32, []float64{0.5}, 1)
	otCheck(t, "Concatenate/promote", trace.Concatenate(0, i, f), ir.Float32, otTensor{[]int{3}, []float64{1, 2, 0.5}}, 0)
	otCheck(t, "Stack/scalars", trace.Stack(0, trace.ScalarAs(1, ir.Float32), trace.Scalar(2)), ir.Float32, otTensor{[]int{2}, []float64{1, 2}}, 0)

	a, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	b, _ := otMake(r, ir.Float32, otNormal, 3, 3)
	otExpectError(t, "Concatenate", func() { trace.Concatenate(1, a, b) }, "operand 1 is f32[3,3], which does not match f32[2,3] off axis 1")
	otExpectError(t, "Concatenate", func() { trace.Concatenate(2, a, b) }, "axis 2 out of range")
	otExpectError(t, "Concatenate", func() { trace.Concatenate(0) }, "no operands")
	otExpectError(t, "Stack", func() { trace.Stack(0, a, b) }, "shapes must be equal")
	otExpectError(t, "Split", func() { trace.Split(a, 1, 1, 1) }, "add up to 2")
}

func TestOpsPad(t *testing.T) {
	r := otRand(t)
	for _, dt := range []ir.DType{ir.Float32, ir.Int32, ir.BFloat16} {
		x, xr := otMake(r, dt, otGenFor(dt), 3, 4)
		cases := []struct{ lo, hi, in []int }{
			{[]int{1, 0}, []int{0, 2}, nil},
			{[]int{0, 1}, []int{1, 0}, []int{1, 2}},
			{[]int{-1, 0}, []int{0, -2}, []int{0, 0}},
			{[]int{-2, 1}, []int{2, -3}, []int{2, 1}},
		}
		for _, c := range cases {
			in := c.in
			if in == nil {
				in = []int{0, 0}
			}
			shape := make([]int, 2)
			for d := range shape {
				shape[d] = c.lo[d] + xr.shape[d] + (xr.shape[d]-1)*in[d] + c.hi[d]
			}
			want := otIndexMap(xr, shape, -7, func(idx []int) []int {
				src := make([]int, 2)
				for d := range idx {
					p := idx[d] - c.lo[d]
					if p < 0 || p%(in[d]+1) != 0 || p/(in[d]+1) >= xr.shape[d] {
						return nil
					}
					src[d] = p / (in[d] + 1)
				}
				return src
			})
			otCheck(t, otName("Pad", dt, c.lo, c.hi, c.in), trace.Pad(x, trace.Scalar(-7), c.lo, c.hi, c.in), dt, want, 0)
		}
	}
	x, _ := otMake(r, ir.Float32, otNormal, 3)
	otExpectError(t, "Pad", func() { trace.Pad(x, x, []int{0}, []int{0}, nil) }, "must be a scalar")
	otExpectError(t, "Pad", func() { trace.Pad(x, trace.Scalar(0), []int{-2}, []int{-2}, nil) }, "negative size")
}

func TestOpsShapeTraced(t *testing.T) {
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		x := trace.Transpose(trace.Reshape(a[0], 4, -1))
		parts := trace.Split(x, 0, 1, 2)
		return trace.Concatenate(0, parts[1], parts[0], trace.Pad(parts[0], trace.Scalar(0), []int{1, 0}, []int{0, 0}, nil))
	}, ir.TypeOf(ir.Float32, 2, 6))
	codes := otCodes(ops)
	if codes[ir.Reshape] != 1 || codes[ir.Transpose] != 1 || codes[ir.Slice] != 2 || codes[ir.Pad] != 1 || codes[ir.Concatenate] != 1 {
		t.Errorf("recorded %v", codes)
	}
	if !out.Type().Equal(ir.TypeOf(ir.Float32, 5, 4)) {
		t.Errorf("result %v, want f32[5,4]", out.Type())
	}
}
