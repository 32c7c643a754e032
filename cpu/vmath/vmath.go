// Package vmath holds float32 vector kernels over slices: the
// transcendental functions of Ferry's elementwise ops (Exp, Log, Log1p,
// Expm1, Tanh, Erf, Logistic) and plain arithmetic (Add, Sub, Mul, Div,
// Max, Min, Neg, Abs, Sqrt, Rsqrt).
//
// Numerics: arithmetic, Neg, Abs and Sqrt are exact (IEEE single rounding,
// as Go's float32 operators); Max and Min follow eval (x > y ? x : y, x when x
// is NaN). The transcendental functions are within 2 ulp of the correctly
// rounded value (measured against Go's math in float64, rounded to float32;
// see vmath_test.go), with IEEE special values (±0, ±inf, NaN, subnormal
// inputs and results). Log1p and Expm1 round math.Log1p/math.Expm1.
//
// NaNs follow one rule on every path (AVX-512, AVX2, pure Go), the one
// x86 arithmetic and XLA's CPU backend follow: Max, Min, Neg, Abs and
// selects move bits (a NaN operand comes out as it went in, a signalling
// NaN included); every other op returns a quiet NaN for a NaN operand, the
// operand's sign and payload with the quiet bit set (Logistic's with the
// sign bit set; a NaN made from numbers, such as Log of a negative, is a
// quiet NaN without payload). TestNaNRule checks it on every path.
//
// Implementations: on linux/amd64 CPUs with AVX-512, or with AVX2 and FMA,
// every kernel is generated code: the op alone compiled on first use by the
// run-time code generator (jit.go; CompileChain) to AVX-512 code over
// 16-lane vectors or AVX2 code over 8-lane vectors, the same generator that
// compiles the executor's fused chains. Pure Go (scalar.go) elsewhere, and
// where FERRY_VMATH=go or FERRY_CPU_JIT=0 (SetJIT) turns generated code
// off.
//
// Each op is therefore written twice, once as vector code and once as the
// scalar reference: its body in jit.go (one body for both instruction
// sets, the AVX2 stand-ins for AVX-512-only instructions chosen inside it)
// and its pure-Go kernel in scalar.go, both with the same constants and
// formulas, checked against each other and against float64 references
// (vmath_test.go). There is no ahead-of-time assembly of the kernels: a
// second emitter (an avo generator, as until 2026-11) would be a third
// copy of every body, and the run-time generator already covers both
// instruction sets, fuses ops into chains, and needs no build step; a
// one-op chain costs one compile on first use (about 1 ms for erf, the
// largest, on the 2-core Zen 5 this was written on). The AVX-512 kernels
// were avo-generated assembly until 2026-11, with the same instruction
// sequences as the generator's AVX-512 bodies: chains were checked bit for
// bit against them on AVX-512 hardware (TestChainMatchesKernels with
// contraction off), and TestCodeHashes pins the generated code of every op
// and a few chains for both instruction sets, so the kernels compute what
// those did, and a change to the code is deliberate.
//
// Adding an op: a constant before opEnd (ops.go), its row in ops (name,
// arity, temporaries for AVX-512 and AVX2, pure-Go kernel, body), the body
// (a gen method in jit.go; with amd64enc encodings for any new
// instruction), the scalar kernel (scalar.go) and the exported function
// (vmath.go), with an accuracy case in vmath_test.go and entries in
// kernel1 or kernel2 (jit_test.go). The opcode checks, the generator's
// temporaries and dispatch, the kernels of every implementation and
// RunProgram derive from the row. The ir op table names the row
// (ir.Lowering.VMath) of the ops it computes; internal/eval and
// cpu/cpuexec derive their kernels and opcodes from that name.
//
// Every element of a call goes through the same instructions, whatever its
// position and the slice length, so splitting a slice into blocks never
// changes a result.
//
// Every function writes dst[i] for i < len(x) (dst must be at least as long;
// other operands as well). dst may be the same slice as an operand.
package vmath

import "github.com/ferryml/ferry/internal/settings"

// impl is a set of kernels, by opcode (f1 for unary ops, f2 for binary
// ones).
type impl struct {
	name string
	f1   [opEnd]func(dst, x []float32)
	f2   [opEnd]func(dst, a, b []float32)
}

var cur = choose(settings.VMath.Get() == "go")

// Impl names the kernels in use: "avx512", "avx2" or "go".
func Impl() string {
	if cur != goImpl && jitOff.Load() {
		return goImpl.name // generated code falls back to Go with the JIT off
	}
	return cur.name
}

// SetGo switches to the pure-Go kernels (on) or back to the best for the CPU
// (off) and returns the previous setting's name. For tests and benchmarks;
// not safe while kernels run.
func SetGo(on bool) string {
	prev := cur.name
	cur = choose(on)
	return prev
}

func choose(goOnly bool) *impl {
	if a := archImpls(); !goOnly && len(a) > 0 {
		return a[0]
	}
	return goImpl
}

// available lists every implementation this machine runs, best first
// (ending with pure Go): for tests and benchmarks, which run each.
func available() []*impl { return append(archImpls(), goImpl) }

