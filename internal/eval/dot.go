package eval

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

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

// dotGeneral lays lhs out as [batch, M, K] and rhs as [batch, K, N] and
// multiplies; the result layout [batch, lhs free, rhs free] is then the
// row-major [batch, M, N].
func dotGeneral(lhs, rhs *ir.Literal, attrs ir.Attrs, out *ir.Literal) error {
	lb, rb := attrs.Ints("lhs_batch"), attrs.Ints("rhs_batch")
	lc, rc := attrs.Ints("lhs_contract"), attrs.Ints("rhs_contract")
	ls, rs := lhs.Type.Shape, rhs.Type.Shape
	lf, rf := freeAxes(len(ls), lb, lc), freeAxes(len(rs), rb, rc)
	bsz, m, k, n := dimsProduct(ls, lb), dimsProduct(ls, lf), dimsProduct(ls, lc), dimsProduct(rs, rf)
	if len(out.Data) == 0 {
		return nil
	}
	clear(out.Data) // matmul accumulates into zeros
	a, _ := permute(lhs, slices.Concat(lb, lf, lc))
	b, _ := permute(rhs, slices.Concat(rb, rc, rf))
	g := gemm{batch: bsz, m: m, k: k, n: n}
	switch dt := lhs.Type.DType; dt {
	case ir.Float32:
		matmul(g, viewAs[float32](out.Data), viewAs[float32](a), viewAs[float32](b))
	case ir.Float64:
		matmul(g, viewAs[float64](out.Data), viewAs[float64](a), viewAs[float64](b))
	case ir.Float16, ir.BFloat16:
		fa := toF32(&ir.Literal{Type: ir.TypeOf(dt, len(a)/2), Data: a})
		fb := toF32(&ir.Literal{Type: ir.TypeOf(dt, len(b)/2), Data: b})
		c := make([]float32, bsz*m*n)
		matmul(g, c, fa, fb)
		fromF32(out, c)
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
