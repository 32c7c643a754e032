// Package x86emu interprets the x86-64 machine code Ferry generates at run
// time, and the Go assembly micro-kernels of cpu/gemm, so that tests
// can check the AVX-512 code (and the AVX2 code) on any host: one without
// AVX-512 runs the AVX-512 chains of cpu/vmath and the GEMM kernels
// here and compares their results with the references, and a host with
// the features compares the interpreter with the hardware bit for bit.
//
// The interpreter decodes the bytes themselves (checking what the encoder
// produced, not what it was asked for) and executes them against real
// process memory through unsafe pointers: the operands a program reads and
// writes are Go heap memory (which does not move), and RIP-relative
// constants are read from the code bytes at their address. It is not a
// sandbox: a wrong address reads or writes whatever lies there (a fault is
// reported as an error where Go can turn it into a panic).
//
// The subset is what Ferry's generators emit, decoded by tables that new
// instructions join with one row:
//
//   - general-purpose: MOV (load, store, register, immediate), LEA, ADD, SUB,
//     AND, OR, XOR, CMP, TEST, INC, DEC, SHL, SHR, SAR (by 1, an immediate or
//     CL), Jcc and JMP (rel8 and rel32), RET, NOP and the prefetches, in 32-
//     and 64-bit operand sizes; SSE MOVUPS (bits 128 and up kept);
//   - vector, as VEX (AVX, AVX2, FMA on XMM and YMM) and as EVEX (AVX-512F
//     and VL on XMM, YMM and ZMM registers 0–31, with opmask merging and
//     zeroing, embedded {1toN} broadcasts and compressed displacements),
//     float32 and int32 lanes: VADDPS, VSUBPS, VMULPS, VDIVPS, VMAXPS,
//     VMINPS, VSQRTPS, VFMADD/VFMSUB/VFNMADD/VFNMSUB in the 132, 213 and 231
//     forms, VCMPPS (all 32 predicates, into an opmask or a vector),
//     VPCMPEQD, VPCMPGTD, VPTESTMD, VBLENDVPS, VBLENDMPS, VPBLENDMD,
//     VPERMPS, VPTERNLOGD, VSCALEFPS, VGETEXPPS, VGETMANTPS, VRNDSCALEPS,
//     VROUNDPS, VCVTDQ2PS, VCVTPS2DQ, VCVTTPS2DQ, VPADDD, VPSUBD, VPAND(D),
//     VPANDN(D), VPOR(D), VPXOR(D), VANDPS, VANDNPS, VORPS, VXORPS, VPSLLD,
//     VPSRLD, VPSRAD (immediate counts), VMOVAPS, VMOVUPS, VMOVDQA32,
//     VMOVDQU32, VMOVNTPS, VBROADCASTSS, VPBROADCASTD, VPMOVM2D, VPMOVD2M,
//     VZEROUPPER (not VRCP14PS, whose result Intel defines by a table);
//     float64 lanes (opmask bits, {1to2/4/8} broadcasts and scalar operands
//     per 64-bit element): VADDPD, VSUBPD, VMULPD, VDIVPD, the
//     VFMADD/VFMSUB/VFNMADD/VFNMSUB PD forms, VXORPD, VMOVUPD, VBROADCASTSD
//     (what Ferry's float64 GEMM kernels use);
//   - opmask: KMOVW (to and from general-purpose and opmask registers and
//     memory), KANDW, KANDNW, KORW, KXORW, KXNORW, KNOTW, KORTESTW.
//
// Instructions lists the mnemonics.
//
// Floating point follows the instructions' definitions with the MXCSR Go
// runs with (0x1F80: round to nearest even, exceptions masked, no
// flush-to-zero and no denormals-are-zero): every result rounded once (a
// fused multiply-add included), NaN operands quieted and propagated in the
// order the instruction defines, the default NaN (0xFFC00000;
// 0xFFF8000000000000 in float64) for invalid operations, MAXPS and MINPS
// returning their second source for NaNs and equal zeros. Anything
// outside the subset (an opcode, a prefix, an encoding such as embedded
// rounding or 64-bit lanes in other instructions) stops the run with an
// error naming its address and bytes, and a step limit stops runaway loops.
package x86emu

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"unsafe"
)

