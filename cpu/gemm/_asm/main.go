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

// kernelGen is the state of one kernel being generated: its spec, the
// registers it assigned and the pointers it loaded.
type kernelGen struct {
	kernelSpec
	nacc  int               // accumulators: mr*nv
	bregs []reg.VecPhysical // one B row
	tmps  []reg.VecPhysical // broadcast A elements, used in turn
	tmpi  int               // the next of tmps
	// k, a, b and c pointers and ldc in bytes.
	k, ap, bp, cp, ldc reg.Register
	aStep, bStep       int // bytes per k step of packed A and B
	// In place, rows 0-2 of A are at ap + {0,1,2}*rs and rows 3-5 at
	// ap3 + {0,1,2}*rs, and both pointers move by cs per k step.
	rs, cs, ap3 reg.Register
}

func (s kernelSpec) generate() {
	g := &kernelGen{kernelSpec: s}
	g.header()
	g.assignRegs()
	g.loadParams()
	// Zero the accumulators.
	for r := 0; r < g.nacc; r++ {
		s.zero(s.vreg(r))
	}
	g.prefetchC()
	g.aStep = s.mr * s.elem
	g.bStep = s.nr() * s.elem
	if s.stridedA {
		g.loadStrides()
	}
	g.kLoop()
	g.epilogue()
}

// header starts the kernel's TEXT with its signature and doc comment.
func (g *kernelGen) header() {
	s := g.kernelSpec
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
}

// assignRegs assigns the vector registers: the accumulators first, then
// one B row, then up to two for broadcasts.
func (g *kernelGen) assignRegs() {
	s := g.kernelSpec
	g.nacc = s.mr * s.nv
	g.bregs = make([]reg.VecPhysical, s.nv)
	for j := range g.bregs {
		g.bregs[j] = s.vreg(g.nacc + j)
	}
	nregs := 16
	if s.zmm {
		nregs = 32
	}
	for r := g.nacc + s.nv; r < nregs && len(g.tmps) < 2; r++ {
		g.tmps = append(g.tmps, s.vreg(r))
	}
	if len(g.tmps) == 0 {
		panic(s.name + ": no register left for the broadcast")
	}
}

// acc is the accumulator of row i, vector j.
func (g *kernelGen) acc(i, j int) reg.VecPhysical { return g.vreg(i*g.nv + j) }

// loadParams loads k, the pointers and ldc (scaled to bytes).
func (g *kernelGen) loadParams() {
	g.k = Load(Param("k"), reg.RCX)
	g.ap = Load(Param("a"), reg.RSI)
	g.bp = Load(Param("b"), reg.RDI)
	g.cp = Load(Param("c"), reg.RDX)
	g.ldc = Load(Param("ldc"), reg.R8)
	if g.elem == 4 {
		SHLQ(Imm(2), g.ldc)
	} else {
		SHLQ(Imm(3), g.ldc)
	}
}

// prefetchC prefetches the C tile while the k loop runs.
func (g *kernelGen) prefetchC() {
	row := reg.R9
	MOVQ(g.cp, row)
	rowBytes := g.nr() * g.elem
	for i := 0; i < g.mr; i++ {
		for off := 0; off < rowBytes; off += 64 {
			PREFETCHT0(Mem{Base: row, Disp: off})
		}
		// The last byte of the row, in case it is not 64-byte aligned.
		PREFETCHT0(Mem{Base: row, Disp: rowBytes - 1})
		if i+1 < g.mr {
			ADDQ(g.ldc, row)
		}
	}
}

// loadStrides loads A's strides (scaled to bytes) and points ap3 at row 3.
func (g *kernelGen) loadStrides() {
	if g.mr != 6 {
		panic(g.name + ": strided A needs MR = 6")
	}
	g.rs = Load(Param("rsa"), reg.R10)
	g.cs = Load(Param("csa"), reg.R11)
	if g.elem == 4 {
		SHLQ(Imm(2), g.rs)
		SHLQ(Imm(2), g.cs)
	} else {
		SHLQ(Imm(3), g.rs)
		SHLQ(Imm(3), g.cs)
	}
	g.ap3 = reg.R12
	LEAQ(Mem{Base: g.rs, Index: g.rs, Scale: 2}, g.ap3)
	ADDQ(g.ap, g.ap3)
}

