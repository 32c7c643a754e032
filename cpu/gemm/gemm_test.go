package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// forEachKernel runs f as a subtest with each kernel this machine supports.
func forEachKernel(t *testing.T, f func(t *testing.T)) {
	prev := Kernel()
	defer SetKernel(prev)
	for _, name := range Kernels() {
		if err := SetKernel(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, f)
	}
}

// refGemm is the float64 triple loop: C = alpha*op(A)*op(B) + beta*C. It
// runs i, p, j so that the inner loop has no branch and walks a row of op(B);
// each element still sums its k products in order of p.
func refGemm[T float](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) []float64 {
	ai, ap := lda, 1 // op(A)[i][p] is a[i*ai+p*ap]
	if transA {
		ai, ap = 1, lda
	}
	bp, bj := ldb, 1 // op(B)[p][j] is b[p*bp+j*bj]
	if transB {
		bp, bj = 1, ldb
	}
	out := make([]float64, m*n)
	for i := range m {
		row := out[i*n : (i+1)*n]
		for p := range k {
			av, b0 := float64(a[i*ai+p*ap]), p*bp
			for j := range row {
				row[j] += av * float64(b[b0+j*bj])
			}
		}
		for j := range row {
			v := float64(alpha) * row[j]
			if beta != 0 {
				v += float64(beta) * float64(c[i*ldc+j])
			}
			row[j] = v
		}
	}
	return out
}

type gemmCase struct {
	transA, transB bool
	m, n, k        int
	padA, padB     int // extra row stride
	padC           int
	alpha, beta    float64
}

func (g gemmCase) String() string {
	return fmt.Sprintf("tA=%v,tB=%v,m=%d,n=%d,k=%d,pad=%d/%d/%d,alpha=%g,beta=%g",
		g.transA, g.transB, g.m, g.n, g.k, g.padA, g.padB, g.padC, g.alpha, g.beta)
}

func runCase[T float](t *testing.T, rng *rand.Rand, g gemmCase, eps float64, f func(transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)) {
	t.Helper()
	rowsA, colsA := g.m, g.k
	if g.transA {
		rowsA, colsA = g.k, g.m
	}
	rowsB, colsB := g.k, g.n
	if g.transB {
		rowsB, colsB = g.n, g.k
	}
	lda, ldb, ldc := max(1, colsA)+g.padA, max(1, colsB)+g.padB, max(1, g.n)+g.padC
	fill := func(n int) []T {
		s := make([]T, n)
		for i := range s {
			s[i] = T(rng.Float64()*2 - 1)
		}
		return s
	}
	a := fill(rowsA * lda)
	b := fill(rowsB * ldb)
	c := fill(g.m * ldc)
	if g.beta == 0 {
		for i := range c {
			c[i] = T(math.NaN())
		}
	}
	c0 := append([]T(nil), c...)
	want := refGemm(g.transA, g.transB, g.m, g.n, g.k, T(g.alpha), a, lda, b, ldb, T(g.beta), c, ldc)
	f(g.transA, g.transB, g.m, g.n, g.k, T(g.alpha), a, lda, b, ldb, T(g.beta), c, ldc)
	tol := eps * math.Sqrt(float64(g.k)+1) * (math.Abs(g.alpha) + math.Abs(g.beta) + 1)
	bad := 0
	for i := 0; i < g.m; i++ {
		for j := 0; j < ldc; j++ {
			got := float64(c[i*ldc+j])
			if j >= g.n { // padding must be untouched
				if math.Float64bits(got) != math.Float64bits(float64(c0[i*ldc+j])) {
					t.Fatalf("%v: C[%d][%d] (padding) changed: %v -> %v", g, i, j, c0[i*ldc+j], got)
				}
				continue
			}
			w := want[i*g.n+j]
			if !(math.Abs(got-w) <= tol*(1+math.Abs(w))) {
				if bad++; bad <= 3 {
					t.Errorf("%v: C[%d][%d] = %v, want %v", g, i, j, got, w)
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%v: %d wrong elements", g, bad)
	}
}

var sizes = []int{0, 1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 32, 33, 48, 63, 64, 65, 97, 127, 129, 200}

func randomCases(rng *rand.Rand, n int) []gemmCase {
	alphas := []float64{1, -1, 0.5, 2.5, 0}
	betas := []float64{0, 1, -0.5, 2}
	var cs []gemmCase
	for i := 0; i < n; i++ {
		g := gemmCase{
			transA: rng.IntN(2) == 1,
			transB: rng.IntN(2) == 1,
			m:      sizes[rng.IntN(len(sizes))],
			n:      sizes[rng.IntN(len(sizes))],
			k:      sizes[rng.IntN(len(sizes))],
			alpha:  alphas[rng.IntN(len(alphas))],
			beta:   betas[rng.IntN(len(betas))],
		}
		if rng.IntN(3) == 0 {
			g.padA, g.padB, g.padC = rng.IntN(9), rng.IntN(9), rng.IntN(9)
		}
		cs = append(cs, g)
	}
	return cs
}

// fixedCases covers every transpose combination with sizes around the
// tile and block edges of every kernel.
func fixedCases() []gemmCase {
	var cs []gemmCase
	for _, tA := range []bool{false, true} {
		for _, tB := range []bool{false, true} {
			for _, s := range [][3]int{
				{1, 1, 1}, {0, 5, 5}, {5, 0, 5}, {5, 5, 0}, {6, 64, 256}, {7, 65, 257},
				{12, 128, 513}, {300, 70, 300}, {289, 2050, 3}, {5, 3000, 17},
				{577, 129, 31}, {101, 103, 107},
			} {
				cs = append(cs, gemmCase{transA: tA, transB: tB, m: s[0], n: s[1], k: s[2], alpha: 1.5, beta: 0})
				cs = append(cs, gemmCase{transA: tA, transB: tB, m: s[0], n: s[1], k: s[2], padA: 3, padB: 5, padC: 2, alpha: -0.75, beta: 0.5})
			}
		}
	}
	return cs
}

func TestSgemm(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, g := range append(fixedCases(), randomCases(rng, 300)...) {
			runCase(t, rng, g, 2e-6, Sgemm)
		}
	})
}

func TestDgemm(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, g := range append(fixedCases(), randomCases(rng, 300)...) {
			runCase(t, rng, g, 1e-14, Dgemm)
		}
	})
}

