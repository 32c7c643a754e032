package x86emu

import (
	"fmt"
	"slices"
)

// The vector and opmask instructions: one row of vectorRows per
// instruction and encoding; decoding looks a row up by encoding, opcode
// map, mandatory prefix, opcode and (for group opcodes) ModRM.reg, and
// execution reads the sources the row's form names, calls its lane
// function and writes the result under the opmask.

// vform says where an instruction's operands are.
type vform int

const (
	fRVM  vform = iota // reg ← vvvv, rm (reg's old value also read)
	fRM                // reg ← rm
	fMR                // rm ← reg (a store when rm is memory)
	fVM                // vvvv ← rm (group opcodes: ModRM.reg is the extension)
	fKVM               // opmask reg ← vvvv, rm
	fRVMR              // reg ← vvvv, rm, the register in imm[7:4] (VEX /is4)
	fRaw               // raw executes everything (opmask instructions)
)

// tuple is the memory operand's kind.
type tuple int

const (
	tFV  tuple = iota // a full vector, or one element broadcast ({1toN})
	tFVM              // a full vector, no broadcast
	tT1S              // one 32-bit element
	tReg              // registers only
)

// mkind is what an EVEX opmask does.
type mkind int

const (
	mNone  mkind = iota // no opmask allowed
	mWrite              // write mask, merging or zeroing (merging only into memory)
	mCmp                // the result is an opmask, ANDed with the mask
	mSel                // the mask selects between the sources (VBLENDMPS)
)

// Encodings a row applies to.
const (
	bVEX  = 1 << encVEX
	bEVEX = 1 << encEVEX
	bBoth = bVEX | bEVEX
)

// Opcode maps and prefixes.
const (
	m0F   = 1
	m0F38 = 2
	m0F3A = 3
	pNone = 0
	p66   = 1
	pF3   = 2
	pF2   = 3
)

type vdef struct {
	name  string
	encs  int
	mm    byte
	pp    byte
	op    byte
	ext   int8 // ModRM.reg extension, -1: none
	form  vform
	tuple tuple
	imm   bool
	w     int8 // required W (0 or 1), -1 either
	mask  mkind
	align bool // a memory operand must be aligned to the vector length
	mem   bool // the rm operand must be memory
	min   int  // smallest vector length in bytes (0: any)
	q     bool // 64-bit elements: opmask bits, broadcasts and T1S operands are per 64 bits
	fn    func(x *vctx)
	raw   func(m *Machine, in *Inst) error
}

// vctx holds one execution's lanes: a the vvvv source, b the rm source,
// c the /is4 source, d the destination's old value, r the result.
type vctx struct {
	a, b, c, d, r [16]uint32
	n             int  // 32-bit lanes
	q             bool // 64-bit elements (pairs of lanes)
	imm           uint8
	sel           uint64 // mSel: the lanes taking b
	kout          uint64 // mCmp: the result
}

type vkey struct {
	enc        int
	mm, pp, op byte
	ext        int8
	w          int8 // the row's W (0 or 1), -1 either
}

var vectorTable = map[vkey]*vdef{}

// lookupVector finds the row of an instruction: by its ModRM.reg
// extension or none, and by its W bit (the PS and PD forms of an FMA share
// an opcode) or either. A row for the other W is returned when there is
// no other, for the decoder to name the unsupported W.
func lookupVector(enc int, mm, pp, op, reg byte, w bool) *vdef {
	wk := int8(0)
	if w {
		wk = 1
	}
	for _, ww := range [][]int8{{wk, -1}, {1 - wk}} {
		for _, ext := range []int8{int8(reg), -1} {
			for _, w := range ww {
				if d := vectorTable[vkey{enc, mm, pp, op, ext, w}]; d != nil {
					return d
				}
			}
		}
	}
	return nil
}

// addRows enters rows into vectorTable.
func addRows(rows []vdef) {
	for i := range rows {
		d := &rows[i]
		for _, enc := range []int{encVEX, encEVEX} {
			if d.encs&(1<<enc) == 0 {
				continue
			}
			k := vkey{enc, d.mm, d.pp, d.op, d.ext, d.w}
			if vectorTable[k] != nil {
				panic("x86emu: two rows for " + d.name)
			}
			vectorTable[k] = d
		}
	}
}

