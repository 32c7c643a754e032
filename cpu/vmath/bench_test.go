package vmath

import (
	"math/rand/v2"
	"testing"
)

// The kernels over 1024 elements (in L1, as in a fused block): ns/element
// and GB/s of elements read and written.
func benchUnary(b *testing.B, f func(dst, x []float32)) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 3)
	}
	dst := make([]float32, len(x))
	b.SetBytes(int64(8 * len(x)))
	for b.Loop() {
		f(dst, x)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(x)), "ns/elem")
}

func benchBinary(b *testing.B, f func(dst, a, c []float32)) {
	x := make([]float32, 1024)
	y := make([]float32, 1024)
	for i := range x {
		x[i], y[i] = float32(i)+0.5, float32(3*i)+1
	}
	dst := make([]float32, len(x))
	b.SetBytes(int64(12 * len(x)))
	for b.Loop() {
		f(dst, x, y)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(x)), "ns/elem")
}

func both(b *testing.B, f func(b *testing.B)) {
	for _, im := range available() {
		prev := use(im)
		b.Run(im.name, f)
		use(prev)
	}
}

func BenchmarkExp(b *testing.B)      { both(b, func(b *testing.B) { benchUnary(b, Exp) }) }
func BenchmarkLog(b *testing.B)      { both(b, func(b *testing.B) { benchUnary(b, Log) }) }
func BenchmarkTanh(b *testing.B)     { both(b, func(b *testing.B) { benchUnary(b, Tanh) }) }
func BenchmarkLogistic(b *testing.B) { both(b, func(b *testing.B) { benchUnary(b, Logistic) }) }
func BenchmarkErf(b *testing.B)      { both(b, func(b *testing.B) { benchUnary(b, Erf) }) }
func BenchmarkLog1p(b *testing.B)    { both(b, func(b *testing.B) { benchUnary(b, Log1p) }) }
func BenchmarkExpm1(b *testing.B)    { both(b, func(b *testing.B) { benchUnary(b, Expm1) }) }
func BenchmarkSqrt(b *testing.B)     { both(b, func(b *testing.B) { benchUnary(b, Sqrt) }) }
func BenchmarkNeg(b *testing.B)      { both(b, func(b *testing.B) { benchUnary(b, Neg) }) }
func BenchmarkAdd(b *testing.B)      { both(b, func(b *testing.B) { benchBinary(b, Add) }) }
func BenchmarkMul(b *testing.B)      { both(b, func(b *testing.B) { benchBinary(b, Mul) }) }
func BenchmarkDiv(b *testing.B)      { both(b, func(b *testing.B) { benchBinary(b, Div) }) }
func BenchmarkMax(b *testing.B)      { both(b, func(b *testing.B) { benchBinary(b, Max) }) }

// BenchmarkTanhRef is float32(math.Tanh(float64(x))), the kernel eval used.
func BenchmarkTanhRef(b *testing.B) {
	benchUnary(b, func(dst, x []float32) {
		for i, v := range x {
			dst[i] = float32(tanh64(float64(v)))
		}
	})
}
