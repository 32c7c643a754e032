package gemm

import "fmt"

// Indexed says where the elements of one operand of SgemmIndexed or
// DgemmIndexed lie in its slice: element (r, c) of batch item t is at
// Off[t] + Rows[r] + Cols[c]. For A (m×k) Rows has m entries and Cols k;
// for B (k×n) Rows has k and Cols n. Any layout of a dense array — axes in
// any order, several array axes merged into one matrix index, batch axes
// that do not merge — is such a table of offsets, so the product reads the
// operand where it lies: only the packing into cache blocks, which every
// product does anyway, walks the tables.
type Indexed struct {
	Off, Rows, Cols []int
}

// SgemmIndexed computes, for each batch item t < len(a.Off),
// C_t = alpha*A_t*B_t + beta*C_t, with A_t (m×k) and B_t (k×n) read where
// a and b place them (see Indexed) and C_t row-major with row stride ldc
// starting at c[t*strideC]. Each item is computed bit for bit as Sgemm
// computes the same matrices stored row-major. SgemmIndexed panics when
// the tables do not have m, k and n entries, when a and b do not have the
// same number of items, or when an offset is negative or outside its slice.
func SgemmIndexed(m, n, k int, alpha float32, a []float32, la Indexed, b []float32, lb Indexed, beta float32, c []float32, ldc, strideC int) {
	gemmIndexed(&active.Load().s, m, n, k, alpha, a, la, b, lb, beta, c, ldc, strideC)
}

// DgemmIndexed is SgemmIndexed for float64 matrices.
func DgemmIndexed(m, n, k int, alpha float64, a []float64, la Indexed, b []float64, lb Indexed, beta float64, c []float64, ldc, strideC int) {
	gemmIndexed(&active.Load().d, m, n, k, alpha, a, la, b, lb, beta, c, ldc, strideC)
}

func gemmIndexed[T float](kr *kernel[T], m, n, k int, alpha T, a []T, la Indexed, b []T, lb Indexed, beta T, c []T, ldc, strideC int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("gemm: negative dimension m=%d n=%d k=%d", m, n, k))
	}
	if len(la.Off) != len(lb.Off) {
		panic(fmt.Sprintf("gemm: %d items of A, %d of B", len(la.Off), len(lb.Off)))
	}
	if len(la.Rows) != m || len(la.Cols) != k || len(lb.Rows) != k || len(lb.Cols) != n {
		panic(fmt.Sprintf("gemm: tables of %d×%d and %d×%d for m=%d n=%d k=%d", len(la.Rows), len(la.Cols), len(lb.Rows), len(lb.Cols), m, n, k))
	}
	if m > 0 && n > 0 && k > 0 {
		checkIndexed("a", len(a), la)
		checkIndexed("b", len(b), lb)
	}
	// The tables are the same for every item: each item gets A and B
	// sliced at its offsets, and C as SgemmStrided's. An operand whose
	// rows and columns are each evenly spaced, one of them one element
	// apart, is read as a plain or transposed matrix (A then possibly in
	// place by the kernel); others are packed through their tables.
	s := spec[T]{m: m, n: n, k: k, alpha: alpha, beta: beta, a: a, b: b, c: c, ldc: ldc}
	s.transA, s.lda, s.aOff = regular(la)
	if s.aOff == nil {
		s.ar, s.ac, s.aOff = la.Rows, la.Cols, la.Off
	}
	s.transB, s.ldb, s.bOff = regular(lb)
	if s.bOff == nil {
		s.br, s.bc, s.bOff = lb.Rows, lb.Cols, lb.Off
	}
	gemmStrided(kr, len(la.Off), 0, 0, strideC, s)
}