// Lane functions.

func lane2(f func(a, b uint32) uint32) func(*vctx) {
	return func(x *vctx) {
		for i := range x.n {
			x.r[i] = f(x.a[i], x.b[i])
		}
	}
}

func lane1(f func(b uint32) uint32) func(*vctx) {
	return func(x *vctx) {
		for i := range x.n {
			x.r[i] = f(x.b[i])
		}
	}
}

func lane1imm(f func(imm uint8, b uint32) uint32) func(*vctx) {
	return func(x *vctx) {
		for i := range x.n {
			x.r[i] = f(x.imm, x.b[i])
		}
	}
}

// lane2q is lane2 over 64-bit elements (pairs of 32-bit lanes, low first).
func lane2q(f func(a, b uint64) uint64) func(*vctx) {
	return func(x *vctx) {
		for i := 0; i+1 < x.n; i += 2 {
			r := f(uint64(x.a[i])|uint64(x.a[i+1])<<32, uint64(x.b[i])|uint64(x.b[i+1])<<32)
			x.r[i], x.r[i+1] = uint32(r), uint32(r>>32)
		}
	}
}

func mask32(b bool) uint32 {
	if b {
		return 0xffffffff
	}
	return 0
}

// fmaRow is one FMA instruction: form 132, 213 or 231 (which of the
// destination d, vvvv a and rm b are the factors and the addend) and its
// signs.
func fmaRow(name string, op byte, form int, negMul, negAdd bool) vdef {
	fn := func(x *vctx) {
		for i := range x.n {
			d, a, b := x.d[i], x.a[i], x.b[i]
			var p, q, s uint32 // p*q + s
			switch form {
			case 132:
				p, q, s = d, b, a
			case 213:
				p, q, s = a, d, b
			default:
				p, q, s = a, b, d
			}
			x.r[i] = fmaF(p, q, s, negMul, negAdd)
		}
	}
	return vdef{name: name, encs: bBoth, mm: m0F38, pp: p66, op: op, ext: -1, w: 0, mask: mWrite, fn: fn}
}

// fmaRowPD is fmaRow for the PD form (W1) of the same opcode.
func fmaRowPD(name string, op byte, form int, negMul, negAdd bool) vdef {
	fn := func(x *vctx) {
		for i := 0; i+1 < x.n; i += 2 {
			d := uint64(x.d[i]) | uint64(x.d[i+1])<<32
			a := uint64(x.a[i]) | uint64(x.a[i+1])<<32
			b := uint64(x.b[i]) | uint64(x.b[i+1])<<32
			var p, q, s uint64 // p*q + s
			switch form {
			case 132:
				p, q, s = d, b, a
			case 213:
				p, q, s = a, d, b
			default:
				p, q, s = a, b, d
			}
			r := fmaD(p, q, s, negMul, negAdd)
			x.r[i], x.r[i+1] = uint32(r), uint32(r>>32)
		}
	}
	return vdef{name: name, encs: bBoth, mm: m0F38, pp: p66, op: op, ext: -1, w: 1, q: true, mask: mWrite, fn: fn}
}

// pdRows returns the VEX (W ignored) and EVEX (W1) rows of a PD
// instruction with 64-bit elements.
func pdRows(d vdef) []vdef {
	d.q = true
	v, e := d, d
	v.encs, v.w = bVEX, -1
	e.encs, e.w = bEVEX, 1
	return []vdef{v, e}
}

// init enters the rows of every family into vectorTable, with a row's
// zero ModRM.reg extension meaning none (but for group opcodes) and a
// write mask allowed by default (but for opmask instructions and
// memory-only rows).
func init() {
	rows := slices.Concat(float32Rows(), compareRows(), integerRows(), moveRows(), opmaskRows(), float64Rows())
	for i := range rows {
		if rows[i].ext == 0 && rows[i].form != fVM {
			rows[i].ext = -1
		}
		if rows[i].mask == mNone && rows[i].form != fRaw && !rows[i].mem {
			rows[i].mask = mWrite
		}
	}
	addRows(rows)
}

