package x86emu

import (
	"errors"
	"math"
	"math/big"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	e "github.com/ferryml/ferry/cpu/internal/amd64enc"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// fmaBig is x*y + z rounded once to float32, by math/big (finite operands).
func fmaBig(x, y, z float32) float32 {
	p := new(big.Float).SetPrec(1024)
	p.Mul(big.NewFloat(float64(x)), big.NewFloat(float64(y)))
	p.Add(p, big.NewFloat(float64(z)))
	f, _ := p.Float32()
	if f == 0 { // big.Float has no signed zero of a sum: IEEE's rule
		return float32(float64(x)*float64(y) + float64(z))
	}
	return f
}

// TestFMARoundsOnce checks fma32 against exact arithmetic on random
// operands, on products at float32 midpoints with tiny addends (the double
// rounding cases) and on subnormal results.
func TestFMARoundsOnce(t *testing.T) {
	r := testseed.Rand(t, 1)
	for i := 0; i < 200000; i++ {
		var x, y, z float32
		switch i % 4 {
		case 0:
			x, y, z = math.Float32frombits(r.Uint32()), math.Float32frombits(r.Uint32()), math.Float32frombits(r.Uint32())
		case 1: // a midpoint product plus or minus a tiny addend
			x = math.Float32frombits(0x3f800000 | r.Uint32()&0x7fffff)
			y = 1.5
			z = float32(math.Ldexp(float64(r.Float32()), -30-r.IntN(120))) * float32(1-2*r.IntN(2))
		case 2: // subnormal results
			x = float32(math.Ldexp(1+r.Float64(), -70))
			y = float32(math.Ldexp(1+r.Float64(), -70)) * float32(1-2*r.IntN(2))
			z = float32(math.Ldexp(r.Float64(), -126-r.IntN(20)))
		default: // cancellation
			x, y = float32(r.NormFloat64()), float32(r.NormFloat64())
			z = -float32(float64(x) * float64(y))
		}
		if x != x || y != y || z != z || math.IsInf(float64(x), 0) || math.IsInf(float64(y), 0) || math.IsInf(float64(z), 0) {
			continue
		}
		got := fma32(math.Float32bits(x), math.Float32bits(y), math.Float32bits(z))
		want := fmaBig(x, y, z)
		if p := float64(x) * float64(y); !math.IsInf(float64(want), 0) && got != math.Float32bits(want) && !(p == 0 && z == 0) {
			t.Fatalf("fma(%g, %g, %g) = %#x, want %#x", x, y, z, got, math.Float32bits(want))
		}
	}
}

// TestSpecialValues checks documented special cases of the lane
// functions.
func TestSpecialValues(t *testing.T) {
	const qnan, snan, inf, ninf, one = 0x7fc00001, 0x7f800001, 0x7f800000, 0xff800000, 0x3f800000
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"add snan", addF(snan, one), 0x7fc00001},
		{"add first nan", addF(0xffc00002, qnan), 0xffc00002},
		{"inf - inf", subF(inf, inf), defaultNaN},
		{"0 * inf", mulF(0, inf), defaultNaN},
		{"max nan second", maxF(qnan, one), one},
		{"max nan first", maxF(one, snan), snan},
		{"max zeros", maxF(0, 0x80000000), 0x80000000},
		{"min zeros", minF(0x80000000, 0), 0},
		{"sqrt -0", sqrtF(0x80000000), 0x80000000},
		{"sqrt -1", sqrtF(0xbf800000), defaultNaN},
		{"getexp 0", getexpF(0), ninf},
		{"getexp subnormal", getexpF(1), math.Float32bits(-149)},
		{"getmant 1.5*2^5 [1/2,1)", getmantF(2, math.Float32bits(48)), math.Float32bits(0.75)},
		{"scalef 1 by 2.5", scalefF(one, math.Float32bits(2.5)), math.Float32bits(4)},
		{"scalef 0 by inf", scalefF(0, inf), defaultNaN},
		{"scalef qnan by -inf", scalefF(0xffc00000, ninf), 0},
		{"scalef underflow", scalefF(math.Float32bits(1.5), math.Float32bits(-150)), 1},
		{"cvt nan", cvtF2I(qnan, false), 0x80000000},
		{"cvt 2.5", cvtF2I(math.Float32bits(2.5), false), 2},
		{"cvt 2^31", cvtF2I(0x4f000000, true), 0x80000000},
		{"rndscale 2.5", rndscaleF(0, math.Float32bits(2.5)), math.Float32bits(2)},
		{"rndscale -0.3 up", rndscaleF(2, math.Float32bits(-0.3)), 0x80000000},
	} {
		if c.got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if !cmpF(4, 0x7fc00000, 0) || cmpF(0, 0x7fc00000, 0x7fc00000) || !cmpF(0, 0, 0x80000000) || cmpF(1, 0, 0x80000000) {
		t.Error("compare predicates on NaN and signed zeros")
	}
}

