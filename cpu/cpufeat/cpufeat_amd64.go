package cpufeat

// Assembly in cpufeat_amd64.s.

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

func detect() (avx2fma, avx512f, bmi2 bool) {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false, false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const (
		fma     = 1 << 12
		osxsave = 1 << 27
		avx     = 1 << 28
	)
	if ecx1&(fma|osxsave|avx) != fma|osxsave|avx {
		return false, false, false
	}
	xcr0, _ := xgetbv()
	if xcr0&0x6 != 0x6 { // SSE and AVX state
		return false, false, false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	const avx2, bmi2Bit, avx512fBit = 1 << 5, 1 << 8, 1 << 16
	avx2fma = ebx7&avx2 != 0
	avx512f = avx2fma && ebx7&avx512fBit != 0 && xcr0&0xe0 == 0xe0 // opmask, ZMM_Hi256, Hi16_ZMM state
	bmi2 = avx2fma && ebx7&bmi2Bit != 0
	return avx2fma, avx512f, bmi2
}
