//go:build amd64

package gemm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/cpu/internal/x86emu"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// kernelInstrs decodes a kernel's bytes up to the padding after its last
// instruction and returns the offsets and decodings.
func kernelInstrs(code []byte) ([]int, []*x86emu.Inst, error) {
	var offs []int
	var ins []*x86emu.Inst
	for off := 0; off < len(code) && code[off] != 0xcc; { // INT3 pads to the next function
		in, err := x86emu.Decode(code[off:], 0)
		if err != nil {
			return nil, nil, fmt.Errorf("offset %#x: %v", off, err)
		}
		offs, ins = append(offs, off), append(ins, in)
		off += in.Len
	}
	return offs, ins, nil
}

// mutation is one corruption of the instruction at offset at.
type mutation struct {
	kind string
	at   int
	f    func(c []byte)
}

// evexMutations lists the corruptions of one EVEX instruction in (at
// offset at; bytes 62 P0 P1 P2 opcode ModRM ...): the opcode turned into
// its sibling (multiply → divide, multiply-add → multiply-subtract,
// XOR → OR), the ModRM.reg register and (for a register operand) the
// ModRM.rm register changed, the second source (EVEX.vvvv) changed, the
// vector length halved, a disp8 moved by one element or vector, and an
// {1toN} broadcast set on a memory source of an arithmetic instruction.
// Memory operands keep their base register, so a corrupted kernel reads
// and writes only near its own buffers (within the guards).
func evexMutations(in *x86emu.Inst, at int) []mutation {
	b := in.Bytes
	var ms []mutation
	add := func(kind string, f func(c []byte)) { ms = append(ms, mutation{kind, at, f}) }
	swaps := map[byte]byte{0x59: 0x5e, 0xb8: 0xba, 0xef: 0xeb}
	if sw, ok := swaps[b[4]]; ok {
		add("opcode", func(c []byte) { c[at+4] = sw })
	}
	modrm := b[5]
	mod, reg, rm := modrm>>6, modrm>>3&7, modrm&7
	arith := in.Name != "VMOVUPS" && in.Name != "VMOVUPD" && in.Name != "VBROADCASTSS" && in.Name != "VBROADCASTSD"
	// The registers with their EVEX extension bits (R, R'; B, X; V').
	p0, p1, p2 := ^b[1], ^b[2], ^b[3]
	fullReg := reg | p0>>7&1<<3 | p0>>4&1<<4
	fullRM := rm | p0>>5&1<<3 | p0>>6&1<<4
	fullV := p1>>3&15 | p2>>3&1<<4
	zeroing := in.Name == "VPXORD" && mod == 3 && fullReg == fullRM && fullV == fullReg
	add("reg", func(c []byte) { c[at+5] ^= 1 << 3 })
	if mod == 3 {
		add("rm", func(c []byte) { c[at+5] ^= 1 })
	}
	if arith {
		add("vvvv", func(c []byte) { c[at+2] ^= 1 << 3 })
	}
	if b[3]>>5&3 == 2 && !zeroing { // a 256-bit VPXORD zeroing idiom clears all 512 bits as well
		add("length", func(c []byte) { c[at+3] = c[at+3]&^0x60 | 0x20 })
	}
	if mod == 1 {
		d := at + 6
		if rm == 4 {
			d++ // SIB
		}
		add("disp8", func(c []byte) { c[d]++ })
	}
	if mod != 3 && arith {
		add("broadcast", func(c []byte) { c[at+3] |= 0x10 })
	}
	return ms
}

