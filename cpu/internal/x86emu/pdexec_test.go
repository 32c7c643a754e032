package x86emu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// venc is one vector instruction for the test encoder: VEX (three-byte
// form) or EVEX, a register rm or a memory operand [base + disp] (an EVEX
// disp8 is the compressed one, multiplied by the operand size).
type venc struct {
	evex       bool
	pp, mm, op byte
	w          bool
	reg, vvvv  byte
	rm         byte // register rm
	mem        bool
	base       byte
	disp       int32
	d8         bool // disp is a disp8 (compressed in EVEX)
	vl         int  // 16, 32, 64
	k          byte
	z, bcst    bool
}

// bytes encodes v.
func (v venc) bytes() []byte {
	inv := func(b byte) byte { return ^b & 1 }
	b3 := v.rm >> 3 & 1
	x := byte(0)
	if v.mem {
		b3 = v.base >> 3 & 1
	} else {
		x = v.rm >> 4 & 1
	}
	w := byte(0)
	if v.w {
		w = 1
	}
	ll := map[int]byte{16: 0, 32: 1, 64: 2}[v.vl]
	var out []byte
	if v.evex {
		p2 := v.k | inv(v.vvvv>>4)<<3 | ll<<5
		if v.z {
			p2 |= 0x80
		}
		if v.bcst {
			p2 |= 0x10
		}
		out = []byte{0x62, inv(v.reg>>3)<<7 | inv(x)<<6 | inv(b3)<<5 | inv(v.reg>>4)<<4 | v.mm,
			w<<7 | (^v.vvvv&15)<<3 | 4 | v.pp, p2}
	} else {
		out = []byte{0xc4, inv(v.reg>>3)<<7 | inv(x)<<6 | inv(b3)<<5 | v.mm, w<<7 | (^v.vvvv&15)<<3 | ll<<2 | v.pp}
	}
	out = append(out, v.op)
	if !v.mem {
		return append(out, 0xc0|(v.reg&7)<<3|v.rm&7)
	}
	if v.d8 {
		return append(out, 0x40|(v.reg&7)<<3|v.base&7, byte(int8(v.disp)))
	}
	out = append(out, 0x80|(v.reg&7)<<3|v.base&7)
	return binary.LittleEndian.AppendUint32(out, uint32(v.disp))
}

// The harness block (64-bit words): Z1, Z2, Z3 at bytes 0, 64, 128, the
// opmask K2 at 192, a memory area at 256 (RDI), Z3 out at 512.
const (
	hbZ1, hbZ2, hbZ3, hbK, hbMem, hbOut = 0, 8, 16, 24, 32, 64
	hbWords                             = 72
)

// harness wraps the instruction ins: the block's address in RAX loads
// Z1-Z3 (YMM for VEX) and K2, points RDI at the memory area, runs ins and
// stores Z3.
func harness(evex bool, ins []byte) []byte {
	vl := 32
	if evex {
		vl = 64
	}
	mov := func(op, r byte, disp int32) []byte {
		return venc{evex: evex, mm: 1, op: op, reg: r, mem: true, base: RAX, disp: disp, vl: vl}.bytes()
	}
	c := []byte{0x48, 0x8d, 0xb8, 0, 1, 0, 0} // LEA RDI, [RAX+256]
	for r := byte(1); r <= 3; r++ {
		c = append(c, mov(0x10, r, int32(r-1)*64)...)
	}
	if evex {
		c = append(c, venc{mm: 1, op: 0x90, reg: 2, mem: true, base: RAX, disp: 192, vl: 16}.bytes()...) // KMOVW K2, [RAX+192]
	}
	c = append(c, ins...)
	c = append(c, mov(0x11, 3, 512)...)
	return append(c, 0xc5, 0xf8, 0x77, 0xc3) // VZEROUPPER; RET
}

// zero is 0, unknown to the compiler: make with a size of n+zero always
// allocates on the heap, where memory the interpreter addresses does not
// move (a stack may, and would leave the interpreter's addresses behind).
var zero = 0

