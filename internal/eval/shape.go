package eval

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

func iotaOp(attrs ir.Attrs, out *ir.Literal) error {
	shape := out.Type.Shape
	dim := attrs.Int("dim")
	// The values along dim (converted like convert from i64: integers wrap,
	// floats round to nearest even), then broadcast over the other dims.
	idx := make([]int64, shape[dim])
	for i := range idx {
		idx[i] = int64(i)
	}
	vec := ir.NewLiteral(ir.TypeOf(out.Type.DType, shape[dim]))
	if err := convertFromInts(idx, vec); err != nil {
		return err
	}
	broadcastInDim(vec, []int{dim}, out)
	return nil
}

// broadcastInDim, transpose and slice copy the elements of x that result
// out reads through the op's view (ir.BroadcastView, ir.TransposeView,
// ir.SliceView: the index formulas are ir's).
func broadcastInDim(x *ir.Literal, dims []int, out *ir.Literal) {
	copyView(x, ir.BroadcastView(x.Type.Shape, out.Type.Shape, dims), out)
}

func transpose(x *ir.Literal, perm []int, out *ir.Literal) {
	copyView(x, ir.TransposeView(x.Type.Shape, perm), out)
}

func slice(x *ir.Literal, start, strides []int, out *ir.Literal) {
	copyView(x, ir.SliceView(x.Type.Shape, out.Type.Shape, start, strides), out)
}

// copyView writes x's element v.At(i) to out's element i, for every i.
func copyView(x *ir.Literal, v ir.StridedView, out *ir.Literal) {
	if out.Type.Size() == 0 {
		return
	}
	copyStrided(x.Type.DType.Size(), out.Data, 0, ir.Shape(v.Shape).Strides(), x.Data, v.Offset, v.Strides, v.Shape)
}

// clampStarts reads the start index scalars and clamps each into
// [0, dim-size].
func clampStarts(idx []*ir.Literal, dims, sizes []int) []int {
	st := make([]int, len(idx))
	for i, l := range idx {
		v := scalarInt(l)
		hi := int64(dims[i] - sizes[i])
		st[i] = int(max(0, min(v, hi)))
	}
	return st
}

func dynamicSlice(x *ir.Literal, idx []*ir.Literal, out *ir.Literal) {
	sizes := out.Type.Shape
	st := clampStarts(idx, x.Type.Shape, sizes)
	ist := x.Type.Shape.Strides()
	off := 0
	for i := range st {
		off += st[i] * ist[i]
	}
	copyStrided(x.Type.DType.Size(), out.Data, 0, sizes.Strides(), x.Data, off, ist, sizes)
}

// dynamicUpdateSlice copies x to out and writes upd over the window; when out
// is x's memory only the window is written.
func dynamicUpdateSlice(x, upd *ir.Literal, idx []*ir.Literal, out *ir.Literal) {
	if !sameMem(out.Data, x.Data) {
		copy(out.Data, x.Data)
	}
	st := clampStarts(idx, x.Type.Shape, upd.Type.Shape)
	ost := out.Type.Shape.Strides()
	off := 0
	for i := range st {
		off += st[i] * ost[i]
	}
	copyStrided(x.Type.DType.Size(), out.Data, off, ost, upd.Data, 0, upd.Type.Shape.Strides(), upd.Type.Shape)
}

func concatenate(xs []*ir.Literal, axis int, out *ir.Literal) {
	esz := out.Type.DType.Size()
	shape := out.Type.Shape
	outer := ir.Shape(shape[:axis]).Size()
	inner := ir.Shape(shape[axis+1:]).Size() * esz
	row := shape[axis] * inner
	off := 0
	for _, x := range xs {
		n := x.Type.Shape[axis] * inner
		for o := 0; o < outer; o++ {
			copy(out.Data[o*row+off:o*row+off+n], x.Data[o*n:(o+1)*n])
		}
		off += n
	}
}

