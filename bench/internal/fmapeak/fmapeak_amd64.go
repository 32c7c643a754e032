package fmapeak

import "github.com/ferryml/ferry/cpu/cpufeat"

// iterations of the assembly loops per call: about 0.1 ms, short enough
// for the scheduler to preempt between calls.
const iterations = 1 << 15

//go:noescape
func fmaAVX2(n int)

//go:noescape
func fmaAVX512(n int)

// avx512: the CPU and OS run AVX-512 code (package cpufeat, the detection
// package gemm chooses its micro-kernels by).
var avx512 = cpufeat.AVX512F

func flopsPerCall() (float64, string) {
	if !cpufeat.AVX2FMA {
		return goFlopsPerCall, "go"
	}
	if avx512 {
		return iterations * 12 * 16 * 2, "avx512"
	}
	return iterations * 12 * 8 * 2, "avx2"
}

func fmaLoop() {
	if !cpufeat.AVX2FMA {
		goLoop()
		return
	}
	if avx512 {
		fmaAVX512(iterations)
	} else {
		fmaAVX2(iterations)
	}
}
