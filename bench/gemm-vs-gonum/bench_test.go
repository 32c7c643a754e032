package gemmcmp

import (
	"fmt"
	"testing"
)

var benchSizes = []int{256, 512, 1024, 2048}

func bench(b *testing.B, pick func(ferry, gonum func()) func()) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			f := pick(Sgemm(n))
			f()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f()
			}
			b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkSgemmFerry times Ferry's Sgemm on square matrices.
func BenchmarkSgemmFerry(b *testing.B) { bench(b, func(f, _ func()) func() { return f }) }

// BenchmarkSgemmGonum times gonum's Sgemm on the same matrices.
func BenchmarkSgemmGonum(b *testing.B) { bench(b, func(_, g func()) func() { return g }) }

func TestCompare(t *testing.T) {
	r := Compare([]int{64}, 0, 1)
	if len(r) != 1 || r[0].Ferry <= 0 || r[0].Gonum <= 0 {
		t.Fatalf("Compare = %+v", r)
	}
}