// float32Rows returns the float32 arithmetic and conversions, and the
// FMAs (PS and PD forms).
func float32Rows() []vdef {
	return []vdef{
		{name: "VADDPS", encs: bBoth, mm: m0F, op: 0x58, fn: lane2(addF)},
		{name: "VMULPS", encs: bBoth, mm: m0F, op: 0x59, fn: lane2(mulF)},
		{name: "VSUBPS", encs: bBoth, mm: m0F, op: 0x5c, fn: lane2(subF)},
		{name: "VMINPS", encs: bBoth, mm: m0F, op: 0x5d, fn: lane2(minF)},
		{name: "VDIVPS", encs: bBoth, mm: m0F, op: 0x5e, fn: lane2(divF)},
		{name: "VMAXPS", encs: bBoth, mm: m0F, op: 0x5f, fn: lane2(maxF)},
		{name: "VSQRTPS", encs: bBoth, mm: m0F, op: 0x51, form: fRM, fn: lane1(sqrtF)},
		{name: "VSCALEFPS", encs: bEVEX, mm: m0F38, pp: p66, op: 0x2c, fn: lane2(scalefF)},
		{name: "VGETEXPPS", encs: bEVEX, mm: m0F38, pp: p66, op: 0x42, form: fRM, fn: lane1(getexpF)},
		{name: "VGETMANTPS", encs: bEVEX, mm: m0F3A, pp: p66, op: 0x26, form: fRM, imm: true, fn: lane1imm(getmantF)},
		{name: "VRNDSCALEPS", encs: bEVEX, mm: m0F3A, pp: p66, op: 0x08, form: fRM, imm: true, fn: lane1imm(rndscaleF)},
		{name: "VROUNDPS", encs: bVEX, mm: m0F3A, pp: p66, op: 0x08, form: fRM, imm: true,
			fn: lane1imm(func(imm uint8, b uint32) uint32 { return rndscaleF(imm&15, b) })},
		{name: "VCVTDQ2PS", encs: bBoth, mm: m0F, op: 0x5b, form: fRM, fn: lane1(cvtI2F)},
		{name: "VCVTPS2DQ", encs: bBoth, mm: m0F, pp: p66, op: 0x5b, form: fRM,
			fn: lane1(func(b uint32) uint32 { return cvtF2I(b, false) })},
		{name: "VCVTTPS2DQ", encs: bBoth, mm: m0F, pp: pF3, op: 0x5b, form: fRM,
			fn: lane1(func(b uint32) uint32 { return cvtF2I(b, true) })},
		fmaRow("VFMADD132PS", 0x98, 132, false, false),
		fmaRow("VFMADD213PS", 0xa8, 213, false, false),
		fmaRow("VFMADD231PS", 0xb8, 231, false, false),
		fmaRow("VFMSUB132PS", 0x9a, 132, false, true),
		fmaRow("VFMSUB213PS", 0xaa, 213, false, true),
		fmaRow("VFMSUB231PS", 0xba, 231, false, true),
		fmaRow("VFNMADD132PS", 0x9c, 132, true, false),
		fmaRow("VFNMADD213PS", 0xac, 213, true, false),
		fmaRow("VFNMADD231PS", 0xbc, 231, true, false),
		fmaRow("VFNMSUB132PS", 0x9e, 132, true, true),
		fmaRow("VFNMSUB213PS", 0xae, 213, true, true),
		fmaRow("VFNMSUB231PS", 0xbe, 231, true, true),
		fmaRowPD("VFMADD132PD", 0x98, 132, false, false),
		fmaRowPD("VFMADD213PD", 0xa8, 213, false, false),
		fmaRowPD("VFMADD231PD", 0xb8, 231, false, false),
		fmaRowPD("VFMSUB132PD", 0x9a, 132, false, true),
		fmaRowPD("VFMSUB213PD", 0xaa, 213, false, true),
		fmaRowPD("VFMSUB231PD", 0xba, 231, false, true),
		fmaRowPD("VFNMADD132PD", 0x9c, 132, true, false),
		fmaRowPD("VFNMADD213PD", 0xac, 213, true, false),
		fmaRowPD("VFNMADD231PD", 0xbc, 231, true, false),
		fmaRowPD("VFNMSUB132PD", 0x9e, 132, true, true),
		fmaRowPD("VFNMSUB213PD", 0xae, 213, true, true),
		fmaRowPD("VFNMSUB231PD", 0xbe, 231, true, true),
	}
}

