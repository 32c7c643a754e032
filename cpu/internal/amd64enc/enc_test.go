package amd64enc

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

type encCase struct {
	goAsm string // the same instruction in Go assembler syntax
	emit  func(a *Asm)
}

func m(base Reg, disp int32) Mem { return Mem{Base: base, Disp: disp} }

func mi(base, idx Reg, disp int32) Mem {
	return Mem{Base: base, Index: idx, HasIndex: true, Scale: 1, Disp: disp}
}

func bc(x Mem) Mem { x.Bcst = true; return x }

// encCases covers every instruction with low and high registers (the EVEX
// R, R', X, B and V' bits), every memory form (no displacement, disp8 with
// the EVEX scale, disp32, SIB with RSP/R12/R13 bases, broadcast) and masks.
var encCases = []encCase{
	{"VADDPS Z2, Z1, Z0", func(a *Asm) { a.VADDPS(Z(2), 1, 0) }},
	{"VADDPS Z31, Z17, Z9", func(a *Asm) { a.VADDPS(Z(31), 17, 9) }},
	{"VADDPS Z8, Z24, Z16", func(a *Asm) { a.VADDPS(Z(8), 24, 16) }},
	{"VADDPS Z3, Z3, K2, Z3", func(a *Asm) { a.VADDPSk(Z(3), 3, 2, 3) }},
	{"VSUBPS Z5, Z6, Z7", func(a *Asm) { a.VSUBPS(Z(5), 6, 7) }},
	{"VSUBPS.BCST (BX), Z6, K3, Z7", func(a *Asm) { a.VSUBPSk(bc(m(RBX, 0)), 6, 3, 7) }},
	{"VMULPS Z20, Z21, Z22", func(a *Asm) { a.VMULPS(Z(20), 21, 22) }},
	{"VMULPS (SI)(AX*1), Z1, Z2", func(a *Asm) { a.VMULPS(mi(RSI, RAX, 0), 1, 2) }},
	{"VMULPS 128(R13)(AX*1), Z1, Z2", func(a *Asm) { a.VMULPS(mi(R13, RAX, 128), 1, 2) }},
	{"VMULPS (R13)(R9*1), Z1, Z2", func(a *Asm) { a.VMULPS(mi(R13, R9, 0), 1, 2) }},
	{"VMULPS.BCST 8(R12), Z30, Z29", func(a *Asm) { a.VMULPS(bc(m(R12, 8)), 30, 29) }},
	{"VMULPS 100(DX), Z1, Z2", func(a *Asm) { a.VMULPS(m(RDX, 100), 1, 2) }},
	{"VMULPS 64(DX), Z1, Z2", func(a *Asm) { a.VMULPS(m(RDX, 64), 1, 2) }},
	{"VMULPS -8192(DX), Z1, Z2", func(a *Asm) { a.VMULPS(m(RDX, -8192), 1, 2) }},
	{"VMULPS.BCST 1000(R8), Z1, Z2", func(a *Asm) { a.VMULPS(bc(m(R8, 1000)), 1, 2) }},
	{"VDIVPS Z12, Z13, Z14", func(a *Asm) { a.VDIVPS(Z(12), 13, 14) }},
	{"VMAXPS Z0, Z16, Z31", func(a *Asm) { a.VMAXPS(Z(0), 16, 31) }},
	{"VMINPS Z1, Z17, Z30", func(a *Asm) { a.VMINPS(Z(1), 17, 30) }},
	{"VSQRTPS Z25, Z9", func(a *Asm) { a.VSQRTPS(Z(25), 9) }},
	{"VFMADD213PS Z1, Z2, Z3", func(a *Asm) { a.VFMADD213PS(Z(1), 2, 3) }},
	{"VFMADD213PS.BCST (R11), Z18, Z27", func(a *Asm) { a.VFMADD213PS(bc(m(R11, 0)), 18, 27) }},
	{"VFMADD231PS Z19, Z11, Z4", func(a *Asm) { a.VFMADD231PS(Z(19), 11, 4) }},
	{"VFNMADD231PS.BCST 4(AX), Z17, Z16", func(a *Asm) { a.VFNMADD231PS(bc(m(RAX, 4)), 17, 16) }},
	{"VFMSUB213PS Z1, Z2, Z3", func(a *Asm) { a.VFMSUB213PS(Z(1), 2, 3) }},
	{"VFMSUB213PS.BCST 4(AX), Z17, Z26", func(a *Asm) { a.VFMSUB213PS(bc(m(RAX, 4)), 17, 26) }},
	{"VFMSUB231PS Z19, Z11, Z4", func(a *Asm) { a.VFMSUB231PS(Z(19), 11, 4) }},
	{"VFNMADD213PS Z29, Z2, Z13", func(a *Asm) { a.VFNMADD213PS(Z(29), 2, 13) }},
	{"VSCALEFPS Z17, Z19, Z4", func(a *Asm) { a.VSCALEFPS(Z(17), 19, 4) }},
	{"VPANDD.BCST (CX), Z0, Z8", func(a *Asm) { a.VPANDD(bc(m(RCX, 0)), 0, 8) }},
	{"VPORD Z7, Z23, Z15", func(a *Asm) { a.VPORD(Z(7), 23, 15) }},
	{"VPXORD Z9, Z9, Z9", func(a *Asm) { a.VPXORD(Z(9), 9, 9) }},
	{"VPXORD.BCST (SP), Z24, Z10", func(a *Asm) { a.VPXORD(bc(m(RSP, 0)), 24, 10) }},
	{"VBLENDMPS Z10, Z4, K2, Z4", func(a *Asm) { a.VBLENDMPSk(Z(10), 4, 2, 4) }},
	{"VBLENDMPS Z26, Z20, K7, Z28", func(a *Asm) { a.VBLENDMPSk(Z(26), 20, 7, 28) }},
	{"VPTERNLOGD $0xb8, Z0, Z11, Z4", func(a *Asm) { a.VPTERNLOGD(0xb8, Z(0), 11, 4) }},
	{"VPTERNLOGD $0xb8, Z24, Z27, Z20", func(a *Asm) { a.VPTERNLOGD(0xb8, Z(24), 27, 20) }},
	{"VRNDSCALEPS $8, Z17, Z17", func(a *Asm) { a.VRNDSCALEPS(8, Z(17), 17) }},
	{"VGETMANTPS $2, Z0, Z8", func(a *Asm) { a.VGETMANTPS(2, Z(0), 8) }},
	{"VGETEXPPS Z24, Z9", func(a *Asm) { a.VGETEXPPS(Z(24), 9) }},
	{"VRCP14PS Z3, Z4", func(a *Asm) { a.VRCP14PS(Z(3), 4) }},
	{"VRCP14PS Z25, Z17", func(a *Asm) { a.VRCP14PS(Z(25), 17) }},
	{"VCVTPS2DQ Z9, Z20", func(a *Asm) { a.VCVTPS2DQ(Z(9), 20) }},
	{"VCVTDQ2PS Z21, Z2", func(a *Asm) { a.VCVTDQ2PS(Z(21), 2) }},
	{"VPERMPS Z1, Z18, Z27", func(a *Asm) { a.VPERMPS(Z(1), 18, 27) }},
	{"VPERMPS 64(DX), Z18, Z27", func(a *Asm) { a.VPERMPS(m(RDX, 64), 18, 27) }},
	{"VPADDD Z16, Z9, Z8", func(a *Asm) { a.VPADDD(Z(16), 9, 8) }},
	{"VPSLLD $23, Z17, Z12", func(a *Asm) { a.VPSLLD(23, Z(17), 12) }},
	{"VPSLLD $23, Z5, Z30", func(a *Asm) { a.VPSLLD(23, Z(5), 30) }},
	{"VMOVNTPS Z6, (DI)(AX*1)", func(a *Asm) { a.VMOVNTPS(6, mi(RDI, RAX, 0)) }},
	{"VMOVNTPS Z22, 64(R9)(AX*1)", func(a *Asm) { a.VMOVNTPS(22, mi(R9, RAX, 64)) }},
	{"VCMPPS $0x11, Z10, Z8, K2", func(a *Asm) { a.VCMPPS(0x11, Z(10), 8, 2) }},
	{"VPTESTMD Z10, Z8, K2", func(a *Asm) { a.VPTESTMD(Z(10), 8, 2) }},
	{"VPTESTMD.BCST (R10), Z24, K7", func(a *Asm) { a.VPTESTMD(bc(m(R10, 0)), 24, 7) }},
	{"VCMPPS.BCST $0x1d, (R10), Z24, K2", func(a *Asm) { a.VCMPPS(0x1d, bc(m(R10, 0)), 24, 2) }},
	{"VCMPPS $3, Z24, Z24, K1", func(a *Asm) { a.VCMPPS(3, Z(24), 24, 1) }},
	{"VMOVAPS Z20, Z24", func(a *Asm) { a.VMOVAPS(20, 24) }},
	{"VMOVAPS Z0, K2, Z4", func(a *Asm) { a.VMOVAPSk(0, 2, 4) }},
	{"VMOVUPS (BX)(AX*1), Z0", func(a *Asm) { a.VMOVUPSload(mi(RBX, RAX, 0), 0, 0) }},
	{"VMOVUPS (R12)(AX*1), Z21", func(a *Asm) { a.VMOVUPSload(mi(R12, RAX, 0), 0, 21) }},
	{"VMOVUPS.Z (R8)(AX*1), K1, Z17", func(a *Asm) { a.VMOVUPSload(mi(R8, RAX, 0), 1, 17) }},
	{"VMOVUPS Z4, (DI)(AX*1)", func(a *Asm) { a.VMOVUPSstore(4, 0, mi(RDI, RAX, 0)) }},
	{"VMOVUPS Z29, K1, (R13)(AX*1)", func(a *Asm) { a.VMOVUPSstore(29, 1, mi(R13, RAX, 0)) }},
	{"VMOVUPS Z3, 192(SI)", func(a *Asm) { a.VMOVUPSstore(3, 0, m(RSI, 192)) }},
	{"VBROADCASTSS (R9), Z19", func(a *Asm) { a.VBROADCASTSS(m(R9, 0), 19) }},
	{"VBROADCASTSS 8(DX), Z3", func(a *Asm) { a.VBROADCASTSS(m(RDX, 8), 3) }},
	{"VZEROUPPER", func(a *Asm) { a.VZEROUPPER() }},
	{"KMOVW DX, K1", func(a *Asm) { a.KMOVW(RDX, 1) }},
	{"MOVQ (DI), CX", func(a *Asm) { a.MOVQload(m(RDI, 0), RCX) }},
	{"MOVQ 8(DI), R13", func(a *Asm) { a.MOVQload(m(RDI, 8), R13) }},
	{"MOVQ 1024(DI), R8", func(a *Asm) { a.MOVQload(m(RDI, 1024), R8) }},
	{"MOVQ 16(R12), BX", func(a *Asm) { a.MOVQload(m(R12, 16), RBX) }},
	{"MOVQ R11, 24(DI)", func(a *Asm) { a.MOVQstore(R11, m(RDI, 24)) }},
	{"ADDQ $64, AX", func(a *Asm) { a.ADDQ(64, RAX) }},
	{"ADDQ $4096, R9", func(a *Asm) { a.ADDQ(4096, R9) }},
	{"SUBQ $16, CX", func(a *Asm) { a.SUBQ(16, RCX) }},
	{"CMPQ CX, $16", func(a *Asm) { a.CMPQ(RCX, 16) }},
	{"CMPQ R10, $100000", func(a *Asm) { a.CMPQ(R10, 100000) }},
	{"TESTQ CX, CX", func(a *Asm) { a.TESTQ(RCX) }},
	{"XORL AX, AX", func(a *Asm) { a.XORL(RAX) }},
	{"MOVL $1, DX", func(a *Asm) { a.MOVL(1, RDX) }},
	{"SHLL CX, DX", func(a *Asm) { a.SHLLCL(RDX) }},
	{"DECL DX", func(a *Asm) { a.DECL(RDX) }},
	{"PREFETCHT0 2048(SI)(AX*1)", func(a *Asm) { a.PREFETCHT0(mi(RSI, RAX, 2048)) }},
	{"PREFETCHT0 2112(R13)(AX*1)", func(a *Asm) { a.PREFETCHT0(mi(R13, RAX, 2112)) }},
	{"PREFETCHT0 64(R9)(R10*1)", func(a *Asm) { a.PREFETCHT0(mi(R9, R10, 64)) }},
	{"PREFETCHNTA 3072(BX)(AX*1)", func(a *Asm) { a.PREFETCHNTA(mi(RBX, RAX, 3072)) }},
	{"PREFETCHNTA 3136(R12)(AX*1)", func(a *Asm) { a.PREFETCHNTA(mi(R12, RAX, 3136)) }},
	{"RET", func(a *Asm) { a.RET() }},

	// VEX (AVX2) code: two- and three-byte prefixes (R, X, B, map, W0),
	// every memory form, every instruction the AVX2 generator emits.
	{"VADDPS Y2, Y1, Y0", vx(func(a *Asm) { a.VADDPS(Z(2), 1, 0) })},
	{"VADDPS Y15, Y9, Y8", vx(func(a *Asm) { a.VADDPS(Z(15), 9, 8) })},
	{"VADDPS Y1, Y14, Y3", vx(func(a *Asm) { a.VADDPS(Z(1), 14, 3) })},
	{"VSUBPS (BX), Y6, Y7", vx(func(a *Asm) { a.VSUBPS(m(RBX, 0), 6, 7) })},
	{"VMULPS (SI)(AX*1), Y1, Y2", vx(func(a *Asm) { a.VMULPS(mi(RSI, RAX, 0), 1, 2) })},
	{"VMULPS 128(R13)(AX*1), Y1, Y12", vx(func(a *Asm) { a.VMULPS(mi(R13, RAX, 128), 1, 12) })},
	{"VMULPS (R13)(R9*1), Y1, Y2", vx(func(a *Asm) { a.VMULPS(mi(R13, R9, 0), 1, 2) })},
	{"VMULPS 8(R12), Y10, Y9", vx(func(a *Asm) { a.VMULPS(m(R12, 8), 10, 9) })},
	{"VMULPS 100(DX), Y1, Y2", vx(func(a *Asm) { a.VMULPS(m(RDX, 100), 1, 2) })},
	{"VMULPS -8192(DX), Y1, Y2", vx(func(a *Asm) { a.VMULPS(m(RDX, -8192), 1, 2) })},
	{"VMULPS (SP), Y1, Y2", vx(func(a *Asm) { a.VMULPS(m(RSP, 0), 1, 2) })},
	{"VDIVPS Y12, Y13, Y14", vx(func(a *Asm) { a.VDIVPS(Z(12), 13, 14) })},
	{"VMAXPS Y0, Y6, Y15", vx(func(a *Asm) { a.VMAXPS(Z(0), 6, 15) })},
	{"VMINPS Y11, Y7, Y3", vx(func(a *Asm) { a.VMINPS(Z(11), 7, 3) })},
	{"VSQRTPS Y13, Y9", vx(func(a *Asm) { a.VSQRTPS(Z(13), 9) })},
	{"VFMADD213PS Y1, Y2, Y3", vx(func(a *Asm) { a.VFMADD213PS(Z(1), 2, 3) })},
	{"VFMADD213PS (R11), Y8, Y12", vx(func(a *Asm) { a.VFMADD213PS(m(R11, 0), 8, 12) })},
	{"VFMADD231PS Y9, Y11, Y4", vx(func(a *Asm) { a.VFMADD231PS(Z(9), 11, 4) })},
	{"VFNMADD231PS 4(AX), Y7, Y6", vx(func(a *Asm) { a.VFNMADD231PS(m(RAX, 4), 7, 6) })},
	{"VFMSUB213PS Y1, Y12, Y3", vx(func(a *Asm) { a.VFMSUB213PS(Z(1), 12, 3) })},
	{"VFMSUB231PS Y9, Y1, Y14", vx(func(a *Asm) { a.VFMSUB231PS(Z(9), 1, 14) })},
	{"VFNMADD213PS Y15, Y2, Y13", vx(func(a *Asm) { a.VFNMADD213PS(Z(15), 2, 13) })},
	{"VPAND (CX), Y0, Y8", vx(func(a *Asm) { a.VPANDD(m(RCX, 0), 0, 8) })},
	{"VPOR Y7, Y13, Y15", vx(func(a *Asm) { a.VPORD(Z(7), 13, 15) })},
	{"VPXOR Y9, Y9, Y9", vx(func(a *Asm) { a.VPXORD(Z(9), 9, 9) })},
	{"VPANDN Y3, Y10, Y4", vx(func(a *Asm) { a.VPANDN(Z(3), 10, 4) })},
	{"VPADDD Y11, Y9, Y8", vx(func(a *Asm) { a.VPADDD(Z(11), 9, 8) })},
	{"VPSUBD 32(R8), Y2, Y10", vx(func(a *Asm) { a.VPSUBD(m(R8, 32), 2, 10) })},
	{"VPSLLD $23, Y1, Y12", vx(func(a *Asm) { a.VPSLLD(23, Z(1), 12) })},
	{"VPSLLD $28, Y9, Y2", vx(func(a *Asm) { a.VPSLLD(28, Z(9), 2) })},
	{"VPSRLD $23, Y10, Y3", vx(func(a *Asm) { a.VPSRLD(23, 10, 3) })},
	{"VPSRAD $4, Y4, Y11", vx(func(a *Asm) { a.VPSRAD(4, 4, 11) })},
	{"VCVTDQ2PS Y11, Y2", vx(func(a *Asm) { a.VCVTDQ2PS(Z(11), 2) })},
	{"VCVTPS2DQ Y1, Y9", vx(func(a *Asm) { a.VCVTPS2DQ(Z(1), 9) })},
	{"VPERMPS Y1, Y8, Y13", vx(func(a *Asm) { a.VPERMPS(Z(1), 8, 13) })},
	{"VPERMPS 64(DX), Y3, Y4", vx(func(a *Asm) { a.VPERMPS(m(RDX, 64), 3, 4) })},
	{"VCMPPS $0x11, Y10, Y8, Y2", vx(func(a *Asm) { a.VCMPPSv(0x11, Z(10), 8, 2) })},
	{"VCMPPS $0x1d, (R10), Y14, Y12", vx(func(a *Asm) { a.VCMPPSv(0x1d, m(R10, 0), 14, 12) })},
	{"VCMPPS $3, Y4, Y4, Y5", vx(func(a *Asm) { a.VCMPPSv(3, Z(4), 4, 5) })},
	{"VBLENDVPS Y1, Y2, Y3, Y4", vx(func(a *Asm) { a.VBLENDVPS(1, Z(2), 3, 4) })},
	{"VBLENDVPS Y15, (R9), Y11, Y10", vx(func(a *Asm) { a.VBLENDVPS(15, m(R9, 0), 11, 10) })},
	{"VMOVAPS Y3, Y4", vx(func(a *Asm) { a.VMOVAPS(3, 4) })},
	{"VMOVAPS Y12, Y1", vx(func(a *Asm) { a.VMOVAPS(12, 1) })},
	{"VMOVAPS Y2, Y9", vx(func(a *Asm) { a.VMOVAPS(2, 9) })},
	{"VMOVUPS (BX)(AX*1), Y0", vx(func(a *Asm) { a.VMOVUPSload(mi(RBX, RAX, 0), 0, 0) })},
	{"VMOVUPS 32(R12)(AX*1), Y13", vx(func(a *Asm) { a.VMOVUPSload(mi(R12, RAX, 32), 0, 13) })},
	{"VMOVUPS Y4, (DI)(AX*1)", vx(func(a *Asm) { a.VMOVUPSstore(4, 0, mi(RDI, RAX, 0)) })},
	{"VMOVUPS Y14, 96(R13)(AX*1)", vx(func(a *Asm) { a.VMOVUPSstore(14, 0, mi(R13, RAX, 96)) })},
	{"VMOVNTPS Y6, (DI)(AX*1)", vx(func(a *Asm) { a.VMOVNTPS(6, mi(RDI, RAX, 0)) })},
	{"VMOVNTPS Y10, 64(R9)(AX*1)", vx(func(a *Asm) { a.VMOVNTPS(10, mi(R9, RAX, 64)) })},
	{"VBROADCASTSS (R9), Y9", vx(func(a *Asm) { a.VBROADCASTSS(m(R9, 0), 9) })},
	{"VBROADCASTSS 8(DX), Y3", vx(func(a *Asm) { a.VBROADCASTSS(m(RDX, 8), 3) })},
}