// regular returns the layout of an operand whose rows and columns are
// evenly spaced with one of the two one element apart: transposed or not,
// the row stride, and each item's offset of element (0, 0); off is nil
// when the operand is not so.
func regular(l Indexed) (trans bool, ld int, off []int) {
	rs, rok := spacing(l.Rows)
	cs, cok := spacing(l.Cols)
	if !rok || !cok {
		return false, 0, nil
	}
	nr, nc := len(l.Rows), len(l.Cols)
	switch {
	case cs == 1 && rs >= max(1, nc):
		trans, ld = false, rs
	case nc <= 1 && rs >= 1:
		trans, ld = false, rs
	case nr <= 1 && cs == 1:
		trans, ld = false, max(1, nc)
	case rs == 1 && cs >= max(1, nr):
		trans, ld = true, cs
	case nr <= 1 && cs >= 1:
		trans, ld = true, cs
	default:
		return false, 0, nil
	}
	base := 0
	if nr > 0 && nc > 0 {
		base = l.Rows[0] + l.Cols[0]
	}
	off = make([]int, len(l.Off))
	for i, o := range l.Off {
		off[i] = o + base
	}
	return trans, ld, off
}

// spacing returns the constant difference of consecutive entries of s (1
// when s has fewer than two), and whether there is one.
func spacing(s []int) (int, bool) {
	if len(s) < 2 {
		return 1, true
	}
	d := s[1] - s[0]
	for i := 2; i < len(s); i++ {
		if s[i]-s[i-1] != d {
			return 0, false
		}
	}
	return d, true
}

// checkIndexed panics unless every element the table addresses lies in a
// slice of n elements.
func checkIndexed(what string, n int, l Indexed) {
	lo, hi := spanOf(l.Off)
	rlo, rhi := spanOf(l.Rows)
	clo, chi := spanOf(l.Cols)
	if lo < 0 || rlo < 0 || clo < 0 || hi+rhi+chi >= n {
		panic(fmt.Sprintf("gemm: %s's offsets span [%d, %d], outside len(%s)=%d", what, lo+rlo+clo, hi+rhi+chi, what, n))
	}
}

func spanOf(s []int) (lo, hi int) {
	if len(s) == 0 {
		return 0, 0
	}
	lo, hi = s[0], s[0]
	for _, v := range s[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// packAIdx packs rows i0..i0+mc and columns p0..p0+kc of A, element (i, p)
// at a[rows[i]+cols[p]], into mr-row slivers as packA does.
func packAIdx[T float](dst, a []T, rows, cols []int, i0, p0, mc, kc, mr int) {
	cols = cols[p0 : p0+kc]
	for ir := 0; ir < mc; ir += mr {
		d := dst[ir*kc : ir*kc+mr*kc]
		rs := rows[i0+ir : i0+ir+min(mr, mc-ir)]
		if mr == 6 && len(rs) == 6 {
			r0, r1, r2, r3, r4, r5 := rs[0], rs[1], rs[2], rs[3], rs[4], rs[5]
			for p, cp := range cols {
				dd := d[6*p : 6*p+6 : 6*p+6]
				dd[0], dd[1], dd[2], dd[3], dd[4], dd[5] = a[r0+cp], a[r1+cp], a[r2+cp], a[r3+cp], a[r4+cp], a[r5+cp]
			}
			continue
		}
		for p, cp := range cols {
			dd := d[p*mr : p*mr+mr]
			for i, r := range rs {
				dd[i] = a[r+cp]
			}
			clear(dd[len(rs):])
		}
	}
}

// packBIdx packs rows p0..p0+kc and columns j0..j0+nc of B, element (p, j)
// at b[rows[p]+cols[j]], into nr-column slivers as packB does. Runs of
// columns one element apart are copied.
func packBIdx[T float](dst, b []T, rows, cols []int, p0, j0, kc, nc, nr int) {
	rows = rows[p0 : p0+kc]
	for jr := 0; jr < nc; jr += nr {
		d := dst[jr*kc : jr*kc+nr*kc]
		cs := cols[j0+jr : j0+jr+min(nr, nc-jr)]
		unit := true
		for j := 1; j < len(cs) && unit; j++ {
			unit = cs[j] == cs[0]+j
		}
		for p, rp := range rows {
			dd := d[p*nr : p*nr+nr]
			if unit {
				o := rp + cs[0]
				copy(dd, b[o:o+len(cs)])
			} else {
				for j, cj := range cs {
					dd[j] = b[rp+cj]
				}
			}
			clear(dd[len(cs):])
		}
	}
}