// compareRows returns the compares and blends.
func compareRows() []vdef {
	return []vdef{
		{name: "VCMPPS", encs: bEVEX, mm: m0F, op: 0xc2, form: fKVM, imm: true, mask: mCmp, fn: func(x *vctx) {
			for i := range x.n {
				if cmpF(x.imm&31, x.a[i], x.b[i]) {
					x.kout |= 1 << i
				}
			}
		}},
		{name: "VCMPPS", encs: bVEX, mm: m0F, op: 0xc2, imm: true, fn: func(x *vctx) {
			for i := range x.n {
				x.r[i] = mask32(cmpF(x.imm&31, x.a[i], x.b[i]))
			}
		}},
		{name: "VPCMPEQD", encs: bEVEX, mm: m0F, pp: p66, op: 0x76, form: fKVM, mask: mCmp, fn: func(x *vctx) {
			for i := range x.n {
				if x.a[i] == x.b[i] {
					x.kout |= 1 << i
				}
			}
		}},
		{name: "VPCMPEQD", encs: bVEX, mm: m0F, pp: p66, op: 0x76, fn: lane2(func(a, b uint32) uint32 { return mask32(a == b) })},
		{name: "VPCMPGTD", encs: bEVEX, mm: m0F, pp: p66, op: 0x66, form: fKVM, mask: mCmp, fn: func(x *vctx) {
			for i := range x.n {
				if int32(x.a[i]) > int32(x.b[i]) {
					x.kout |= 1 << i
				}
			}
		}},
		{name: "VPCMPGTD", encs: bVEX, mm: m0F, pp: p66, op: 0x66,
			fn: lane2(func(a, b uint32) uint32 { return mask32(int32(a) > int32(b)) })},
		{name: "VPTESTMD", encs: bEVEX, mm: m0F38, pp: p66, op: 0x27, form: fKVM, mask: mCmp, fn: func(x *vctx) {
			for i := range x.n {
				if x.a[i]&x.b[i] != 0 {
					x.kout |= 1 << i
				}
			}
		}},
		{name: "VBLENDVPS", encs: bVEX, mm: m0F3A, pp: p66, op: 0x4a, form: fRVMR, imm: true, fn: func(x *vctx) {
			for i := range x.n {
				x.r[i] = x.a[i]
				if x.c[i]>>31 != 0 {
					x.r[i] = x.b[i]
				}
			}
		}},
		{name: "VBLENDMPS", encs: bEVEX, mm: m0F38, pp: p66, op: 0x65, mask: mSel, fn: blendm},
		{name: "VPBLENDMD", encs: bEVEX, mm: m0F38, pp: p66, op: 0x64, mask: mSel, fn: blendm},
	}
}

