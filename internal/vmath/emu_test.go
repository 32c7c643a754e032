package vmath

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/x86emu"
)

// The tests of this file run the generated code of both widths, AVX-512
// and AVX2, in the interpreter of internal/x86emu, whatever this machine's
// CPU: a wrong AVX-512 result fails them on an AVX2-only host too. Where
// the CPU runs the code, emu_hw_amd64_test.go checks the interpreter
// against it bit for bit.

// testSeed returns FERRY_TEST_SEED or a fresh seed, and reports it when t
// fails.
func testSeed(t testing.TB) uint64 {
	seed := rand.Uint64()
	if s := os.Getenv("FERRY_TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("bad FERRY_TEST_SEED %q", s)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (FERRY_TEST_SEED=%d repeats this run)", seed, seed)
		}
	})
	return seed
}

func uintptrOf32(p *uint32) uintptr { return uintptr(unsafe.Pointer(p)) }
func uintptrOf64(p *uint64) uintptr { return uintptr(unsafe.Pointer(p)) }

// widthName names the generator's two instruction sets.
var widthName = map[bool]string{false: "avx512", true: "avx2"}

// emuChain is a compiled chain with both its codes (ordinary and
// non-temporal stores), run by the interpreter as Chain.run runs it on the
// CPU.
type emuChain struct {
	c      *Chain
	code   []byte
	ntCode []byte
	m      x86emu.Machine
}

// compileEmu compiles code for AVX-512 (vex false) or AVX2 without mapping
// it (generation only: any host).
func compileEmu(code []Instr, nvals int, uniform []bool, vex, fuse bool) (*emuChain, error) {
	vals, err := checkChain(code, nvals, uniform)
	if err != nil {
		return nil, err
	}
	if !vex && hasMask(code) {
		// AVX-512 mask chains: compileChain decides whether they compile.
		if _, err := compileChain(code, nvals, uniform, vex, fuse); err != nil && !JITAvailable() {
			return nil, err
		} else if err != nil {
			return nil, err
		}
	}
	cc, fused := contract(code, vals, fuse)
	c, err := generateChain(cc, vals, vex)
	if err != nil {
		return nil, err
	}
	c.fused = fused
	nt, err := generateUnrolled(cc, vals, true, c.unroll, vex)
	if err != nil {
		return nil, err
	}
	return &emuChain{c: c, code: c.code, ntCode: nt.code}, nil
}

// run computes the chain over elements [0, n) of vals in the interpreter:
// calls of at most chainMaxPerCall elements, AVX2's last partial vector
// through zero-padded scratch, the non-temporal code when nt and every
// stored value is 64-byte aligned.
func (ec *emuChain) run(vals []*float32, n int, nt bool) error {
	c := ec.c
	code := ec.code
	if nt {
		code = ec.ntCode
		for s, v := range c.used {
			if c.stored[s] && uintptrOf(vals[v])%64 != 0 {
				code = ec.code
				break
			}
		}
	}
	args := make([]uint64, 1+len(c.used)) // heap: the interpreter keeps its address
	call := func() error {
		ec.m.R[x86emu.RDI] = uint64(uintptrOf64(&args[0]))
		return ec.m.Call(code, 0)
	}
	whole := n &^ (c.lanes - 1)
	if c.lanes == 16 {
		whole = n
	}
	for off := 0; off < whole; off += chainMaxPerCall {
		args[0] = uint64(min(whole-off, chainMaxPerCall))
		for s, v := range c.used {
			p := uintptrOf(vals[v])
			if !c.uniform[s] {
				p += uintptr(4 * off)
			}
			args[1+s] = uint64(p)
		}
		if err := call(); err != nil {
			return err
		}
	}
	if whole == n {
		return nil
	}
	off, r := whole, n-whole
	buf := make([]float32, c.lanes*len(c.used))
	at := func(v int32) []float32 {
		return unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(vals[v]), 4*off)), r)
	}
	args[0] = uint64(c.lanes)
	for s, v := range c.used {
		if c.uniform[s] {
			args[1+s] = uint64(uintptrOf(vals[v]))
			continue
		}
		sc := buf[c.lanes*s : c.lanes*(s+1)]
		if c.input[s] {
			copy(sc, at(v))
		}
		args[1+s] = uint64(uintptrOf(&sc[0]))
	}
	if err := call(); err != nil {
		return err
	}
	for s, v := range c.used {
		if c.stored[s] {
			copy(at(v), buf[c.lanes*s:])
		}
	}
	return nil
}

// emuValues are lane values the interpreted tests mix in beyond
// edgeValues: signalling and quiet NaNs of both signs with payloads, the
// smallest and largest subnormals.
var emuValues = []uint32{0x7f800001, 0xff800001, 0x7fa12345, 0xffb00000, 0x7fc00001, 0xffc12345, 0x00000001,
	0x80000001, 0x007fffff, 0x807fffff, 0x00000400, 0x7f7fffff, 0x80000000}

// emuVec is randVec with emuValues mixed in.
func emuVec(r *rand.Rand, n int) []float32 {
	x := randVec(r, n)
	for i := range x {
		if r.IntN(8) == 0 {
			x[i] = math.Float32frombits(emuValues[r.IntN(len(emuValues))])
		}
	}
	return x
}

// goRef computes code as the generator sees it (contracted multiply-adds
// included) with the pure-Go kernels, whatever the implementation in use,
// and compares and selects as mask_test's reference does.
func goRef(code []cins, vals [][]float32, n int) {
	for _, in := range code {
		dst, a, b := vals[in.Dst][:n], vals[in.A][:n], vals[in.B][:n]
		switch cd := in.Code(); {
		case cd == opFMA || cd == opFMS || cd == opFNMA:
			c := vals[in.C][:n]
			for i := range dst {
				switch cd {
				case opFMA:
					dst[i] = fma32(a[i], b[i], c[i])
				case opFMS:
					dst[i] = fma32(a[i], b[i], -c[i])
				default:
					dst[i] = fma32(-a[i], b[i], c[i])
				}
			}
		case isCompare(cd):
			for j := range dst {
				dst[j] = 0
				if cmp64(cd, a[j], b[j]) {
					dst[j] = maskTrue
				}
			}
		case cd == OpSelect:
			c := vals[in.C][:n]
			for j := range dst {
				dst[j] = c[j]
				if math.Float32bits(a[j]) == 0xffffffff {
					dst[j] = b[j]
				}
			}
		case ops[cd].arity == 1:
			ops[cd].go1(dst, a)
		default:
			ops[cd].go2(dst, a, b)
		}
	}
}

// sameBits reports whether got and want agree bit for bit, or are both
// NaN when nanAny.
func sameBits(got, want float32, nanAny bool) bool {
	return math.Float32bits(got) == math.Float32bits(want) || nanAny && got != got && want != want
}

var _ = fmt.Sprint
