//go:build amd64 && linux

package vmath

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	e "github.com/ferryml/ferry/cpu/internal/amd64enc"
	"github.com/ferryml/ferry/cpu/internal/x86emu"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// hwRuns reports whether this machine runs AVX-512 (vex false) or AVX2
// (vex true) code, as the kernels in force see it (FERRY_CPU=avx2 lowers
// an AVX-512 host to an AVX2 one).
func hwRuns(vex bool) bool {
	if vex {
		return hasAVX2 && jitExecOK
	}
	return hasAVX512 && jitExecOK
}

// hwCall runs code on the CPU with the argument block args.
func hwCall(t testing.TB, code []byte, args []uint64) {
	ex, err := mapExec(code)
	if err != nil {
		t.Fatal(err)
	}
	ex.call(&args[0])
}

// instrCase is one instruction under test: emit writes it with Z1 and Z2
// (Y1, Y2) the sources, Z3 the destination (holding its old value), K2 a
// mask and Z4 all ones, Z5 zero.
type instrCase struct {
	name string
	emit func(a *e.Asm)
}

// instrCases lists the instructions the generators emit, in every variant
// whose semantics differ (each predicate, rounding and normalisation
// immediate; merging masks; broadcast memory operands), for vex or EVEX.
func instrCases(vex bool) []instrCase {
	var cs []instrCase
	add := func(name string, f func(a *e.Asm)) { cs = append(cs, instrCase{name, f}) }
	bin := map[string]func(a *e.Asm, src2 e.Operand, src1, dst e.Z){
		"VADDPS": (*e.Asm).VADDPS, "VSUBPS": (*e.Asm).VSUBPS, "VMULPS": (*e.Asm).VMULPS, "VDIVPS": (*e.Asm).VDIVPS,
		"VMAXPS": (*e.Asm).VMAXPS, "VMINPS": (*e.Asm).VMINPS, "VFMADD213PS": (*e.Asm).VFMADD213PS,
		"VFMADD231PS": (*e.Asm).VFMADD231PS, "VFNMADD231PS": (*e.Asm).VFNMADD231PS, "VFMSUB213PS": (*e.Asm).VFMSUB213PS,
		"VFMSUB231PS": (*e.Asm).VFMSUB231PS, "VFNMADD213PS": (*e.Asm).VFNMADD213PS, "VPADDD": (*e.Asm).VPADDD,
		"VPANDD": (*e.Asm).VPANDD, "VPORD": (*e.Asm).VPORD, "VPXORD": (*e.Asm).VPXORD, "VPERMPS": (*e.Asm).VPERMPS,
	}
	if vex {
		bin["VPANDN"], bin["VPSUBD"] = (*e.Asm).VPANDN, (*e.Asm).VPSUBD
	} else {
		bin["VSCALEFPS"] = (*e.Asm).VSCALEFPS
	}
	for name, f := range bin {
		add(name, func(a *e.Asm) { f(a, e.Z(2), 1, 3) })
		add(name+" const", func(a *e.Asm) { f(a, a.Const(0x3fc00000), 1, 3) }) // 1.5, broadcast in EVEX
		add(name+" same", func(a *e.Asm) { f(a, e.Z(1), 1, 3) })
	}
	un := map[string]func(a *e.Asm, src e.Operand, dst e.Z){
		"VSQRTPS": (*e.Asm).VSQRTPS, "VCVTDQ2PS": (*e.Asm).VCVTDQ2PS, "VCVTPS2DQ": (*e.Asm).VCVTPS2DQ,
	}
	if !vex {
		un["VGETEXPPS"] = (*e.Asm).VGETEXPPS
	}
	for name, f := range un {
		add(name, func(a *e.Asm) { f(a, e.Z(1), 3) })
	}
	for sh := uint8(0); sh < 40; sh += 3 {
		add(fmt.Sprintf("VPSLLD %d", sh), func(a *e.Asm) { a.VPSLLD(sh, e.Z(1), 3) })
		if vex {
			add(fmt.Sprintf("VPSRLD %d", sh), func(a *e.Asm) { a.VPSRLD(sh, e.Z(1), 3) })
			add(fmt.Sprintf("VPSRAD %d", sh), func(a *e.Asm) { a.VPSRAD(sh, e.Z(1), 3) })
		}
	}
	add("VBROADCASTSS", func(a *e.Asm) { a.VBROADCASTSS(a.Const(0xff812345), 3) })
	add("VMOVAPS", func(a *e.Asm) { a.VMOVAPS(1, 3) })
	for imm := range 32 {
		if vex {
			add(fmt.Sprintf("VCMPPSv %d", imm), func(a *e.Asm) { a.VCMPPSv(uint8(imm), e.Z(2), 1, 3) })
		} else {
			add(fmt.Sprintf("VCMPPS %d", imm), func(a *e.Asm) {
				a.VCMPPS(uint8(imm), e.Z(2), 1, 3)
				a.VBLENDMPSk(e.Z(4), 5, 3, 3)
			})
		}
	}
	if vex {
		add("VBLENDVPS", func(a *e.Asm) { a.VBLENDVPS(2, e.Z(1), 3, 3) })
		add("VBLENDVPS const", func(a *e.Asm) { a.VBLENDVPS(1, a.Const(0x7fc00001), 2, 3) })
		return cs
	}
	for imm := range 16 {
		add(fmt.Sprintf("VGETMANTPS %d", imm), func(a *e.Asm) { a.VGETMANTPS(uint8(imm), e.Z(1), 3) })
	}
	for _, imm := range []uint8{0, 1, 2, 3, 4, 8, 9, 10, 11, 0x18, 0x21, 0x32, 0x4b, 0x88} {
		add(fmt.Sprintf("VRNDSCALEPS %#x", imm), func(a *e.Asm) { a.VRNDSCALEPS(imm, e.Z(1), 3) })
	}
	for imm := range 256 {
		add(fmt.Sprintf("VPTERNLOGD %#x", imm), func(a *e.Asm) { a.VPTERNLOGD(uint8(imm), e.Z(2), 1, 3) })
	}
	add("VPTESTMD", func(a *e.Asm) {
		a.VPTESTMD(e.Z(2), 1, 3)
		a.VBLENDMPSk(e.Z(4), 5, 3, 3)
	})
	add("VPTESTMD const", func(a *e.Asm) {
		a.VPTESTMD(a.Const(0x80000000), 1, 3)
		a.VBLENDMPSk(e.Z(4), 5, 3, 3)
	})
	add("VBLENDMPSk", func(a *e.Asm) { a.VBLENDMPSk(e.Z(2), 1, 2, 3) })
	add("VBLENDMPSk const", func(a *e.Asm) { a.VBLENDMPSk(a.Const(0x12345678), 1, 2, 3) })
	add("VADDPSk", func(a *e.Asm) { a.VADDPSk(e.Z(2), 1, 2, 3) })
	add("VSUBPSk const", func(a *e.Asm) { a.VSUBPSk(a.Const(0x80000001), 1, 2, 3) })
	add("VMOVAPSk", func(a *e.Asm) { a.VMOVAPSk(1, 2, 3) })
	add("VMOVUPSload k", func(a *e.Asm) { a.VMOVUPSload(e.Mem{Base: e.RBX}, 2, 3) })
	add("VPERMPS table", func(a *e.Asm) {
		var v [16]uint32
		for i := range v {
			v[i] = uint32(i*0x01010101) ^ 0x3f000000
		}
		a.VPERMPS(a.ConstVec(v), 1, 3)
	})
	return cs
}

