// Package amd64enc encodes the few x86-64 instructions Ferry's run-time code
// generator needs: AVX-512 (EVEX) float32 vector arithmetic, compares,
// blends, broadcasts and conversions on 512-bit registers, opmask moves, and
// the general-purpose loads, adds, compares and jumps of a loop; and, with
// Asm.VEX set, the AVX2/FMA (VEX) forms of the same vector instructions on
// 256-bit registers, plus the AVX2 vector-mask compare and blend, shifts and
// integer subtract that replace opmasks and AVX-512-only instructions there.
//
// Operands are written in the Go assembler's order (sources first, the
// destination last), so generator code reads as Go assembly does; the tests compare the bytes with what the Go assembler produces for the
// same text.
//
// Memory operands are [base + index*scale + disp] or RIP-relative constants
// of the code's constant pool (placed after the code by Finish). A memory
// operand with Bcst set is an embedded {1to16} broadcast of a float32.
package amd64enc

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Reg is a general-purpose register (RAX=0 ... R15=15).
type Reg uint8

// The general-purpose registers.
const (
	RAX Reg = iota
	RCX
	RDX
	RBX
	RSP
	RBP
	RSI
	RDI
	R8
	R9
	R10
	R11
	R12
	R13
	R14
	R15
)

// Z is a 512-bit vector register (Z0 ... Z31).
type Z uint8

// K is an opmask register (K0 ... K7); K0 as a write mask means no mask.
type K uint8

// Mem is a memory operand: Base + Index*Scale + Disp, or the constant of
// the pool at offset Disp when RIP is set. Bcst broadcasts one float32 to
// all 16 lanes (EVEX embedded broadcast).
type Mem struct {
	Base     Reg
	Index    Reg
	HasIndex bool
	Scale    uint8 // 1, 2, 4 or 8 (with HasIndex)
	Disp     int32
	RIP      bool
	Bcst     bool
}

// Operand is a vector instruction's register-or-memory operand: a Z or a Mem.
type Operand interface{ isOperand() }

func (Z) isOperand()   {}
func (Mem) isOperand() {}

// Label is a position in the code, bound by Bind.
type Label int

// Asm accumulates code.
type Asm struct {
	b      []byte
	pool   []byte
	consts map[uint32]int32
	vecs   map[[16]uint32]int32
	labels []int // position, -1 while unbound
	vecs8  map[[8]uint32]int32
	jumps  []fix // rel32 to labels
	rips   []fix // rel32 to the pool
	wv     *weave

	// VEX selects AVX2 code: the vector instructions are VEX-encoded on
	// 256-bit registers (Z numbers 0-15 name Y0-Y15, 8 float32 lanes),
	// Const pools a full 32-byte vector (no embedded broadcast), opmask
	// forms and AVX-512-only instructions panic, and the AVX2-only ones
	// (VCMPPSv, VBLENDVPS, ...) may be used. Set it before emitting.
	VEX bool
}

type fix struct {
	at, end int // the rel32 field and the end of its instruction
	target  int // label, or pool offset
}

// Len returns the number of bytes emitted so far.
func (a *Asm) Len() int { return len(a.b) }

// Const returns a broadcast memory operand holding the float32 bits b in the
// constant pool.
func (a *Asm) Const(b uint32) Mem {
	if a.consts == nil {
		a.consts = map[uint32]int32{}
	}
	off, ok := a.consts[b]
	if !ok && a.VEX {
		var v [8]uint32
		for i := range v {
			v[i] = b
		}
		off = a.ConstVec8(v).Disp
		a.consts[b] = off
	} else if !ok {
		off = int32(len(a.pool))
		a.pool = binary.LittleEndian.AppendUint32(a.pool, b)
		a.consts[b] = off
	}
	return Mem{RIP: true, Disp: off, Bcst: !a.VEX}
}

// ConstVec returns a full-width (not broadcast) memory operand holding the
// 16 float32 bit patterns v in the constant pool, 64-byte aligned so that a
// load of it never splits a cache line (a table for VPERMPS, say). Equal
// tables are pooled once.
func (a *Asm) ConstVec(v [16]uint32) Mem {
	if a.vecs == nil {
		a.vecs = map[[16]uint32]int32{}
	}
	off, ok := a.vecs[v]
	if !ok {
		off = a.poolWords(v[:], 64)
		a.vecs[v] = off
	}
	return Mem{RIP: true, Disp: off}
}

