package gemm

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkSgemm measures square C = A*B with the active kernel (set
// FERRY_GEMM_KERNEL to pick another) and reports GFLOP/s.
func BenchmarkSgemm(b *testing.B) {
	for _, n := range []int{256, 512, 1024, 2048} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			a, bb, c := randMat32(n*n, 1), randMat32(n*n, 2), make([]float32, n*n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				Sgemm(false, false, n, n, n, 1, a, n, bb, n, 0, c, n)
			}
			b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkDgemm is BenchmarkSgemm for float64.
func BenchmarkDgemm(b *testing.B) {
	for _, n := range []int{256, 512, 1024} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			a, bb, c := randMat64(n*n, 1), randMat64(n*n, 2), make([]float64, n*n)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				Dgemm(false, false, n, n, n, 1, a, n, bb, n, 0, c, n)
			}
			b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func randMat32(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0))
	s := make([]float32, n)
	for i := range s {
		s[i] = rng.Float32()*2 - 1
	}
	return s
}

func randMat64(n int, seed uint64) []float64 {
	rng := rand.New(rand.NewPCG(seed, 0))
	s := make([]float64, n)
	for i := range s {
		s[i] = rng.Float64()*2 - 1
	}
	return s
}
