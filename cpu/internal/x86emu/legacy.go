package x86emu

import (
	"fmt"
	"math/bits"
)

// The general-purpose instructions: one row of legacyTable per opcode (0x0f
// xx as 0x1xx), a group's rows by ModRM.reg.

// Immediate kinds.
const (
	immNone = iota
	imm8
	imm32
	immV // 32 bits, 64 with REX.W (MOV r, imm)
)

type ldef struct {
	name  string
	modrm bool
	imm   int
	group *[8]*ldef
	check func(in *Inst) error
	exec  func(m *Machine, in *Inst, next uintptr) (uintptr, error)
}

var legacyTable = map[uint16]*ldef{}

// ALU operations of the 0x00-0x3f rows and group 1 (by ModRM.reg).
const (
	aluADD = 0
	aluOR  = 1
	aluAND = 4
	aluSUB = 5
	aluXOR = 6
	aluCMP = 7
	aluTST = 8 // TEST: AND without the result
)

var aluName = map[int]string{aluADD: "ADD", aluOR: "OR", aluAND: "AND", aluSUB: "SUB", aluXOR: "XOR", aluCMP: "CMP", aluTST: "TEST"}

func init() {
	t := legacyTable
	addALU(t)
	addMoves(t)
	addUnary(t)
	addShifts(t)
	addIMUL(t)
	addMOVUPS(t)
	addJumps(t)
	addHints(t)
}

// addALU adds the ALU rows (ADD, OR, AND, SUB, XOR, CMP, TEST) and group 1.
func addALU(t map[uint16]*ldef) {
	for _, op := range []int{aluADD, aluOR, aluAND, aluSUB, aluXOR, aluCMP} {
		o := uint16(op) << 3
		t[o|1] = &ldef{name: aluName[op], modrm: true, exec: aluExec(op, false, false)} // r/m op= r
		t[o|3] = &ldef{name: aluName[op], modrm: true, exec: aluExec(op, true, false)}  // r op= r/m
	}
	t[0x85] = &ldef{name: "TEST", modrm: true, exec: aluExec(aluTST, false, false)}
	var g1, g81 [8]*ldef
	for _, op := range []int{aluADD, aluOR, aluAND, aluSUB, aluXOR, aluCMP} {
		g1[op] = &ldef{name: aluName[op], imm: imm8, exec: aluExec(op, false, true)}
		g81[op] = &ldef{name: aluName[op], imm: imm32, exec: aluExec(op, false, true)}
	}
	t[0x83] = &ldef{name: "group1", modrm: true, group: &g1}
	t[0x81] = &ldef{name: "group1", modrm: true, group: &g81}
}

// addMoves adds MOV (register, memory and immediate forms) and LEA.
func addMoves(t map[uint16]*ldef) {
	t[0x89] = &ldef{name: "MOV", modrm: true, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		m.setRM(in, m.reg(in.reg, in.op32))
		return next, nil
	}}
	t[0x8b] = &ldef{name: "MOV", modrm: true, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		m.setReg(in.reg, m.getRM(in), in.op32)
		return next, nil
	}}
	t[0x8d] = &ldef{name: "LEA", modrm: true, check: needMem, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		m.setReg(in.reg, in.ea(m), in.op32)
		return next, nil
	}}
	t[0xc7] = &ldef{name: "group11", modrm: true, group: &[8]*ldef{0: {name: "MOV", imm: imm32,
		exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
			m.setRM(in, uint64(in.imm))
			return next, nil
		}}}}
	for r := range 8 {
		t[uint16(0xb8+r)] = &ldef{name: "MOV", imm: immV, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
			m.setReg(in.rm, uint64(in.imm), in.op32)
			return next, nil
		}}
	}
}

// addUnary adds groups 5 (INC, DEC) and 3 (NOT, NEG).
func addUnary(t map[uint16]*ldef) {
	t[0xff] = &ldef{name: "group5", modrm: true, group: &[8]*ldef{
		0: {name: "INC", exec: incDec(1)},
		1: {name: "DEC", exec: incDec(-1)},
	}}
	t[0xf7] = &ldef{name: "group3", modrm: true, group: &[8]*ldef{
		2: {name: "NOT", exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
			m.setRM(in, ^m.getRM(in))
			return next, nil
		}},
		3: {name: "NEG", exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
			v := m.getRM(in)
			r := m.alu(aluSUB, 0, v, in.op32)
			m.setRM(in, r)
			return next, nil
		}},
	}}
}

