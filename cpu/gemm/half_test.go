package gemm

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
)

// irWiden and irRound are package ir's conversions, the reference.
func irWiden(f Format, h uint16) float32 {
	if f == BF16 {
		return ir.BF16(h).Float32()
	}
	return ir.F16(h).Float32()
}

func irRound(f Format, x float32) uint16 {
	if f == BF16 {
		return uint16(ir.BF16FromFloat32(x))
	}
	return uint16(ir.F16FromFloat32(x))
}

func widen(f Format, h uint16) float32 {
	if f == BF16 {
		return bf16ToF32(h)
	}
	return f16ToF32(h)
}

func round16(f Format, x float32) uint16 {
	if f == BF16 {
		return f32ToBF16(x)
	}
	return f32ToF16(x)
}

var formats = []Format{BF16, F16}

// TestHalfConversions checks the conversions against package ir bit for
// bit: widening every 16-bit pattern, and rounding every widened value,
// the midpoints between neighbours and the float32 values next to them
// (the ties and near-ties), and random float32 bit patterns.
func TestHalfConversions(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, f := range formats {
		bad := 0
		checkRound := func(x float32) {
			if got, want := round16(f, x), irRound(f, x); got != want && bad < 5 {
				bad++
				t.Errorf("%v: round(%g = %#08x) = %#04x, want %#04x", f, x, math.Float32bits(x), got, want)
			}
		}
		for h := 0; h < 1<<16; h++ {
			got, want := widen(f, uint16(h)), irWiden(f, uint16(h))
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Fatalf("%v: widen(%#04x) = %#08x, want %#08x", f, h, math.Float32bits(got), math.Float32bits(want))
			}
			checkRound(got)
			if h&0x7fff == 0x7fff {
				continue
			}
			// Midpoint to the next pattern up in magnitude, and its neighbours.
			next := widen(f, uint16(h+1))
			mid := float32((float64(got) + float64(next)) / 2)
			b := math.Float32bits(mid)
			for _, y := range []uint32{b - 2, b - 1, b, b + 1, b + 2} {
				checkRound(math.Float32frombits(y))
			}
			gb := math.Float32bits(got)
			checkRound(math.Float32frombits(gb + 1))
			checkRound(math.Float32frombits(gb - 1))
		}
		for i := 0; i < 1<<20; i++ {
			checkRound(math.Float32frombits(rng.Uint32()))
		}
		for _, x := range []float64{0, 65504, 65519.99, 65520, 65536, 1e30, 0x1p-24, 0x1p-25, 0x1.8p-25, 0x1p-26, 0x1p-14, 0x1.ffcp-15, 0x1.ffep-15, 0x1.fffp-15} {
			checkRound(float32(x))
			checkRound(float32(-x))
		}
		checkRound(float32(math.Inf(1)))
		checkRound(float32(math.Inf(-1)))
		checkRound(float32(math.NaN()))
	}
}

// halfMat draws 16-bit values in [-2, 2) (a few NaNs and infinities when
// specials is set).
func halfMat(rng *rand.Rand, f Format, n int, specials bool) []uint16 {
	s := make([]uint16, n)
	for i := range s {
		v := rng.Float32()*4 - 2
		if specials {
			switch rng.IntN(400) {
			case 0:
				v = float32(math.NaN())
			case 1:
				v = float32(math.Inf(1))
			case 2:
				v = float32(math.Inf(-1))
			}
		}
		s[i] = round16(f, v)
	}
	return s
}

func widenAll(f Format, s []uint16) []float32 {
	out := make([]float32, len(s))
	for i, h := range s {
		out[i] = irWiden(f, h)
	}
	return out
}

type halfRun struct {
	f    Format
	g    gemmCase
	a, b []uint16
	c    []uint16 // C before the product
	lda  int
	ldb  int
	ldc  int
}

func newHalfRun(rng *rand.Rand, f Format, g gemmCase, specials bool) *halfRun {
	rowsA, colsA := g.m, g.k
	if g.transA {
		rowsA, colsA = g.k, g.m
	}
	rowsB, colsB := g.k, g.n
	if g.transB {
		rowsB, colsB = g.n, g.k
	}
	r := &halfRun{f: f, g: g, lda: max(1, colsA) + g.padA, ldb: max(1, colsB) + g.padB, ldc: max(1, g.n) + g.padC}
	r.a = halfMat(rng, f, rowsA*r.lda, specials)
	r.b = halfMat(rng, f, rowsB*r.ldb, specials)
	r.c = halfMat(rng, f, g.m*r.ldc, false)
	return r
}

