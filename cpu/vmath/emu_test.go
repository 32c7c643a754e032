package vmath

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/cpu/internal/x86emu"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// The tests of this file run the generated code of both widths, AVX-512
// and AVX2, in the interpreter of cpu/internal/x86emu, whatever this machine's
// CPU: a wrong AVX-512 result fails them on an AVX2-only host too. Where
// the CPU runs the code, emu_hw_amd64_test.go checks the interpreter
// against it bit for bit.

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
	// The interpreter holds only addresses: keep what they point to alive
	// through every call (the garbage collector may run in one).
	call := func() error {
		ec.m.R[x86emu.RDI] = uint64(uintptrOf64(&args[0]))
		err := ec.m.Call(code, 0)
		runtime.KeepAlive(args)
		runtime.KeepAlive(vals)
		return err
	}
	whole := c.whole(n)
	for off := 0; off < whole; off += chainMaxPerCall {
		c.bodyArgs(vals, off, min(whole-off, chainMaxPerCall), args)
		if err := call(); err != nil {
			return err
		}
	}
	if whole == n {
		return nil
	}
	off, r := whole, n-whole
	buf := make([]float32, c.lanes*len(c.used))
	c.tailArgs(vals, off, r, args, buf)
	err := call()
	runtime.KeepAlive(buf)
	if err != nil {
		return err
	}
	c.tailStore(vals, off, r, buf)
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

// sameBits reports whether got and want agree bit for bit, or are both
// NaN when nanAny.
func sameBits(got, want float32, nanAny bool) bool {
	return math.Float32bits(got) == math.Float32bits(want) || nanAny && got != got && want != want
}

// emuLengths hit the unrolled main loop, the single-vector loop and the
// tail (masked in AVX-512 code, through scratch in AVX2 code).
var emuLengths = []int{1, 7, 8, 9, 15, 16, 17, 31, 100, 129, 1031}

// emuCase is one chain run: its inputs, and the results of the
// interpreter, the reference and (where the CPU runs the code) the CPU.
type emuCase struct {
	code    []Instr
	nin     int // values below nin are inputs
	uniform []bool
	n       int
	nt      bool // non-temporal code (over 64-byte aligned memory)
	nanAny  bool // NaN payloads may differ from the reference's
}

const emuGuard = 12345 // past n, memory must keep this

// newVals returns the values of c: inputs from r (uniform ones
// constant), results filled with the guard, 16 elements past n.
func (c *emuCase) newVals(r *rand.Rand) [][]float32 {
	nv := len(c.uniform)
	vals := make([][]float32, nv)
	for i := range vals {
		off := 4
		if c.nt {
			off = 0
		}
		vals[i] = aligned32(c.n+16, off)
		if i < c.nin {
			copy(vals[i], emuVec(r, c.n+16))
			if c.uniform[i] {
				for j := range vals[i] {
					vals[i][j] = vals[i][0]
				}
			}
		} else {
			for j := range vals[i] {
				vals[i][j] = emuGuard
			}
		}
	}
	return vals
}

func cloneVals(v [][]float32) [][]float32 {
	out := make([][]float32, len(v))
	for i := range v {
		out[i] = append([]float32(nil), v[i]...)
	}
	return out
}

func ptrsOf(v [][]float32) []*float32 {
	p := make([]*float32, len(v))
	for i := range v {
		p[i] = &v[i][0]
	}
	return p
}

// compare checks the stored results of got against want (bit for bit,
// NaN payloads aside when nanAny) and the guard past n.
func (c *emuCase) compare(got, want [][]float32, nanAny bool) error {
	for k, in := range c.code {
		v := int(in.Dst)
		stored := in.Op&NoStore == 0
		for j := 0; j < c.n+16; j++ {
			g, w := got[v][j], want[v][j]
			if j >= c.n {
				w = emuGuard
			} else if !stored {
				continue
			}
			if !sameBits(g, w, nanAny && j < c.n) {
				return fmt.Errorf("n=%d nt=%v: instruction %d (op %#x, a=%v b=%v) element %d: got %v (%#x), want %v (%#x)",
					c.n, c.nt, k, in.Code(), want[in.A][j], want[in.B][j], j, g, math.Float32bits(g), w, math.Float32bits(w))
			}
		}
	}
	return nil
}

