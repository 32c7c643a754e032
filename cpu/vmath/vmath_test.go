package vmath

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
)

// ulps is the distance between a and b in units in the last place (0 when
// both are NaN, huge when only one is).
func ulps(a, b float32) int64 {
	if a != a || b != b {
		if a != a && b != b {
			return 0
		}
		return 1 << 40
	}
	o := func(x float32) int64 {
		b := int64(math.Float32bits(x))
		if b&0x80000000 != 0 {
			return -(b & 0x7fffffff)
		}
		return b
	}
	d := o(a) - o(b)
	if d < 0 {
		d = -d
	}
	return d
}

func logistic64(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

type fn struct {
	name string
	vec  func(dst, x []float32)
	ref  func(float64) float64
	ulp  int64 // allowed
}

var fns = []fn{
	{"Exp", Exp, math.Exp, 2},
	{"Log", Log, math.Log, 2},
	{"Tanh", Tanh, math.Tanh, 2},
	{"Logistic", Logistic, logistic64, 2},
	{"Erf", Erf, math.Erf, 2},
	{"Log1p", Log1p, math.Log1p, 0},
	{"Expm1", Expm1, math.Expm1, 0},
	{"Sqrt", Sqrt, math.Sqrt, 0},
	{"Rsqrt", Rsqrt, func(x float64) float64 { return 1 / math.Sqrt(x) }, 1},
	{"Abs", Abs, math.Abs, 0},
	{"Neg", Neg, func(x float64) float64 { return -x }, 0},
}

// impls runs f with each implementation available on this machine
// (AVX-512, AVX2, pure Go).
func impls(t *testing.T, f func(t *testing.T)) {
	for _, im := range available() {
		prev := use(im)
		t.Run(im.name, f)
		use(prev)
	}
}

func specials() []float32 {
	inf := float32(math.Inf(1))
	v := []float32{0, float32(math.Copysign(0, -1)), inf, -inf, float32(math.NaN()),
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-40, -1e-40, 1.1754942e-38,
		math.MaxFloat32, -math.MaxFloat32, 1, -1, 0.5, 2, 1e-7, -1e-7, 1e-20, 88.72283, 88.72284, 89, -87.33655,
		-88, -100, -103.97, -104, -110, 0.625, -0.625, 0.875, -0.875, 3.9375, 9.1, -9.1, 20, -20, 1e10, -1e10}
	for e := -149; e < 128; e++ {
		v = append(v, float32(math.Ldexp(1, e)), -float32(math.Ldexp(1, e)), float32(math.Ldexp(1.3, e)))
	}
	return v
}

// check compares f over xs with the reference and returns the largest error.
func check(t *testing.T, f fn, xs []float32) (worst int64, at float32) {
	got := make([]float32, len(xs))
	f.vec(got, xs)
	for i, x := range xs {
		want := float32(f.ref(float64(x)))
		if d := ulps(got[i], want); d > worst {
			worst, at = d, x
		}
	}
	if worst > f.ulp {
		want := float32(f.ref(float64(at)))
		one := make([]float32, 1)
		f.vec(one, []float32{at})
		t.Errorf("%s(%g) = %g (%#x), want %g (%#x): %d ulp", f.name, at, one[0], math.Float32bits(one[0]), want, math.Float32bits(want), worst)
	}
	return
}

func TestAccuracy(t *testing.T) {
	impls(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, f := range fns {
			t.Run(f.name, func(t *testing.T) {
				xs := specials()
				for range 1 << 18 { // any bit pattern
					xs = append(xs, math.Float32frombits(r.Uint32()))
				}
				for range 1 << 18 { // the interesting range
					xs = append(xs, float32(r.NormFloat64()*4))
				}
				// a strided sweep over every bit pattern
				for b := uint64(0); b < 1<<32; b += 4093 {
					xs = append(xs, math.Float32frombits(uint32(b)))
				}
				w, at := check(t, f, xs)
				t.Logf("%s: max %d ulp (at %g) over %d inputs", f.name, w, at, len(xs))
			})
		}
	})
}

// TestBlocks checks that results do not depend on the position in the slice
// or on the length (the assembly's masked tail).
func TestBlocks(t *testing.T) {
	impls(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		xs := make([]float32, 100)
		for i := range xs {
			xs[i] = float32(r.NormFloat64() * 3)
		}
		for _, f := range fns {
			all := make([]float32, len(xs))
			f.vec(all, xs)
			for lo := 0; lo < len(xs); lo += 7 {
				for hi := lo; hi <= len(xs); hi += 13 {
					part := make([]float32, hi-lo+1)
					part[hi-lo] = 42
					f.vec(part, xs[lo:hi])
					for i := range hi - lo {
						if math.Float32bits(part[i]) != math.Float32bits(all[lo+i]) {
							t.Fatalf("%s: element %d of [%d:%d] differs", f.name, i, lo, hi)
						}
					}
					if part[hi-lo] != 42 {
						t.Fatalf("%s wrote past the end", f.name)
					}
				}
			}
		}
	})
}