// ConstVec8 returns a memory operand holding the 8 float32 bit patterns v
// in the constant pool, 32-byte aligned (a YMM operand or VPERMPS table of
// VEX code). Equal tables are pooled once.
func (a *Asm) ConstVec8(v [8]uint32) Mem {
	if a.vecs8 == nil {
		a.vecs8 = map[[8]uint32]int32{}
	}
	off, ok := a.vecs8[v]
	if !ok {
		off = a.poolWords(v[:], 32)
		a.vecs8[v] = off
	}
	return Mem{RIP: true, Disp: off}
}

// poolWords appends the words v to the constant pool at the next offset
// that is a multiple of align (padding with zero bytes) and returns that
// offset.
func (a *Asm) poolWords(v []uint32, align int) int32 {
	for len(a.pool)%align != 0 {
		a.pool = append(a.pool, 0)
	}
	off := int32(len(a.pool))
	for _, b := range v {
		a.pool = binary.LittleEndian.AppendUint32(a.pool, b)
	}
	return off
}

// ConstF returns Const(math.Float32bits(v)).
func (a *Asm) ConstF(v float32) Mem { return a.Const(math.Float32bits(v)) }

// NewLabel returns an unbound label.
func (a *Asm) NewLabel() Label {
	a.labels = append(a.labels, -1)
	return Label(len(a.labels) - 1)
}

// Bind sets l to the current position.
func (a *Asm) Bind(l Label) { a.labels[l] = len(a.b) }

// Finish resolves jumps and constant references and returns the code
// followed by the constant pool (64-byte aligned).
func (a *Asm) Finish() ([]byte, error) {
	for _, j := range a.jumps {
		p := a.labels[j.target]
		if p < 0 {
			return nil, fmt.Errorf("amd64enc: label %d not bound", j.target)
		}
		binary.LittleEndian.PutUint32(a.b[j.at:], uint32(int32(p-j.end)))
	}
	out := append([]byte(nil), a.b...)
	for len(out)%64 != 0 {
		out = append(out, 0xcc) // int3
	}
	poolAt := len(out)
	out = append(out, a.pool...)
	for _, r := range a.rips {
		binary.LittleEndian.PutUint32(out[r.at:], uint32(int32(poolAt+r.target-r.end)))
	}
	return out, nil
}

func (a *Asm) byte1(v ...byte) { a.b = append(a.b, v...) }

func (a *Asm) imm32(v int32) { a.b = binary.LittleEndian.AppendUint32(a.b, uint32(v)) }

// modrm emits ModRM, SIB and displacement for reg (low 3 bits used) and rm;
// n is the disp8 scale (EVEX compressed displacement; 1 otherwise). It
// returns the position of a RIP-relative disp32, or -1.
func (a *Asm) modrm(reg byte, rm Operand, n int32) int {
	switch o := rm.(type) {
	case Z:
		a.byte1(0xc0 | (reg&7)<<3 | byte(o)&7)
		return -1
	case Reg:
		a.byte1(0xc0 | (reg&7)<<3 | byte(o)&7)
		return -1
	case Mem:
		if o.RIP {
			a.byte1(0x05 | (reg&7)<<3)
			at := len(a.b)
			a.imm32(o.Disp)
			return at
		}
		var mod byte
		d8 := o.Disp / n
		switch {
		case o.Disp == 0 && o.Base&7 != 5:
			mod = 0
		case o.Disp%n == 0 && d8 >= -128 && d8 <= 127:
			mod = 1
		default:
			mod = 2
		}
		if o.HasIndex || o.Base&7 == 4 {
			a.byte1(mod<<6 | (reg&7)<<3 | 4)
			idx, sc := byte(4), byte(0) // no index
			if o.HasIndex {
				idx = byte(o.Index) & 7
				switch o.Scale {
				case 2:
					sc = 1
				case 4:
					sc = 2
				case 8:
					sc = 3
				}
			}
			a.byte1(sc<<6 | idx<<3 | byte(o.Base)&7)
		} else {
			a.byte1(mod<<6 | (reg&7)<<3 | byte(o.Base)&7)
		}
		switch mod {
		case 1:
			a.byte1(byte(int8(d8)))
		case 2:
			a.imm32(o.Disp)
		}
	}
	return -1
}

