package gemm

//go:generate sh -c "cd _asm && go run . -out ../kernel_amd64.s -stubs ../kernel_amd64_stub.go"

import "github.com/ferryml/ferry/cpu/cpufeat"

// CPU features (package cpufeat, shared with package vmath).
// hasAVX2FMA: AVX2 and FMA3, with YMM state enabled by the OS;
// hasAVX512F: AVX-512F as well, with ZMM and opmask state enabled.
var hasAVX2FMA, hasAVX512F = cpufeat.AVX2FMA, cpufeat.AVX512F

// The shapes must match the generator's specs in _asm/main.go.
var avx512Kernels = &kernelSet{
	name: "avx512",
	s:    kernel[float32]{fn: sgemmKernelAVX512, fnA: sgemmKernelAVX512A, mr: 6, nr: 64, mc: 144, kc: 384, nc: 4096},
	d:    kernel[float64]{fn: dgemmKernelAVX512, mr: 6, nr: 32, mc: 144, kc: 384, nc: 4096},
}

var avx2Kernels = &kernelSet{
	name: "avx2",
	s:    kernel[float32]{fn: sgemmKernelAVX2, fnA: sgemmKernelAVX2A, mr: 6, nr: 16, mc: 144, kc: 384, nc: 4096},
	d:    kernel[float64]{fn: dgemmKernelAVX2, mr: 6, nr: 8, mc: 144, kc: 384, nc: 4096},
}

func archKernels() []*kernelSet {
	var ks []*kernelSet
	if hasAVX512F {
		ks = append(ks, avx512Kernels)
	}
	if hasAVX2FMA {
		ks = append(ks, avx2Kernels)
	}
	return ks
}