// integerRows returns the integer, bitwise, shift and permute instructions.
func integerRows() []vdef {
	return []vdef{
		{name: "VPADDD", encs: bBoth, mm: m0F, pp: p66, op: 0xfe, fn: lane2(func(a, b uint32) uint32 { return a + b })},
		{name: "VPSUBD", encs: bBoth, mm: m0F, pp: p66, op: 0xfa, fn: lane2(func(a, b uint32) uint32 { return a - b })},
		{name: "VPANDD", encs: bBoth, mm: m0F, pp: p66, op: 0xdb, fn: lane2(func(a, b uint32) uint32 { return a & b })},
		{name: "VPANDND", encs: bBoth, mm: m0F, pp: p66, op: 0xdf, fn: lane2(func(a, b uint32) uint32 { return ^a & b })},
		{name: "VPORD", encs: bBoth, mm: m0F, pp: p66, op: 0xeb, fn: lane2(func(a, b uint32) uint32 { return a | b })},
		{name: "VPXORD", encs: bBoth, mm: m0F, pp: p66, op: 0xef, fn: lane2(func(a, b uint32) uint32 { return a ^ b })},
		{name: "VANDPS", encs: bBoth, mm: m0F, op: 0x54, fn: lane2(func(a, b uint32) uint32 { return a & b })},
		{name: "VANDNPS", encs: bBoth, mm: m0F, op: 0x55, fn: lane2(func(a, b uint32) uint32 { return ^a & b })},
		{name: "VORPS", encs: bBoth, mm: m0F, op: 0x56, fn: lane2(func(a, b uint32) uint32 { return a | b })},
		{name: "VXORPS", encs: bBoth, mm: m0F, op: 0x57, fn: lane2(func(a, b uint32) uint32 { return a ^ b })},
		{name: "VPSRLD", encs: bBoth, mm: m0F, pp: p66, op: 0x72, ext: 2, form: fVM, imm: true,
			fn: lane1imm(func(n uint8, b uint32) uint32 { return uint32(uint64(b) >> min(n, 32)) })},
		{name: "VPSRAD", encs: bBoth, mm: m0F, pp: p66, op: 0x72, ext: 4, form: fVM, imm: true,
			fn: lane1imm(func(n uint8, b uint32) uint32 { return uint32(int32(b) >> min(n, 31)) })},
		{name: "VPSLLD", encs: bBoth, mm: m0F, pp: p66, op: 0x72, ext: 6, form: fVM, imm: true,
			fn: lane1imm(func(n uint8, b uint32) uint32 { return uint32(uint64(b) << min(n, 32)) })},
		{name: "VPTERNLOGD", encs: bEVEX, mm: m0F3A, pp: p66, op: 0x25, imm: true, fn: func(x *vctx) {
			for i := range x.n {
				d, a, b := x.d[i], x.a[i], x.b[i]
				var r uint32
				for k := range 8 {
					if x.imm>>k&1 == 0 {
						continue
					}
					t := ^uint32(0)
					for j, v := range [3]uint32{b, a, d} { // imm index bits: d<<2 | a<<1 | b
						if k>>j&1 == 0 {
							v = ^v
						}
						t &= v
					}
					r |= t
				}
				x.r[i] = r
			}
		}},
		{name: "VPERMPS", encs: bBoth, mm: m0F38, pp: p66, op: 0x16, min: 32, fn: func(x *vctx) {
			for i := range x.n {
				x.r[i] = x.b[x.a[i]&uint32(x.n-1)]
			}
		}},
	}
}