func (Reg) isOperand() {}

// EVEX map and prefix selectors.
const (
	m0F   = 1
	m0F38 = 2
	m0F3A = 3

	ppNone = 0
	pp66   = 1
)

// evex emits one EVEX.512 instruction: opcode op in map mm with prefix pp,
// ModRM.reg = reg (a vector or opmask register number), vvvv = the second
// source (0 when unused), rm the register-or-memory operand, opmask k,
// zeroing z, and an imm8 when imm >= 0.
func (a *Asm) evex(pp, mm byte, op byte, reg, vvvv byte, rm Operand, k K, z bool, imm int) {
	if a.VEX {
		if k != 0 || z {
			panic("amd64enc: opmask in VEX code")
		}
		a.vex(pp, mm, op, reg, vvvv, rm, imm)
		return
	}
	a.mark()
	var bc byte
	n := int32(64)
	if o, ok := rm.(Mem); ok && o.Bcst {
		bc, n = 1, 4
	}
	var zz byte
	if z {
		zz = 1
	}
	p2 := zz<<7 | 2<<5 | bc<<4 | (^(vvvv>>4)&1)<<3 | byte(k)&7
	a.byte1(0x62, evexP0(mm, reg, rm), (^vvvv&15)<<3|1<<2|pp, p2, op)
	at := a.modrm(reg, rm, n)
	end := len(a.b)
	if imm >= 0 {
		a.byte1(byte(imm))
		end++
	}
	a.ripFix(at, end, rm)
}

// vex emits one VEX.256.W0 instruction (the two-byte form where it
// fits, as the Go assembler): opcode op in map mm with prefix pp, ModRM.reg
// = reg, vvvv = the second source, rm the register-or-memory operand, and
// an imm8 when imm >= 0.
func (a *Asm) vex(pp, mm byte, op byte, reg, vvvv byte, rm Operand, imm int) {
	a.mark()
	var x, b byte
	switch o := rm.(type) {
	case Z:
		if o > 15 {
			panic("amd64enc: register above 15 in VEX code")
		}
		b = byte(o) >> 3 & 1
	case Reg:
		b = byte(o) >> 3 & 1
	case Mem:
		if o.Bcst {
			panic("amd64enc: embedded broadcast in VEX code")
		}
		if !o.RIP {
			b = byte(o.Base) >> 3 & 1
			if o.HasIndex {
				x = byte(o.Index) >> 3 & 1
			}
		}
	}
	if reg > 15 || vvvv > 15 {
		panic("amd64enc: register above 15 in VEX code")
	}
	r := reg >> 3 & 1
	last := (^vvvv&15)<<3 | 1<<2 | pp // W0, L1 (256 bits)
	if mm == m0F && x == 0 && b == 0 {
		a.byte1(0xc5, (^r&1)<<7|last)
	} else {
		a.byte1(0xc4, (^r&1)<<7|(^x&1)<<6|(^b&1)<<5|mm, last)
	}
	a.byte1(op)
	at := a.modrm(reg, rm, 1)
	end := len(a.b)
	if imm >= 0 {
		a.byte1(byte(imm))
		end++
	}
	a.ripFix(at, end, rm)
}

// evexOnly panics in VEX code (an AVX-512 instruction or opmask form).
func (a *Asm) evexOnly() {
	if a.VEX {
		panic("amd64enc: AVX-512 instruction in VEX code")
	}
}

// vexOnly panics in EVEX code (an AVX2-only form).
func (a *Asm) vexOnly() {
	if !a.VEX {
		panic("amd64enc: AVX2-only instruction in EVEX code")
	}
}

// evexP0 is the first EVEX payload byte: the inverted R, X, B and R'
// extension bits of reg and rm, and the map mm.
func evexP0(mm, reg byte, rm Operand) byte {
	var bx, xx byte // X and B extension bits of rm (before inversion)
	switch o := rm.(type) {
	case Z:
		bx, xx = byte(o)>>3&1, byte(o)>>4&1
	case Mem:
		if !o.RIP {
			bx = byte(o.Base) >> 3 & 1
			if o.HasIndex {
				xx = byte(o.Index) >> 3 & 1
			}
		}
	}
	r1, r2 := reg>>3&1, reg>>4&1
	return (^r1&1)<<7 | (^xx&1)<<6 | (^bx&1)<<5 | (^r2&1)<<4 | mm
}