// addShifts adds group 2, the shifts SHL, SHR and SAR by 1, CL or an immediate.
func addShifts(t map[uint16]*ldef) {
	for _, sh := range []struct {
		op  uint16
		imm int
		cnt func(m *Machine, in *Inst) uint64
	}{
		{0xd1, immNone, func(*Machine, *Inst) uint64 { return 1 }},
		{0xd3, immNone, func(m *Machine, _ *Inst) uint64 { return m.R[RCX] }},
		{0xc1, imm8, func(_ *Machine, in *Inst) uint64 { return uint64(in.imm) }},
	} {
		var g [8]*ldef
		for ext, name := range map[int]string{4: "SHL", 5: "SHR", 7: "SAR"} {
			g[ext] = &ldef{name: name, imm: sh.imm, exec: shiftExec(ext, sh.cnt)}
		}
		t[sh.op] = &ldef{name: "group2", modrm: true, group: &g}
	}
}

// addIMUL adds the two-operand IMUL.
func addIMUL(t map[uint16]*ldef) {
	t[0x1af] = &ldef{name: "IMUL", modrm: true, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		a, b := m.reg(in.reg, in.op32), m.getRM(in)
		var r uint64
		var ovf bool
		if in.op32 {
			p := int64(int32(a)) * int64(int32(b))
			r, ovf = uint64(uint32(p)), p != int64(int32(p))
		} else {
			hi, lo := bits.Mul64(a, b)
			// signed high word: correct the unsigned one
			if int64(a) < 0 {
				hi -= b
			}
			if int64(b) < 0 {
				hi -= a
			}
			r, ovf = lo, hi != uint64(int64(lo)>>63)
		}
		m.setReg(in.reg, r, in.op32)
		m.CF, m.OF = ovf, ovf
		m.szp(r, in.op32)
		return next, nil
	}}
}

// addMOVUPS adds the SSE MOVUPS loads and stores: 16 bytes, bits 128 and up of the register kept.
func addMOVUPS(t map[uint16]*ldef) {
	t[0x110] = &ldef{name: "MOVUPS", modrm: true, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		dst := &m.Z[in.reg&15]
		if !in.mem {
			copy(dst[:4], m.Z[in.rm&15][:4])
			return next, nil
		}
		a := in.ea(m)
		for i := range 4 {
			dst[i] = load32(a + 4*uint64(i))
		}
		return next, nil
	}}
	t[0x111] = &ldef{name: "MOVUPS", modrm: true, exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		src := m.Z[in.reg&15]
		if !in.mem {
			copy(m.Z[in.rm&15][:4], src[:4])
			return next, nil
		}
		a := in.ea(m)
		for i := range 4 {
			store32(a+4*uint64(i), src[i])
		}
		return next, nil
	}}
}

// addJumps adds the conditional jumps, JMP and RET.
func addJumps(t map[uint16]*ldef) {
	for cc := range 16 {
		t[uint16(0x70+cc)] = &ldef{name: "J" + condName[cc], imm: imm8, exec: jcc(cc)}
		t[uint16(0x180+cc)] = &ldef{name: "J" + condName[cc], imm: imm32, exec: jcc(cc)}
	}
	jmp := func(m *Machine, in *Inst, next uintptr) (uintptr, error) { return next + uintptr(in.imm), nil }
	t[0xeb] = &ldef{name: "JMP", imm: imm8, exec: jmp}
	t[0xe9] = &ldef{name: "JMP", imm: imm32, exec: jmp}
	t[0xc3] = &ldef{name: "RET", exec: func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		ret := load64(m.R[RSP])
		m.R[RSP] += 8
		return uintptr(ret), nil
	}}
}

// addHints adds the hints, which have no architectural effect: NOP and the prefetches.
func addHints(t map[uint16]*ldef) {
	nop := func(m *Machine, in *Inst, next uintptr) (uintptr, error) { return next, nil }
	t[0x90] = &ldef{name: "NOP", exec: nop}
	t[0x11f] = &ldef{name: "NOP", modrm: true, exec: nop}
	var pf [8]*ldef
	for i, name := range []string{"PREFETCHNTA", "PREFETCHT0", "PREFETCHT1", "PREFETCHT2"} {
		pf[i] = &ldef{name: name, check: needMem, exec: nop}
	}
	t[0x118] = &ldef{name: "PREFETCH", modrm: true, group: &pf}
}

var condName = [16]string{"O", "NO", "B", "AE", "E", "NE", "BE", "A", "S", "NS", "P", "NP", "L", "GE", "LE", "G"}

func needMem(in *Inst) error {
	if !in.mem {
		return fmt.Errorf("%s needs a memory operand", in.Name)
	}
	return nil
}

// cond evaluates condition code cc on the flags.
func (m *Machine) cond(cc int) bool {
	var r bool
	switch cc >> 1 {
	case 0:
		r = m.OF
	case 1:
		r = m.CF
	case 2:
		r = m.ZF
	case 3:
		r = m.CF || m.ZF
	case 4:
		r = m.SF
	case 5:
		r = m.PF
	case 6:
		r = m.SF != m.OF
	case 7:
		r = m.ZF || m.SF != m.OF
	}
	return r != (cc&1 != 0)
}