// checkEmu runs code compiled for vex (AVX2) or AVX-512, contraction fuse,
// in the interpreter over fresh inputs of every length and compares the
// results with the pure-Go reference and, where this CPU runs the code,
// with the CPU's bit for bit.
func checkEmu(t *testing.T, r *rand.Rand, code []Instr, nin int, uniform []bool, vex, fuse bool, lengths []int) {
	t.Helper()
	ec, err := compileEmu(code, len(uniform), uniform, vex, fuse)
	if err != nil {
		t.Fatal(err)
	}
	var hw *Chain
	if hwRuns(vex) && JITAvailable() {
		if hw, err = compileChain(code, len(uniform), uniform, vex, fuse); err != nil {
			t.Fatal(err)
		}
	}
	vals, _ := checkChain(code, len(uniform), uniform)
	cc, _ := contract(code, vals, fuse)
	for i, n := range lengths {
		c := &emuCase{code: code, nin: nin, uniform: uniform, n: n, nt: i%2 == 1}
		in := c.newVals(r)
		got, err := ec.check(c, cc, in, vex, fuse)
		if err != nil {
			t.Fatalf("%s chain %v: %v", widthName[vex], code, err)
		}
		if hw != nil {
			cpu := cloneVals(in)
			if !hw.run(ptrsOf(cpu), n, c.nt) {
				t.Fatal("Run refused")
			}
			Fence()
			if err := c.compare(got, cpu, false); err != nil {
				t.Fatalf("%s chain %v, interpreter vs CPU: %v", widthName[vex], code, err)
			}
		}
	}
}

// check runs ec over case c's inputs in in the interpreter and compares
// the results with the kernels' op after op (cc: the code as the
// generator sees it); it returns the results.
func (ec *emuChain) check(c *emuCase, cc []cins, in [][]float32, vex, fuse bool) ([][]float32, error) {
	got, want := cloneVals(in), cloneVals(in)
	if err := ec.run(ptrsOf(got), c.n, c.nt); err != nil {
		return nil, err
	}
	if err := emuRef(cc, want, c.n, vex); err != nil {
		return nil, err
	}
	if err := c.compare(got, want, fuse); err != nil {
		return nil, fmt.Errorf("fused %d, interpreter vs the kernels: %v", ec.c.fused, err)
	}
	return got, nil
}

// emuKernels caches the interpreted kernels: the one-op chains of each op
// and width, compiled as jitimpl.go compiles them.
var emuKernels [2][opEnd]*emuChain

// emuKernel runs op's kernel of width vex in the interpreter: dst = op(a,
// b) over n elements.
func emuKernel(op int32, vex bool, dst, a, b []float32, n int) error {
	w := 0
	if vex {
		w = 1
	}
	ec := emuKernels[w][op]
	if ec == nil {
		var err error
		ec, err = compileEmu([]Instr{{Op: op, Dst: 2, A: 0, B: 1}}, 3, nil, vex, false)
		if err != nil {
			return err
		}
		emuKernels[w][op] = ec
	}
	if n == 0 {
		return nil
	}
	return ec.run([]*float32{&a[0], &b[0], &dst[0]}, n, false)
}

// emuRef computes code as the generator sees it the way the chain tests'
// reference does (refChain), with the kernels of width vex run in the
// interpreter.
func emuRef(code []cins, vals [][]float32, n int, vex bool) error {
	return refChain(code, vals, n, func(op int32, dst, a, b []float32) error {
		if err := emuKernel(op, vex, dst, a, b, n); err != nil {
			return fmt.Errorf("kernel %s: %v", ops[op].name, err)
		}
		return nil
	})
}

// emuOpRef is op's reference for x (and y): Go's float64 math rounded to
// float32 with its tolerance in ulp (TestAccuracy's), or the pure-Go
// kernel's bits (the arithmetic, exact in both) with tolerance -1.
func emuOpRef(op int32, x, y float32) (float32, int64) {
	ref := map[int32]func(float64) float64{OpExp: math.Exp, OpLog: math.Log, OpTanh: math.Tanh,
		OpLogistic: logistic64, OpErf: math.Erf}[op]
	if ref != nil {
		return float32(ref(float64(x))), 2
	}
	d := []float32{0}
	if ops[op].arity == 1 {
		ops[op].go1(d, []float32{x})
	} else {
		ops[op].go2(d, []float32{x}, []float32{y})
	}
	return d[0], -1
}

