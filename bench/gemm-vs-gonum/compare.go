// Package gemmcmp measures Ferry's CPU matrix product (cpu/gemm)
// against gonum's pure-Go BLAS in the same process, so that the ratio holds
// on a shared, noisy machine. It is its own module so that the main module
// does not depend on gonum.
//
//	go run ./cmd/gemm-vs-gonum            # table for n = 256..2048
//	go test -bench . -benchtime 2x         # the same as benchmarks
package gemmcmp

import (
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/ferryml/ferry/cpu/gemm"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Result is one size's measurement: the best of several interleaved
// rounds for each implementation.
type Result struct {
	N              int     // square size
	Threads        int     // GOMAXPROCS during the run
	Kernel         string  // Ferry's micro-kernel
	Ferry, Gonum   float64 // GFLOP/s
	Ratio          float64 // Ferry / Gonum
	FerryT, GonumT time.Duration
}

// Sgemm returns the two implementations' C = A*B for n×n float32 matrices,
// as functions to time.
func Sgemm(n int) (ferry, gonumFn func()) {
	a, b, c := Rand(n*n, 1), Rand(n*n, 2), make([]float32, n*n)
	var impl gonum.Implementation
	ferry = func() { gemm.Sgemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n) }
	gonumFn = func() { impl.Sgemm(blas.NoTrans, blas.NoTrans, n, n, n, 1, a, n, b, n, 0, c, n) }
	return ferry, gonumFn
}

// Rand returns n uniform values in [-1, 1).
func Rand(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0))
	s := make([]float32, n)
	for i := range s {
		s[i] = rng.Float32()*2 - 1
	}
	return s
}

// Compare times Ferry's and gonum's Sgemm for each size with GOMAXPROCS
// set to threads (0 leaves it), alternating the two for rounds rounds and
// keeping each one's best time.
func Compare(sizes []int, threads, rounds int) []Result {
	if threads > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
	}
	var out []Result
	for _, n := range sizes {
		f, g := Sgemm(n)
		r := Result{N: n, Threads: runtime.GOMAXPROCS(0), Kernel: gemm.Kernel()}
		f()
		g()
		r.FerryT, r.GonumT = time.Hour, time.Hour
		for i := 0; i < rounds; i++ {
			r.FerryT = min(r.FerryT, timeIt(f, 20))
			r.GonumT = min(r.GonumT, timeIt(g, 2))
		}
		flop := 2 * float64(n) * float64(n) * float64(n)
		r.Ferry = flop / r.FerryT.Seconds() / 1e9
		r.Gonum = flop / r.GonumT.Seconds() / 1e9
		r.Ratio = r.Ferry / r.Gonum
		out = append(out, r)
	}
	return out
}

// timeIt returns the time of one call of f, averaged over enough calls to
// last about minMS milliseconds.
func timeIt(f func(), minMS int) time.Duration {
	reps := 1
	for {
		t0 := time.Now()
		for i := 0; i < reps; i++ {
			f()
		}
		d := time.Since(t0)
		if d >= time.Duration(minMS)*time.Millisecond || reps >= 1<<20 {
			return d / time.Duration(reps)
		}
		reps *= 2
	}
}