// heapBlock returns a harness block on the heap holding b.
func heapBlock(b [hbWords]uint64) *[hbWords]uint64 {
	p := (*[hbWords]uint64)(make([]uint64, hbWords+zero))
	*p = b
	return p
}

// runEmu runs harness code in the interpreter on block.
func runEmu(m *Machine, code []byte, block *[hbWords]uint64) error {
	m.R[RAX] = uint64(uintptr(unsafe.Pointer(block)))
	err := m.Call(code, 0)
	runtime.KeepAlive(block) // the interpreter holds only its address
	return err
}

// pdCase is one encoding of a PD instruction and its reference on 64-bit
// elements: src1 (vvvv), src2 (rm: register, memory or broadcast), old
// (the destination's old value).
type pdCase struct {
	name string
	v    venc
	ref  func(src1, src2, old uint64) uint64
	bcst bool // a T1S source: element 0 of src2 to every element
	st   bool // a store: rm (memory) ← reg
}

// pdCases lists the PD instructions in every encoding the interpreter
// accepts: VEX XMM and YMM, EVEX XMM, YMM and ZMM with no mask, a merging
// and a zeroing mask, register, full-vector and broadcast memory operands
// (compressed disp8).
func pdCases(evex bool) []pdCase {
	type op struct {
		name   string
		pp, mm byte
		op     byte
		w      bool // W1 in VEX too (the FMAs)
		ref    func(a, b, d uint64) uint64
	}
	fma := func(form int, negMul, negAdd bool) func(a, b, d uint64) uint64 {
		return func(a, b, d uint64) uint64 {
			switch form {
			case 132:
				return fmaD(d, b, a, negMul, negAdd)
			case 213:
				return fmaD(a, d, b, negMul, negAdd)
			}
			return fmaD(a, b, d, negMul, negAdd)
		}
	}
	ops := []op{
		{"VADDPD", 1, 1, 0x58, false, func(a, b, _ uint64) uint64 { return addD(a, b) }},
		{"VSUBPD", 1, 1, 0x5c, false, func(a, b, _ uint64) uint64 { return subD(a, b) }},
		{"VMULPD", 1, 1, 0x59, false, func(a, b, _ uint64) uint64 { return mulD(a, b) }},
		{"VDIVPD", 1, 1, 0x5e, false, func(a, b, _ uint64) uint64 { return divD(a, b) }},
		{"VXORPD", 1, 1, 0x57, false, func(a, b, _ uint64) uint64 { return a ^ b }},
	}
	for i, f := range []struct {
		name           string
		negMul, negAdd bool
	}{{"VFMADD", false, false}, {"VFMSUB", false, true}, {"VFNMADD", true, false}, {"VFNMSUB", true, true}} {
		for j, form := range []int{132, 213, 231} {
			ops = append(ops, op{fmt.Sprintf("%s%dPD", f.name, form), 1, 2, byte(0x98 + 0x10*j + 2*i), true, fma(form, f.negMul, f.negAdd)})
		}
	}
	var cs []pdCase
	vls := []int{16, 32}
	masks := []struct {
		k byte
		z bool
	}{{0, false}}
	if evex {
		vls = append(vls, 64)
		masks = append(masks, struct {
			k byte
			z bool
		}{2, false}, struct {
			k byte
			z bool
		}{2, true})
	}
	// disp8 operands: one vector (or one element, broadcast) in, compressed
	// in EVEX, in bytes in VEX.
	disp := func(vl int, elem bool) int32 {
		switch {
		case evex:
			return 1
		case elem:
			return 8
		}
		return int32(vl)
	}
	for _, vl := range vls {
		for _, mk := range masks {
			base := venc{evex: evex, vl: vl, k: mk.k, z: mk.z, reg: 3, vvvv: 1, w: evex}
			sfx := fmt.Sprintf(" vl=%d k=%d z=%v", vl, mk.k, mk.z)
			for _, o := range ops {
				v := base
				v.pp, v.mm, v.op, v.w = o.pp, o.mm, o.op, evex || o.w
				v.rm = 2
				cs = append(cs, pdCase{name: o.name + sfx, v: v, ref: o.ref})
				v.mem, v.base, v.disp, v.d8 = true, RDI, disp(vl, false), true
				cs = append(cs, pdCase{name: o.name + " mem" + sfx, v: v, ref: o.ref})
				if evex {
					v.bcst = true
					cs = append(cs, pdCase{name: o.name + " {1toN}" + sfx, v: v, ref: o.ref, bcst: true})
				}
			}
			mv := base
			mv.pp, mv.mm, mv.vvvv = 1, 1, 0
			ld, st := mv, mv
			ld.op, ld.rm = 0x10, 2
			cs = append(cs, pdCase{name: "VMOVUPD reg" + sfx, v: ld, ref: func(_, b, _ uint64) uint64 { return b }})
			ld.mem, ld.base, ld.disp, ld.d8 = true, RDI, disp(vl, false), true
			cs = append(cs, pdCase{name: "VMOVUPD load" + sfx, v: ld, ref: func(_, b, _ uint64) uint64 { return b }})
			st.op, st.mem, st.base, st.disp, st.d8, st.z = 0x11, true, RDI, disp(vl, false), true, false
			if !mk.z {
				cs = append(cs, pdCase{name: "VMOVUPD store" + sfx, v: st, ref: func(_, b, _ uint64) uint64 { return b }, st: true})
			}
			if vl > 16 {
				bc := mv
				bc.mm, bc.op, bc.w = 2, 0x19, evex
				bc.rm = 2
				cs = append(cs, pdCase{name: "VBROADCASTSD reg" + sfx, v: bc, ref: func(_, b, _ uint64) uint64 { return b }, bcst: true})
				bc.mem, bc.base, bc.disp, bc.d8 = true, RDI, 3*disp(vl, true), true
				cs = append(cs, pdCase{name: "VBROADCASTSD mem" + sfx, v: bc, ref: func(_, b, _ uint64) uint64 { return b }, bcst: true})
			}
		}
	}
	return cs
}

