package vmath

import "unsafe"

//go:generate sh -c "cd _asm && go run . -out ../vmath_amd64.s -stubs ../vmath_amd64_stub.go"

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

// archImpls lists the kernels this CPU runs, best first.
func archImpls() []*impl {
	var l []*impl
	if hasAVX512 {
		l = append(l, avx512Impl)
	}
	if hasAVX2 && jitExecOK {
		l = append(l, avx2Impl)
	}
	return l
}

var avx512Impl = &impl{
	name: "avx512",
	exp:  asm1(expAVX512), log: asm1(logAVX512), tanh: asm1(tanhAVX512),
	logistic: asm1(logisticAVX512), erf: asm1(erfAVX512),
	sqrt: asm1(sqrtAVX512), neg: asm1(negAVX512), abs: asm1(absAVX512),
	add: asm2(addAVX512), sub: asm2(subAVX512), mul: asm2(mulAVX512), div: asm2(divAVX512),
	maxf: asm2(maxAVX512), minf: asm2(minAVX512),
}

func asm1(k func(dst, a *float32, n int)) func(dst, x []float32) {
	return func(dst, x []float32) {
		n := len(x)
		if n == 0 {
			return
		}
		_ = dst[n-1]
		k(&dst[0], &x[0], n)
	}
}

func asm2(k func(dst, a, b *float32, n int)) func(dst, a, b []float32) {
	return func(dst, a, b []float32) {
		n := len(a)
		if n == 0 {
			return
		}
		_, _ = dst[n-1], b[n-1]
		k(&dst[0], &a[0], &b[0], n)
	}
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

func runProgram(code []Instr, vals []*float32, n int) int {
	m := n &^ (ProgramChunk - 1)
	if cur != avx512Impl || len(code) == 0 || len(vals) == 0 || m == 0 {
		return 0
	}
	ok := func(i int32) bool { return uint32(i) < uint32(len(vals)) && vals[i] != nil }
	for _, in := range code {
		if in.Op&^(0xff|AccA|AccB|NoStore) != 0 || !ok(in.Dst) || !ok(in.A) || !ok(in.B) {
			panic("vmath: bad program instruction")
		}
	}
	progAVX512(&code[0].Op, len(code), &vals[0], m)
	return m
}
