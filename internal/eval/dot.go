package eval

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	fgemm "github.com/ferryml/ferry/cpu/gemm"
	"github.com/ferryml/ferry/ir"
)

// freeAxes returns the axes of a rank-r operand that are in neither list.
func freeAxes(r int, a, b []int) []int {
	var out []int
	for i := 0; i < r; i++ {
		if !slices.Contains(a, i) && !slices.Contains(b, i) {
			out = append(out, i)
		}
	}
	return out
}

func dimsProduct(shape []int, axes []int) int {
	n := 1
	for _, a := range axes {
		n *= shape[a]
	}
	return n
}

// dotGeneral computes the product as a batch of matrix products
// [batch, M, K] × [batch, K, N] → [batch, M, N]; the result layout [batch,
// lhs free, rhs free] is exactly the row-major [batch, M, N].
//
// Floating-point products go to cpu/gemm (f32 and f64 directly; f16
// and bf16 through gemm.SgemmHalf, which widens the operands to float32 a
// cache block at a time while packing them, accumulates in float32 and
// rounds each result once from the kernel's tile, so no full-size float32
// copy is made).
// The contracting index runs over the contracting pairs in the order the
// attributes list them (row-major over them), whatever the operands'
// layouts, so a product's bits do not depend on where its operands lie.
// f32 and f64 operands are always read in place: as plain or transposed
// row-major matrices (with one batch stride) when their batch, free and
// contracting axes each merge into one strided index and one of the two
// matrix indices has unit stride, and through tables of offsets
// (gemm.SgemmIndexed: only the packing walks them) otherwise — transposed
// operands, split axes, batch axes that do not merge. f16 and bf16
// operands that do not merge are transposed into a packed temporary
// first. Integer products use plain loops with wrapping arithmetic over
// packed operands.
func dotGeneral(lhs, rhs *ir.Literal, attrs ir.Attrs, out *ir.Literal) error {
	lb, rb := attrs.Ints("lhs_batch"), attrs.Ints("rhs_batch")
	lc, rc := attrs.Ints("lhs_contract"), attrs.Ints("rhs_contract")
	ls, rs := lhs.Type.Shape, rhs.Type.Shape
	lf, rf := freeAxes(len(ls), lb, lc), freeAxes(len(rs), rb, rc)
	bsz, m, k, n := dimsProduct(ls, lb), dimsProduct(ls, lf), dimsProduct(ls, lc), dimsProduct(rs, rf)
	if len(out.Data) == 0 {
		return nil
	}
	dt := lhs.Type.DType
	if k == 0 {
		clear(out.Data) // an empty sum
		return nil
	}
	g := gemm{batch: bsz, m: m, k: k, n: n}
	switch dt {
	case ir.Float32, ir.Float64, ir.Float16, ir.BFloat16:
		dotFloat(lhs, rhs, g, lb, lf, rb, rf, lc, rc, out)
		return nil
	}
	clear(out.Data) // matmul accumulates into zeros
	a, _ := permute(lhs, slices.Concat(lb, lf, lc))
	b, _ := permute(rhs, slices.Concat(rb, rc, rf))
	switch dt {
	case ir.Uint8:
		matmul(g, viewAs[uint8](out.Data), viewAs[uint8](a), viewAs[uint8](b))
	case ir.Int32:
		matmul(g, viewAs[int32](out.Data), viewAs[int32](a), viewAs[int32](b))
	case ir.Int64:
		matmul(g, viewAs[int64](out.Data), viewAs[int64](a), viewAs[int64](b))
	case ir.Uint32:
		matmul(g, viewAs[uint32](out.Data), viewAs[uint32](a), viewAs[uint32](b))
	default:
		return fmt.Errorf("dot_general: no kernel for %v", dt)
	}
	return nil
}

// matLayout says how a gemm reads one operand in place: as batch matrices
// starting stride elements apart, each stored rows×cols with row stride ld,
// or, when trans is set, cols×rows (the transpose) with row stride ld.
type matLayout struct {
	trans      bool
	ld, stride int
}

// groupStride returns the stride of axes (in the given order) of an array
// with the given row-major strides when they merge into one index (unit
// axes ignored); unit reports a group of one element, whose stride does not
// matter. ok is false when the axes do not merge.
func groupStride(shape, strides, axes []int) (s int, unit, ok bool) {
	s = -1
	for _, ax := range axes {
		if shape[ax] == 1 {
			continue
		}
		if s >= 0 && s != strides[ax]*shape[ax] {
			return 0, false, false
		}
		s = strides[ax]
	}
	if s < 0 {
		return 0, true, true
	}
	return s, false, true
}