// vx returns emit with VEX (AVX2) code selected.
func vx(emit func(a *Asm)) func(a *Asm) {
	return func(a *Asm) { a.VEX = true; emit(a) }
}

// TestEncodingsMatchGoAssembler assembles every case with the Go toolchain
// (a throwaway program holding one assembly function per case, read back
// from the linked ELF binary) and compares the bytes with ours.
func TestEncodingsMatchGoAssembler(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("needs linux/amd64 to read the Go assembler's output")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		t.Skip("no go command: ", err)
	}
	dir := t.TempDir()
	var s, decl strings.Builder
	s.WriteString("#include \"textflag.h\"\n")
	for i, c := range encCases {
		fmt.Fprintf(&s, "TEXT ·enc%d(SB), NOSPLIT|NOFRAME, $0-0\n\t%s\n\tBYTE $0xcc; BYTE $0xcc; BYTE $0xcc; BYTE $0xcc\n", i, c.goAsm)
		fmt.Fprintf(&decl, "func enc%d()\n", i)
	}
	decl.WriteString("func main() {\n")
	for i := range encCases {
		fmt.Fprintf(&decl, "\tprintln(enc%d)\n", i)
	}
	decl.WriteString("}\n")
	files := map[string]string{
		"go.mod":      "module enctest\n\ngo 1.22\n",
		"main.go":     "package main\n\n" + decl.String(),
		"enc_amd64.s": s.String(),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "enctest")
	cmd := exec.Command(gobin, "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	data, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	addr := map[string]uint64{}
	for _, sy := range syms {
		addr[sy.Name] = sy.Value
	}
	for i, c := range encCases {
		v, ok := addr[fmt.Sprintf("main.enc%d.abi0", i)] // not the ABIInternal wrapper
		if !ok {
			v, ok = addr[fmt.Sprintf("main.enc%d", i)]
		}
		if !ok {
			t.Fatalf("symbol of case %d missing", i)
		}
		off := v - text.Addr
		want := data[off:]
		want = want[:bytes.Index(want, []byte{0xcc, 0xcc, 0xcc, 0xcc})]
		var a Asm
		c.emit(&a)
		if got := a.b; !bytes.Equal(got, want) {
			t.Errorf("%s: got %s, Go assembler %s", c.goAsm, hex.EncodeToString(got), hex.EncodeToString(want))
		}
	}
}

