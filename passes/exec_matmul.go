package passes

import "github.com/ferryml/ferry/ir"

// MatrixLayout is how one operand of a product lies in memory, read as
// Batch matrices (the lhs: M×K, its free dimensions by its contracting
// ones; the rhs: K×N) whose batch items, rows and columns are each evenly
// spaced in the row-major array of its shape (Plain): the matrices start
// BatchStride elements apart, and each is stored row-major with row stride
// LD, or, when Trans, transposed (its columns are the stored rows, LD
// apart). A backend hands a plain operand to a strided GEMM (cuBLASLt, the
// CPU's half-precision products) and reads others through offset tables or
// a kernel of its own.
type MatrixLayout struct {
	Plain, Trans    bool
	LD, BatchStride int
}

// matrixLayout returns the layout of an operand of the given shape whose
// batch items, rows and columns run over the axes listed (each list
// row-major over its axes, in the order given).
func matrixLayout(shape ir.Shape, batch, rows, cols []int) MatrixLayout {
	st := shape.Strides()
	bs, bok := spacing(shape, st, batch)
	rs, rok := spacing(shape, st, rows)
	cs, cok := spacing(shape, st, cols)
	if !bok || !rok || !cok {
		return MatrixLayout{}
	}
	nr, nc := extent(shape, rows), extent(shape, cols)
	l := MatrixLayout{Plain: true, BatchStride: bs}
	switch {
	case (nc <= 1 || cs == 1) && (nr <= 1 || rs >= max(1, nc)):
		l.LD = max(1, nc)
		if nr > 1 {
			l.LD = rs
		}
	case (nr <= 1 || rs == 1) && (nc <= 1 || cs >= max(1, nr)):
		l.Trans, l.LD = true, max(1, nr)
		if nc > 1 {
			l.LD = cs
		}
	default:
		return MatrixLayout{}
	}
	return l
}

// spacing returns the common difference of the offsets of the index
// combinations of axes (row-major over them, in the order given) in an
// array of that shape and strides: 0 for fewer than two offsets, ok false
// when they are not evenly spaced (the axes of more than one element do
// not merge into one).
func spacing(shape ir.Shape, st []int, axes []int) (d int, ok bool) {
	prev := -1 // the last axis of more than one element
	for _, ax := range axes {
		if shape[ax] <= 1 {
			continue
		}
		if prev >= 0 && st[prev] != st[ax]*shape[ax] {
			return 0, false
		}
		prev = ax
	}
	if prev < 0 {
		return 0, true
	}
	return st[prev], true
}

// extent is the number of index combinations of axes.
func extent(shape ir.Shape, axes []int) int {
	n := 1
	for _, ax := range axes {
		n *= shape[ax]
	}
	return n
}
