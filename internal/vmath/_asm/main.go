// Command _asm generates the AVX-512 kernels of package vmath with avo.
//
// Run it from this directory (go generate in package vmath does so):
//
//	go run . -out ../vmath_amd64.s -stubs ../vmath_amd64_stub.go
//
// Every kernel maps n float32 elements: a main loop over whole 16-lane
// vectors and one masked tail (so every element goes through the same
// instructions, whatever its position). The formulas are those of the
// pure-Go scalar kernels in ../scalar.go, evaluated with fused multiply-adds:
// constants are broadcast from memory, special values are fixed with
// compares and blends.
package main

import (
	"flag"
	"fmt"
	"math"
	"slices"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// Must match ../scalar.go.
const (
	log2e    = 1.44269504088896341
	ln2Hi    = 0.693359375
	ln2Lo    = -2.12194440e-4
	sqrtHf   = 0.707106781186547524
	expHi    = 89
	expLo    = -104
	ln2F32   = 0.693147182464599609375 // float32(ln 2)
	ln2F32Lo = -1.904654323148236e-09  // ln 2 - ln2F32
	// expShift (1.5 * 2^19, ulp 1/16): x*log2e + expShift rounds x*log2e
	// to a multiple of 1/16.
	expShift = 786432
	expC2    = 5.000162721e-01
	expC3    = 1.666700840e-01
	tanhLo   = 0.625
	tanhHi   = 9.1
	erfMid   = 0.875
	erfHi    = 3.9375
)

var logP = []float32{7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
	1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1}

var tanhP = []float32{-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1}

var erfS = []float32{8.7370725e-05, -0.0008225737, 0.005208063, -0.026862139, 0.11283744, -0.37612638, 0.12837917}

var erfL = []float32{-8.414678e-07, -1.5651069e-05, 0.00029121392, -0.002210701, 0.011352337,
	-0.04690298, -0.8265409, -2.4302197, -1.5328244}

var consts = map[uint32]Mem{}

// c returns a memory operand holding the float32 v.
func c(v float32) Mem { return cbits(math.Float32bits(v)) }

func cbits(b uint32) Mem {
	if m, ok := consts[b]; ok {
		return m
	}
	m := ConstData(fmt.Sprintf("vmc_%08x", b), U32(b))
	consts[b] = m
	return m
}

const (
	signMask = 0x80000000
	absMask  = 0x7fffffff
)

// Comparison predicates (VCMPPS imm8).
const (
	cmpEQ  = 0x00 // EQ_OQ
	cmpLT  = 0x11 // LT_OQ
	cmpGE  = 0x1d // GE_OQ
	cmpUNO = 0x03 // UNORD_Q
)

var Z = []reg.VecPhysical{
	reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7,
	reg.Z8, reg.Z9, reg.Z10, reg.Z11, reg.Z12, reg.Z13, reg.Z14, reg.Z15,
	reg.Z16, reg.Z17, reg.Z18, reg.Z19, reg.Z20, reg.Z21, reg.Z22, reg.Z23,
}

// horner leaves c[0]*t^(n-1)+...+c[n-1] in acc.
func horner(acc, t reg.VecPhysical, cs []float32) {
	VBROADCASTSS(c(cs[0]), acc)
	for _, k := range cs[1:] {
		VFMADD213PS_BCST(c(k), t, acc) // acc = t*acc + k
	}
}

// body computes out from the inputs; temporaries are Z8 and up.
type body func(in []reg.VecPhysical, out reg.VecPhysical)

// expInto: out = e^x (x is preserved). Uses Z16..Z19.
//
// e^x = 2^(n + j/16) * e^r: kf = n + j/16 is x*log2e rounded to a multiple
// of 1/16 (by adding expShift, whose ulp is 1/16, so the low four mantissa
// bits of the sum are j), r = x - kf*ln2F32 (one rounding, |r| ≤ ln2/32),
// the rest of kf*ln2 added to e^r - 1 (where it is a relative correction
// of 2^-22 at most, so r's polynomial need not see it), 2^(j/16)
// comes from 16-entry tables by VPERMPS (which reads the low four bits of
// each index lane) as T(1 + d) with d T's relative rounding error, e^r - 1
// is r(1 + r(expC2 + expC3 r)), 2^(j/16) e^r is T + T(e^r - 1 + d), and
// VSCALEFPS multiplies by 2^floor(kf) = 2^n, overflowing to +inf and underflowing
// through the subnormals with one rounding.
func expInto(x, out reg.VecPhysical) {
	t0, t1 := Z[16], Z[17]
	VBROADCASTSS(c(expLo), t1)
	VMAXPS(x, t1, t0) // NaN: x
	VBROADCASTSS(c(expHi), t1)
	VMINPS(t0, t1, t0)
	expCore(t0, out)
}

// expCore: out = e^t0 for t0 in [expLo, expHi] or NaN (t0 is clobbered).
// Uses Z17..Z19.
func expCore(t0, out reg.VecPhysical) {
	t1, t2, t3 := Z[17], Z[18], Z[19]
	VBROADCASTSS(c(expShift), t1)
	VFMADD231PS_BCST(c(log2e), t0, t1)     // kf + expShift
	VSUBPS_BCST(c(expShift), t1, t2)       // kf
	VFNMADD231PS_BCST(c(ln2F32), t2, t0)   // r = x - kf*ln2F32, one rounding
	VPERMPS(expTable(0), t1, out)          // T: 2^(j/16) rounded
	VPERMPS(expTable(1), t1, t1)           // d = (2^(j/16) - T) / T
	VFNMADD231PS_BCST(c(ln2F32Lo), t2, t1) // d - kf*(ln 2 - ln2F32)
	VBROADCASTSS(c(expC2), t3)
	VFMADD231PS_BCST(c(expC3), t0, t3)
	VFMADD213PS_BCST(c(1), t0, t3)
	VFMADD213PS(t1, t0, t3)   // e^r - 1 + d
	VFMADD213PS(out, out, t3) // ≈ 2^(j/16) e^r
	VSCALEFPS(t2, t3, out)
}

var expTabs [2]Mem

// expTable returns the table of T = 2^(j/16) rounded to float32, j = 0..15
// (which 0), or of the relative rounding errors (2^(j/16) - T) / T (which
// 1), folded into e^r - 1 so that the result carries no table error.
func expTable(which int) Mem {
	if expTabs[which].Symbol.Name == "" {
		expTabs[which] = GLOBL(fmt.Sprintf("vmtab_exp2_%d", which), RODATA|NOPTR)
		for j := range 16 {
			v := math.Exp2(float64(j) / 16)
			t := float64(float32(v))
			if which == 1 {
				t = (v - t) / t
			}
			DATA(4*j, U32(math.Float32bits(float32(t))))
		}
	}
	return expTabs[which]
}

// copysign: out = |out| with the sign of x (bitwise select by the sign mask).
func copysign(out, x, tmp reg.VecPhysical) {
	VPBROADCASTD_m(signMask, tmp)
	VPTERNLOGD(U8(0xB8), x, tmp, out) // out = tmp ? x : out
}

func VPBROADCASTD_m(b uint32, z reg.VecPhysical) { VBROADCASTSS(cbits(b), z) }

func expBody(in []reg.VecPhysical, out reg.VecPhysical) { expInto(in[0], out) }

func tanhBody(in []reg.VecPhysical, out reg.VecPhysical) {
	x := in[0]
	a, z, s, t, e := Z[8], Z[9], Z[10], Z[11], Z[12]
	VPANDD_BCST(cbits(absMask), x, a)
	VMULPS(x, x, z)
	horner(s, z, tanhP)
	VMULPS(x, z, t)
	VFMADD213PS(x, t, s) // small = t*s + x
	// large = 1 - 2/(e^(2a)+1), 2a clamped to 2*tanhHi (NaN kept)
	VADDPS(a, a, t)
	VBROADCASTSS(c(2*tanhHi), e)
	VMINPS(t, e, t) // [0, 2*tanhHi] or NaN: no clamps
	expCore(t, e)
	VADDPS_BCST(c(1), e, e) // d
	VBROADCASTSS(c(2), out)
	VDIVPS(e, out, t) // 2/d (see logisticBody's note on VDIVPS)
	VBROADCASTSS(c(1), out)
	VSUBPS(t, out, out)
	VCMPPS_BCST(U8(cmpLT), c(tanhLo), a, reg.K2)
	VBLENDMPS(s, out, reg.K2, out)
	copysign(out, x, t)
}

func logisticBody(in []reg.VecPhysical, out reg.VecPhysical) {
	x := in[0]
	n, e, num := Z[8], Z[9], Z[10]
	VPORD_BCST(cbits(signMask), x, n) // -|x|
	VBROADCASTSS(c(expLo), e)
	VMAXPS(n, e, n) // ≥ expLo, or NaN
	expCore(n, e)
	VBROADCASTSS(c(1), num)
	VXORPS(n, n, n)
	VCMPPS(U8(cmpLT), n, x, reg.K2) // x < 0
	VBLENDMPS(e, num, reg.K2, num)
	VADDPS_BCST(c(1), e, e)
	// A correctly rounded VDIVPS: with the table exp, the FMA pipe is the
	// bottleneck of logistic, tanh and gelu, and the divider runs beside
	// it, so one VDIVPS beat VRCP14PS with a Newton step (four FMA-pipe
	// ops): logistic 8.2 → 6.7 and gelu 13.0 → 12.1 cycles per vector in
	// L1 (bench/RESULTS.md, 2026-11-25, third session).
	VDIVPS(e, num, out)
}

func erfBody(in []reg.VecPhysical, out reg.VecPhysical) {
	x := in[0]
	a, z, s, t, q := Z[8], Z[9], Z[10], Z[11], Z[12]
	VPANDD_BCST(cbits(absMask), x, a)
	VMULPS(x, x, z)
	horner(s, z, erfS)
	VFMADD213PS(x, x, s) // small = x*s + x
	VBROADCASTSS(c(erfHi), t)
	VMINPS(a, t, t) // NaN: a
	VSUBPS_BCST(c(erfMid), t, t)
	horner(q, t, erfL)
	expInto(q, t)
	VBROADCASTSS(c(1), out)
	VSUBPS(t, out, out)
	VCMPPS_BCST(U8(cmpGE), c(erfHi), a, reg.K2)
	VBROADCASTSS(c(1), t)
	VBLENDMPS(t, out, reg.K2, out)
	VCMPPS_BCST(U8(cmpLT), c(erfMid), a, reg.K2)
	VBLENDMPS(s, out, reg.K2, out)
	copysign(out, x, t)
}

func logBody(in []reg.VecPhysical, out reg.VecPhysical) {
	x := in[0]
	m, e, f, z, y, t := Z[8], Z[9], Z[10], Z[11], Z[12], Z[13]
	VGETMANTPS(U8(0x02), x, m) // [0.5, 1)
	VGETEXPPS(x, e)
	VADDPS_BCST(c(1), e, e)
	VCMPPS_BCST(U8(cmpLT), c(sqrtHf), m, reg.K2)
	VADDPS(m, m, reg.K2, m)
	VSUBPS_BCST(c(1), e, reg.K2, e)
	VSUBPS_BCST(c(1), m, f)
	VMULPS(f, f, z)
	horner(y, f, logP)
	VMULPS(f, y, y)
	VMULPS(z, y, y)
	VFMADD231PS_BCST(c(ln2Lo), e, y)
	VFNMADD231PS_BCST(c(0.5), z, y) // y -= 0.5*z
	VADDPS(f, y, out)
	VFMADD231PS_BCST(c(ln2Hi), e, out)
	// x == +inf: +inf; x == 0: -inf; x < 0: NaN (NaN stays NaN).
	VCMPPS_BCST(U8(cmpEQ), cbits(0x7f800000), x, reg.K2)
	VMOVAPS(x, reg.K2, out)
	VXORPS(t, t, t)
	VCMPPS(U8(cmpEQ), t, x, reg.K2)
	VBROADCASTSS(cbits(0xff800000), t)
	VMOVAPS(t, reg.K2, out)
	VXORPS(t, t, t)
	VCMPPS(U8(cmpLT), t, x, reg.K2)
	VBROADCASTSS(cbits(0x7fc00000), t)
	VMOVAPS(t, reg.K2, out)
}

func binBody(op func(b, a, dst Op)) body {
	return func(in []reg.VecPhysical, out reg.VecPhysical) { op(in[1], in[0], out) }
}

// maxBody: x > y ? x : y, and x when x is NaN (eval's max).
func maxBody(in []reg.VecPhysical, out reg.VecPhysical) {
	VMAXPS(in[1], in[0], out) // Intel vmaxps out, x, y: x > y ? x : y
	VCMPPS(U8(cmpUNO), in[0], in[0], reg.K2)
	VMOVAPS(in[0], reg.K2, out)
}

func minBody(in []reg.VecPhysical, out reg.VecPhysical) {
	VMINPS(in[1], in[0], out)
	VCMPPS(U8(cmpUNO), in[0], in[0], reg.K2)
	VMOVAPS(in[0], reg.K2, out)
}

// kernel emits func name(dst, a[, b] *float32, n int).
func kernel(name string, nin int, b body) {
	params := "dst, a *float32, n int"
	if nin == 2 {
		params = "dst, a, b *float32, n int"
	}
	TEXT(name, NOSPLIT, "func("+params+")")
	Pragma("noescape")
	ptrs := []reg.Register{reg.RSI, reg.RDX}
	names := []string{"a", "b"}
	Load(Param("dst"), reg.RDI)
	for i := 0; i < nin; i++ {
		Load(Param(names[i]), ptrs[i])
	}
	Load(Param("n"), reg.RCX)
	in := Z[:nin]
	out := Z[4]
	Label(name + "_loop")
	CMPQ(reg.RCX, Imm(16))
	JL(LabelRef(name + "_tail"))
	for i := 0; i < nin; i++ {
		VMOVUPS(Mem{Base: ptrs[i]}, in[i])
	}
	b(in, out)
	VMOVUPS(out, Mem{Base: reg.RDI})
	for i := 0; i < nin; i++ {
		ADDQ(Imm(64), ptrs[i])
	}
	ADDQ(Imm(64), reg.RDI)
	SUBQ(Imm(16), reg.RCX)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_tail")
	TESTQ(reg.RCX, reg.RCX)
	JLE(LabelRef(name + "_done"))
	MOVL(U32(0xffff), reg.EAX)
	BZHIL(reg.ECX, reg.EAX, reg.EAX)
	KMOVW(reg.EAX, reg.K1)
	for i := 0; i < nin; i++ {
		VMOVUPS_Z(Mem{Base: ptrs[i]}, reg.K1, in[i])
	}
	b(in, out)
	VMOVUPS(out, reg.K1, Mem{Base: reg.RDI})
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

func cpuid() {
	TEXT("cpuid", NOSPLIT, "func(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)")
	Load(Param("eaxArg"), reg.EAX)
	Load(Param("ecxArg"), reg.ECX)
	CPUID()
	Store(reg.EAX, Return("eax"))
	Store(reg.EBX, Return("ebx"))
	Store(reg.ECX, Return("ecx"))
	Store(reg.EDX, Return("edx"))
	RET()

	TEXT("xgetbv", NOSPLIT, "func() (eax, edx uint32)")
	XORL(reg.ECX, reg.ECX)
	XGETBV()
	Store(reg.EAX, Return("eax"))
	Store(reg.EDX, Return("edx"))
	RET()
}

// prefetch emits func prefetchT0(p *byte, n int) and prefetchT1: a
// prefetch of every 64-byte line of [p, p+n).
func prefetch(name string, ins func(Op)) {
	TEXT(name, NOSPLIT, "func(p *byte, n int)")
	Pragma("noescape")
	Load(Param("p"), reg.RSI)
	Load(Param("n"), reg.RCX)
	Label(name + "_loop")
	CMPQ(reg.RCX, Imm(0))
	JLE(LabelRef(name + "_done"))
	ins(Mem{Base: reg.RSI})
	ADDQ(Imm(64), reg.RSI)
	SUBQ(Imm(64), reg.RCX)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_done")
	RET()
}

// storeNT emits func storeNT(dst, src *byte, n int): n bytes (a multiple of
// 64, dst 64-byte aligned) copied with non-temporal stores; and sfence.
func storeNT() {
	TEXT("storeNT", NOSPLIT, "func(dst, src *byte, n int)")
	Pragma("noescape")
	Load(Param("dst"), reg.RDI)
	Load(Param("src"), reg.RSI)
	Load(Param("n"), reg.RCX)
	Label("storeNT_loop")
	CMPQ(reg.RCX, Imm(64))
	JL(LabelRef("storeNT_done"))
	VMOVUPS(Mem{Base: reg.RSI}, reg.Z0)
	VMOVNTPS(reg.Z0, Mem{Base: reg.RDI})
	ADDQ(Imm(64), reg.RSI)
	ADDQ(Imm(64), reg.RDI)
	SUBQ(Imm(64), reg.RCX)
	JMP(LabelRef("storeNT_loop"))
	Label("storeNT_done")
	VZEROUPPER()
	RET()

	TEXT("sfence", NOSPLIT, "func()")
	SFENCE()
	RET()
}

// progOps are the bodies of the program interpreter's opcodes (opcode i+1;
// must match the Op constants of ../program.go): the very bodies of the
// kernels, so a program computes what the kernels compute.
var progOps = []body{
	binBody(func(b, a, d Op) { VADDPS(b, a, d) }),
	binBody(func(b, a, d Op) { VSUBPS(b, a, d) }),
	binBody(func(b, a, d Op) { VMULPS(b, a, d) }),
	binBody(func(b, a, d Op) { VDIVPS(b, a, d) }),
	maxBody,
	minBody,
	func(in []reg.VecPhysical, out reg.VecPhysical) { VPXORD_BCST(cbits(signMask), in[0], out) },
	func(in []reg.VecPhysical, out reg.VecPhysical) { VPANDD_BCST(cbits(absMask), in[0], out) },
	func(in []reg.VecPhysical, out reg.VecPhysical) { VSQRTPS(in[0], out) },
	expBody,
	logBody,
	tanhBody,
	logisticBody,
	erfBody,
}

// progChunk is the number of elements each instruction of a program
// computes before the next one runs: 4 vectors, held in registers.
const progChunk = 64

// Flags of a program instruction's opcode word (must match ../program.go).
const (
	flagAccA    = 1 << 8  // operand a is the previous instruction's result (registers)
	flagAccB    = 1 << 9  // operand b likewise
	flagNoStore = 1 << 10 // the result is not stored (only the next instruction reads it)
)

// program emits func progAVX512(code *int32, ncode int, ptrs **float32,
// n int): for every chunk of progChunk elements of n (a multiple of it), the
// instructions in order, each (op|flags, dst, a, b) computing
// ptrs[dst][chunk] = op(ptrs[a][chunk], ptrs[b][chunk]) (b ignored by unary
// ops). The result of an instruction stays in Z20..Z23 for the next one
// (flagAccA, flagAccB), and is stored unless flagNoStore.
func program() {
	TEXT("progAVX512", NOSPLIT, "func(code *int32, ncode int, ptrs **float32, n int)")
	Pragma("noescape")
	Load(Param("ptrs"), reg.R9)
	Load(Param("n"), reg.RCX)
	XORQ(reg.R10, reg.R10) // byte offset of the chunk
	acc := []reg.VecPhysical{reg.Z20, reg.Z21, reg.Z22, reg.Z23}
	ina := []reg.VecPhysical{reg.Z24, reg.Z25, reg.Z26, reg.Z27}
	inb := []reg.VecPhysical{reg.Z28, reg.Z29, reg.Z30, reg.Z31}
	Label("prog_chunk")
	CMPQ(reg.RCX, U32(progChunk))
	JL(LabelRef("prog_done"))
	Load(Param("code"), reg.RSI)
	Load(Param("ncode"), reg.R11)
	Label("prog_ins")
	TESTQ(reg.R11, reg.R11)
	JE(LabelRef("prog_next"))
	MOVL(Mem{Base: reg.RSI}, reg.EAX)
	MOVLQZX(Mem{Base: reg.RSI, Disp: 4}, reg.RBX)
	MOVQ(Mem{Base: reg.R9, Index: reg.RBX, Scale: 8}, reg.RBX)
	ADDQ(reg.R10, reg.RBX)
	MOVLQZX(Mem{Base: reg.RSI, Disp: 8}, reg.RDX)
	MOVQ(Mem{Base: reg.R9, Index: reg.RDX, Scale: 8}, reg.RDX)
	ADDQ(reg.R10, reg.RDX)
	MOVLQZX(Mem{Base: reg.RSI, Disp: 12}, reg.RDI)
	MOVQ(Mem{Base: reg.R9, Index: reg.RDI, Scale: 8}, reg.RDI)
	ADDQ(reg.R10, reg.RDI)
	ADDQ(Imm(16), reg.RSI)
	DECQ(reg.R11)
	operand := func(name string, flag int, p reg.Register, in []reg.VecPhysical) {
		TESTL(U32(flag), reg.EAX)
		JNZ(LabelRef("prog_" + name + "_acc"))
		for v := range in {
			VMOVUPS(Mem{Base: p, Disp: 64 * v}, in[v])
		}
		JMP(LabelRef("prog_" + name + "_done"))
		Label("prog_" + name + "_acc")
		for v := range in {
			VMOVAPS(acc[v], in[v])
		}
		Label("prog_" + name + "_done")
	}
	operand("a", flagAccA, reg.RDX, ina)
	operand("b", flagAccB, reg.RDI, inb)
	MOVBLZX(reg.AL, reg.R13L)
	// The most common opcodes first: mul, add, tanh, sub, then in order.
	order := []int{3, 1, 12, 2}
	for i := range progOps {
		if !slices.Contains(order, i+1) {
			order = append(order, i+1)
		}
	}
	for _, op := range order {
		CMPL(reg.R13L, U32(op))
		JE(LabelRef(fmt.Sprintf("prog_op%d", op)))
	}
	JMP(LabelRef("prog_ins")) // unknown opcode: skipped
	for i, b := range progOps {
		Label(fmt.Sprintf("prog_op%d", i+1))
		for v := range acc {
			b([]reg.VecPhysical{ina[v], inb[v]}, acc[v])
		}
		JMP(LabelRef("prog_store"))
	}
	Label("prog_store")
	TESTL(U32(flagNoStore), reg.EAX)
	JNZ(LabelRef("prog_ins"))
	for v := range acc {
		VMOVUPS(acc[v], Mem{Base: reg.RBX, Disp: 64 * v})
	}
	JMP(LabelRef("prog_ins"))
	Label("prog_next")
	ADDQ(U32(4*progChunk), reg.R10)
	SUBQ(U32(progChunk), reg.RCX)
	JMP(LabelRef("prog_chunk"))
	Label("prog_done")
	VZEROUPPER()
	RET()
}

func main() {
	flag.CommandLine.Set("pkg", "vmath")
	ConstraintExpr("amd64")
	cpuid()
	storeNT()
	prefetch("prefetchT0", func(m Op) { PREFETCHT0(m) })
	prefetch("prefetchT1", func(m Op) { PREFETCHT1(m) })
	kernel("expAVX512", 1, expBody)
	kernel("logAVX512", 1, logBody)
	kernel("tanhAVX512", 1, tanhBody)
	kernel("logisticAVX512", 1, logisticBody)
	kernel("erfAVX512", 1, erfBody)
	kernel("sqrtAVX512", 1, func(in []reg.VecPhysical, out reg.VecPhysical) { VSQRTPS(in[0], out) })
	kernel("negAVX512", 1, func(in []reg.VecPhysical, out reg.VecPhysical) { VPXORD_BCST(cbits(signMask), in[0], out) })
	kernel("absAVX512", 1, func(in []reg.VecPhysical, out reg.VecPhysical) { VPANDD_BCST(cbits(absMask), in[0], out) })
	kernel("addAVX512", 2, binBody(func(b, a, d Op) { VADDPS(b, a, d) }))
	kernel("subAVX512", 2, binBody(func(b, a, d Op) { VSUBPS(b, a, d) }))
	kernel("mulAVX512", 2, binBody(func(b, a, d Op) { VMULPS(b, a, d) }))
	kernel("divAVX512", 2, binBody(func(b, a, d Op) { VDIVPS(b, a, d) }))
	kernel("maxAVX512", 2, maxBody)
	kernel("minAVX512", 2, minBody)
	program()
	Generate()
}