// TestThreads checks that splitting across more parts than cores, and
// single-threaded runs, give the same results.
func TestThreads(t *testing.T) {
	defer SetThreads(SetThreads(0))
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for _, nt := range []int{1, 3, 8} {
			SetThreads(nt)
			for _, g := range []gemmCase{
				{m: 250, n: 190, k: 130, alpha: 1, beta: 0},
				{transA: true, m: 20, n: 700, k: 90, alpha: 1, beta: 1},
				{transB: true, m: 700, n: 9, k: 90, alpha: 2, beta: 0},
				{transA: true, transB: true, m: 130, n: 131, k: 300, padA: 1, padB: 2, padC: 3, alpha: 1, beta: -1},
			} {
				runCase(t, rng, g, 2e-6, Sgemm)
				runCase(t, rng, g, 1e-14, Dgemm)
			}
		}
	})
}

// TestBlocking shrinks the cache blocks so that every block loop runs
// several times with edges.
func TestBlocking(t *testing.T) {
	for _, ks := range kernels {
		saveS, saveD := ks.s, ks.d
		ks.s.mc, ks.s.kc, ks.s.nc = 2*ks.s.mr, 7, 3*ks.s.nr
		ks.d.mc, ks.d.kc, ks.d.nc = 3*ks.d.mr, 5, 2*ks.d.nr
		defer func() { ks.s, ks.d = saveS, saveD }()
	}
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 8))
		for _, g := range randomCases(rng, 100) {
			runCase(t, rng, g, 2e-6, Sgemm)
			runCase(t, rng, g, 1e-14, Dgemm)
		}
	})
}