// want computes what the harness leaves in block for c: the reference
// per 64-bit element under the opmask, the elements beyond the vector
// length zeroed, a store's memory.
func (c pdCase) want(block [hbWords]uint64) [hbWords]uint64 {
	v := c.v
	n := v.vl / 8
	out := block
	width := 4 // the harness stores Z3 as a YMM in VEX
	if v.evex {
		width = 8
	}
	moff := int(v.disp) // the memory operand's offset in bytes, then elements
	if v.evex && v.d8 {
		if v.bcst || c.bcst {
			moff *= 8
		} else {
			moff *= v.vl
		}
	}
	moff /= 8
	for e := range width {
		old := block[hbZ3+e]
		if c.st {
			out[hbOut+e] = old // the register is not written
			continue
		}
		if e >= n {
			out[hbOut+e] = 0
			continue
		}
		src2 := block[hbZ2+e]
		switch {
		case c.bcst && v.mem, v.bcst:
			src2 = block[hbMem+moff]
		case c.bcst:
			src2 = block[hbZ2]
		case v.mem:
			src2 = block[hbMem+moff+e]
		}
		r := c.ref(block[hbZ1+e], src2, old)
		if v.k != 0 && block[hbK]>>e&1 == 0 {
			r = old
			if v.z {
				r = 0
			}
		}
		out[hbOut+e] = r
	}
	if c.st {
		for e := range n {
			if v.k == 0 || block[hbK]>>e&1 != 0 {
				out[hbMem+moff+e] = block[hbZ3+e]
			}
		}
	}
	return out
}

// randBlock fills a harness block: finite values (for want's math/big
// references), or (special) NaNs, infinities and zeros mixed in.
func randBlock(r *rand.Rand, special bool) [hbWords]uint64 {
	var b [hbWords]uint64
	specials := []uint64{0, 1 << 63, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000, 0xfff8000000000000,
		0x7ff8000000012345, 0x7ff0000000000001, 0xfff4000000000abc, 1, 0x800fffffffffffff, 0x7fefffffffffffff,
		0x0010000000000000, 0x3ff0000000000000, 0xbff0000000000000, 0x3ff0000000000001}
	for i := range b {
		b[i] = randFinite64(r)
		if special && r.IntN(3) == 0 {
			b[i] = specials[r.IntN(len(specials))]
		}
	}
	b[hbK] = r.Uint64() & 0xffff
	return b
}