// aAddr is the address of A's row i at unrolled step u.
func (g *kernelGen) aAddr(u, i int) Mem {
	if !g.stridedA {
		return Mem{Base: g.ap, Disp: u*g.aStep + i*g.elem}
	}
	base := g.ap
	if i >= 3 {
		base, i = g.ap3, i-3
	}
	if i == 0 {
		return Mem{Base: base}
	}
	return Mem{Base: base, Index: g.rs, Scale: uint8(i)}
}

// step emits unrolled k step u: load a B row, and per row of A broadcast
// its element and multiply-add it with the B row into the accumulators.
func (g *kernelGen) step(u int) {
	s := g.kernelSpec
	for j := 0; j < s.nv; j++ {
		s.movu(Mem{Base: g.bp, Disp: u*g.bStep + j*s.vecBytes()}, g.bregs[j])
	}
	for i := 0; i < s.mr; i++ {
		t := g.tmps[g.tmpi%len(g.tmps)]
		g.tmpi++
		s.bcast(g.aAddr(u, i), t)
		for j := 0; j < s.nv; j++ {
			s.fma(g.bregs[j], t, g.acc(i, j))
		}
	}
	if s.stridedA {
		ADDQ(g.cs, g.ap)
		ADDQ(g.cs, g.ap3)
	}
}

// advanceA moves the packed A pointer past u steps (in place, step did).
func (g *kernelGen) advanceA(u int) {
	if !g.stridedA {
		ADDQ(U32(u*g.aStep), g.ap)
	}
}

// kLoop emits the unrolled main loop and the loop over the remaining
// steps.
func (g *kernelGen) kLoop() {
	n := reg.RAX
	MOVQ(g.k, n)
	SHRQ(Imm(uint64(log2(g.unroll))), n)
	JZ(LabelRef("tail"))
	Label("loop")
	for u := 0; u < g.unroll; u++ {
		g.step(u)
	}
	g.advanceA(g.unroll)
	ADDQ(U32(g.unroll*g.bStep), g.bp)
	DECQ(n)
	JNZ(LabelRef("loop"))

	Label("tail")
	ANDQ(Imm(uint64(g.unroll-1)), g.k)
	JZ(LabelRef("epilogue"))
	Label("tailloop")
	g.step(0)
	g.advanceA(1)
	ADDQ(U32(g.bStep), g.bp)
	DECQ(g.k)
	JNZ(LabelRef("tailloop"))
}

// epilogue emits C = alpha*acc + beta*C, or alpha*acc when beta is ±0.
func (g *kernelGen) epilogue() {
	s := g.kernelSpec
	Label("epilogue")
	alpha, beta := g.bregs[0], g.tmps[0]
	if s.nv > 1 {
		beta = g.bregs[1]
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
	g.storeC(alpha, beta)

	Label("betazero")
	g.storeC(alpha, nil)
}

// storeC emits the scaling of the accumulators by alpha, plus beta times
// C when beta is not nil, their stores into C, and the return.
func (g *kernelGen) storeC(alpha reg.VecPhysical, beta reg.VecPhysical) {
	s := g.kernelSpec
	for i := 0; i < s.mr; i++ {
		for j := 0; j < s.nv; j++ {
			s.mul(alpha, g.acc(i, j), g.acc(i, j))
			if beta != nil {
				s.fma(Mem{Base: g.cp, Disp: j * s.vecBytes()}, beta, g.acc(i, j))
			}
			s.movu(g.acc(i, j), Mem{Base: g.cp, Disp: j * s.vecBytes()})
		}
		if i+1 < s.mr {
			ADDQ(g.ldc, g.cp)
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