// moveRows returns the moves, broadcasts and mask-vector conversions.
func moveRows() []vdef {
	return []vdef{
		{name: "VMOVUPS", encs: bBoth, mm: m0F, op: 0x10, form: fRM, tuple: tFVM, fn: move},
		{name: "VMOVUPS", encs: bBoth, mm: m0F, op: 0x11, form: fMR, tuple: tFVM, fn: move},
		{name: "VMOVAPS", encs: bBoth, mm: m0F, op: 0x28, form: fRM, tuple: tFVM, align: true, fn: move},
		{name: "VMOVAPS", encs: bBoth, mm: m0F, op: 0x29, form: fMR, tuple: tFVM, align: true, fn: move},
		{name: "VMOVDQA32", encs: bBoth, mm: m0F, pp: p66, op: 0x6f, form: fRM, tuple: tFVM, align: true, w: -1, fn: move},
		{name: "VMOVDQA32", encs: bBoth, mm: m0F, pp: p66, op: 0x7f, form: fMR, tuple: tFVM, align: true, w: -1, fn: move},
		{name: "VMOVDQU32", encs: bBoth, mm: m0F, pp: pF3, op: 0x6f, form: fRM, tuple: tFVM, w: -1, fn: move},
		{name: "VMOVDQU32", encs: bBoth, mm: m0F, pp: pF3, op: 0x7f, form: fMR, tuple: tFVM, w: -1, fn: move},
		{name: "VMOVNTPS", encs: bBoth, mm: m0F, op: 0x2b, form: fMR, tuple: tFVM, align: true, mem: true, mask: mNone, fn: move},
		{name: "VBROADCASTSS", encs: bBoth, mm: m0F38, pp: p66, op: 0x18, form: fRM, tuple: tT1S, fn: bcast},
		{name: "VPBROADCASTD", encs: bBoth, mm: m0F38, pp: p66, op: 0x58, form: fRM, tuple: tT1S, fn: bcast},
		{name: "VBROADCASTSD", encs: bVEX, mm: m0F38, pp: p66, op: 0x19, form: fRM, tuple: tT1S, q: true, min: 32, fn: bcast},
		{name: "VBROADCASTSD", encs: bEVEX, mm: m0F38, pp: p66, op: 0x19, form: fRM, tuple: tT1S, w: 1, q: true, min: 32, fn: bcast},
		{name: "VPMOVM2D", encs: bEVEX, mm: m0F38, pp: pF3, op: 0x38, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
			n := in.vl / 4
			k := m.K[in.rm&7]
			for i := range 16 {
				m.Z[in.reg][i] = 0
				if i < n {
					m.Z[in.reg][i] = mask32(k>>i&1 != 0)
				}
			}
			return nil
		}},
		{name: "VPMOVD2M", encs: bEVEX, mm: m0F38, pp: pF3, op: 0x39, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
			var k uint64
			for i := range in.vl / 4 {
				k |= uint64(m.Z[in.rm][i]>>31) << i
			}
			m.K[in.reg&7] = k
			return nil
		}},
	}
}

// opmaskRows returns the opmask instructions (VEX).
func opmaskRows() []vdef {
	return []vdef{
		{name: "KMOVW", encs: bVEX, mm: m0F, op: 0x92, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
			m.K[in.reg&7] = m.R[in.rm&15] & 0xffff
			return nil
		}},
		{name: "KMOVW", encs: bVEX, mm: m0F, op: 0x93, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
			m.R[in.reg&15] = m.K[in.rm&7] & 0xffff
			return nil
		}},
		{name: "KMOVW", encs: bVEX, mm: m0F, op: 0x90, form: fRaw, raw: func(m *Machine, in *Inst) error {
			if in.mem {
				m.K[in.reg&7] = uint64(load32(in.ea(m)) & 0xffff)
			} else {
				m.K[in.reg&7] = m.K[in.rm&7] & 0xffff
			}
			return nil
		}},
		{name: "KMOVW", encs: bVEX, mm: m0F, op: 0x91, form: fRaw, mem: true, raw: func(m *Machine, in *Inst) error {
			a := in.ea(m)
			*(*uint16)(addrPtr(a)) = uint16(m.K[in.reg&7])
			return nil
		}},
		kRow("KANDW", 0x41, func(a, b uint64) uint64 { return a & b }),
		kRow("KANDNW", 0x42, func(a, b uint64) uint64 { return ^a & b }),
		kRow("KORW", 0x45, func(a, b uint64) uint64 { return a | b }),
		kRow("KXNORW", 0x46, func(a, b uint64) uint64 { return ^(a ^ b) }),
		kRow("KXORW", 0x47, func(a, b uint64) uint64 { return a ^ b }),
		{name: "KNOTW", encs: bVEX, mm: m0F, op: 0x44, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
			m.K[in.reg&7] = ^m.K[in.rm&7] & 0xffff
			return nil
		}},
		{name: "KORTESTW", encs: bVEX, mm: m0F, op: 0x98, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
			v := (m.K[in.reg&7] | m.K[in.rm&7]) & 0xffff
			m.ZF, m.CF, m.OF, m.SF, m.PF = v == 0, v == 0xffff, false, false, false
			return nil
		}},
	}
}