// inPlace finds the layout in which an operand of the given shape is the
// batch of matrices [batch axes][row axes][col axes] without a copy
// (nrows and ncols are the row and column counts).
func inPlace(shape, batch, rowAxes, colAxes []int, nrows, ncols int) (matLayout, bool) {
	st := ir.Shape(shape).Strides()
	bs, bunit, bok := groupStride(shape, st, batch)
	rs, runit, rok := groupStride(shape, st, rowAxes)
	cs, cunit, cok := groupStride(shape, st, colAxes)
	if !bok || !rok || !cok {
		return matLayout{}, false
	}
	var l matLayout
	if !bunit {
		l.stride = bs
	}
	switch {
	case cunit || cs == 1: // row-major rows×cols
		l.ld = max(1, ncols)
		if !runit {
			l.ld = rs
		}
	case runit || rs == 1: // stored as cols×rows
		l.trans, l.ld = true, max(1, nrows, cs)
	default:
		return matLayout{}, false
	}
	return l, true
}

// dotOperand returns the bytes a gemm reads for one operand and their
// layout: the operand itself when inPlace allows, a packed
// [batch][rows][cols] copy otherwise.
func dotOperand(l *ir.Literal, batch, rowAxes, colAxes []int, nrows, ncols int) ([]byte, matLayout) {
	if ml, ok := inPlace(l.Type.Shape, batch, rowAxes, colAxes, nrows, ncols); ok {
		return l.Data, ml
	}
	data, _ := permute(l, slices.Concat(batch, rowAxes, colAxes))
	return data, matLayout{ld: max(1, ncols), stride: nrows * ncols}
}

// axisOffsets returns the offsets, in row-major order of axes (as
// listed), of the elements of an array of the given shape and strides
// along those axes.
func axisOffsets(shape, strides, axes []int) []int {
	out := make([]int, 1, dimsProduct(shape, axes))
	for _, ax := range axes {
		next := make([]int, 0, len(out)*shape[ax])
		for _, o := range out {
			for i := range shape[ax] {
				next = append(next, o+i*strides[ax])
			}
		}
		out = next
	}
	return out
}

// indexed returns the offset tables of one operand of a product read in
// place whatever its layout (gemm.SgemmIndexed).
func indexed(l *ir.Literal, batch, rowAxes, colAxes []int) fgemm.Indexed {
	sh := l.Type.Shape
	st := sh.Strides()
	return fgemm.Indexed{Off: axisOffsets(sh, st, batch), Rows: axisOffsets(sh, st, rowAxes), Cols: axisOffsets(sh, st, colAxes)}
}

// dotFloat runs a floating-point dot_general through cpu/gemm (k > 0,
// non-empty result).
func dotFloat(lhs, rhs *ir.Literal, g gemm, lb, lf, rb, rf, lc, rc []int, out *ir.Literal) {
	m, k, n := g.m, g.k, g.n
	dt := lhs.Type.DType
	_, lok := inPlace(lhs.Type.Shape, lb, lf, lc, m, k)
	_, rok := inPlace(rhs.Type.Shape, rb, rc, rf, k, n)
	if (!lok || !rok) && (dt == ir.Float32 || dt == ir.Float64) {
		// Read both operands where they lie through offset tables.
		li, ri := indexed(lhs, lb, lf, lc), indexed(rhs, rb, rc, rf)
		if dt == ir.Float32 {
			fgemm.SgemmIndexed(m, n, k, 1, viewAs[float32](lhs.Data), li, viewAs[float32](rhs.Data), ri, 0, viewAs[float32](out.Data), max(1, n), m*n)
		} else {
			fgemm.DgemmIndexed(m, n, k, 1, viewAs[float64](lhs.Data), li, viewAs[float64](rhs.Data), ri, 0, viewAs[float64](out.Data), max(1, n), m*n)
		}
		return
	}
	a, la := dotOperand(lhs, lb, lf, lc, m, k)
	b, lb2 := dotOperand(rhs, rb, rc, rf, k, n)
	switch lhs.Type.DType {
	case ir.Float32:
		runSgemm(g, viewAs[float32](a), la, viewAs[float32](b), lb2, viewAs[float32](out.Data))
	case ir.Float64:
		runDgemm(g, viewAs[float64](a), la, viewAs[float64](b), lb2, viewAs[float64](out.Data))
	case ir.BFloat16:
		runHalf(fgemm.BF16, g, viewAs[uint16](a), la, viewAs[uint16](b), lb2, viewAs[uint16](out.Data))
	case ir.Float16:
		runHalf(fgemm.F16, g, viewAs[uint16](a), la, viewAs[uint16](b), lb2, viewAs[uint16](out.Data))
	}
}

