// Command _asm generates the amd64 micro-kernels of package gemm with avo.
//
// Run it from this directory (go generate in package gemm does so):
//
//	go run . -out ../kernel_amd64.s -stubs ../kernel_amd64_stub.go
//
// Every kernel computes one MR×NR tile of C from packed panels:
//
//	C[i][j] = alpha * sum_p A[p*MR+i] * B[p*NR+j] + beta * C[i][j]
//
// where C rows are ldc elements apart. When beta is ±0, C is not read
// (so NaNs in C are overwritten). The accumulators stay in vector
// registers for the whole k loop; the A element of each row is broadcast
// and multiplied with the NR/lanes vectors of the B row.
package main

import (
	"flag"
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/gotypes"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// kernelSpec describes one register-blocked micro-kernel.
type kernelSpec struct {
	name   string
	elem   int  // element size in bytes: 4 (float32) or 8 (float64)
	zmm    bool // AVX-512 (zmm, 32 registers) or AVX2 (ymm, 16 registers)
	mr     int  // rows of the tile
	nv     int  // vectors per row; NR = nv * lanes
	unroll int  // k-loop unroll factor
	// stridedA: A is read in place, element (i, p) at a[i*rsa + p*csa]
	// (two more arguments), instead of from a packed panel (rsa = 1,
	// csa = MR). B is packed either way.
	stridedA bool
}

func (s kernelSpec) vecBytes() int {
	if s.zmm {
		return 64
	}
	return 32
}

func (s kernelSpec) lanes() int { return s.vecBytes() / s.elem }

func (s kernelSpec) nr() int { return s.nv * s.lanes() }

func (s kernelSpec) vreg(i int) reg.VecPhysical {
	if s.zmm {
		return zmm[i]
	}
	return ymm[i]
}

var zmm = []reg.VecPhysical{
	reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7,
	reg.Z8, reg.Z9, reg.Z10, reg.Z11, reg.Z12, reg.Z13, reg.Z14, reg.Z15,
	reg.Z16, reg.Z17, reg.Z18, reg.Z19, reg.Z20, reg.Z21, reg.Z22, reg.Z23,
	reg.Z24, reg.Z25, reg.Z26, reg.Z27, reg.Z28, reg.Z29, reg.Z30, reg.Z31,
}

var ymm = []reg.VecPhysical{
	reg.Y0, reg.Y1, reg.Y2, reg.Y3, reg.Y4, reg.Y5, reg.Y6, reg.Y7,
	reg.Y8, reg.Y9, reg.Y10, reg.Y11, reg.Y12, reg.Y13, reg.Y14, reg.Y15,
}

// Instruction selection by element type.
func (s kernelSpec) movu(a, b Op) {
	if s.elem == 4 {
		VMOVUPS(a, b)
	} else {
		VMOVUPD(a, b)
	}
}

func (s kernelSpec) bcast(m, r Op) {
	if s.elem == 4 {
		VBROADCASTSS(m, r)
	} else {
		VBROADCASTSD(m, r)
	}
}

func (s kernelSpec) fma(a, b, acc Op) {
	if s.elem == 4 {
		VFMADD231PS(a, b, acc)
	} else {
		VFMADD231PD(a, b, acc)
	}
}

func (s kernelSpec) mul(a, b, dst Op) {
	if s.elem == 4 {
		VMULPS(a, b, dst)
	} else {
		VMULPD(a, b, dst)
	}
}

func (s kernelSpec) zero(r Op) {
	if s.zmm {
		VPXORD(r, r, r) // VXORPS on zmm needs AVX512DQ
	} else if s.elem == 4 {
		VXORPS(r, r, r)
	} else {
		VXORPD(r, r, r)
	}
}

func (s kernelSpec) generate() {
	typ := "float32"
	if s.elem == 8 {
		typ = "float64"
	}
	sig := fmt.Sprintf("func(k int, a, b, c *%s, ldc int, alpha, beta %s)", typ, typ)
	if s.stridedA {
		sig = fmt.Sprintf("func(k int, a, b, c *%s, ldc int, alpha, beta %s, rsa, csa int)", typ, typ)
	}
	TEXT(s.name, NOSPLIT, sig)
	isa := "AVX2+FMA"
	if s.zmm {
		isa = "AVX-512F"
	}
	if s.stridedA {
		Doc(fmt.Sprintf("%s computes a %d×%d tile of C with %s from A in place (element (i, p) at a[i*rsa+p*csa]) and a packed panel of B: C = alpha*A*B + beta*C, C not read when beta is ±0.", s.name, s.mr, s.nr(), isa))
	} else {
		Doc(fmt.Sprintf("%s computes a %d×%d tile of C with %s from packed panels: C = alpha*A*B + beta*C, C not read when beta is ±0.", s.name, s.mr, s.nr(), isa))
	}

	nacc := s.mr * s.nv
	acc := func(i, j int) reg.VecPhysical { return s.vreg(i*s.nv + j) }
	bregs := make([]reg.VecPhysical, s.nv)
	for j := range bregs {
		bregs[j] = s.vreg(nacc + j)
	}
	nregs := 16
	if s.zmm {
		nregs = 32
	}
	var tmps []reg.VecPhysical
	for r := nacc + s.nv; r < nregs && len(tmps) < 2; r++ {
		tmps = append(tmps, s.vreg(r))
	}
	if len(tmps) == 0 {
		panic(s.name + ": no register left for the broadcast")
	}

	k := Load(Param("k"), reg.RCX)
	ap := Load(Param("a"), reg.RSI)
	bp := Load(Param("b"), reg.RDI)
	cp := Load(Param("c"), reg.RDX)
	ldc := Load(Param("ldc"), reg.R8)
	if s.elem == 4 {
		SHLQ(Imm(2), ldc)
	} else {
		SHLQ(Imm(3), ldc)
	}

	// Zero the accumulators.
	for r := 0; r < nacc; r++ {
		s.zero(s.vreg(r))
	}

	// Prefetch the C tile while the k loop runs.
	{
		row := reg.R9
		MOVQ(cp, row)
		rowBytes := s.nr() * s.elem
		for i := 0; i < s.mr; i++ {
			for off := 0; off < rowBytes; off += 64 {
				PREFETCHT0(Mem{Base: row, Disp: off})
			}
			// The last byte of the row, in case it is not 64-byte aligned.
			PREFETCHT0(Mem{Base: row, Disp: rowBytes - 1})
			if i+1 < s.mr {
				ADDQ(ldc, row)
			}
		}
	}

	aStep := s.mr * s.elem
	bStep := s.nr() * s.elem
	// In place, rows 0-2 of A are at ap + {0,1,2}*rs and rows 3-5 at
	// ap3 + {0,1,2}*rs, and both pointers move by cs per k step.
	var rs, cs, ap3 reg.Register
	if s.stridedA {
		if s.mr != 6 {
			panic(s.name + ": strided A needs MR = 6")
		}
		rs = Load(Param("rsa"), reg.R10)
		cs = Load(Param("csa"), reg.R11)
		if s.elem == 4 {
			SHLQ(Imm(2), rs)
			SHLQ(Imm(2), cs)
		} else {
			SHLQ(Imm(3), rs)
			SHLQ(Imm(3), cs)
		}
		ap3 = reg.R12
		LEAQ(Mem{Base: rs, Index: rs, Scale: 2}, ap3)
		ADDQ(ap, ap3)
	}
	aAddr := func(u, i int) Mem {
		if !s.stridedA {
			return Mem{Base: ap, Disp: u*aStep + i*s.elem}
		}
		base := ap
		if i >= 3 {
			base, i = ap3, i-3
		}
		if i == 0 {
			return Mem{Base: base}
		}
		return Mem{Base: base, Index: rs, Scale: uint8(i)}
	}
	tmpi := 0
	step := func(u int) {
		for j := 0; j < s.nv; j++ {
			s.movu(Mem{Base: bp, Disp: u*bStep + j*s.vecBytes()}, bregs[j])
		}
		for i := 0; i < s.mr; i++ {
			t := tmps[tmpi%len(tmps)]
			tmpi++
			s.bcast(aAddr(u, i), t)
			for j := 0; j < s.nv; j++ {
				s.fma(bregs[j], t, acc(i, j))
			}
		}
		if s.stridedA {
			ADDQ(cs, ap)
			ADDQ(cs, ap3)
		}
	}
	// advanceA moves the packed A pointer past u steps (in place, step did).
	advanceA := func(u int) {
		if !s.stridedA {
			ADDQ(U32(u*aStep), ap)
		}
	}

	// Unrolled main loop.
	n := reg.RAX
	MOVQ(k, n)
	SHRQ(Imm(uint64(log2(s.unroll))), n)
	JZ(LabelRef("tail"))
	Label("loop")
	for u := 0; u < s.unroll; u++ {
		step(u)
	}
	advanceA(s.unroll)
	ADDQ(U32(s.unroll*bStep), bp)
	DECQ(n)
	JNZ(LabelRef("loop"))

	Label("tail")
	ANDQ(Imm(uint64(s.unroll-1)), k)
	JZ(LabelRef("epilogue"))
	Label("tailloop")
	step(0)
	advanceA(1)
	ADDQ(U32(bStep), bp)
	DECQ(k)
	JNZ(LabelRef("tailloop"))

	// Epilogue: C = alpha*acc + beta*C, or alpha*acc when beta is ±0.
	Label("epilogue")
	alpha, beta := bregs[0], tmps[0]
	if s.nv > 1 {
		beta = bregs[1]
	}
	s.bcast(addr(Param("alpha")), alpha)
	if s.elem == 4 {
		MOVL(addr(Param("beta")), reg.EAX)
		SHLL(Imm(1), reg.EAX)
	} else {
		MOVQ(addr(Param("beta")), reg.RAX)
		SHLQ(Imm(1), reg.RAX)
	}
	JZ(LabelRef("betazero"))
	s.bcast(addr(Param("beta")), beta)
	for i := 0; i < s.mr; i++ {
		for j := 0; j < s.nv; j++ {
			s.mul(alpha, acc(i, j), acc(i, j))
			s.fma(Mem{Base: cp, Disp: j * s.vecBytes()}, beta, acc(i, j))
			s.movu(acc(i, j), Mem{Base: cp, Disp: j * s.vecBytes()})
		}
		if i+1 < s.mr {
			ADDQ(ldc, cp)
		}
	}
	VZEROUPPER()
	RET()

	Label("betazero")
	for i := 0; i < s.mr; i++ {
		for j := 0; j < s.nv; j++ {
			s.mul(alpha, acc(i, j), acc(i, j))
			s.movu(acc(i, j), Mem{Base: cp, Disp: j * s.vecBytes()})
		}
		if i+1 < s.mr {
			ADDQ(ldc, cp)
		}
	}
	VZEROUPPER()
	RET()
}

func addr(c gotypes.Component) Mem {
	b, err := c.Resolve()
	if err != nil {
		panic(err)
	}
	return b.Addr
}

func log2(n int) int {
	l := 0
	for 1<<l < n {
		l++
	}
	if 1<<l != n {
		panic("unroll must be a power of two")
	}
	return l
}

// The kernel shapes; package gemm mirrors MR and NR in kernel_amd64.go.
var specs = []kernelSpec{
	{name: "sgemmKernelAVX512", elem: 4, zmm: true, mr: 6, nv: 4, unroll: 4},
	{name: "dgemmKernelAVX512", elem: 8, zmm: true, mr: 6, nv: 4, unroll: 4},
	{name: "sgemmKernelAVX2", elem: 4, zmm: false, mr: 6, nv: 2, unroll: 4},
	{name: "dgemmKernelAVX2", elem: 8, zmm: false, mr: 6, nv: 2, unroll: 4},
	{name: "sgemmKernelAVX512A", elem: 4, zmm: true, mr: 6, nv: 4, unroll: 4, stridedA: true},
	{name: "sgemmKernelAVX2A", elem: 4, zmm: false, mr: 6, nv: 2, unroll: 4, stridedA: true},
}

func main() {
	flag.CommandLine.Set("pkg", "gemm")
	ConstraintExpr("amd64")
	for _, s := range specs {
		s.generate()
	}
	Generate()
}
