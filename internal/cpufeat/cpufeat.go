// Package cpufeat reports the x86-64 vector features Ferry's kernels
// choose between (internal/gemm, internal/vmath): one CPUID and XGETBV
// probe at start-up, so every package agrees on what the CPU and the
// operating system support. A feature counts only when the OS saves the
// register state it needs (XGETBV's XCR0). On other architectures every
// flag is false.
package cpufeat

// The features, set once at package initialisation.
var (
	// AVX2FMA: AVX2 and FMA3, with the YMM (AVX) state enabled by the OS.
	AVX2FMA bool
	// AVX512F: AVX-512 Foundation with the opmask, ZMM_Hi256 and Hi16_ZMM
	// state enabled, on a CPU that has AVX2FMA as well.
	AVX512F bool
	// BMI2: the BMI2 instructions (PDEP, PEXT, SHLX, ...), on a CPU that
	// has AVX2FMA as well.
	BMI2 bool
)

func init() { AVX2FMA, AVX512F, BMI2 = detect() }