// runHalf is runSgemm for 16-bit floats: the gemm widens the operands while
// packing them, accumulates in float32 and rounds each result once, with
// no full-size float32 copy.
func runHalf(f fgemm.Format, g gemm, a []uint16, la matLayout, b []uint16, lb matLayout, c []uint16) {
	if g.batch == 1 {
		fgemm.SgemmHalf(f, la.trans, lb.trans, g.m, g.n, g.k, 1, a, la.ld, b, lb.ld, 0, c, max(1, g.n))
		return
	}
	fgemm.SgemmHalfStrided(f, la.trans, lb.trans, g.batch, g.m, g.n, g.k, 1, a, la.ld, la.stride, b, lb.ld, lb.stride, 0, c, max(1, g.n), g.m*g.n)
}

func runSgemm(g gemm, a []float32, la matLayout, b []float32, lb matLayout, c []float32) {
	if g.batch == 1 {
		fgemm.Sgemm(la.trans, lb.trans, g.m, g.n, g.k, 1, a, la.ld, b, lb.ld, 0, c, max(1, g.n))
		return
	}
	fgemm.SgemmStrided(la.trans, lb.trans, g.batch, g.m, g.n, g.k, 1, a, la.ld, la.stride, b, lb.ld, lb.stride, 0, c, max(1, g.n), g.m*g.n)
}

func runDgemm(g gemm, a []float64, la matLayout, b []float64, lb matLayout, c []float64) {
	if g.batch == 1 {
		fgemm.Dgemm(la.trans, lb.trans, g.m, g.n, g.k, 1, a, la.ld, b, lb.ld, 0, c, max(1, g.n))
		return
	}
	fgemm.DgemmStrided(la.trans, lb.trans, g.batch, g.m, g.n, g.k, 1, a, la.ld, la.stride, b, lb.ld, lb.stride, 0, c, max(1, g.n), g.m*g.n)
}

type gemm struct{ batch, m, k, n int }

// matmul computes c[b] = a[b] @ b[b] for row-major a [batch,m,k], b
// [batch,k,n], c [batch,m,n] (c must be zero), accumulating in T in
// increasing k order. Rows are split among goroutines when the work is large.
func matmul[T numT](g gemm, c, a, b []T) {
	rows := g.batch * g.m
	if rows == 0 || g.n == 0 {
		return
	}
	work := rows * g.k * g.n
	workers := min(runtime.GOMAXPROCS(0), rows, max(1, work/(1<<16)))
	if workers <= 1 {
		matmulRows(g, c, a, b, 0, rows)
		return
	}
	var wg sync.WaitGroup
	per := (rows + workers - 1) / workers
	for lo := 0; lo < rows; lo += per {
		hi := min(lo+per, rows)
		wg.Add(1)
		go func() {
			defer wg.Done()
			matmulRows(g, c, a, b, lo, hi)
		}()
	}
	wg.Wait()
}

func matmulRows[T numT](g gemm, c, a, b []T, lo, hi int) {
	k, n := g.k, g.n
	r := lo
	// Four rows at a time while they share a batch: each row of b is loaded
	// once for four rows of c. Every c element still accumulates in
	// increasing k order.
	for ; r+4 <= hi && r/g.m == (r+3)/g.m; r += 4 {
		c0, c1, c2, c3 := c[r*n:(r+1)*n], c[(r+1)*n:(r+2)*n], c[(r+2)*n:(r+3)*n], c[(r+3)*n:(r+4)*n]
		a0, a1, a2, a3 := a[r*k:(r+1)*k], a[(r+1)*k:(r+2)*k], a[(r+2)*k:(r+3)*k], a[(r+3)*k:(r+4)*k]
		bb := b[(r/g.m)*k*n:]
		for kk := range a0 {
			axpy4(c0, c1, c2, c3, bb[kk*n:(kk+1)*n], a0[kk], a1[kk], a2[kk], a3[kk])
		}
	}
	for ; r < hi; r++ {
		crow := c[r*n : (r+1)*n]
		arow := a[r*k : (r+1)*k]
		bb := b[(r/g.m)*k*n:]
		for kk, av := range arow {
			axpy(crow, bb[kk*n:(kk+1)*n], av)
		}
	}
}

// axpy does y += a*x.
func axpy[T numT](y, x []T, a T) {
	x = x[:len(y)]
	for j, v := range x {
		y[j] += a * v
	}
}

// axpy4 does yi += ai*x for four rows.
func axpy4[T numT](y0, y1, y2, y3, x []T, a0, a1, a2, a3 T) {
	n := len(x)
	y0, y1, y2, y3 = y0[:n], y1[:n], y2[:n], y3[:n]
	for j, v := range x {
		y0[j] += a0 * v
		y1[j] += a1 * v
		y2[j] += a2 * v
		y3[j] += a3 * v
	}
}