// float64Rows returns the instructions on float64 elements, their VEX and
// EVEX rows.
func float64Rows() []vdef {
	var rows []vdef
	for _, d := range []vdef{
		{name: "VADDPD", mm: m0F, pp: p66, op: 0x58, fn: lane2q(addD)},
		{name: "VMULPD", mm: m0F, pp: p66, op: 0x59, fn: lane2q(mulD)},
		{name: "VSUBPD", mm: m0F, pp: p66, op: 0x5c, fn: lane2q(subD)},
		{name: "VDIVPD", mm: m0F, pp: p66, op: 0x5e, fn: lane2q(divD)},
		{name: "VXORPD", mm: m0F, pp: p66, op: 0x57, fn: lane2(func(a, b uint32) uint32 { return a ^ b })},
		{name: "VMOVUPD", mm: m0F, pp: p66, op: 0x10, form: fRM, tuple: tFVM, fn: move},
		{name: "VMOVUPD", mm: m0F, pp: p66, op: 0x11, form: fMR, tuple: tFVM, fn: move},
	} {
		rows = append(rows, pdRows(d)...)
	}
	return rows
}

// kRow is a two-source opmask instruction (VEX.L1, 16 bits).
func kRow(name string, op byte, f func(a, b uint64) uint64) vdef {
	return vdef{name: name, encs: bVEX, mm: m0F, op: op, form: fRaw, tuple: tReg, raw: func(m *Machine, in *Inst) error {
		m.K[in.reg&7] = f(m.K[in.vvvv&7], m.K[in.rm&7]) & 0xffff
		return nil
	}}
}

func move(x *vctx) { x.r = x.b }

// bcast copies element 0 of b (lanes 0 and 1 for 64-bit elements) to
// every element.
func bcast(x *vctx) {
	for i := range x.n {
		x.r[i] = x.b[0]
		if x.q {
			x.r[i] = x.b[i&1]
		}
	}
}

func blendm(x *vctx) {
	for i := range x.n {
		x.r[i] = x.a[i]
		if x.sel>>i&1 != 0 {
			x.r[i] = x.b[i]
		}
	}
}

// checkVector checks the operands of a decoded vector instruction against
// its row and scales an EVEX disp8.
func checkVector(in *Inst, d *vdef) error {
	if in.enc == encVEX && !in.mem {
		in.rm &= 15 // VEX.X does not extend a register rm
	}
	if d.form == fRM || d.form == fMR || (d.form == fRaw && d.op != 0x41 && d.op != 0x42 && (d.op < 0x45 || d.op > 0x47)) {
		if in.vvvv != 0 {
			return fmt.Errorf("%s: vvvv must be unused (1111b)", d.name)
		}
	}
	if d.mem && !in.mem {
		return fmt.Errorf("%s needs a memory operand", d.name)
	}
	if d.tuple == tReg && in.mem {
		return fmt.Errorf("%s takes registers only", d.name)
	}
	if in.vl < d.min {
		return fmt.Errorf("%s has no %d-bit form", d.name, 8*in.vl)
	}
	if in.enc != encEVEX {
		return nil
	}
	if in.bcst && (!in.mem || d.tuple != tFV) {
		return fmt.Errorf("%s: EVEX.b (embedded broadcast or rounding) unsupported here", d.name)
	}
	if in.k != 0 && d.mask == mNone {
		return fmt.Errorf("%s takes no opmask", d.name)
	}
	if in.z && (d.mask == mNone || d.mask == mCmp || d.form == fMR && in.mem) {
		return fmt.Errorf("%s: zeroing-masking not allowed", d.name)
	}
	if in.d8 {
		n := int64(in.vl)
		if in.bcst || d.tuple == tT1S {
			n = 4
			if d.q {
				n = 8
			}
		}
		in.disp *= n
	}
	return nil
}

