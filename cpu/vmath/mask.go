package vmath

import (
	"math"

	e "github.com/ferryml/ferry/cpu/internal/amd64enc"
)

// Opcodes of the compare and select instructions of CompileChain and
// RunProgram. A compare's result is a mask value: every bit set (the f32
// bit pattern 0xffffffff, a NaN) where the predicate holds, zero where not;
// compares are ordered (false when an operand is NaN) except OpNe (true).
// OpSelect's result is B where its mask A has the sign bit set, C elsewhere
// (Instr.C is its third operand); A should be a compare's result. AVX2
// code keeps compare masks in vector registers and selects by VBLENDVPS;
// AVX-512 code compares into an opmask and selects by VBLENDMPS under the
// opmask of the mask's sign bit.
const (
	OpEq int32 = 0x20 + iota
	OpNe
	OpLt
	OpLe
	OpGt
	OpGe
	OpSelect
	maskEnd
)

// maskOp is one compare's row: its name and VCMPPS predicate.
type maskOp struct {
	name string
	imm  uint8
	cmp  func(a, b float32) bool
}

var maskOps = [...]maskOp{
	OpEq - OpEq: {"eq", cmpEQ, func(a, b float32) bool { return a == b }},
	OpNe - OpEq: {"ne", cmpNE, func(a, b float32) bool { return a != b }},
	OpLt - OpEq: {"lt", cmpLT, func(a, b float32) bool { return a < b }},
	OpLe - OpEq: {"le", cmpLE, func(a, b float32) bool { return a <= b }},
	OpGt - OpEq: {"gt", cmpGT, func(a, b float32) bool { return a > b }},
	OpGe - OpEq: {"ge", cmpGE, func(a, b float32) bool { return a >= b }},
}

// isCompare reports whether code is a compare opcode.
func isCompare(code int32) bool { return code >= OpEq && code < OpSelect }

// isMaskOp reports whether code is a compare or OpSelect.
func isMaskOp(code int32) bool { return code >= OpEq && code < maskEnd }

// validCode reports whether code is an opcode a caller may pass.
func validCode(code int32) bool { return validOp(code) || isMaskOp(code) }

// CompareByName returns the compare opcode named name ("gt"), or 0.
func CompareByName(name string) int32 {
	for i, m := range maskOps {
		if m.name == name {
			return OpEq + int32(i)
		}
	}
	return 0
}

// maskTrue is the f32 of a compare's true mask.
var maskTrue = math.Float32frombits(0xffffffff)

// CompareKernel returns the kernel of compare opcode op (dst[i] = the mask
// of a[i] op b[i]), or nil when op is not a compare.
func CompareKernel(op int32) func(dst, a, b []float32) {
	if !isCompare(op) {
		return nil
	}
	f := maskOps[op-OpEq].cmp
	return func(dst, a, b []float32) {
		_, _ = dst[len(a)-1:], b[len(a)-1:]
		for i, x := range a {
			dst[i] = 0
			if f(x, b[i]) {
				dst[i] = maskTrue
			}
		}
	}
}

// Select sets dst[i] = a[i] where mask[i] has its sign bit set (a compare's
// true), b[i] elsewhere.
func Select(dst, mask, a, b []float32) {
	if len(mask) == 0 {
		return
	}
	_, _, _ = dst[len(mask)-1], a[len(mask)-1], b[len(mask)-1]
	for i, m := range mask {
		if math.Float32bits(m)>>31 != 0 {
			dst[i] = a[i]
		} else {
			dst[i] = b[i]
		}
	}
}

// maskBody emits a compare or select. AVX2: the compare's vector mask
// (VCMPPS), VBLENDVPS on the mask's sign bit. AVX-512: the compare into
// the opmask, whose lanes then set every bit of the result (zeroed first),
// and the select's opmask from the mask's sign bit (VPTESTMD) for a
// VBLENDMPS.
func (g *gen) maskBody(code int32, in []e.Z, out e.Z) {
	switch {
	case g.vex && code == OpSelect:
		g.a.VBLENDVPS(in[0], in[1], in[2], out)
	case g.vex:
		g.a.VCMPPSv(maskOps[code-OpEq].imm, in[1], in[0], out)
	case code == OpSelect:
		g.a.VPTESTMD(g.cbits(signBit), in[0], g.km)
		g.a.VBLENDMPSk(in[1], in[2], g.km, out)
	default:
		g.a.VCMPPS(maskOps[code-OpEq].imm, in[1], in[0], g.km)
		g.a.VPXORD(out, out, out)
		g.a.VBLENDMPSk(g.cbits(0xffffffff), out, g.km, out)
	}
}

// cmpSelBody emits a compare joined to its select: pred(in[0], in[1]) ?
// in[2] : in[3]. AVX-512: the compare into the opmask and one VBLENDMPS
// under it; AVX2: the compare's vector mask in out, then VBLENDVPS.
func (g *gen) cmpSelBody(pred int32, in []e.Z, out e.Z) {
	imm := maskOps[pred-OpEq].imm
	if g.vex {
		g.a.VCMPPSv(imm, in[1], in[0], out)
		g.a.VBLENDVPS(out, in[2], in[3], out)
		return
	}
	g.a.VCMPPS(imm, in[1], in[0], g.km)
	g.a.VBLENDMPSk(in[2], in[3], g.km, out)
}
