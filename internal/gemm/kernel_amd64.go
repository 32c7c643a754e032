package gemm

//go:generate sh -c "cd _asm && go run . -out ../kernel_amd64.s -stubs ../kernel_amd64_stub.go"

// CPU features, read with CPUID and XGETBV (the OS must save the vector state).
// hasAVX2FMA: AVX2 and FMA3, with YMM state enabled by the OS;
// hasAVX512F: AVX-512F as well, with ZMM and opmask state enabled.
var hasAVX2FMA, hasAVX512F = detectCPU()

func detectCPU() (avx2fma, avx512f bool) {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const (
		fma     = 1 << 12
		osxsave = 1 << 27
		avx     = 1 << 28
	)
	if ecx1&(fma|osxsave|avx) != fma|osxsave|avx {
		return false, false
	}
	xcr0, _ := xgetbv()
	if xcr0&0x6 != 0x6 { // SSE and AVX state
		return false, false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	avx2fma = ebx7&(1<<5) != 0
	avx512f = avx2fma && ebx7&(1<<16) != 0 && xcr0&0xe0 == 0xe0 // opmask, ZMM_Hi256, Hi16_ZMM state
	return avx2fma, avx512f
}

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