// TestEmuCatchesKernelMutations proves that a wrong AVX-512 kernel fails
// the interpreted tests on any amd64 host, one without AVX-512 included:
// each EVEX instruction of each AVX-512 kernel is corrupted in a copy of
// the kernel's bytes (see evexMutations), one corruption at a time, and
// the copy, run by the interpreter over calls through both epilogues and
// both k loops, must then fail the bit-for-bit comparison with the exact
// model of TestEmuKernels (or stop with an error), while the intact copy
// passes it. Every corruption must be caught; the figures are logged,
// with how many the looser comparison with the Go kernel catches too.
func TestEmuCatchesKernelMutations(t *testing.T) {
	r := testseed.Rand(t, 42)
	total, byError, byBound, missed := 0, 0, 0, 0
	for _, ek := range emuKernels() {
		if !ek.avx512 {
			continue
		}
		af, err := locateAsm(ek.fn)
		if err != nil {
			t.Fatal(err)
		}
		// k = 9: two unrolled iterations (in the first, every accumulator
		// starts at zero, where a multiply-subtract equals the multiply-add)
		// and one tail step; k = 10 the same with two tail steps and the
		// other epilogue; alpha and beta not ±1, so that a multiply turned
		// into a divide shows.
		cases := []tileCase{
			{k: 9, ldc: ek.nr + 3, alpha: 1.375, beta: -0.625, cOff: 1},
			{k: 10, ldc: ek.nr + 5, alpha: -0.8125, beta: 0, cOff: 2},
		}
		if ek.inPlace {
			cases[0].rsa, cases[0].csa = 9, 1
			cases[1].rsa, cases[1].csa = 1, 11
		}
		offs, ins, err := kernelInstrs(af.code)
		if err != nil {
			t.Fatalf("%s: %v", af.name, err)
		}
		var n, nErr, nBound, nMissed int
		if ek.elem == 4 {
			n, nErr, nBound, nMissed = mutateKernel[float32](t, r, ek, af, cases, offs, ins)
		} else {
			n, nErr, nBound, nMissed = mutateKernel[float64](t, r, ek, af, cases, offs, ins)
		}
		t.Logf("%s: %d instructions, %d corruptions of EVEX ones: %d unnoticed, %d stopped the interpreter, %d gave a wrong C (%d of these outside the Go kernel's bound too)",
			af.name, len(ins), n, nMissed, nErr, n-nMissed-nErr, nBound)
		total, byError, byBound, missed = total+n, byError+nErr, byBound+nBound, missed+nMissed
	}
	if total < 1000 {
		t.Fatalf("only %d corruptions tried", total)
	}
	t.Logf("%d corruptions of AVX-512 kernel instructions: %d unnoticed, %d stopped the interpreter, %d gave a wrong C (%d of these outside the Go kernel's bound too)",
		total, missed, byError, total-missed-byError, byBound)
}

// mutateKernel applies every corruption of the kernel's EVEX instructions
// and reports how many it tried, how many stopped the interpreter, how
// many also fail the comparison with the Go kernel and how many went
// unnoticed (each of which fails t).
func mutateKernel[T float](t *testing.T, r *rand.Rand, ek emuKernel, af *asmFunc, cases []tileCase, offs []int, ins []*x86emu.Inst) (n, nErr, nBound, nMissed int) {
	var m x86emu.Machine
	m.MaxSteps = 1 << 16 // ten times what these calls take
	data := make([]*tileData[T], len(cases))
	for i, c := range cases {
		data[i] = newTile[T](r, ek, c)
		got, err := data[i].runEmu(&m, r, ek, 0, af.code)
		if err == nil {
			err = data[i].checkExact(ek, got)
		}
		if err != nil {
			t.Fatalf("%s intact: %v", af.name, err)
		}
	}
	for k, in := range ins {
		if in.Bytes[0] != 0x62 {
			continue // EVEX only
		}
		for _, mu := range evexMutations(in, offs[k]) {
			bad := append([]byte(nil), af.code...)
			mu.f(bad)
			n++
			caught, stopped, bound := false, false, false
			for _, d := range data {
				got, err := d.runEmu(&m, r, ek, 0, bad)
				if err != nil {
					caught, stopped = true, true
					break
				}
				if d.checkExact(ek, got) != nil {
					caught = true
					bound = d.checkGo(ek, got) != nil
					break
				}
			}
			if stopped {
				nErr++
			}
			if bound {
				nBound++
			}
			if !caught {
				nMissed++
				t.Errorf("%s: corrupting %s at offset %#x (%s: % x → % x) went unnoticed", af.name, in.Name, offs[k], mu.kind,
					in.Bytes, bad[offs[k]:offs[k]+in.Len])
			}
		}
	}
	return n, nErr, nBound, nMissed
}