// ripFix records the RIP-relative disp32 at (from modrm; -1: none) of an
// instruction ending at end, referring to the pool constant of rm.
func (a *Asm) ripFix(at, end int, rm Operand) {
	if at >= 0 {
		a.rips = append(a.rips, fix{at: at, end: end, target: int(rm.(Mem).Disp)})
	}
}

// ---- vector instructions (Go operand order: sources first, then the
// destination; Intel's is the reverse) ----

func (a *Asm) v3(pp, mm, op byte, src2 Operand, src1, dst Z, k K) {
	a.evex(pp, mm, op, byte(dst), byte(src1), src2, k, false, -1)
}

// VADDPS sets dst = src1 + src2.
func (a *Asm) VADDPS(src2 Operand, src1, dst Z) { a.v3(ppNone, m0F, 0x58, src2, src1, dst, 0) }

// VADDPSk is VADDPS merged under mask k.
func (a *Asm) VADDPSk(src2 Operand, src1 Z, k K, dst Z) { a.v3(ppNone, m0F, 0x58, src2, src1, dst, k) }

// VSUBPS sets dst = src1 - src2.
func (a *Asm) VSUBPS(src2 Operand, src1, dst Z) { a.v3(ppNone, m0F, 0x5c, src2, src1, dst, 0) }

// VSUBPSk is VSUBPS merged under mask k.
func (a *Asm) VSUBPSk(src2 Operand, src1 Z, k K, dst Z) { a.v3(ppNone, m0F, 0x5c, src2, src1, dst, k) }

// VMULPS sets dst = src1 * src2.
func (a *Asm) VMULPS(src2 Operand, src1, dst Z) { a.v3(ppNone, m0F, 0x59, src2, src1, dst, 0) }

// VDIVPS sets dst = src1 / src2.
func (a *Asm) VDIVPS(src2 Operand, src1, dst Z) { a.v3(ppNone, m0F, 0x5e, src2, src1, dst, 0) }

// VMAXPS sets dst = src1 > src2 ? src1 : src2 (src2 when either is NaN).
func (a *Asm) VMAXPS(src2 Operand, src1, dst Z) { a.v3(ppNone, m0F, 0x5f, src2, src1, dst, 0) }

// VMINPS sets dst = src1 < src2 ? src1 : src2 (src2 when either is NaN).
func (a *Asm) VMINPS(src2 Operand, src1, dst Z) { a.v3(ppNone, m0F, 0x5d, src2, src1, dst, 0) }

// VSQRTPS sets dst = √src.
func (a *Asm) VSQRTPS(src Operand, dst Z) { a.evex(ppNone, m0F, 0x51, byte(dst), 0, src, 0, false, -1) }

// VFMADD213PS sets dst = src1*dst + src2.
func (a *Asm) VFMADD213PS(src2 Operand, src1, dst Z) { a.v3(pp66, m0F38, 0xa8, src2, src1, dst, 0) }

// VFMADD231PS sets dst = src1*src2 + dst.
func (a *Asm) VFMADD231PS(src2 Operand, src1, dst Z) { a.v3(pp66, m0F38, 0xb8, src2, src1, dst, 0) }

// VFNMADD231PS sets dst = -(src1*src2) + dst.
func (a *Asm) VFNMADD231PS(src2 Operand, src1, dst Z) { a.v3(pp66, m0F38, 0xbc, src2, src1, dst, 0) }

// VFMSUB213PS sets dst = src1*dst - src2.
func (a *Asm) VFMSUB213PS(src2 Operand, src1, dst Z) { a.v3(pp66, m0F38, 0xaa, src2, src1, dst, 0) }

// VFMSUB231PS sets dst = src1*src2 - dst.
func (a *Asm) VFMSUB231PS(src2 Operand, src1, dst Z) { a.v3(pp66, m0F38, 0xba, src2, src1, dst, 0) }

// VFNMADD213PS sets dst = src2 - src1*dst.
func (a *Asm) VFNMADD213PS(src2 Operand, src1, dst Z) { a.v3(pp66, m0F38, 0xac, src2, src1, dst, 0) }