// execVector executes a vector instruction.
func execVector(m *Machine, in *Inst, next uintptr) (uintptr, error) {
	d := in.vdef
	if d.raw != nil {
		return next, d.raw(m, in)
	}
	n := in.vl / 4
	all := uint64(1)<<n - 1
	kmask := all
	if in.k != 0 {
		k := m.K[in.k]
		if d.q { // a bit per 64-bit element: spread it over its two lanes
			var k2 uint64
			for i := range n / 2 {
				k2 |= (k >> i & 1) * 3 << (2 * i)
			}
			k = k2
		}
		kmask &= k
	}
	var x vctx
	x.n, x.q, x.imm = n, d.q, uint8(in.imm)
	var dst *[16]uint32
	switch d.form {
	case fRVM, fKVM, fRVMR:
		x.a = m.Z[in.vvvv]
		dst = &m.Z[in.reg]
	case fRM:
		dst = &m.Z[in.reg]
	case fMR:
		if !in.mem {
			dst = &m.Z[in.rm]
		}
	case fVM:
		dst = &m.Z[in.vvvv]
	}
	if d.form == fMR {
		x.b = m.Z[in.reg]
	} else if err := m.source(in, d, kmask, &x.b); err != nil {
		return 0, err
	}
	if d.form == fRVMR {
		x.c = m.Z[in.imm>>4&15]
	}
	if dst != nil {
		x.d = *dst
	}
	x.sel = kmask
	d.fn(&x)
	switch {
	case d.mask == mCmp:
		m.K[in.reg&7] = x.kout & kmask
	case dst == nil: // a store
		a := in.ea(m)
		if d.align && a%uint64(in.vl) != 0 {
			return 0, fmt.Errorf("misaligned %d-byte store to %#x", in.vl, a)
		}
		for i := range n {
			if kmask>>i&1 != 0 {
				store32(a+4*uint64(i), x.r[i])
			}
		}
	default:
		wm := kmask
		if d.mask == mSel && !in.z {
			wm = all
		}
		for i := range 16 {
			switch {
			case i >= n:
				dst[i] = 0
			case wm>>i&1 != 0:
				dst[i] = x.r[i]
			case in.z:
				dst[i] = 0
			}
		}
	}
	return next, nil
}

// source reads the rm operand into b: a register, a vector from memory
// (EVEX: masked-off lanes are not read, as the hardware suppresses their
// faults), or one element (broadcast, or a T1S operand in lane 0).
func (m *Machine) source(in *Inst, d *vdef, kmask uint64, b *[16]uint32) error {
	if !in.mem {
		*b = m.Z[in.rm]
		return nil
	}
	a := in.ea(m)
	n := in.vl / 4
	switch {
	case d.tuple == tT1S:
		b[0] = load32(a)
		if d.q {
			b[1] = load32(a + 4)
		}
	case in.bcst && d.q:
		lo, hi := load32(a), load32(a+4)
		for i := 0; i+1 < n; i += 2 {
			b[i], b[i+1] = lo, hi
		}
	case in.bcst:
		v := load32(a)
		for i := range n {
			b[i] = v
		}
	default:
		if d.align && a%uint64(in.vl) != 0 {
			return fmt.Errorf("misaligned %d-byte load from %#x", in.vl, a)
		}
		suppress := in.enc == encEVEX && in.k != 0
		for i := range n {
			if !suppress || kmask>>i&1 != 0 {
				b[i] = load32(a + 4*uint64(i))
			}
		}
	}
	return nil
}

// execVzeroupper clears bits 128 and up of vector registers 0-15.
func execVzeroupper(m *Machine, in *Inst, next uintptr) (uintptr, error) {
	for r := range 16 {
		clear(m.Z[r][4:])
	}
	return next, nil
}

// Instructions returns the mnemonics the interpreter knows, vector and
// general-purpose, sorted, each once.
func Instructions() []string {
	seen := map[string]bool{}
	var out []string
	addName := func(s string) {
		if !seen[s] && s != "" {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, d := range vectorTable {
		addName(d.name)
	}
	addName("VZEROUPPER")
	for _, d := range legacyTable {
		if d.group != nil {
			for _, g := range d.group {
				if g != nil {
					addName(g.name)
				}
			}
			continue
		}
		addName(d.name)
	}
	slices.Sort(out)
	return out
}
