package x86emu

import (
	"encoding/binary"
	"fmt"
)

// Encodings of an instruction.
const (
	encLegacy = iota
	encVEX
	encEVEX
)

// Inst is one decoded instruction.
type Inst struct {
	Name  string // mnemonic (Intel's)
	Len   int    // bytes
	Bytes []byte // its encoding

	enc  int
	reg  uint8 // ModRM.reg with its extension bits (register number or opcode extension)
	vvvv uint8 // VEX/EVEX second source (with EVEX V')
	rm   uint8 // ModRM.rm register (with extension bits) when !mem
	mem  bool  // rm is a memory operand
	base int8  // memory base register, -1 none (RIP-relative: absolute disp)
	idx  int8  // memory index register, -1 none
	sc   uint8 // index scale
	disp int64
	d8   bool // the displacement was a disp8 (EVEX: scaled by the operand size)
	imm  int64
	w    bool // REX.W / VEX.W / EVEX.W
	op32 bool // legacy: 32-bit operand size (else 64)
	vl   int  // vector length in bytes (16, 32, 64)
	k    uint8
	z    bool
	bcst bool
	mm   uint8
	pp   uint8
	opc  byte

	vdef *vdef
	exec func(m *Machine, in *Inst, next uintptr) (uintptr, error)
}

// ea returns the effective address of the memory operand.
func (in *Inst) ea(m *Machine) uint64 {
	a := uint64(in.disp)
	if in.base >= 0 {
		a += m.R[in.base]
	}
	if in.idx >= 0 {
		a += m.R[in.idx] * uint64(in.sc)
	}
	return a
}

// String writes the mnemonic and the bytes.
func (in *Inst) String() string { return fmt.Sprintf("%s [% x]", in.Name, in.Bytes) }

// decoder reads one instruction.
type decoder struct {
	b   []byte
	i   int
	err error
}

func (d *decoder) next() byte {
	if d.i >= len(d.b) {
		if d.err == nil {
			d.err = fmt.Errorf("truncated instruction")
		}
		d.i++
		return 0
	}
	v := d.b[d.i]
	d.i++
	return v
}

func (d *decoder) int8() int64 { return int64(int8(d.next())) }

func (d *decoder) int32() int64 {
	var v [4]byte
	for i := range v {
		v[i] = d.next()
	}
	return int64(int32(binary.LittleEndian.Uint32(v[:])))
}

// modrm reads ModRM, SIB and displacement: rr, xx, bb are the extension
// bits of ModRM.reg, SIB.index and the base or rm register (REX, VEX or
// EVEX), rr2 and xx2 EVEX's R' and (for a register rm) X.
func (d *decoder) modrm(in *Inst, rr, xx, bb, rr2 uint8) {
	m := d.next()
	mod, reg, rm := m>>6, m>>3&7, m&7
	in.reg = reg | rr<<3 | rr2<<4
	if mod == 3 {
		in.rm = rm | bb<<3 | xx<<4
		return
	}
	in.mem, in.base, in.idx, in.sc = true, int8(rm|bb<<3), -1, 1
	if rm == 4 {
		sib := d.next()
		in.sc = 1 << (sib >> 6)
		if ix := sib >> 3 & 7; ix != 4 || xx != 0 {
			in.idx = int8(ix | xx<<3)
		}
		in.base = int8(sib&7 | bb<<3)
		if sib&7 == 5 && mod == 0 {
			in.base = -1
			in.disp = d.int32()
			return
		}
	} else if rm == 5 && mod == 0 {
		in.base = -2 // RIP-relative, resolved when the length is known
		in.disp = d.int32()
		return
	}
	switch mod {
	case 1:
		in.disp, in.d8 = d.int8(), true
	case 2:
		in.disp = d.int32()
	}
}

// Decode decodes the instruction at the start of b, which lies at address
// pc (for RIP-relative operands).
func Decode(b []byte, pc uintptr) (*Inst, error) {
	d := &decoder{b: b}
	in := &Inst{base: -1, idx: -1}
	err := d.decode(in)
	if err == nil {
		err = d.err
	}
	n := min(d.i, len(b))
	if err != nil {
		return nil, fmt.Errorf("%w: bytes [% x]", err, b[:max(n, min(len(b), 8))])
	}
	in.Len = n
	in.Bytes = append([]byte(nil), b[:n]...)
	if in.base == -2 {
		in.base = -1
		in.disp += int64(pc) + int64(n)
	}
	return in, nil
}