// viaF32 is the path SgemmHalf replaces: widen, Sgemm, round.
func (r *halfRun) viaF32() []uint16 {
	c := widenAll(r.f, r.c)
	g := r.g
	Sgemm(g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), widenAll(r.f, r.a), r.lda, widenAll(r.f, r.b), r.ldb, float32(g.beta), c, r.ldc)
	out := append([]uint16(nil), r.c...)
	for i := 0; i < g.m; i++ {
		for j := 0; j < g.n; j++ {
			out[i*r.ldc+j] = irRound(r.f, c[i*r.ldc+j])
		}
	}
	return out
}

// check compares C from SgemmHalf with the float64 reference: within the
// float32 accumulation error, then one rounding to the format.
func (r *halfRun) check(t *testing.T, got []uint16) {
	t.Helper()
	g := r.g
	want := refGemm(g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), widenAll(r.f, r.a), r.lda, widenAll(r.f, r.b), r.ldb, float32(g.beta), widenAll(r.f, r.c), r.ldc)
	ulp := 0x1p-8
	if r.f == F16 {
		ulp = 0x1p-11
	}
	bad := 0
	for i := 0; i < g.m; i++ {
		for j := 0; j < r.ldc; j++ {
			o := i*r.ldc + j
			if j >= g.n {
				if got[o] != r.c[o] {
					t.Fatalf("%v %v: C[%d][%d] (padding) changed", r.f, g, i, j)
				}
				continue
			}
			w := want[i*g.n+j]
			v := float64(irWiden(r.f, got[o]))
			// |sum| ≤ 4k+2|beta|: float32 error plus one rounding.
			tol := 4*float64(g.k+1)*0x1p-23*(4*float64(g.k)*math.Abs(g.alpha)+2*math.Abs(g.beta)) + ulp*math.Abs(w)
			if math.IsNaN(w) != math.IsNaN(v) || (!math.IsNaN(w) && !(math.Abs(v-w) <= tol) && !(math.IsInf(w, 0) && v == w)) {
				if bad++; bad <= 3 {
					t.Errorf("%v %v: C[%d][%d] = %v, want %v", r.f, g, i, j, v, w)
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%v %v: %d wrong elements", r.f, g, bad)
	}
}

func (r *halfRun) run() []uint16 {
	g := r.g
	c := append([]uint16(nil), r.c...)
	SgemmHalf(r.f, g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), r.a, r.lda, r.b, r.ldb, float32(g.beta), c, r.ldc)
	return c
}

func sameBits(t *testing.T, what string, got, want []uint16) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: C[%d] = %#04x, want %#04x (widen, Sgemm, round)", what, i, got[i], want[i])
		}
	}
}

// TestSgemmHalf checks SgemmHalf against the float64 reference, and bit
// for bit against widening, Sgemm and rounding.
func TestSgemmHalf(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(23, 24))
		cases := append(fixedCases(), randomCases(rng, 150)...)
		cases = append(cases, gemmCase{m: 37, n: 70, k: 1000, alpha: 1}, gemmCase{transA: true, transB: true, m: 13, n: 130, k: 777, padA: 1, padC: 3, alpha: 0.5})
		for i, g := range cases {
			f := formats[i%2]
			r := newHalfRun(rng, f, g, false)
			got := r.run()
			r.check(t, got)
			sameBits(t, f.String()+" "+g.String(), got, r.viaF32())
			// With NaNs and infinities, bit for bit (NaN payloads too).
			if i%3 == 0 {
				r := newHalfRun(rng, f, g, true)
				sameBits(t, f.String()+" "+g.String()+" specials", r.run(), r.viaF32())
			}
		}
	})
}

