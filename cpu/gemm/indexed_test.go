package gemm

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// splitLayout builds offset tables for a batch of matrices rows×cols stored
// as one dense array whose axes — batch, the row index split in two, the
// column index split in two — are in a random order: the layouts of
// dot_general operands whose axes do not merge.
func splitLayout(rng *rand.Rand, batch, rows, cols int) Indexed {
	r1 := 1 + rng.IntN(max(1, rows))
	for rows%r1 != 0 {
		r1--
	}
	c1 := 1 + rng.IntN(max(1, cols))
	for cols%c1 != 0 {
		c1--
	}
	dims := []int{batch, r1, rows / r1, c1, cols / c1} // axes 0..4
	order := rng.Perm(5)
	st := make([]int, 5)
	s := 1
	for i := 4; i >= 0; i-- {
		st[order[i]] = s
		s *= dims[order[i]]
	}
	l := Indexed{Off: make([]int, batch), Rows: make([]int, rows), Cols: make([]int, cols)}
	for t := range batch {
		l.Off[t] = t * st[0]
	}
	for i := range rows {
		l.Rows[i] = i/(rows/r1)*st[1] + i%(rows/r1)*st[2]
	}
	for p := range cols {
		l.Cols[p] = p/(cols/c1)*st[3] + p%(cols/c1)*st[4]
	}
	return l
}

// TestIndexed multiplies batches of matrices stored in random axis orders
// through offset tables and checks every item against the float64 triple
// loop and, bit for bit, against Sgemm/Dgemm on row-major copies.
func TestIndexed(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(21, uint64(len(t.Name()))))
		for range 40 {
			batch := 1 + rng.IntN(4)
			m, n, k := sizes[rng.IntN(len(sizes))], sizes[rng.IntN(len(sizes))], sizes[rng.IntN(len(sizes))]
			if rng.IntN(4) == 0 {
				m, n, k = 64+rng.IntN(100), 64+rng.IntN(100), 300+rng.IntN(500) // several k slices
			}
			alpha, beta := []float32{1, -0.5}[rng.IntN(2)], []float32{0, 1, 0.5}[rng.IntN(3)]
			la, lb := splitLayout(rng, batch, m, k), splitLayout(rng, batch, k, n)
			a := randSlice(rng, batch*m*k)
			b := randSlice(rng, batch*k*n)
			ldc := max(1, n) + rng.IntN(3)
			c := randSlice(rng, batch*m*ldc)
			c0 := slices.Clone(c)
			SgemmIndexed(m, n, k, alpha, a, la, b, lb, beta, c, ldc, m*ldc)
			cd := make([]float64, len(c0))
			for i, v := range c0 {
				cd[i] = float64(v)
			}
			ad, bd := to64(a), to64(b)
			DgemmIndexed(m, n, k, float64(alpha), ad, la, bd, lb, float64(beta), cd, ldc, m*ldc)
			for tt := range batch {
				am, bm := gather(a, la, tt, m, k), gather(b, lb, tt, k, n)
				want := slices.Clone(c0[tt*m*ldc : (tt+1)*m*ldc])
				ref := refGemm(false, false, m, n, k, alpha, am, max(1, k), bm, max(1, n), beta, want, ldc)
				Sgemm(false, false, m, n, k, alpha, am, max(1, k), bm, max(1, n), beta, want, ldc)
				wantD := to64(c0[tt*m*ldc : (tt+1)*m*ldc])
				Dgemm(false, false, m, n, k, float64(alpha), to64(am), max(1, k), to64(bm), max(1, n), float64(beta), wantD, ldc)
				for i := range m {
					for j := range ldc {
						o := tt*m*ldc + i*ldc + j
						if j >= n {
							if c[o] != c0[o] {
								t.Fatalf("padding C[%d][%d][%d] changed", tt, i, j)
							}
							continue
						}
						if math.Float32bits(c[o]) != math.Float32bits(want[i*ldc+j]) || cd[o] != wantD[i*ldc+j] {
							t.Fatalf("m=%d n=%d k=%d item %d C[%d][%d] = %v (f64 %v), row-major Sgemm %v (Dgemm %v)", m, n, k, tt, i, j, c[o], cd[o], want[i*ldc+j], wantD[i*ldc+j])
						}
						if w := ref[i*n+j]; math.Abs(float64(c[o])-w) > 2e-6*math.Sqrt(float64(k)+1)*3*(1+math.Abs(w)) {
							t.Fatalf("m=%d n=%d k=%d item %d C[%d][%d] = %v, want %v", m, n, k, tt, i, j, c[o], w)
						}
					}
				}
			}
		}
	})
}

func TestIndexedPanics(t *testing.T) {
	a := make([]float32, 12)
	ok := Indexed{Off: []int{0}, Rows: []int{0, 4, 8}, Cols: []int{0, 1, 2, 3}} // 3×4
	for name, f := range map[string]func(){
		"out of range": func() {
			SgemmIndexed(3, 3, 4, 1, a, Indexed{Off: []int{1}, Rows: ok.Rows, Cols: ok.Cols}, a, Indexed{Off: []int{0}, Rows: []int{0, 3, 6, 9}, Cols: []int{0, 1, 2}}, 0, make([]float32, 9), 3, 9)
		},
		"negative": func() {
			SgemmIndexed(3, 3, 4, 1, a, Indexed{Off: []int{-1}, Rows: ok.Rows, Cols: ok.Cols}, a, Indexed{Off: []int{0}, Rows: []int{0, 3, 6, 9}, Cols: []int{0, 1, 2}}, 0, make([]float32, 9), 3, 9)
		},
		"table size": func() {
			SgemmIndexed(3, 3, 4, 1, a, ok, a, Indexed{Off: []int{0}, Rows: []int{0, 3, 6}, Cols: []int{0, 1, 2}}, 0, make([]float32, 9), 3, 9)
		},
		"items": func() {
			SgemmIndexed(3, 3, 4, 1, a, ok, a, Indexed{Off: []int{0, 0}, Rows: []int{0, 3, 6, 9}, Cols: []int{0, 1, 2}}, 0, make([]float32, 18), 3, 9)
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.Float64()*2 - 1)
	}
	return s
}

func to64(s []float32) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = float64(v)
	}
	return out
}

// gather returns item t of an indexed operand as a row-major rows×cols copy.
func gather(s []float32, l Indexed, t, rows, cols int) []float32 {
	out := make([]float32, max(1, rows*cols))
	for i := range rows {
		for p := range cols {
			out[i*cols+p] = s[l.Off[t]+l.Rows[i]+l.Cols[p]]
		}
	}
	return out
}

// BenchmarkPackBTrans packs a transposed 384×4096 panel of B (the
// attention scores' keys are read this way).
func BenchmarkPackBTrans(b *testing.B) {
	const kc, nc, nr = 384, 4096, 16
	src := make([]float32, nc*kc)
	dst := make([]float32, kc*nc)
	b.SetBytes(4 * kc * nc)
	for b.Loop() {
		packB(dst, src, kc, true, 0, 0, kc, nc, nr)
	}
}