func jcc(cc int) func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
	return func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		if m.cond(cc) {
			return next + uintptr(in.imm), nil
		}
		return next, nil
	}
}

// reg reads register r (its low 32 bits when op32).
func (m *Machine) reg(r uint8, op32 bool) uint64 {
	if op32 {
		return uint64(uint32(m.R[r&15]))
	}
	return m.R[r&15]
}

// setReg writes register r (a 32-bit write clears the upper half).
func (m *Machine) setReg(r uint8, v uint64, op32 bool) {
	if op32 {
		v = uint64(uint32(v))
	}
	m.R[r&15] = v
}

func (m *Machine) getRM(in *Inst) uint64 {
	if !in.mem {
		return m.reg(in.rm, in.op32)
	}
	if in.op32 {
		return uint64(load32(in.ea(m)))
	}
	return load64(in.ea(m))
}

func (m *Machine) setRM(in *Inst, v uint64) {
	if !in.mem {
		m.setReg(in.rm, v, in.op32)
		return
	}
	if in.op32 {
		store32(in.ea(m), uint32(v))
	} else {
		store64(in.ea(m), v)
	}
}

// szp sets SF, ZF and PF from result r.
func (m *Machine) szp(r uint64, op32 bool) {
	if op32 {
		r = uint64(uint32(r))
		m.SF = r>>31 != 0
	} else {
		m.SF = r>>63 != 0
	}
	m.ZF = r == 0
	m.PF = bits.OnesCount8(uint8(r))%2 == 0
}

// alu computes a op b, sets the flags and returns the result.
func (m *Machine) alu(op int, a, b uint64, op32 bool) uint64 {
	sh := 63
	if op32 {
		sh = 31
		a, b = uint64(uint32(a)), uint64(uint32(b))
	}
	mask := uint64(1)<<sh<<1 - 1
	var r uint64
	switch op {
	case aluADD:
		r = (a + b) & mask
		m.CF = r < a
		m.OF = (a>>sh == b>>sh) && r>>sh != a>>sh
	case aluSUB, aluCMP:
		r = (a - b) & mask
		m.CF = a < b
		m.OF = (a>>sh != b>>sh) && r>>sh != a>>sh
	case aluAND, aluTST:
		r, m.CF, m.OF = a&b, false, false
	case aluOR:
		r, m.CF, m.OF = a|b, false, false
	case aluXOR:
		r, m.CF, m.OF = a^b, false, false
	}
	m.szp(r, op32)
	return r
}

// aluExec: ALU op on r/m and reg (toReg: the result to reg), or on r/m and
// the immediate (imm, sign-extended).
func aluExec(op int, toReg, imm bool) func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
	return func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		a := m.getRM(in)
		var b uint64
		switch {
		case imm:
			b = uint64(in.imm)
		case toReg:
			a, b = m.reg(in.reg, in.op32), a
		default:
			b = m.reg(in.reg, in.op32)
		}
		r := m.alu(op, a, b, in.op32)
		if op == aluCMP || op == aluTST {
			return next, nil
		}
		if toReg {
			m.setReg(in.reg, r, in.op32)
		} else {
			m.setRM(in, r)
		}
		return next, nil
	}
}

func incDec(d int64) func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
	return func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		cf := m.CF
		op := aluADD
		if d < 0 {
			op = aluSUB
		}
		r := m.alu(op, m.getRM(in), 1, in.op32)
		m.CF = cf // INC and DEC keep CF
		m.setRM(in, r)
		return next, nil
	}
}

// shiftExec: SHL (ext 4), SHR (5), SAR (7) by the count cnt returns.
func shiftExec(ext int, cnt func(m *Machine, in *Inst) uint64) func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
	return func(m *Machine, in *Inst, next uintptr) (uintptr, error) {
		size := uint64(64)
		if in.op32 {
			size = 32
		}
		n := cnt(m, in) & (size - 1)
		v := m.getRM(in)
		if n == 0 {
			return next, nil // flags unchanged
		}
		mask := uint64(1)<<(size-1)<<1 - 1
		var r uint64
		switch ext {
		case 4:
			r = v << n & mask
			m.CF = v>>(size-n)&1 != 0
			m.OF = (r>>(size-1)&1 != 0) != m.CF
		case 5:
			r = v >> n
			m.CF = v>>(n-1)&1 != 0
			m.OF = v>>(size-1)&1 != 0
		default:
			sv := int64(v<<(64-size)) >> (64 - size)
			r = uint64(sv>>n) & mask
			m.CF = uint64(sv>>(n-1))&1 != 0
			m.OF = false
		}
		m.szp(r, in.op32)
		m.setRM(in, r)
		return next, nil
	}
}