// VSCALEFPS sets dst = src1 * 2^floor(src2).
func (a *Asm) VSCALEFPS(src2 Operand, src1, dst Z) {
	a.evexOnly()
	a.v3(pp66, m0F38, 0x2c, src2, src1, dst, 0)
}

// VRCP14PS sets dst to an approximation of 1/src (relative error below
// 2^-14).
func (a *Asm) VRCP14PS(src Operand, dst Z) {
	a.evexOnly()
	a.evex(pp66, m0F38, 0x4c, byte(dst), 0, src, 0, false, -1)
}

// VCVTPS2DQ converts src to int32 lanes (rounding to nearest even).
func (a *Asm) VCVTPS2DQ(src Operand, dst Z) { a.evex(pp66, m0F, 0x5b, byte(dst), 0, src, 0, false, -1) }

// VCVTDQ2PS converts the int32 lanes of src to float32.
func (a *Asm) VCVTDQ2PS(src Operand, dst Z) {
	a.evex(ppNone, m0F, 0x5b, byte(dst), 0, src, 0, false, -1)
}

// VPERMPS sets dst[i] = src2[idx[i] & 15].
func (a *Asm) VPERMPS(src2 Operand, idx, dst Z) { a.v3(pp66, m0F38, 0x16, src2, idx, dst, 0) }

// VPADDD sets dst = src1 + src2 (int32 lanes).
func (a *Asm) VPADDD(src2 Operand, src1, dst Z) { a.v3(pp66, m0F, 0xfe, src2, src1, dst, 0) }

// VPSLLD sets dst = src << imm (int32 lanes).
func (a *Asm) VPSLLD(imm uint8, src Operand, dst Z) {
	a.evex(pp66, m0F, 0x72, 6, byte(dst), src, 0, false, int(imm))
}

// VMOVNTPS stores src to m (64-byte aligned) with a non-temporal hint.
func (a *Asm) VMOVNTPS(src Z, m Mem) { a.evex(ppNone, m0F, 0x2b, byte(src), 0, m, 0, false, -1) }

// VPANDD sets dst = src1 & src2 (bitwise).
func (a *Asm) VPANDD(src2 Operand, src1, dst Z) { a.v3(pp66, m0F, 0xdb, src2, src1, dst, 0) }

// VPORD sets dst = src1 | src2.
func (a *Asm) VPORD(src2 Operand, src1, dst Z) { a.v3(pp66, m0F, 0xeb, src2, src1, dst, 0) }

// VPXORD sets dst = src1 ^ src2.
func (a *Asm) VPXORD(src2 Operand, src1, dst Z) { a.v3(pp66, m0F, 0xef, src2, src1, dst, 0) }

// VBLENDMPSk sets dst = k ? src2 : src1 per lane.
func (a *Asm) VBLENDMPSk(src2 Operand, src1 Z, k K, dst Z) {
	a.evexOnly()
	a.v3(pp66, m0F38, 0x65, src2, src1, dst, k)
}

// VPTERNLOGD sets dst to the ternary logic function imm of dst, src1, src2.
func (a *Asm) VPTERNLOGD(imm uint8, src2 Operand, src1, dst Z) {
	a.evexOnly()
	a.evex(pp66, m0F3A, 0x25, byte(dst), byte(src1), src2, 0, false, int(imm))
}

// VRNDSCALEPS rounds src as imm says (8: to nearest even, no precision
// exception).
func (a *Asm) VRNDSCALEPS(imm uint8, src Operand, dst Z) {
	a.evexOnly()
	a.evex(pp66, m0F3A, 0x08, byte(dst), 0, src, 0, false, int(imm))
}

// VGETMANTPS sets dst to the mantissa of src normalised as imm says.
func (a *Asm) VGETMANTPS(imm uint8, src Operand, dst Z) {
	a.evexOnly()
	a.evex(pp66, m0F3A, 0x26, byte(dst), 0, src, 0, false, int(imm))
}

// VGETEXPPS sets dst = floor(log2 |src|) as a float.
func (a *Asm) VGETEXPPS(src Operand, dst Z) {
	a.evexOnly()
	a.evex(pp66, m0F38, 0x42, byte(dst), 0, src, 0, false, -1)
}