// instrValues are lane values mixed into the instruction tests: quiet and
// signalling NaNs of both signs with payloads, zeros, infinities,
// subnormals, the extremes, values around rounding ties.
var instrValues = []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7fc12345, 0xffd00001,
	0x7f800001, 0xff812345, 0x7fa00000, 0x00000001, 0x80000001, 0x007fffff, 0x807fffff, 0x00400000, 0x00800000,
	0x80800000, 0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000, 0x3f000000, 0x40000000, 0x3fc00000, 0x3f7fffff,
	0x3f800001, 0x4b000000, 0x4b000001, 0xcb7fffff, 0x4effffff, 0x4f000000, 0xcf000000, 0xcf000001, 0x3effffff,
	0x3f400000, 0x3fbfffff, 0x42fe0000, 0xc3160000, 0x7, 0xffffffff, 0x0000000f, 0x80000010}

func instrLane(r *rand.Rand) uint32 {
	switch r.IntN(4) {
	case 0:
		return instrValues[r.IntN(len(instrValues))]
	case 1:
		return math.Float32bits(float32(r.NormFloat64() * 4))
	case 2:
		return uint32(r.IntN(64)) // small integers (permute indices, shift-like)
	}
	return r.Uint32()
}

// TestEmuInstructionsMatchHardware runs each instruction the generators
// emit, alone, on this CPU and in the interpreter over random lanes mixed
// with edge values and compares the results bit for bit (NaN payloads
// included): where the host has the feature, this validates the
// interpreter the other tests rely on.
func TestEmuInstructionsMatchHardware(t *testing.T) {
	for _, vex := range []bool{false, true} {
		t.Run(map[bool]string{false: "avx512", true: "avx2"}[vex], func(t *testing.T) {
			if !hwRuns(vex) {
				t.Skip("the CPU does not run this code here")
			}
			seed := testseed.Uint64(t)
			r := rand.New(rand.NewPCG(seed, 21))
			lanes := 16
			if vex {
				lanes = 8
			}
			var m x86emu.Machine
			for _, c := range instrCases(vex) {
				a := e.Asm{VEX: vex}
				a.MOVQload(e.Mem{Base: e.RDI}, e.RBX)
				a.MOVQload(e.Mem{Base: e.RDI, Disp: 8}, e.RSI)
				a.MOVQload(e.Mem{Base: e.RDI, Disp: 16}, e.R8)
				a.MOVQload(e.Mem{Base: e.RDI, Disp: 24}, e.R9)
				a.VMOVUPSload(e.Mem{Base: e.RBX}, 0, 1)
				a.VMOVUPSload(e.Mem{Base: e.RSI}, 0, 2)
				a.VMOVUPSload(e.Mem{Base: e.R8}, 0, 3)
				a.VBROADCASTSS(a.Const(0xffffffff), 4)
				a.VPXORD(e.Z(5), 5, 5)
				if !vex {
					a.MOVQload(e.Mem{Base: e.RDI, Disp: 32}, e.RDX)
					a.KMOVW(e.RDX, 2)
				}
				c.emit(&a)
				a.VMOVUPSstore(3, 0, e.Mem{Base: e.R9})
				a.VZEROUPPER()
				a.RET()
				code, err := a.Finish()
				if err != nil {
					t.Fatal(err)
				}
				ex, err := mapExec(code)
				if err != nil {
					t.Fatal(err)
				}
				for trial := 0; trial < 40; trial++ {
					in := make([]uint32, 3*lanes)
					for i := range in {
						in[i] = instrLane(r)
					}
					hw, em := make([]uint32, lanes), make([]uint32, lanes)
					k := uint64(r.Uint32() & 0xffff)
					args := []uint64{uint64(uintptrOf32(&in[0])), uint64(uintptrOf32(&in[lanes])), uint64(uintptrOf32(&in[2*lanes])),
						uint64(uintptrOf32(&hw[0])), k}
					ex.call(&args[0])
					args[3] = uint64(uintptrOf32(&em[0]))
					m.R[x86emu.RDI] = uint64(uintptrOf64(&args[0]))
					err := m.Call(code, 0)
					runtime.KeepAlive(args) // the interpreter holds only addresses
					runtime.KeepAlive(in)
					runtime.KeepAlive(em)
					if err != nil {
						t.Fatalf("%s: %v", c.name, err)
					}
					for i := range hw {
						if hw[i] != em[i] {
							t.Fatalf("%s (seed %d) lane %d: sources %#x, %#x, old %#x, mask %#x: hardware %#x, interpreter %#x",
								c.name, seed, i, in[i], in[lanes+i], in[2*lanes+i], k, hw[i], em[i])
						}
					}
				}
			}
		})
	}
}