// TestEmuOps runs every op of ops alone (the kernels), in AVX-512 and AVX2
// code, in the interpreter over every length class and inputs with NaNs,
// infinities, zeros and subnormals, and checks them against the
// references (pure Go for the exact ops, 2 ulp of float64 math for the
// transcendental functions), the two widths against each other bit for
// bit (NaN payloads aside, as TestImplsAgree), and against the CPU where
// it runs the code.
func TestEmuOps(t *testing.T) {
	r := testseed.Rand(t, 31)
	for op := OpAdd; op < opEnd; op++ {
		t.Run(ops[op].name, func(t *testing.T) {
			code := []Instr{{Op: op, Dst: 2, A: 0, B: 1}}
			for _, vex := range []bool{false, true} {
				checkEmu(t, r, code, 2, make([]bool, 3), vex, false, emuLengths)
			}
			const n = 4099
			a, b := emuVec(r, n), emuVec(r, n)
			var out [2][]float32
			for w, vex := range []bool{false, true} {
				out[w] = make([]float32, n)
				if err := emuKernel(op, vex, out[w], a, b, n); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					want, tol := emuOpRef(op, a[i], b[i])
					got := out[w][i]
					if tol < 0 && !sameBits(got, want, true) || tol >= 0 && ulps(got, want) > tol {
						t.Fatalf("%s %s(%v, %v) = %v (%#x), want %v (%#x)", widthName[vex], ops[op].name, a[i], b[i],
							got, math.Float32bits(got), want, math.Float32bits(want))
					}
				}
			}
			for i := range n {
				if !sameBits(out[0][i], out[1][i], true) {
					t.Fatalf("%s(%v, %v): avx512 %#x, avx2 %#x", ops[op].name, a[i], b[i],
						math.Float32bits(out[0][i]), math.Float32bits(out[1][i]))
				}
			}
		})
	}
}

// TestEmuChains runs random chains of every op (uniform inputs, chains
// long and wide enough to spill, multiplies contractible into
// multiply-adds) compiled for AVX-512 and AVX2, contraction on and off, in
// the interpreter over every length class (one past a call's
// chainMaxPerCall elements too), and checks them bit for bit against the
// kernels of the same width op after op (NaN payloads aside with
// contraction on), as TestChainMatchesKernels does on the CPU, and
// against the CPU where it runs the code.
func TestEmuChains(t *testing.T) {
	r := testseed.Rand(t, 32)
	shapes := []struct{ nin, nuni, nins int }{
		{1, 0, 1}, {2, 0, 14}, {3, 1, 20}, {2, 2, 14}, {12, 3, 40}, {30, 4, 60}, {4, 0, 120},
	}
	for _, vex := range []bool{false, true} {
		for _, fuse := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fuse=%v", widthName[vex], fuse), func(t *testing.T) {
				spilled, fused := false, false
				for _, sh := range shapes {
					// the longest shape until a chain spills (most do)
					for trial := 0; trial < 2 || sh.nins > 60 && !spilled && trial < 8; trial++ {
						code, uniform := randChain(r, sh.nin, sh.nuni, sh.nins, opEnd-1)
						lengths := emuLengths
						switch {
						case sh.nins <= 14 && trial == 0:
							lengths = append(lengths[:len(lengths):len(lengths)], chainMaxPerCall+33)
						case sh.nins > 60:
							lengths = []int{1, 17, 129, 300}
						}
						ec, err := compileEmu(code, len(uniform), uniform, vex, fuse)
						if err != nil {
							t.Fatal(err)
						}
						spilled = spilled || ec.c.spills > 0
						fused = fused || ec.c.fused > 0
						checkEmu(t, r, code, sh.nin, uniform, vex, fuse, lengths)
					}
				}
				if !spilled || fused != fuse {
					t.Errorf("no chain spilled (%v) or contracted (%v, want %v): the test misses a path", spilled, fused, fuse)
				}
			})
		}
	}
}

// TestEmuMaskChains runs random chains with compares and selects in the
// (and compares joined to their selects) in AVX-512 and AVX2 code in the
// interpreter against the reference, as TestMaskChainMatchesReference
// does on the CPU.
func TestEmuMaskChains(t *testing.T) {
	r := testseed.Rand(t, 33)
	for _, vex := range []bool{true, false} {
		t.Run(widthName[vex], func(t *testing.T) {
			for trial := 0; trial < 20; trial++ {
				nin, nins := 1+r.IntN(6), 1+r.IntN(40)
				code, _ := randMaskChain(r, nin, nins)
				checkEmu(t, r, code, nin, make([]bool, nin+nins), vex, false, []int{1, 7, 8, 9, 16, 33, 100, 1031})
			}
		})
	}
}