func pad(x, val *ir.Literal, low, interior []int, out *ir.Literal) {
	fillElem(out.Data, val.Data)
	in, os := x.Type.Shape, out.Type.Shape
	ist, ost := in.Strides(), os.Strides()
	soff, doff := 0, 0
	cnt := make([]int, len(in))
	sst := make([]int, len(in))
	dst := make([]int, len(in))
	for i := range in {
		step := interior[i] + 1
		// operand index j lands at lo + j*step; keep those inside [0, out).
		j0 := 0
		if low[i] < 0 {
			j0 = (-low[i] + step - 1) / step
		}
		j1 := in[i] // exclusive
		if last := os[i] - 1 - low[i]; last < 0 {
			j1 = 0
		} else if m := last/step + 1; m < j1 {
			j1 = m
		}
		if j1 <= j0 {
			return
		}
		cnt[i] = j1 - j0
		soff += j0 * ist[i]
		doff += (low[i] + j0*step) * ost[i]
		sst[i] = ist[i]
		dst[i] = ost[i] * step
	}
	copyStrided(x.Type.DType.Size(), out.Data, doff, dst, x.Data, soff, sst, cnt)
}

func gather(x, indices *ir.Literal, axis int, out *ir.Literal) error {
	shape := x.Type.Shape
	esz := x.Type.DType.Size()
	outer := ir.Shape(shape[:axis]).Size()
	n := shape[axis]
	inner := ir.Shape(shape[axis+1:]).Size() * esz
	idx := intsOf(indices)
	if len(out.Data) == 0 {
		return nil
	}
	if n == 0 {
		return fmt.Errorf("gather from an empty axis %d of %v", axis, x.Type)
	}
	ni := len(idx)
	for o := 0; o < outer; o++ {
		for j, k := range idx {
			k = max(0, min(k, int64(n-1)))
			d := (o*ni + j) * inner
			s := (o*n + int(k)) * inner
			copy(out.Data[d:d+inner], x.Data[s:s+inner])
		}
	}
	return nil
}

func scatterAdd(x, indices, upd *ir.Literal, axis int, out *ir.Literal) error {
	copy(out.Data, x.Data)
	shape := x.Type.Shape
	outer := ir.Shape(shape[:axis]).Size()
	n := shape[axis]
	inner := ir.Shape(shape[axis+1:]).Size()
	idx := intsOf(indices)
	s := scatterShape{outer: outer, n: n, inner: inner, idx: idx}
	switch x.Type.DType {
	case ir.Bool:
		scatterT(s, out.Data, upd.Data, func(a, b uint8) uint8 { return b2u(a != 0 || b != 0) })
	case ir.Uint8:
		scatterT(s, out.Data, upd.Data, func(a, b uint8) uint8 { return a + b })
	case ir.Int32:
		scatterT(s, viewAs[int32](out.Data), viewAs[int32](upd.Data), func(a, b int32) int32 { return a + b })
	case ir.Int64:
		scatterT(s, viewAs[int64](out.Data), viewAs[int64](upd.Data), func(a, b int64) int64 { return a + b })
	case ir.Uint32:
		scatterT(s, viewAs[uint32](out.Data), viewAs[uint32](upd.Data), func(a, b uint32) uint32 { return a + b })
	case ir.Float16:
		t := f16Table()
		scatterT(s, viewAs[ir.F16](out.Data), viewAs[ir.F16](upd.Data), func(a, b ir.F16) ir.F16 { return ir.F16FromFloat32(t[a] + t[b]) })
	case ir.BFloat16:
		scatterT(s, viewAs[ir.BF16](out.Data), viewAs[ir.BF16](upd.Data), func(a, b ir.BF16) ir.BF16 { return ir.BF16FromFloat32(a.Float32() + b.Float32()) })
	case ir.Float32:
		scatterT(s, viewAs[float32](out.Data), viewAs[float32](upd.Data), func(a, b float32) float32 { return a + b })
	case ir.Float64:
		scatterT(s, viewAs[float64](out.Data), viewAs[float64](upd.Data), func(a, b float64) float64 { return a + b })
	default:
		return fmt.Errorf("scatter_add: no kernel for %v", x.Type.DType)
	}
	return nil
}

type scatterShape struct {
	outer, n, inner int
	idx             []int64
}

func scatterT[T any](s scatterShape, dst, upd []T, add func(a, b T) T) {
	ni := len(s.idx)
	for o := 0; o < s.outer; o++ {
		for j, k := range s.idx {
			if k < 0 || k >= int64(s.n) {
				continue
			}
			d := dst[(o*s.n+int(k))*s.inner:][:s.inner]
			u := upd[(o*ni+j)*s.inner:][:s.inner]
			for t := range d {
				d[t] = add(d[t], u[t])
			}
		}
	}
}