// VCMPPS sets opmask k to the predicate imm of src1 and src2 per lane.
func (a *Asm) VCMPPS(imm uint8, src2 Operand, src1 Z, k K) {
	a.evexOnly()
	a.evex(ppNone, m0F, 0xc2, byte(k), byte(src1), src2, 0, false, int(imm))
}

// VPTESTMD sets opmask k to the lanes where src1 & src2 is not zero.
func (a *Asm) VPTESTMD(src2 Operand, src1 Z, k K) {
	a.evexOnly()
	a.evex(pp66, m0F38, 0x27, byte(k), byte(src1), src2, 0, false, -1)
}

// VMOVAPS copies register src to dst.
func (a *Asm) VMOVAPS(src, dst Z) { a.evex(ppNone, m0F, 0x29, byte(src), 0, dst, 0, false, -1) }

// VMOVAPSk copies src to dst in the lanes of k (others kept).
func (a *Asm) VMOVAPSk(src Z, k K, dst Z) { a.evex(ppNone, m0F, 0x29, byte(src), 0, dst, k, false, -1) }

// VMOVUPSload loads 16 float32 from m into dst; with k != 0 only the lanes
// of k, the others zeroed (no fault on masked-off lanes).
func (a *Asm) VMOVUPSload(m Mem, k K, dst Z) {
	a.evex(ppNone, m0F, 0x10, byte(dst), 0, m, k, k != 0, -1)
}

// VMOVUPSstore stores src to m; with k != 0 only the lanes of k.
func (a *Asm) VMOVUPSstore(src Z, k K, m Mem) {
	a.evex(ppNone, m0F, 0x11, byte(src), 0, m, k, false, -1)
}

// VBROADCASTSS sets every lane of dst to the float32 at m (m's Bcst is
// ignored).
func (a *Asm) VBROADCASTSS(m Mem, dst Z) {
	m.Bcst = false
	if a.VEX {
		a.vex(pp66, m0F38, 0x18, byte(dst), 0, m, -1)
		return
	}
	a.evexT1S(pp66, m0F38, 0x18, byte(dst), m)
}

// evexT1S is evex for a 32-bit scalar memory operand (tuple T1S: disp8
// scaled by 4, no broadcast bit).
func (a *Asm) evexT1S(pp, mm, op, reg byte, m Mem) {
	a.mark()
	a.byte1(0x62, evexP0(mm, reg, m), 15<<3|1<<2|pp, 2<<5|1<<3, op)
	at := a.modrm(reg, m, 4)
	a.ripFix(at, len(a.b), m)
}

// ---- AVX2-only instructions (VEX code) ----

// VCMPPSv sets every bit of each lane of dst to the predicate imm of src1
// and src2 in that lane (a vector mask).
func (a *Asm) VCMPPSv(imm uint8, src2 Operand, src1, dst Z) {
	a.vexOnly()
	a.vex(ppNone, m0F, 0xc2, byte(dst), byte(src1), src2, int(imm))
}

// VBLENDVPS sets dst = src2 where the lane's sign bit in mask is set,
// src1 elsewhere.
func (a *Asm) VBLENDVPS(mask Z, src2 Operand, src1, dst Z) {
	a.vexOnly()
	a.vex(pp66, m0F3A, 0x4a, byte(dst), byte(src1), src2, int(mask)<<4)
}

// VPANDN sets dst = ^src1 & src2.
func (a *Asm) VPANDN(src2 Operand, src1, dst Z) {
	a.vexOnly()
	a.vex(pp66, m0F, 0xdf, byte(dst), byte(src1), src2, -1)
}

// VPSUBD sets dst = src1 - src2 (int32 lanes).
func (a *Asm) VPSUBD(src2 Operand, src1, dst Z) {
	a.vexOnly()
	a.vex(pp66, m0F, 0xfa, byte(dst), byte(src1), src2, -1)
}

// VPSRLD sets dst = src >> imm (int32 lanes, logical).
func (a *Asm) VPSRLD(imm uint8, src Z, dst Z) {
	a.vexOnly()
	a.vex(pp66, m0F, 0x72, 2, byte(dst), src, int(imm))
}