// use switches to im and returns the previous implementation (tests and
// benchmarks; not safe while kernels run).
func use(im *impl) *impl {
	prev := cur
	cur = im
	return prev
}

// goImpl: the pure-Go kernels of ops.
var goImpl = func() *impl {
	im := &impl{name: "go"}
	for op := OpAdd; op < opEnd; op++ {
		im.f1[op], im.f2[op] = ops[op].go1, ops[op].go2
	}
	return im
}()

func map1(f func(float32) float32) func(dst, x []float32) {
	return func(dst, x []float32) {
		dst = dst[:len(x)]
		for i, v := range x {
			dst[i] = f(v)
		}
	}
}

// Exp sets dst[i] = e^x[i].
func Exp(dst, x []float32) { cur.f1[OpExp](dst, x) }

// Log sets dst[i] = ln x[i].
func Log(dst, x []float32) { cur.f1[OpLog](dst, x) }

// Tanh sets dst[i] = tanh x[i].
func Tanh(dst, x []float32) { cur.f1[OpTanh](dst, x) }

// Logistic sets dst[i] = 1/(1+e^-x[i]).
func Logistic(dst, x []float32) { cur.f1[OpLogistic](dst, x) }

// Erf sets dst[i] = erf x[i].
func Erf(dst, x []float32) { cur.f1[OpErf](dst, x) }

// Rsqrt sets dst[i] = 1/sqrt(x[i]) as XLA's CPU backend computes it: the
// correctly rounded square root, then a correctly rounded division (within
// 1 ulp of the correctly rounded reciprocal square root).
func Rsqrt(dst, x []float32) { cur.f1[OpRsqrt](dst, x) }

// Log1p sets dst[i] = ln(1+x[i]).
func Log1p(dst, x []float32) { map1(log1p32)(dst, x) }

// Expm1 sets dst[i] = e^x[i] - 1.
func Expm1(dst, x []float32) { map1(expm132)(dst, x) }

// Sqrt sets dst[i] = √x[i] (correctly rounded).
func Sqrt(dst, x []float32) { cur.f1[OpSqrt](dst, x) }

// Neg sets dst[i] = -x[i] (the sign bit flipped, NaN included).
func Neg(dst, x []float32) { cur.f1[OpNeg](dst, x) }

// Abs sets dst[i] = |x[i]| (the sign bit cleared).
func Abs(dst, x []float32) { cur.f1[OpAbs](dst, x) }

// Add sets dst[i] = a[i] + b[i].
func Add(dst, a, b []float32) { cur.f2[OpAdd](dst, a, b) }

// Sub sets dst[i] = a[i] - b[i].
func Sub(dst, a, b []float32) { cur.f2[OpSub](dst, a, b) }

// Mul sets dst[i] = a[i] * b[i].
func Mul(dst, a, b []float32) { cur.f2[OpMul](dst, a, b) }

// Div sets dst[i] = a[i] / b[i].
func Div(dst, a, b []float32) { cur.f2[OpDiv](dst, a, b) }

// Max sets dst[i] = a[i] if a[i] > b[i] or a[i] is NaN, else b[i].
func Max(dst, a, b []float32) { cur.f2[OpMax](dst, a, b) }

// Min sets dst[i] = a[i] if a[i] < b[i] or a[i] is NaN, else b[i].
func Min(dst, a, b []float32) { cur.f2[OpMin](dst, a, b) }

// The scalar pure-Go kernels.

// Exp32 is e^x in float32 (the pure-Go kernel of Exp).
func Exp32(x float32) float32 { return exp32(x) }

// Log32 is ln x in float32.
func Log32(x float32) float32 { return log32(x) }

// Tanh32 is tanh x in float32.
func Tanh32(x float32) float32 { return tanh32(x) }

// Logistic32 is 1/(1+e^-x) in float32.
func Logistic32(x float32) float32 { return logistic32(x) }

// Erf32 is erf x in float32.
func Erf32(x float32) float32 { return erf32(x) }

func sqrtGo(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = float32(sqrt64(float64(v))) // exact: double rounding of sqrt is innocuous
	}
}

func rsqrtGo(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = 1 / float32(sqrt64(float64(v)))
	}
}

func negGo(dst, x []float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = -v
	}
}

func addGo(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	for i, v := range a {
		dst[i] = v + b[i]
	}
}

func subGo(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	for i, v := range a {
		dst[i] = v - b[i]
	}
}

func mulGo(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	for i, v := range a {
		dst[i] = v * b[i]
	}
}

func divGo(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	for i, v := range a {
		dst[i] = v / b[i]
	}
}

func maxGo(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	for i, x := range a {
		if y := b[i]; x != x || x > y {
			dst[i] = x
		} else {
			dst[i] = y
		}
	}
}

func minGo(dst, a, b []float32) {
	dst, b = dst[:len(a)], b[:len(a)]
	for i, x := range a {
		if y := b[i]; x != x || x < y {
			dst[i] = x
		} else {
			dst[i] = y
		}
	}
}