// Register numbers of the general-purpose registers in Machine.R.
const (
	RAX = iota
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

// DefaultMaxSteps is the step limit of a Machine whose MaxSteps is 0.
const DefaultMaxSteps = 1 << 26

// Machine is the state of one emulated core: general-purpose, vector and
// opmask registers and the arithmetic flags. The zero value is ready to
// use; a Machine is not safe for concurrent use.
type Machine struct {
	R [16]uint64     // general-purpose registers (RAX ... R15)
	Z [32][16]uint32 // vector registers as 32-bit lanes (XMM and YMM are their low lanes)
	K [8]uint64      // opmask registers

	CF, ZF, SF, OF, PF bool // arithmetic flags

	// MaxSteps bounds the instructions one call executes (0:
	// DefaultMaxSteps); Steps counts those of the last call.
	MaxSteps int
	Steps    int

	// Trace, when set, is called before each instruction with its address
	// and its decoded form.
	Trace func(pc uintptr, in *Inst)

	cache map[uintptr]*Inst
	code  []byte // a copy of the code of the last Call (the cache's)
	stack []uint64
	lo    uintptr // bounds of the code being run (hi 0: unbounded)
	hi    uintptr
}

// ErrStepLimit is wrapped by the error of a call that ran past MaxSteps.
var ErrStepLimit = errors.New("x86emu: step limit reached")

// returnSentinel is the return address a call's RET stops at.
const returnSentinel = 0xdead_0000_0000_0001

// Call runs code from byte offset entry as a function called with the
// machine's registers as they are set (RDI holding the first argument of
// the System V convention, say) until it returns. RSP points at the return
// address on a stack owned by the machine, followed by the words args (the
// arguments of Go's ABI0 at 8(SP), 16(SP), ...). Instructions are fetched
// from code only; RIP-relative operands address code's own bytes. Memory
// the code reaches through its registers must stay where it is during the
// call (Go heap memory, kept alive by the caller).
func (m *Machine) Call(code []byte, entry int, args ...uint64) error {
	if entry < 0 || entry >= len(code) {
		return fmt.Errorf("x86emu: entry %d outside the %d bytes of code", entry, len(code))
	}
	base := uintptr(unsafe.Pointer(&code[0]))
	if base != m.lo || m.hi == 0 || !bytes.Equal(code, m.code) {
		// Other code (or other code at the same address): decode afresh.
		m.cache, m.code = nil, bytes.Clone(code)
	}
	m.lo, m.hi = base, base+uintptr(len(code))
	err := m.run(base+uintptr(entry), args)
	runtime.KeepAlive(code)
	return err
}

// CallPC is Call for code at address pc in the process (a Go assembly
// function, say), fetched from memory as it runs.
func (m *Machine) CallPC(pc uintptr, args ...uint64) error {
	if m.hi != 0 {
		m.cache, m.code = nil, nil
	}
	m.lo, m.hi = 0, 0
	return m.run(pc, args)
}

// Offset returns the offset of pc in the code of the current or last Call
// (pc itself after CallPC).
func (m *Machine) Offset(pc uintptr) uintptr { return pc - m.lo }

func (m *Machine) run(pc uintptr, args []uint64) (err error) {
	if len(m.stack) < 64+len(args) {
		m.stack = make([]uint64, 64+len(args)+64)
	}
	if m.cache == nil {
		m.cache = map[uintptr]*Inst{}
	}
	// The return address, then the arguments, at the top of the stack.
	top := len(m.stack) - 1 - len(args)
	m.stack[top] = returnSentinel
	copy(m.stack[top+1:], args)
	m.R[RSP] = uint64(uintptr(unsafe.Pointer(&m.stack[top])))
	limit := m.MaxSteps
	if limit <= 0 {
		limit = DefaultMaxSteps
	}
	m.Steps = 0
	var cur uintptr
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("x86emu: at %s: %v", m.where(cur), r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	for {
		cur = pc
		in, err := m.decodeAt(pc)
		if err != nil {
			return err
		}
		if m.Trace != nil {
			m.Trace(pc, in)
		}
		if m.Steps >= limit {
			return fmt.Errorf("%w (%d instructions) at %s", ErrStepLimit, limit, m.where(pc))
		}
		m.Steps++
		next := pc + uintptr(in.Len)
		npc, err := in.exec(m, in, next)
		if err != nil {
			return fmt.Errorf("x86emu: %s at %s: %w", in.Name, m.where(pc), err)
		}
		if npc == returnSentinel {
			runtime.KeepAlive(m.stack)
			return nil
		}
		pc = npc
	}
}

// where names address pc: its offset in the code of Call, or the address.
func (m *Machine) where(pc uintptr) string {
	if m.hi != 0 {
		return fmt.Sprintf("offset %#x", pc-m.lo)
	}
	return fmt.Sprintf("address %#x", pc)
}

// decodeAt returns the instruction at pc, decoding it on first use.
func (m *Machine) decodeAt(pc uintptr) (*Inst, error) {
	if in, ok := m.cache[pc]; ok {
		return in, nil
	}
	var buf [15]byte
	n := len(buf)
	if m.hi != 0 {
		if pc < m.lo || pc >= m.hi {
			return nil, fmt.Errorf("x86emu: jump outside the code, to offset %#x", int64(pc-m.lo))
		}
		n = min(n, int(m.hi-pc))
	}
	for i := range n {
		buf[i] = *(*byte)(addrPtr(uint64(pc) + uint64(i)))
	}
	in, err := Decode(buf[:n], pc)
	if err != nil {
		return nil, fmt.Errorf("x86emu: at %s: %w", m.where(pc), err)
	}
	m.cache[pc] = in
	return in, nil
}

// Reset clears the registers, flags and the decoded-instruction cache (code
// at an address that held other code before must not be run from the
// cache).
func (m *Machine) Reset() {
	*m = Machine{MaxSteps: m.MaxSteps, Trace: m.Trace, stack: m.stack}
}

// ---- memory ----

// addrPtr turns an address into a pointer (through memory, so that vet's
// and checkptr's checks of uintptr arithmetic do not apply: the address
// comes from the emulated program, not from Go pointer arithmetic).
func addrPtr(a uint64) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }

func load8(a uint64) uint8   { return *(*uint8)(addrPtr(a)) }
func load32(a uint64) uint32 { return *(*uint32)(addrPtr(a)) }
func load64(a uint64) uint64 { return *(*uint64)(addrPtr(a)) }

func store32(a uint64, v uint32) { *(*uint32)(addrPtr(a)) = v }
func store64(a uint64, v uint64) { *(*uint64)(addrPtr(a)) = v }