// VPSRAD sets dst = src >> imm (int32 lanes, arithmetic).
func (a *Asm) VPSRAD(imm uint8, src Z, dst Z) {
	a.vexOnly()
	a.vex(pp66, m0F, 0x72, 4, byte(dst), src, int(imm))
}

// VZEROUPPER clears the upper halves of the vector registers.
func (a *Asm) VZEROUPPER() { a.byte1(0xc5, 0xf8, 0x77) }

// KMOVW sets opmask k to the low 16 bits of r (r below R8).
func (a *Asm) KMOVW(r Reg, k K) {
	a.evexOnly()
	if r >= R8 {
		panic("amd64enc: KMOVW from r8-r15")
	}
	a.byte1(0xc5, 0xf8, 0x92, 0xc0|byte(k)<<3|byte(r))
}

// ---- general-purpose instructions ----

func (a *Asm) rex(w bool, reg, idx, base byte, force bool) {
	var v byte
	if w {
		v |= 8
	}
	v |= reg >> 3 & 1 << 2
	v |= idx >> 3 & 1 << 1
	v |= base >> 3 & 1
	if v != 0 || force {
		a.byte1(0x40 | v)
	}
}

func memRex(m Mem) (idx, base byte) {
	if m.HasIndex {
		idx = byte(m.Index)
	}
	return idx, byte(m.Base)
}

// PREFETCHT0 asks for the cache line at m in every cache level (a hint: no
// fault, no effect on results).
func (a *Asm) PREFETCHT0(m Mem) { a.prefetch(1, m) }

// PREFETCHNTA asks for the cache line at m close to the core while
// keeping it out of the outer caches as far as the CPU allows (data read
// once).
func (a *Asm) PREFETCHNTA(m Mem) { a.prefetch(0, m) }

// prefetch emits 0F 18 /hint with memory operand m.
func (a *Asm) prefetch(hint byte, m Mem) {
	idx, base := memRex(m)
	a.rex(false, 0, idx, base, false)
	a.byte1(0x0f, 0x18)
	a.modrm(hint, m, 1)
}

// MOVQload sets dst to the 64-bit word at m.
func (a *Asm) MOVQload(m Mem, dst Reg) {
	idx, base := memRex(m)
	a.rex(true, byte(dst), idx, base, true)
	a.byte1(0x8b)
	a.modrm(byte(dst), m, 1)
}

// MOVQstore stores src at m.
func (a *Asm) MOVQstore(src Reg, m Mem) {
	idx, base := memRex(m)
	a.rex(true, byte(src), idx, base, true)
	a.byte1(0x89)
	a.modrm(byte(src), m, 1)
}

func (a *Asm) arithImm(ext byte, imm int32, r Reg) {
	a.rex(true, 0, 0, byte(r), true)
	if imm >= -128 && imm <= 127 {
		a.byte1(0x83, 0xc0|ext<<3|byte(r)&7, byte(int8(imm)))
		return
	}
	a.byte1(0x81, 0xc0|ext<<3|byte(r)&7)
	a.imm32(imm)
}

// ADDQ adds imm to r.
func (a *Asm) ADDQ(imm int32, r Reg) { a.arithImm(0, imm, r) }

// SUBQ subtracts imm from r.
func (a *Asm) SUBQ(imm int32, r Reg) { a.arithImm(5, imm, r) }

// CMPQ compares r with imm (flags of r - imm).
func (a *Asm) CMPQ(r Reg, imm int32) { a.arithImm(7, imm, r) }

// TESTQ sets the flags of r & r.
func (a *Asm) TESTQ(r Reg) {
	a.rex(true, byte(r), 0, byte(r), true)
	a.byte1(0x85, 0xc0|byte(r)&7<<3|byte(r)&7)
}

// XORL clears r (32-bit xor with itself, zero-extended).
func (a *Asm) XORL(r Reg) {
	a.rex(false, byte(r), 0, byte(r), false)
	a.byte1(0x31, 0xc0|byte(r)&7<<3|byte(r)&7)
}

// MOVL sets r to the 32-bit imm (zero-extended).
func (a *Asm) MOVL(imm uint32, r Reg) {
	a.rex(false, 0, 0, byte(r), false)
	a.byte1(0xb8 + byte(r)&7)
	a.imm32(int32(imm))
}