// TestPDInstructions runs each PD instruction encoding through the
// interpreter on finite operands and checks every element against the
// per-element reference (the math/big-checked lane operations, the opmask,
// the broadcast and the zeroed upper elements spelled out here).
func TestPDInstructions(t *testing.T) {
	r := testseed.Rand(t, 4)
	var m Machine
	for _, evex := range []bool{false, true} {
		for _, c := range pdCases(evex) {
			code := harness(evex, c.v.bytes())
			in, err := Decode(c.v.bytes(), 0)
			if err != nil {
				t.Fatalf("%s: % x: %v", c.name, c.v.bytes(), err)
			}
			if !strings.HasPrefix(c.name, in.Name+" ") {
				t.Fatalf("%s: decoded as %s", c.name, in.Name)
			}
			for range 8 {
				block := heapBlock(randBlock(r, false))
				want := c.want(*block)
				if err := runEmu(&m, code, block); err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if *block != want {
					for i := range block {
						if block[i] != want[i] {
							t.Fatalf("%s: word %d = %#x, want %#x", c.name, i, block[i], want[i])
						}
					}
				}
			}
		}
	}
}

// TestMOVUPS checks the SSE MOVUPS forms: a load and a register copy keep
// bits 128 and up of the destination, a store writes 16 bytes.
func TestMOVUPS(t *testing.T) {
	var m Machine
	for i := range m.Z {
		for j := range m.Z[i] {
			m.Z[i][j] = uint32(i<<8 | j)
		}
	}
	src, dst := make([]uint32, 8+zero), make([]uint32, 8+zero)
	copy(src, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	m.R[RSI] = uint64(uintptr(unsafe.Pointer(&src[0])))
	m.R[RDI] = uint64(uintptr(unsafe.Pointer(&dst[0])))
	code := []byte{
		0x44, 0x0f, 0x10, 0x46, 0x10, // MOVUPS X8, 16(SI)
		0x41, 0x0f, 0x10, 0xc8, // MOVUPS X1, X8
		0x44, 0x0f, 0x11, 0x07, // MOVUPS (DI), X8
		0xc3,
	}
	err := m.Call(code, 0)
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	if err != nil {
		t.Fatal(err)
	}
	if [8]uint32(dst) != [8]uint32{5, 6, 7, 8} {
		t.Errorf("stored %v", dst)
	}
	for _, r := range []int{1, 8} {
		want := [16]uint32{5, 6, 7, 8}
		for j := 4; j < 16; j++ {
			want[j] = uint32(r<<8 | j)
		}
		if m.Z[r] != want {
			t.Errorf("X%d: %#x, want %#x", r, m.Z[r], want)
		}
	}
	if in, err := Decode(code, 0); err != nil || in.Name != "MOVUPS" || in.Len != 5 {
		t.Errorf("decode: %v %v", in, err)
	}
}

// TestPDMatchHardware runs every PD case on this CPU and in the
// interpreter over random operands with NaNs (payloads, signalling),
// infinities, zeros and subnormals mixed in, and compares bit for bit,
// where the host has the feature (which validates the special-value rules
// the references assume).
func TestPDMatchHardware(t *testing.T) {
	for _, evex := range []bool{false, true} {
		t.Run(map[bool]string{false: "vex", true: "evex"}[evex], func(t *testing.T) {
			if !hwHas(evex) {
				t.Skip("the CPU does not run this code here")
			}
			r := testseed.Rand(t, 5)
			var m Machine
			cs := pdCases(evex)
			codes := make([][]byte, len(cs))
			for i, c := range cs {
				codes[i] = harness(evex, c.v.bytes())
			}
			hw, err := hwMap(codes)
			if err != nil {
				t.Fatal(err)
			}
			defer hw.free()
			for i, c := range cs {
				for range 30 {
					block := heapBlock(randBlock(r, true))
					em := heapBlock(*block)
					hw.run(i, block)
					if err := runEmu(&m, codes[i], em); err != nil {
						t.Fatalf("%s: %v", c.name, err)
					}
					if *block != *em {
						for w := range block {
							if block[w] != em[w] {
								t.Fatalf("%s: word %d: hardware %#x, interpreter %#x", c.name, w, block[w], em[w])
							}
						}
					}
				}
			}
			t.Logf("%d encodings match", len(cs))
		})
	}
}

// TestMOVUPSMatchHardware runs the SSE MOVUPS forms after EVEX (or VEX)
// loads of full registers on this CPU and in the interpreter: the upper
// bits are kept the same way.
func TestMOVUPSMatchHardware(t *testing.T) {
	evex := hwHas(true)
	if !evex && !hwHas(false) {
		t.Skip("the CPU does not run the harness here")
	}
	r := testseed.Rand(t, 6)
	insts := [][]byte{
		{0x0f, 0x10, 0x5f, 0x10}, // MOVUPS X3, 16(DI)
		{0x0f, 0x10, 0xda},       // MOVUPS X3, X2
		{0x0f, 0x11, 0x5f, 0x08}, // MOVUPS 8(DI), X3
	}
	var codes [][]byte
	for _, in := range insts {
		codes = append(codes, harness(evex, in))
	}
	hw, err := hwMap(codes)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.free()
	var m Machine
	for i := range codes {
		for range 10 {
			block := heapBlock(randBlock(r, true))
			em := heapBlock(*block)
			hw.run(i, block)
			if err := runEmu(&m, codes[i], em); err != nil {
				t.Fatalf("% x: %v", insts[i], err)
			}
			if *block != *em {
				t.Fatalf("% x: hardware %#x, interpreter %#x", insts[i], *block, *em)
			}
		}
	}
}

// TestDecodeByW checks that W tells the PS and PD forms of an opcode apart
// and that the encodings outside the subset are refused by name.
func TestDecodeByW(t *testing.T) {
	fma := venc{evex: true, pp: 1, mm: 2, op: 0xb8, reg: 3, vvvv: 1, rm: 2, vl: 64}
	for _, c := range []struct {
		v    venc
		name string // "" : refused, the error naming want
		want string
	}{
		{fma, "VFMADD231PS", ""},
		{func() venc { v := fma; v.w = true; return v }(), "VFMADD231PD", ""},
		{func() venc { v := fma; v.evex, v.vl, v.w = false, 32, true; return v }(), "VFMADD231PD", ""},
		{venc{pp: 1, mm: 2, op: 0x19, reg: 3, rm: 2, vl: 32}, "VBROADCASTSD", ""},
		{venc{pp: 1, mm: 2, op: 0x19, reg: 3, rm: 2, vl: 16}, "", "no 128-bit form"},
		{venc{pp: 1, mm: 2, op: 0x19, reg: 3, rm: 2, vl: 32, w: true}, "", "W1"},
		{venc{evex: true, pp: 1, mm: 2, op: 0x19, reg: 3, rm: 2, vl: 64}, "", "W0"},
		{venc{evex: true, pp: 1, mm: 1, op: 0x59, reg: 3, vvvv: 1, rm: 2, vl: 64}, "", "W0"},
		{venc{evex: true, pp: 1, mm: 1, op: 0x59, reg: 3, vvvv: 1, rm: 2, vl: 64, w: true}, "VMULPD", ""},
	} {
		in, err := Decode(c.v.bytes(), 0)
		switch {
		case c.name != "" && (err != nil || in.Name != c.name):
			t.Errorf("% x: %v %v, want %s", c.v.bytes(), in, err, c.name)
		case c.name == "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("% x: %v %v, want an error naming %q", c.v.bytes(), in, err, c.want)
		}
	}
}