// TestHandChecked compares a few encodings with bytes checked by hand
// against the Intel manual (so the encoder is checked where no Go toolchain
// runs the test above).
func TestHandChecked(t *testing.T) {
	cases := []struct {
		want string
		emit func(a *Asm)
	}{
		// vaddps zmm0, zmm1, zmm2
		{"62f1744858c2", func(a *Asm) { a.VADDPS(Z(2), 1, 0) }},
		// vfmadd213ps zmm3, zmm2, zmm1
		{"62f26d48a8d9", func(a *Asm) { a.VFMADD213PS(Z(1), 2, 3) }},
		// vmovups zmm17{k1}{z}, [r8+rax]
		{"62c17cc9100c00", func(a *Asm) { a.VMOVUPSload(mi(R8, RAX, 0), 1, 17) }},
		// kmovw k1, edx
		{"c5f892ca", func(a *Asm) { a.KMOVW(RDX, 1) }},
		// vrcp14ps zmm4, zmm3
		{"62f27d484ce3", func(a *Asm) { a.VRCP14PS(Z(3), 4) }},
		// vpslld zmm12, zmm17, 23
		{"62b11d4872f117", func(a *Asm) { a.VPSLLD(23, Z(17), 12) }},
		// add rax, 64
		{"4883c040", func(a *Asm) { a.ADDQ(64, RAX) }},
		// prefetcht0 [rsi+rax+0x800]
		{"0f188c0600080000", func(a *Asm) { a.PREFETCHT0(mi(RSI, RAX, 2048)) }},
	}
	for _, c := range cases {
		var a Asm
		c.emit(&a)
		if got := hex.EncodeToString(a.b); got != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}

// TestFinishResolves checks label jumps and RIP-relative constants.
func TestFinishResolves(t *testing.T) {
	var a Asm
	top := a.NewLabel()
	a.Bind(top)
	c := a.ConstF(1.5)
	a.VMULPS(c, 1, 2) // 62 f1 74 58 59 15 <rel32>
	a.Jcc(CondL, top)
	if a.ConstF(1.5) != c {
		t.Fatal("constant not pooled")
	}
	code, err := a.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if len(code) != 64+4 {
		t.Fatalf("code length %d", len(code))
	}
	rel := int32(uint32(code[6]) | uint32(code[7])<<8 | uint32(code[8])<<16 | uint32(code[9])<<24)
	if int(rel)+10 != 64 {
		t.Fatalf("constant displacement %d", rel)
	}
	jrel := int32(uint32(code[12]) | uint32(code[13])<<8 | uint32(code[14])<<16 | uint32(code[15])<<24)
	if int(jrel)+16 != 0 {
		t.Fatalf("jump displacement %d", jrel)
	}
	// A table: 64-byte aligned in the pool after the scalar constant,
	// pooled once, read in full (no broadcast bit, disp32 to its start).
	var v Asm
	v.ConstF(1)
	var tab [16]uint32
	for i := range tab {
		tab[i] = uint32(i) * 0x01010101
	}
	tm := v.ConstVec(tab)
	if v.ConstVec(tab) != tm || tm.Bcst || tm.Disp != 64 {
		t.Fatalf("table operand %+v", tm)
	}
	v.VPERMPS(tm, 1, 2)
	vc, err := v.Finish()
	if err != nil {
		t.Fatal(err)
	}
	end := v.Len()
	vrel := int(int32(binary.LittleEndian.Uint32(vc[end-4:])))
	at := end + vrel
	if at%64 != 0 || at+64 > len(vc) {
		t.Fatalf("table at %d (code %d bytes, %d in all)", at, end, len(vc))
	}
	for i, w := range tab {
		if got := binary.LittleEndian.Uint32(vc[at+4*i:]); got != w {
			t.Fatalf("table word %d = %#x, want %#x", i, got, w)
		}
	}
	bad := Asm{}
	bad.JMP(bad.NewLabel())
	if _, err := bad.Finish(); err == nil {
		t.Fatal("unbound label accepted")
	}
}

// TestWeave checks that a woven region holds the streams' instructions
// round-robin, byte for byte as if emitted in that order, with the
// RIP-relative constants of moved instructions still resolved, and that a
// region holding a label is refused.
func TestWeave(t *testing.T) {
	streams := [][]func(a *Asm){
		{
			func(a *Asm) { a.VMULPS(a.ConstF(2), 1, 2) },
			func(a *Asm) { a.VADDPS(Z(2), 2, 3) },
			func(a *Asm) { a.VFMADD231PS(a.ConstF(3), 3, 4) },
		},
		{
			func(a *Asm) { a.VBROADCASTSS(a.ConstF(5), 9) },
			func(a *Asm) { a.VSUBPS(Z(9), 8, 10) },
		},
		{
			func(a *Asm) { a.VCMPPS(1, a.ConstF(2), 20, 3) },
			func(a *Asm) { a.VBLENDMPSk(Z(21), 22, 3, 23) },
			func(a *Asm) { a.VPXORD(Z(24), 24, 24) },
			func(a *Asm) { a.VMOVUPSstore(25, 0, mi(RBX, RAX, 64)) },
		},
	}
	var woven, plain Asm
	woven.XORL(RAX)
	plain.XORL(RAX)
	woven.BeginWeave()
	for _, s := range streams {
		woven.NextStream()
		for _, f := range s {
			f(&woven)
		}
	}
	if err := woven.EndWeave(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		for _, s := range streams {
			if i < len(s) {
				s[i](&plain)
			}
		}
	}
	woven.RET()
	plain.RET()
	// The pools differ in order (constants are pooled at first use), so
	// compare after resolving: the same constant bits at every RIP target.
	w, err := woven.Finish()
	if err != nil {
		t.Fatal(err)
	}
	p, err := plain.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if len(w) != len(p) || len(woven.b) != len(plain.b) {
		t.Fatalf("lengths %d/%d, code %d/%d", len(w), len(p), len(woven.b), len(plain.b))
	}
	if len(woven.rips) != len(plain.rips) {
		t.Fatalf("%d/%d constant references", len(woven.rips), len(plain.rips))
	}
	// Every constant reference of the woven code sits where the plain
	// order has one and reaches the same constant bits.
	disp := func(code []byte, f fix) int {
		return int(int32(uint32(code[f.at])|uint32(code[f.at+1])<<8|uint32(code[f.at+2])<<16|uint32(code[f.at+3])<<24)) + f.end
	}
	for _, rw := range woven.rips {
		i := slices.IndexFunc(plain.rips, func(q fix) bool { return q.at == rw.at && q.end == rw.end })
		if i < 0 {
			t.Fatalf("constant reference at %d not where the plain order has one", rw.at)
		}
		tw, tp := disp(w, rw), disp(p, plain.rips[i])
		if !bytes.Equal(w[tw:tw+4], p[tp:tp+4]) {
			t.Fatalf("constant at %d: %x, want %x", rw.at, w[tw:tw+4], p[tp:tp+4])
		}
	}
	for _, r := range woven.rips {
		for k := r.at; k < r.at+4; k++ {
			w[k], p[k] = 0, 0
		}
	}
	if !bytes.Equal(w[:len(woven.b)], p[:len(plain.b)]) {
		t.Fatalf("woven code\n%x\nwant\n%x", w[:len(woven.b)], p[:len(plain.b)])
	}

	var bad Asm
	bad.BeginWeave()
	bad.NextStream()
	bad.VADDPS(Z(1), 1, 1)
	bad.Bind(bad.NewLabel())
	bad.NextStream()
	bad.VADDPS(Z(2), 2, 2)
	if err := bad.EndWeave(); err == nil {
		t.Fatal("label inside a woven region accepted")
	}
}

// TestVEXConstAndRefusals checks that VEX code pools constants as full
// 32-byte vectors (8 copies, aligned, no broadcast bit) and that opmask or
// AVX-512-only instructions in VEX code, and AVX2-only ones in EVEX code,
// panic instead of emitting wrong bytes.
func TestVEXConstAndRefusals(t *testing.T) {
	a := Asm{VEX: true}
	a.ConstF(7) // pooled first: the next constant lands at 32
	c := a.ConstF(1.5)
	if c.Bcst || c.Disp != 32 || a.ConstF(1.5) != c {
		t.Fatalf("VEX constant operand %+v", c)
	}
	a.VMULPS(c, 1, 2)
	code, err := a.Finish()
	if err != nil {
		t.Fatal(err)
	}
	end := a.Len()
	at := end + int(int32(binary.LittleEndian.Uint32(code[end-4:])))
	for i := range 8 {
		if got := binary.LittleEndian.Uint32(code[at+4*i:]); got != 0x3fc00000 {
			t.Fatalf("constant lane %d = %#x", i, got)
		}
	}
	// vmulps ymm2, ymm1, [rip+x]: the two-byte prefix.
	if got := hex.EncodeToString(code[:4]); got != "c5f45915" {
		t.Fatalf("VEX VMULPS %s", got)
	}
	refused := func(name string, vex bool, f func(a *Asm)) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s accepted (VEX %v)", name, vex)
			}
		}()
		b := Asm{VEX: vex}
		f(&b)
	}
	refused("VSCALEFPS", true, func(a *Asm) { a.VSCALEFPS(Z(1), 2, 3) })
	refused("VPTERNLOGD", true, func(a *Asm) { a.VPTERNLOGD(0xb8, Z(1), 2, 3) })
	refused("masked VMOVUPS", true, func(a *Asm) { a.VMOVUPSload(mi(RBX, RAX, 0), 1, 3) })
	refused("Y16", true, func(a *Asm) { a.VADDPS(Z(16), 2, 3) })
	refused("VBLENDVPS", false, func(a *Asm) { a.VBLENDVPS(1, Z(2), 3, 4) })
	refused("VCMPPSv", false, func(a *Asm) { a.VCMPPSv(1, Z(2), 3, 4) })
}