// SHLLCL shifts the 32-bit r left by CL.
func (a *Asm) SHLLCL(r Reg) {
	a.rex(false, 0, 0, byte(r), false)
	a.byte1(0xd3, 0xe0|byte(r)&7)
}

// DECL decrements the 32-bit r.
func (a *Asm) DECL(r Reg) {
	a.rex(false, 0, 0, byte(r), false)
	a.byte1(0xff, 0xc8|byte(r)&7)
}

// Condition codes of Jcc.
const (
	CondNE = 0x5
	CondL  = 0xc // less (signed)
	CondGE = 0xd
	CondLE = 0xe
	CondG  = 0xf
)

// Jcc jumps to l when condition cc holds (rel32).
func (a *Asm) Jcc(cc byte, l Label) {
	a.byte1(0x0f, 0x80|cc)
	a.rel32(l)
}

// JMP jumps to l (rel32).
func (a *Asm) JMP(l Label) {
	a.byte1(0xe9)
	a.rel32(l)
}

// rel32 emits a jump's rel32 to l, resolved by Finish.
func (a *Asm) rel32(l Label) {
	a.jumps = append(a.jumps, fix{at: len(a.b), end: len(a.b) + 4, target: int(l)})
	a.imm32(0)
}

// ---- weaving ----

// weave is a region being emitted as separate instruction streams.
type weave struct {
	start   int
	rips    int     // constant references before the region (a.rips index)
	streams [][]int // each stream's instruction start offsets
}

// BeginWeave starts a region of independent instruction streams, each begun
// by NextStream; EndWeave then interleaves their instructions round-robin
// (the first of every stream, then the second, ...), so that the
// out-of-order core sees several dependency chains side by side. The
// streams must not depend on each other (through registers, flags or
// memory), and the region must hold no labels or jumps. Vector
// instructions are tracked one by one; any other bytes stay glued to the
// instruction before them in their stream.
func (a *Asm) BeginWeave() { a.wv = &weave{start: len(a.b), rips: len(a.rips)} }

// NextStream starts the next stream of the region.
func (a *Asm) NextStream() { a.wv.streams = append(a.wv.streams, []int{len(a.b)}) }

// mark records the start of an instruction in the current stream.
func (a *Asm) mark() {
	if a.wv == nil || len(a.wv.streams) == 0 {
		return
	}
	s := &a.wv.streams[len(a.wv.streams)-1]
	if (*s)[len(*s)-1] != len(a.b) {
		*s = append(*s, len(a.b))
	}
}

// EndWeave interleaves the region's streams and ends it.
func (a *Asm) EndWeave() error {
	w := a.wv
	a.wv = nil
	end := len(a.b)
	for _, j := range a.jumps {
		if j.at >= w.start {
			return fmt.Errorf("amd64enc: jump inside a woven region")
		}
	}
	for _, l := range a.labels {
		if l > w.start {
			return fmt.Errorf("amd64enc: label inside a woven region")
		}
	}
	type span struct{ lo, hi, to int }
	var spans [][]span
	most := 0
	for k, st := range w.streams {
		hi := end
		if k+1 < len(w.streams) {
			hi = w.streams[k+1][0]
		}
		var ss []span
		for i, lo := range st {
			e := hi
			if i+1 < len(st) {
				e = st[i+1]
			}
			if e > lo {
				ss = append(ss, span{lo: lo, hi: e})
			}
		}
		spans = append(spans, ss)
		most = max(most, len(ss))
	}
	out := make([]byte, 0, end-w.start)
	var all []span
	for i := range most {
		for k := range spans {
			if i < len(spans[k]) {
				sp := spans[k][i]
				sp.to = w.start + len(out)
				out = append(out, a.b[sp.lo:sp.hi]...)
				all = append(all, sp)
			}
		}
	}
	if len(out) != end-w.start {
		return fmt.Errorf("amd64enc: woven region lost bytes")
	}
	copy(a.b[w.start:], out)
	for r := range a.rips[w.rips:] {
		f := &a.rips[w.rips+r]
		for _, sp := range all {
			if f.at >= sp.lo && f.at < sp.hi {
				f.at += sp.to - sp.lo
				f.end += sp.to - sp.lo
				break
			}
		}
	}
	return nil
}

// RET returns.
func (a *Asm) RET() { a.byte1(0xc3) }
