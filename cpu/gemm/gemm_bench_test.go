package gemm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/cpu/internal/parallel"
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

// smallShapes are the products of the Transformer example's train step
// (batch 32 × seq 64 = 2048 tokens, d_model 128, 4 heads of 32, 4×128 MLP,
// vocabulary 96): the forward products, the backward pass's transposed
// ones (transA: weight gradients; transB: input gradients) and the
// per-head attention products, batched over 32×4 = 128 heads; then the
// MLP example's.
var smallShapes = []struct {
	name           string
	transA, transB bool
	batch, m, n, k int
}{
	{"2048x128x128", false, false, 1, 2048, 128, 128},
	{"2048x384x128", false, false, 1, 2048, 384, 128},
	{"2048x512x128", false, false, 1, 2048, 512, 128},
	{"2048x128x512", false, false, 1, 2048, 128, 512},
	{"2048x96x128", false, false, 1, 2048, 96, 128},
	{"2048x128x128_tB", false, true, 1, 2048, 128, 128},
	{"2048x128x384_tB", false, true, 1, 2048, 128, 384},
	{"2048x512x128_tB", false, true, 1, 2048, 512, 128},
	{"128x128x2048_tA", true, false, 1, 128, 128, 2048},
	{"128x512x2048_tA", true, false, 1, 128, 512, 2048},
	{"512x128x2048_tA", true, false, 1, 512, 128, 2048},
	{"attn_64x64x32_tB_b128", false, true, 128, 64, 64, 32},
	{"attn_64x32x64_b128", false, false, 128, 64, 32, 64},
	{"attn_64x64x32_b128", false, false, 128, 64, 64, 32},
	{"attn_64x32x64_tA_b128", true, false, 128, 64, 32, 64},
	// examples/mlp (batch 128, 784→512→10) and bench/vsjax's 128×128×256.
	{"mlp_128x512x784", false, false, 1, 128, 512, 784},
	{"mlp_784x512x128_tA", true, false, 1, 784, 512, 128},
	{"mlp_128x784x512_tB", false, true, 1, 128, 784, 512},
	{"128x128x256", false, false, 1, 128, 128, 256},
}

// BenchmarkSgemmSmall measures the Transformer step's product shapes
// (smallShapes) and reports GFLOP/s. Run it with a fixed -benchtime (say
// 200x) under /usr/bin/time to see the CPU time beside the wall time.
func BenchmarkSgemmSmall(b *testing.B) {
	for _, s := range smallShapes {
		b.Run(s.name, func(b *testing.B) {
			a := randMat32(s.batch*s.m*s.k, 1)
			bb := randMat32(s.batch*s.k*s.n, 2)
			c := make([]float32, s.batch*s.m*s.n)
			lda, ldb := s.k, s.n
			if s.transA {
				lda = s.m
			}
			if s.transB {
				ldb = s.k
			}
			b.ResetTimer()
			cpu0 := parallel.CPUTime()
			for i := 0; i < b.N; i++ {
				SgemmStrided(s.transA, s.transB, s.batch, s.m, s.n, s.k, 1, a, lda, s.m*s.k, bb, ldb, s.k*s.n, 0, c, s.n, s.m*s.n)
			}
			flop := 2 * float64(s.batch*s.m*s.n*s.k) * float64(b.N)
			b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			// On a shared machine the wall time mostly measures the
			// others' load; the process's CPU time (all threads, spinning
			// included) measures what the product costs.
			if cpu := parallel.CPUTime() - cpu0; cpu > 0 {
				b.ReportMetric(flop/cpu/1e9, "GFLOP/cpu-s")
			}
		})
	}
}

// BenchmarkSgemmHalf measures bf16 products rounded to bf16 against the
// former route (widen both operands, Sgemm, round), and reports GFLOP/s.
func BenchmarkSgemmHalf(b *testing.B) {
	for _, n := range []int{128, 512, 1024} {
		a16, b16, c16 := make([]uint16, n*n), make([]uint16, n*n), make([]uint16, n*n)
		for i, v := range randMat32(n*n, 3) {
			a16[i] = f32ToBF16(v)
		}
		for i, v := range randMat32(n*n, 4) {
			b16[i] = f32ToBF16(v)
		}
		flop := 2 * float64(n) * float64(n) * float64(n)
		b.Run(fmt.Sprintf("n=%d/direct", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				SgemmHalf(BF16, false, false, n, n, n, 1, a16, n, b16, n, 0, c16, n)
			}
			b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(fmt.Sprintf("n=%d/widened", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				a, bb, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
				widenRow(BF16, a, a16)
				widenRow(BF16, bb, b16)
				Sgemm(false, false, n, n, n, 1, a, n, bb, n, 0, c, n)
				narrowRow(BF16, c16, c)
			}
			b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// weightShapes are the dense layers of all-MiniLM-L6-v2 at 8 × 32 tokens
// (M = 256; d_model 384, feed-forward 1536) and at 1 × 32, with the weight
// stored [out, in] (transB) as Hugging Face keeps it, and [in, out].
var weightShapes = []struct {
	name    string
	transB  bool
	m, n, k int
}{
	{"256x384x384_tB", true, 256, 384, 384},
	{"256x1536x384_tB", true, 256, 1536, 384},
	{"256x384x1536_tB", true, 256, 384, 1536},
	{"256x1536x384", false, 256, 1536, 384},
	{"32x384x384_tB", true, 32, 384, 384},
	{"32x1536x384_tB", true, 32, 1536, 384},
}

// BenchmarkSgemmWeights measures products by a weight matrix packed at
// every call (pack) and read packed from the packed-weight cache (cached:
// its memory declared read-only), and reports GFLOP/s and GFLOP per
// CPU-second.
func BenchmarkSgemmWeights(b *testing.B) {
	for _, s := range weightShapes {
		for _, cached := range []bool{false, true} {
			name := s.name + "/pack"
			if cached {
				name = s.name + "/cached"
			}
			b.Run(name, func(b *testing.B) {
				a, w, c := randMat32(s.m*s.k, 1), randMat32(s.k*s.n, 2), make([]float32, s.m*s.n)
				ldb := s.n
				if s.transB {
					ldb = s.k
				}
				if cached {
					ReadOnly(bytesOf(w))
					defer Forget(bytesOf(w))
					for range 2 { // seen, then packed
						Sgemm(false, s.transB, s.m, s.n, s.k, 1, a, s.k, w, ldb, 0, c, s.n)
					}
				}
				b.ResetTimer()
				cpu0 := parallel.CPUTime()
				for i := 0; i < b.N; i++ {
					Sgemm(false, s.transB, s.m, s.n, s.k, 1, a, s.k, w, ldb, 0, c, s.n)
				}
				flop := 2 * float64(s.m*s.n*s.k) * float64(b.N)
				b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				if cpu := parallel.CPUTime() - cpu0; cpu > 0 {
					b.ReportMetric(flop/cpu/1e9, "GFLOP/cpu-s")
				}
			})
		}
	}
}