func TestStrided(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(9, 10))
		for _, g := range []gemmCase{
			{m: 7, n: 9, k: 11, alpha: 1, beta: 0},
			{transA: true, transB: true, m: 33, n: 65, k: 20, alpha: -1, beta: 0.5},
			{m: 120, n: 130, k: 140, alpha: 1, beta: 1},
			{m: 0, n: 3, k: 3, alpha: 1, beta: 1},
			{m: 3, n: 3, k: 0, alpha: 1, beta: 0.5},
		} {
			runCase(t, rng, g, 2e-6, func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
				// Batch of 3: items 0 and 2 are scratch copies, item 1 is the
				// checked one, so strides and offsets are exercised.
				rep := func(s []float32) []float32 {
					out := make([]float32, 3*len(s))
					copy(out[len(s):], s)
					return out
				}
				ba, bb, bc := rep(a), rep(b), rep(c)
				SgemmStrided(transA, transB, 3, m, n, k, alpha, ba, lda, len(a), bb, ldb, len(b), beta, bc, ldc, len(c))
				copy(c, bc[len(c):2*len(c)])
			})
		}
	})
}

func TestPanics(t *testing.T) {
	s := make([]float32, 16)
	for _, f := range []func(){
		func() { Sgemm(false, false, -1, 1, 1, 1, s, 1, s, 1, 0, s, 1) },
		func() { Sgemm(false, false, 2, 2, 2, 1, s, 1, s, 2, 0, s, 2) },      // lda < k
		func() { Sgemm(true, false, 3, 2, 2, 1, s, 2, s, 2, 0, s, 2) },       // lda < m
		func() { Sgemm(false, false, 4, 4, 4, 1, s[:15], 4, s, 4, 0, s, 4) }, // a too short
		func() { Sgemm(false, false, 4, 4, 4, 1, s, 4, s, 4, 0, s, 3) },      // ldc < n
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		}()
	}
}

func TestKernelSelection(t *testing.T) {
	names := Kernels()
	if names[len(names)-1] != "go" {
		t.Fatalf("Kernels() = %v, want go last", names)
	}
	if err := SetKernel("nonesuch"); err == nil {
		t.Fatal("SetKernel(nonesuch) succeeded")
	}
	t.Logf("kernels %v, using %s", names, Kernel())
}

// TestConcurrent runs products from several goroutines at once, so that
// they share the worker pool.
func TestConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			const n = 150
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			a, b := make([]float32, n*n), make([]float32, n*n)
			for i := range a {
				a[i], b[i] = rng.Float32()-0.5, rng.Float32()-0.5
			}
			want := refGemm(false, false, n, n, n, 1, a, n, b, n, 0, nil, n)
			for it := 0; it < 20; it++ {
				c := make([]float32, n*n)
				Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n)
				for i, w := range want {
					if math.Abs(float64(c[i])-w) > 1e-4 {
						errs <- fmt.Sprintf("goroutine %d: C[%d] = %v, want %v", g, i, c[i], w)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestInPlaceA checks that reading A in place gives the same bits as
// packing it, for every transpose and sizes with partial row tiles.
func TestInPlaceA(t *testing.T) {
	save := inPlaceMaxN
	defer func() { inPlaceMaxN = save }()
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(31, 32))
		for _, g := range append(randomCases(rng, 100), gemmCase{m: 300, n: 130, k: 900, alpha: 1, beta: 1}, gemmCase{transA: true, m: 131, n: 64, k: 777, padA: 5, alpha: 2}) {
			a := randMat32(max(g.m, g.k)*(max(g.m, g.k)+g.padA), rng.Uint64())
			b := randMat32(max(g.n, g.k)*(max(g.n, g.k)+g.padB), rng.Uint64())
			lda, ldb := g.k+g.padA, g.n+g.padB
			if g.transA {
				lda = g.m + g.padA
			}
			if g.transB {
				ldb = g.k + g.padB
			}
			lda, ldb = max(lda, 1), max(ldb, 1)
			c0 := randMat32(g.m*(g.n+g.padC), rng.Uint64())
			var out [2][]float32
			for i, maxN := range []int{-1, 1 << 30} {
				inPlaceMaxN = maxN
				out[i] = append([]float32(nil), c0...)
				Sgemm(g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), a, lda, b, ldb, float32(g.beta), out[i], max(1, g.n+g.padC))
			}
			for i := range c0 {
				if math.Float32bits(out[0][i]) != math.Float32bits(out[1][i]) {
					t.Fatalf("%v: C[%d] = %v in place, %v packed", g, i, out[1][i], out[0][i])
				}
			}
		}
	})
}
