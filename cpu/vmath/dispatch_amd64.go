package vmath

import (
	"unsafe"

	"github.com/ferryml/ferry/cpu/cpufeat"
)

// Assembly in cpu_amd64.s.

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
// by the OS, hasAVX2 AVX2 and FMA with the YMM state enabled (package
// cpufeat, shared with package gemm).
var hasAVX512, hasAVX2 = cpufeat.AVX512F && cpufeat.BMI2, cpufeat.AVX2FMA

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