// callAsm runs the code a emitted with RDI = &args[0].
func callAsm(t *testing.T, m *Machine, a *e.Asm, args []uint64) error {
	t.Helper()
	code, err := a.Finish()
	if err != nil {
		t.Fatal(err)
	}
	m.R[RDI] = uint64(uintptr(unsafe.Pointer(&args[0])))
	err = m.Call(code, 0)
	runtime.KeepAlive(args) // the interpreter holds only its address
	return err
}

// TestLoopProgram runs an encoder-built loop (y[i] = x[i]*c + y[i] over n
// elements, a masked AVX-512 tail, a VEX variant of 8 lanes) and checks
// it against Go.
func TestLoopProgram(t *testing.T) {
	r := testseed.Rand(t, 2)
	for _, vex := range []bool{false, true} {
		lanes := int32(16)
		if vex {
			lanes = 8
		}
		for _, n := range []int{0, 1, 8, 15, 16, 17, 100} {
			if vex && n%8 != 0 {
				continue
			}
			var a e.Asm
			a.VEX = vex
			a.MOVQload(e.Mem{Base: e.RDI}, e.RCX)
			a.MOVQload(e.Mem{Base: e.RDI, Disp: 8}, e.RBX)
			a.MOVQload(e.Mem{Base: e.RDI, Disp: 16}, e.RSI)
			a.XORL(e.RAX)
			a.VBROADCASTSS(a.ConstF(1.25), 7)
			loop, tail, done := a.NewLabel(), a.NewLabel(), a.NewLabel()
			a.CMPQ(e.RCX, lanes)
			a.Jcc(e.CondL, tail)
			a.Bind(loop)
			x := e.Mem{Base: e.RBX, Index: e.RAX, HasIndex: true, Scale: 1}
			y := e.Mem{Base: e.RSI, Index: e.RAX, HasIndex: true, Scale: 1}
			a.VMOVUPSload(x, 0, 1)
			a.VMOVUPSload(y, 0, 2)
			a.VFMADD231PS(e.Z(7), 1, 2)
			a.VMOVUPSstore(2, 0, y)
			a.ADDQ(4*lanes, e.RAX)
			a.SUBQ(lanes, e.RCX)
			a.CMPQ(e.RCX, lanes)
			a.Jcc(e.CondGE, loop)
			a.Bind(tail)
			if !vex {
				a.TESTQ(e.RCX)
				a.Jcc(e.CondLE, done)
				a.MOVL(1, e.RDX)
				a.SHLLCL(e.RDX)
				a.DECL(e.RDX)
				a.KMOVW(e.RDX, 1)
				a.VMOVUPSload(x, 1, 1)
				a.VMOVUPSload(y, 1, 2)
				a.VFMADD231PS(e.Z(7), 1, 2)
				a.VMOVUPSstore(2, 1, y)
			}
			a.Bind(done)
			a.VZEROUPPER()
			a.RET()
			xs, ys := make([]float32, n+16), make([]float32, n+16)
			for i := range xs {
				xs[i], ys[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			want := append([]float32(nil), ys...)
			for i := range n {
				want[i] = math.Float32frombits(fma32(math.Float32bits(xs[i]), math.Float32bits(1.25), math.Float32bits(ys[i])))
			}
			var m Machine
			args := []uint64{uint64(n), uint64(uintptr(unsafe.Pointer(&xs[0]))), uint64(uintptr(unsafe.Pointer(&ys[0])))}
			if err := callAsm(t, &m, &a, args); err != nil {
				t.Fatal(err)
			}
			runtime.KeepAlive(xs)
			for i := range ys {
				if math.Float32bits(ys[i]) != math.Float32bits(want[i]) {
					t.Fatalf("vex %v n=%d: y[%d] = %v, want %v", vex, n, i, ys[i], want[i])
				}
			}
		}
	}
}

// TestErrors checks that an unknown instruction names its offset and
// bytes, that a runaway loop stops at the step limit, and that a jump out
// of the code is refused.
func TestErrors(t *testing.T) {
	var m Machine
	err := m.Call([]byte{0x90, 0x0f, 0x0b}, 0) // NOP; UD2
	if err == nil || !strings.Contains(err.Error(), "offset 0x1") || !strings.Contains(err.Error(), "0f 0b") {
		t.Errorf("UD2: %v", err)
	}
	m.MaxSteps = 1000
	err = m.Call([]byte{0xeb, 0xfe}, 0) // JMP .
	if !errors.Is(err, ErrStepLimit) {
		t.Errorf("endless loop: %v", err)
	}
	m.MaxSteps = 0
	if err := m.Call([]byte{0xe9, 0, 1, 0, 0}, 0); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("jump out: %v", err)
	}
	// An EVEX instruction with 64-bit lanes (W1) is outside the subset.
	var a e.Asm
	a.VADDPS(e.Z(1), 2, 3)
	code, _ := a.Finish()
	code[2] |= 0x80 // EVEX.W
	if _, err := Decode(code, 0); err == nil || !strings.Contains(err.Error(), "W1") {
		t.Errorf("VADDPD: %v", err)
	}
}

// TestDecodeEncoder decodes instructions of the encoder (EVEX and VEX
// forms, compressed and full displacements, broadcasts, RIP-relative
// constants, registers above 15) and checks the mnemonic, length and
// operands.
func TestDecodeEncoder(t *testing.T) {
	for _, c := range []struct {
		vex  bool
		emit func(a *e.Asm)
		name string
		chk  func(in *Inst) bool
	}{
		{false, func(a *e.Asm) { a.VADDPS(e.Z(31), 17, 9) }, "VADDPS", func(in *Inst) bool { return in.rm == 31 && in.vvvv == 17 && in.reg == 9 && in.vl == 64 }},
		{false, func(a *e.Asm) {
			a.VMOVUPSload(e.Mem{Base: e.R13, Index: e.RAX, HasIndex: true, Scale: 1, Disp: 128}, 1, 20)
		}, "VMOVUPS",
			func(in *Inst) bool {
				return in.base == int8(e.R13) && in.idx == 0 && in.disp == 128 && in.k == 1 && in.z && in.reg == 20
			}},
		{false, func(a *e.Asm) { a.VMULPS(e.Mem{Base: e.RBX, Disp: 8, Bcst: true}, 2, 3) }, "VMULPS", func(in *Inst) bool { return in.bcst && in.disp == 8 }},
		{false, func(a *e.Asm) { a.VBROADCASTSS(e.Mem{Base: e.RSI, Disp: 12}, 3) }, "VBROADCASTSS", func(in *Inst) bool { return in.disp == 12 }},
		{false, func(a *e.Asm) { a.VPTERNLOGD(0xb8, e.Z(5), 6, 7) }, "VPTERNLOGD", func(in *Inst) bool { return in.imm == 0xb8 }},
		{false, func(a *e.Asm) { a.VCMPPS(0x11, e.Z(5), 6, 3) }, "VCMPPS", func(in *Inst) bool { return in.imm == 0x11 && in.reg&7 == 3 }},
		{false, func(a *e.Asm) { a.KMOVW(e.RDX, 1) }, "KMOVW", func(in *Inst) bool { return in.reg == 1 && in.rm == 2 }},
		{true, func(a *e.Asm) { a.VFMADD231PS(e.Z(12), 3, 15) }, "VFMADD231PS", func(in *Inst) bool { return in.rm == 12 && in.vvvv == 3 && in.reg == 15 && in.vl == 32 }},
		{true, func(a *e.Asm) { a.VBLENDVPS(4, e.Z(5), 6, 7) }, "VBLENDVPS", func(in *Inst) bool { return in.imm>>4 == 4 }},
		{true, func(a *e.Asm) { a.VPSRAD(4, 9, 10) }, "VPSRAD", func(in *Inst) bool { return in.vvvv == 10 && in.rm == 9 && in.imm == 4 }},
		{false, func(a *e.Asm) { a.PREFETCHNTA(e.Mem{Base: e.R12, Index: e.RAX, HasIndex: true, Scale: 1, Disp: 3072}) }, "PREFETCHNTA", func(in *Inst) bool { return in.disp == 3072 }},
		{false, func(a *e.Asm) { a.SUBQ(128, e.RCX) }, "SUB", func(in *Inst) bool { return in.imm == 128 && in.w }},
	} {
		a := e.Asm{VEX: c.vex}
		c.emit(&a)
		n := a.Len()
		code, err := a.Finish()
		if err != nil {
			t.Fatal(err)
		}
		in, err := Decode(code[:n], 0)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if in.Name != c.name || in.Len != n || !c.chk(in) {
			t.Errorf("% x: decoded %s (%d bytes) %+v", code[:n], in.Name, in.Len, in)
		}
	}
	// A RIP-relative constant resolves to its address in the pool.
	var a e.Asm
	a.VBROADCASTSS(a.ConstF(2), 1)
	n := a.Len()
	code, _ := a.Finish()
	in, err := Decode(code[:n], 0x1000)
	if err != nil || in.base != -1 || uint64(in.disp) != 0x1000+uint64(len(code))-4 {
		t.Errorf("RIP-relative: %v %+v (code %d bytes)", err, in, len(code))
	}
}