func TestBinary(t *testing.T) {
	nan := float32(math.NaN())
	impls(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		sp := specials()
		var a, b []float32
		for _, x := range sp[:40] {
			for _, y := range sp[:40] {
				a, b = append(a, x), append(b, y)
			}
		}
		for range 5000 {
			a = append(a, math.Float32frombits(r.Uint32()))
			b = append(b, math.Float32frombits(r.Uint32()))
		}
		ops := []struct {
			name string
			f    func(dst, a, b []float32)
			ref  func(x, y float32) float32
		}{
			{"Add", Add, func(x, y float32) float32 { return x + y }},
			{"Sub", Sub, func(x, y float32) float32 { return x - y }},
			{"Mul", Mul, func(x, y float32) float32 { return x * y }},
			{"Div", Div, func(x, y float32) float32 { return x / y }},
			{"Max", Max, func(x, y float32) float32 {
				if x != x || x > y {
					return x
				}
				return y
			}},
			{"Min", Min, func(x, y float32) float32 {
				if x != x || x < y {
					return x
				}
				return y
			}},
		}
		got := make([]float32, len(a))
		for _, op := range ops {
			op.f(got, a, b)
			for i := range a {
				want := op.ref(a[i], b[i])
				if math.Float32bits(got[i]) != math.Float32bits(want) && !(got[i] != got[i] && want != want) {
					t.Fatalf("%s(%g, %g) = %g, want %g", op.name, a[i], b[i], got[i], want)
				}
			}
		}
		_ = nan
	})
}

// TestExhaustive checks every float32 (VMATH_EXHAUSTIVE=1, about a minute
// per function and implementation on two cores; VMATH_EXHAUSTIVE=go for the
// pure-Go kernels only, VMATH_EXHAUSTIVE=asm for the generated vector code
// only: the name is from when that was assembly) and prints the largest error of each function.
func TestExhaustive(t *testing.T) {
	if os.Getenv("VMATH_EXHAUSTIVE") == "" {
		t.Skip("set VMATH_EXHAUSTIVE=1")
	}
	impls(t, func(t *testing.T) {
		if v := os.Getenv("VMATH_EXHAUSTIVE"); v == "asm" && Impl() == "go" || v == "go" && Impl() != "go" {
			t.Skip("VMATH_EXHAUSTIVE=" + v)
		}
		for _, f := range fns[:5] {
			workers := runtime.GOMAXPROCS(0)
			var mu sync.Mutex
			var worst int64
			var at float32
			var wg sync.WaitGroup
			const chunk = 1 << 16
			next := make(chan uint64, 64)
			go func() {
				for b := uint64(0); b < 1<<32; b += chunk {
					next <- b
				}
				close(next)
			}()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					xs := make([]float32, chunk)
					got := make([]float32, chunk)
					for b := range next {
						for i := range xs {
							xs[i] = math.Float32frombits(uint32(b) + uint32(i))
						}
						f.vec(got, xs)
						for i, x := range xs {
							if d := ulps(got[i], float32(f.ref(float64(x)))); d > worst {
								mu.Lock()
								if d > worst {
									worst, at = d, x
								}
								mu.Unlock()
							}
						}
					}
				}()
			}
			wg.Wait()
			fmt.Printf("exhaustive %s %s: max %d ulp at %g\n", Impl(), f.name, worst, at)
			if worst > f.ulp {
				t.Errorf("%s: %d ulp at %g", f.name, worst, at)
			}
		}
	})
}

// TestImplsAgree checks, where the machine runs more than one
// generated-code implementation (AVX-512 and AVX2), that they compute the
// same bits for every kernel (NaN payloads aside): the AVX2 op bodies keep
// the AVX-512 kernels' arithmetic, with exact stand-ins for the
// instructions AVX2 lacks.
func TestImplsAgree(t *testing.T) {
	var vec []*impl
	for _, im := range available() {
		if im != goImpl {
			vec = append(vec, im)
		}
	}
	if len(vec) < 2 {
		t.Skip("one vector implementation here")
	}
	r := testseed.Rand(t, 9)
	xs := specials()
	for range 1 << 16 {
		xs = append(xs, math.Float32frombits(r.Uint32()), float32(r.NormFloat64()*8))
	}
	ys := make([]float32, len(xs))
	for i := range ys {
		ys[i] = xs[r.IntN(len(xs))]
	}
	run := func(im *impl, f func(k *impl, dst []float32)) []float32 {
		prev := use(im)
		defer use(prev)
		dst := make([]float32, len(xs))
		f(im, dst)
		return dst
	}
	kernels := map[string]func(k *impl, dst []float32){}
	for op := OpAdd; op < opEnd; op++ {
		kernels[ops[op].name] = func(k *impl, d []float32) {
			if ops[op].arity == 1 {
				k.f1[op](d, xs)
			} else {
				k.f2[op](d, xs, ys)
			}
		}
	}
	for name, f := range kernels {
		want := run(vec[0], f)
		for _, im := range vec[1:] {
			got := run(im, f)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] != got[i] && want[i] != want[i]) {
					t.Fatalf("%s(%g, %g): %s %g (%#x), %s %g (%#x)", name, xs[i], ys[i], im.name, got[i],
						math.Float32bits(got[i]), vec[0].name, want[i], math.Float32bits(want[i]))
				}
			}
		}
	}
}
