package gemm

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"
)

// TestPackLayout checks packA and packB against their documented layouts,
// element by element, for both storage orders, padded strides, whole and
// partial slivers and the tile widths of every kernel (the fast paths:
// whole 64-byte B rows, transposed A by stored rows).
func TestPackLayout(t *testing.T) {
	rng := testseed.Rand(t, 0)
	for _, w := range []int{4, 6, 8, 16, 32, 64} {
		for _, trans := range []bool{false, true} {
			for _, s := range [][2]int{{1, 1}, {5, 7}, {6, 16}, {12, 33}, {18, 352}, {47, 64}, {70, 9}} {
				rows, cols := s[0], s[1] // of op(X): mc×kc for A, kc×nc for B
				pad := rng.IntN(5)
				i0, j0 := rng.IntN(3), rng.IntN(3)
				stR, stC := rows+i0, cols+j0 // op(X) with the block at (i0, j0)
				ld := stC + pad
				if trans {
					ld = stR + pad
				}
				x := randMat32(max(stR, stC)*ld, rng.Uint64())
				at := func(i, j int) float32 { // element (i, j) of op(X)
					if trans {
						return x[j*ld+i]
					}
					return x[i*ld+j]
				}
				name := fmt.Sprintf("w=%d,trans=%v,%dx%d,pad=%d", w, trans, rows, cols, pad)
				// A: op(A) is rows×cols (m×k), slivers of w rows.
				pa := make([]float32, roundUp(rows, w)*cols)
				for i := range pa {
					pa[i] = float32(rng.NormFloat64())
				}
				packA(pa, x, ld, trans, i0, j0, rows, cols, w)
				for s := 0; s < roundUp(rows, w)/w; s++ {
					for p := 0; p < cols; p++ {
						for i := 0; i < w; i++ {
							want := float32(0)
							if r := s*w + i; r < rows {
								want = at(i0+r, j0+p)
							}
							if got := pa[s*w*cols+p*w+i]; got != want {
								t.Fatalf("packA %s: sliver %d (%d, %d) = %v, want %v", name, s, p, i, got, want)
							}
						}
					}
				}
				// B: op(B) is rows×cols (k×n), slivers of w columns.
				pb := make([]float32, roundUp(cols, w)*rows)
				for i := range pb {
					pb[i] = float32(rng.NormFloat64())
				}
				packB(pb, x, ld, trans, i0, j0, rows, cols, w)
				for s := 0; s < roundUp(cols, w)/w; s++ {
					for p := 0; p < rows; p++ {
						for j := 0; j < w; j++ {
							want := float32(0)
							if c := s*w + j; c < cols {
								want = at(i0+p, j0+c)
							}
							if got := pb[s*w*rows+p*w+j]; got != want {
								t.Fatalf("packB %s: sliver %d (%d, %d) = %v, want %v", name, s, p, j, got, want)
							}
						}
					}
				}
			}
		}
	}
}