func (d *decoder) decode(in *Inst) error {
	var rex byte
	p66 := false
	for {
		c := d.next()
		switch {
		case c == 0x66 && rex == 0:
			p66 = true
			continue
		case c >= 0x40 && c <= 0x4f && rex == 0:
			rex = c
			continue
		case c == 0xc4 || c == 0xc5 || c == 0x62:
			if rex != 0 || p66 {
				return fmt.Errorf("prefix before VEX/EVEX")
			}
			return d.decodeVector(in, c)
		case c == 0xf2 || c == 0xf3 || c == 0xf0 || c == 0x67 || c >= 0x26 && c <= 0x3e && c&7 == 6 || c == 0x64 || c == 0x65:
			return fmt.Errorf("unsupported prefix %#02x", c)
		}
		if p66 {
			return fmt.Errorf("16-bit operand size (0x66 prefix) unsupported")
		}
		key := uint16(c)
		if c == 0x0f {
			key = 0x100 | uint16(d.next())
		}
		in.opc = byte(key)
		in.w = rex&8 != 0
		in.op32 = !in.w
		def, ok := legacyTable[key]
		if !ok {
			return fmt.Errorf("unknown instruction")
		}
		if def.modrm {
			d.modrm(in, rex>>2&1, rex>>1&1, rex&1, 0)
			in.rm &= 15 // REX.X does not extend a register rm
			if def.group != nil {
				g := def.group[in.reg&7]
				if g == nil {
					return fmt.Errorf("unknown instruction (%s /%d)", def.name, in.reg&7)
				}
				def = g
			}
		} else {
			in.rm = c&7 | (rex&1)<<3 // opcode-register forms (MOV r, imm)
		}
		switch def.imm {
		case imm8:
			in.imm = d.int8()
		case imm32:
			in.imm = d.int32()
		case immV:
			if in.w {
				lo, hi := uint64(uint32(d.int32())), uint64(uint32(d.int32()))
				in.imm = int64(lo | hi<<32)
			} else {
				in.imm = int64(uint32(d.int32()))
			}
		}
		in.Name, in.exec = def.name, def.exec
		if def.check != nil {
			if err := def.check(in); err != nil {
				return err
			}
		}
		return nil
	}
}

// decodeVector decodes a VEX (c4, c5) or EVEX (62) instruction.
func (d *decoder) decodeVector(in *Inst, c byte) error {
	var rr, xx, bb, rr2, vv2 uint8
	switch c {
	case 0xc5:
		p := d.next()
		in.enc = encVEX
		rr = ^p >> 7 & 1
		in.vvvv = ^p >> 3 & 15
		in.vl = 16 << (p >> 2 & 1)
		in.pp, in.mm = p&3, 1
	case 0xc4:
		p0, p1 := d.next(), d.next()
		in.enc = encVEX
		rr, xx, bb = ^p0>>7&1, ^p0>>6&1, ^p0>>5&1
		in.mm = p0 & 31
		in.w = p1>>7 != 0
		in.vvvv = ^p1 >> 3 & 15
		in.vl = 16 << (p1 >> 2 & 1)
		in.pp = p1 & 3
	default:
		p0, p1, p2 := d.next(), d.next(), d.next()
		in.enc = encEVEX
		if p0&8 != 0 || p1&4 == 0 {
			return fmt.Errorf("malformed EVEX prefix")
		}
		rr, xx, bb, rr2 = ^p0>>7&1, ^p0>>6&1, ^p0>>5&1, ^p0>>4&1
		in.mm = p0 & 7
		in.w = p1>>7 != 0
		in.vvvv = ^p1 >> 3 & 15
		in.pp = p1 & 3
		in.z = p2>>7 != 0
		ll := p2 >> 5 & 3
		in.bcst = p2>>4&1 != 0
		vv2 = ^p2 >> 3 & 1
		in.vvvv |= vv2 << 4
		in.k = p2 & 7
		if ll == 3 {
			return fmt.Errorf("EVEX vector length 3 unsupported")
		}
		in.vl = 16 << ll
	}
	in.opc = d.next()
	if in.enc == encVEX && in.mm == 1 && in.opc == 0x77 { // VZEROUPPER/VZEROALL: no ModRM
		if in.vl != 16 {
			return fmt.Errorf("VZEROALL unsupported")
		}
		in.Name, in.exec = "VZEROUPPER", execVzeroupper
		return nil
	}
	peek := byte(0)
	if d.i < len(d.b) {
		peek = d.b[d.i] >> 3 & 7
	}
	def := lookupVector(in.enc, in.mm, in.pp, in.opc, peek, in.w)
	if def == nil {
		return fmt.Errorf("unknown %s instruction (map %d, pp %d, opcode %#02x)", encName[in.enc], in.mm, in.pp, in.opc)
	}
	d.modrm(in, rr, xx, bb, rr2)
	if def.w >= 0 && in.w != (def.w == 1) {
		return fmt.Errorf("%s with W%d unsupported", def.name, map[bool]int{false: 0, true: 1}[in.w])
	}
	if def.imm {
		in.imm = int64(d.next())
	}
	in.Name, in.vdef, in.exec = def.name, def, execVector
	return checkVector(in, def)
}

var encName = [...]string{"legacy", "VEX", "EVEX"}