// TestSgemmHalfF32 checks the float32-result variant bit for bit against
// Sgemm on widened copies (the same computation for every alpha and beta).
func TestSgemmHalfF32(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(25, 26))
		for i, g := range append(fixedCases(), randomCases(rng, 100)...) {
			r := newHalfRun(rng, formats[i%2], g, i%4 == 0)
			c0 := widenAll(r.f, r.c)
			got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
			SgemmHalfF32(r.f, g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), r.a, r.lda, r.b, r.ldb, float32(g.beta), got, r.ldc)
			Sgemm(g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), widenAll(r.f, r.a), r.lda, widenAll(r.f, r.b), r.ldb, float32(g.beta), want, r.ldc)
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					t.Fatalf("%v %v: C[%d] = %v, want %v", r.f, g, j, got[j], want[j])
				}
			}
		}
	})
}

// TestHalfBlockingThreads shrinks the cache blocks (so that k is cut into
// several slices and a rounded C packs all of k) and splits across threads.
func TestHalfBlockingThreads(t *testing.T) {
	defer SetThreads(SetThreads(0))
	for _, ks := range kernels {
		save := ks.s
		ks.s.mc, ks.s.kc, ks.s.nc = 2*ks.s.mr, 7, 3*ks.s.nr
		defer func() { ks.s = save }()
	}
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(27, 28))
		for _, nt := range []int{1, 3} {
			SetThreads(nt)
			cases := append(randomCases(rng, 60), gemmCase{m: 250, n: 190, k: 130, alpha: 1}, gemmCase{transA: true, m: 120, n: 300, k: 99, alpha: -2, beta: 0.5})
			for i, g := range cases {
				r := newHalfRun(rng, formats[i%2], g, false)
				got := r.run()
				r.check(t, got)
				sameBits(t, g.String(), got, r.viaF32())
			}
		}
	})
}

// TestSgemmHalfStrided checks batch item 1 of 3 (items 0 and 2 are scratch).
func TestSgemmHalfStrided(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(29, 30))
		for i, g := range []gemmCase{
			{m: 7, n: 9, k: 11, alpha: 1},
			{transA: true, transB: true, m: 33, n: 65, k: 20, alpha: -1, beta: 0.5},
			{m: 120, n: 130, k: 140, alpha: 1, beta: 1},
			{transB: true, m: 64, n: 64, k: 32, alpha: 1},
			{m: 0, n: 3, k: 3, alpha: 1, beta: 1},
			{m: 3, n: 3, k: 0, alpha: 1, beta: 0.5},
		} {
			r := newHalfRun(rng, formats[i%2], g, false)
			rep := func(s []uint16) []uint16 {
				out := make([]uint16, 3*len(s))
				copy(out[len(s):], s)
				return out
			}
			ba, bb, bc := rep(r.a), rep(r.b), rep(r.c)
			SgemmHalfStrided(r.f, g.transA, g.transB, 3, g.m, g.n, g.k, float32(g.alpha), ba, r.lda, len(r.a), bb, r.ldb, len(r.b), float32(g.beta), bc, r.ldc, len(r.c))
			got := bc[len(r.c) : 2*len(r.c)]
			r.check(t, got)
			sameBits(t, g.String(), got, r.viaF32())
			c32 := make([]float32, 3*len(r.c))
			SgemmHalfF32Strided(r.f, g.transA, g.transB, 3, g.m, g.n, g.k, float32(g.alpha), ba, r.lda, len(r.a), bb, r.ldb, len(r.b), 0, c32, r.ldc, len(r.c))
			want := make([]float32, len(r.c))
			Sgemm(g.transA, g.transB, g.m, g.n, g.k, float32(g.alpha), widenAll(r.f, r.a), r.lda, widenAll(r.f, r.b), r.ldb, 0, want, r.ldc)
			for j, w := range want {
				if v := c32[len(r.c)+j]; math.Float32bits(v) != math.Float32bits(w) {
					t.Fatalf("%v F32: C[%d] = %v, want %v", g, j, v, w)
				}
			}
		}
	})
}

func TestHalfPanics(t *testing.T) {
	s := make([]uint16, 16)
	for _, f := range []func(){
		func() { SgemmHalf(Format(9), false, false, 2, 2, 2, 1, s, 2, s, 2, 0, s, 2) },
		func() { SgemmHalf(BF16, false, false, 4, 4, 4, 1, s[:15], 4, s, 4, 0, s, 4) },
		func() { SgemmHalfF32(F16, false, false, 4, 4, 4, 1, s, 4, s, 4, 0, make([]float32, 15), 4) },
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
