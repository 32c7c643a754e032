package vmath

import "unsafe"

// Assembly in cpu_amd64.s.

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// storeNT copies n bytes (a multiple of 64, dst 64-byte aligned) with
// non-temporal stores (AVX-512 only).
//
//go:noescape
func storeNT(dst, src *byte, n int)

func sfence()

// prefetchT0 and prefetchT1 prefetch every 64-byte line of [p, p+n).
//
//go:noescape
func prefetchT0(p *byte, n int)

//go:noescape
func prefetchT1(p *byte, n int)

// hasAVX512 reports AVX-512F and BMI2 with the ZMM and opmask state enabled
// by the OS, hasAVX2 AVX2 and FMA with the YMM state enabled (CPUID and
// XGETBV, as package gemm).
var hasAVX512, hasAVX2 = detectCPU()

func detectCPU() (avx512, avx2 bool) {
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
	const avx2f, bmi2, avx512f = 1 << 5, 1 << 8, 1 << 16
	avx2 = ebx7&avx2f != 0
	avx512 = xcr0&0xe6 == 0xe6 && // opmask, ZMM_Hi256, Hi16_ZMM state
		ebx7&(avx2f|bmi2|avx512f) == avx2f|bmi2|avx512f
	return avx512, avx2
}

// archImpls lists the kernels this CPU runs, best first: generated code
// (jitimpl.go), where it can be mapped and run.
func archImpls() []*impl {
	var l []*impl
	if hasAVX512 && jitExecOK {
		l = append(l, avx512Impl)
	}
	if hasAVX2 && jitExecOK {
		l = append(l, avx2Impl)
	}
	return l
}

// Prefetch asks the CPU to bring b into the cache closest to it (l1) or
// into L2.
func Prefetch(b []byte, l1 bool) {
	if len(b) == 0 {
		return
	}
	if l1 {
		prefetchT0(&b[0], len(b))
	} else {
		prefetchT1(&b[0], len(b))
	}
}

// StoreNT copies src to dst (len(src) bytes) with non-temporal stores where
// the CPU has AVX-512 (plain copy elsewhere and at unaligned ends): for
// large results not read again soon, it saves reading the destination
// lines into the cache. Call Fence before other goroutines read dst.
func StoreNT(dst, src []byte) {
	n := len(src)
	dst = dst[:n]
	if !hasAVX512 || n < 256 {
		copy(dst, src)
		return
	}
	head := int((64 - uintptr(unsafe.Pointer(&dst[0]))%64) % 64)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	if body > 0 {
		storeNT(&dst[head], &src[head], body)
	}
	copy(dst[head+body:], src[head+body:])
}

// Fence orders the non-temporal stores of StoreNT before later stores.
func Fence() {
	if hasAVX512 {
		sfence()
	}
}
