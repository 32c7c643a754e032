//go:build amd64

package gemm

// The amd64 micro-kernels in the interpreter of cpu/internal/x86emu: on any
// x86-64 host the AVX-512 and AVX2 kernels (and copyRows64) run from their
// own bytes, over tiles covering every path of their code (the unrolled k
// loop, the k tail, k = 0 and 1, small and large k, both epilogues: beta
// ±0 (C not read) and beta ≠ 0, any ldc and C alignment, A in place with
// any strides), and are compared with an exact model of their arithmetic
// (bit for bit), with the portable Go kernel (within the float bound of
// the other tests) and, where the host has the feature, with the hardware
// (bit for bit, which validates the interpreter). TestEmuCatchesKernelMutations
// shows that a wrong AVX-512 kernel fails these tests on a host without
// AVX-512.

import (
	"bytes"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/cpu/internal/x86emu"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// addrPtr turns an address into a pointer (through memory: the address is
// a code address from the runtime's tables, not Go pointer arithmetic).
func addrPtr(a uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&a)) }

// asmFunc is the ABI0 body of a Go assembly function: its address and a
// copy of its bytes (up to the next function).
type asmFunc struct {
	name  string
	entry uintptr
	code  []byte
}

// funcBytes returns a copy of the bytes of the function at entry.
func funcBytes(entry uintptr) []byte {
	n := uintptr(0)
	for n < 1<<16 {
		f := runtime.FuncForPC(entry + n)
		if f == nil || f.Entry() != entry {
			break
		}
		n++
	}
	return bytes.Clone(unsafe.Slice((*byte)(addrPtr(entry)), n))
}

// locateAsm finds the ABI0 body of the assembly function fn. A func value
// of an assembly function points to the wrapper the toolchain generates
// for Go's register ABI, which moves the arguments to the stack and CALLs
// the body: the CALL whose target is a function of the same name.
func locateAsm(fn any) (*asmFunc, error) {
	pc := reflect.ValueOf(fn).Pointer()
	f := runtime.FuncForPC(pc)
	if f == nil {
		return nil, fmt.Errorf("no function at %#x", pc)
	}
	name := f.Name()
	code := funcBytes(f.Entry())
	for i := 0; i+5 <= len(code); i++ {
		if code[i] != 0xe8 {
			continue
		}
		rel := int32(uint32(code[i+1]) | uint32(code[i+2])<<8 | uint32(code[i+3])<<16 | uint32(code[i+4])<<24)
		target := uintptr(int64(pc) + int64(i) + 5 + int64(rel))
		if tf := runtime.FuncForPC(target); tf != nil && tf.Entry() == target && target != pc &&
			strings.TrimSuffix(tf.Name(), ".abi0") == name {
			return &asmFunc{name: name[strings.LastIndexByte(name, '.')+1:], entry: target, code: funcBytes(target)}, nil
		}
	}
	return nil, fmt.Errorf("%s: no call of its ABI0 body in its wrapper (% x)", name, code[:min(len(code), 64)])
}

// emuKernel is one assembly micro-kernel under test.
type emuKernel struct {
	fn      any // the Go function (sgemmKernelAVX512, ...)
	elem    int // 4 (float32) or 8 (float64)
	mr, nr  int
	inPlace bool // A read in place (two more arguments: rsa, csa)
	avx512  bool
}

func emuKernels() []emuKernel {
	return []emuKernel{
		{fn: sgemmKernelAVX512, elem: 4, mr: avx512Kernels.s.mr, nr: avx512Kernels.s.nr, avx512: true},
		{fn: dgemmKernelAVX512, elem: 8, mr: avx512Kernels.d.mr, nr: avx512Kernels.d.nr, avx512: true},
		{fn: sgemmKernelAVX512A, elem: 4, mr: avx512Kernels.s.mr, nr: avx512Kernels.s.nr, inPlace: true, avx512: true},
		{fn: sgemmKernelAVX2, elem: 4, mr: avx2Kernels.s.mr, nr: avx2Kernels.s.nr},
		{fn: dgemmKernelAVX2, elem: 8, mr: avx2Kernels.d.mr, nr: avx2Kernels.d.nr},
		{fn: sgemmKernelAVX2A, elem: 4, mr: avx2Kernels.s.mr, nr: avx2Kernels.s.nr, inPlace: true},
	}
}

// hwRunsKernel reports whether this host runs the kernel (as the kernels
// in force see it: FERRY_CPU=avx2 lowers an AVX-512 host).
func (ek emuKernel) hwRuns() bool {
	if ek.avx512 {
		return hasAVX512F
	}
	return hasAVX2FMA
}

// tileCase is one call of a kernel.
type tileCase struct {
	k, ldc      int
	alpha, beta float64
	rsa, csa    int // A in place: element (i, p) at a[i*rsa + p*csa]
	cOff        int // C's offset in its buffer, in elements (alignment)
}

func (c tileCase) String() string {
	return fmt.Sprintf("k=%d ldc=%d alpha=%g beta=%g rsa=%d csa=%d cOff=%d", c.k, c.ldc, c.alpha, c.beta, c.rsa, c.csa, c.cOff)
}

// Guard elements around C (and after A and B): a kernel must not touch
// C's, and a corrupted displacement stays inside them.
const guard = 64

// zeroSize is 0, unknown to the compiler: make with a size of n+zeroSize
// allocates on the heap, whose objects do not move, so the addresses the
// interpreter holds stay valid (a stack may move when it grows).
var zeroSize = 0

// tileData is one call's buffers and its reference results.
type tileData[T float] struct {
	c       tileCase
	a, b    []T
	c0      []T      // C before the call (tile at guard + cOff, rows ldc apart)
	packedA []T      // A as a packed sliver (p*mr + i), for the references
	exact   []T      // the exact model's C (whole buffer)
	goRef   []T      // the Go kernel's tile, mr×nr
	words   []uint64 // the ABI0 argument words (addresses filled per call)
}

func (d *tileData[T]) cBase() int { return guard + d.c.cOff }

// newTile draws the operands of case c for kernel ek.
func newTile[T float](r *rand.Rand, ek emuKernel, c tileCase) *tileData[T] {
	mr, nr := ek.mr, ek.nr
	rnd := func(n int) []T {
		s := make([]T, n+zeroSize)
		for i := range s {
			s[i] = T(r.Float64()*2 - 1)
		}
		return s
	}
	d := &tileData[T]{c: c}
	if ek.inPlace {
		d.a = rnd((mr-1)*c.rsa + max(c.k-1, 0)*c.csa + 1 + guard)
	} else {
		d.a = rnd(mr*c.k + guard)
	}
	d.b = rnd(nr*c.k + guard)
	d.c0 = rnd(guard + c.cOff + (mr-1)*c.ldc + nr + guard)
	if c.beta == 0 { // C must not be read: NaNs in the tile stay out of the result
		for i := range mr {
			for j := range nr {
				d.c0[d.cBase()+i*c.ldc+j] = T(math.NaN())
			}
		}
	}
	d.packedA = make([]T, mr*c.k+1)
	for p := range c.k {
		for i := range mr {
			if ek.inPlace {
				d.packedA[p*mr+i] = d.a[i*c.rsa+p*c.csa]
			} else {
				d.packedA[p*mr+i] = d.a[p*mr+i]
			}
		}
	}
	d.exact = exactTile(ek, c, d.packedA, d.b, d.c0)
	d.goRef = goTile(ek, c, d.packedA, d.b, d.c0)
	return d
}

// fma32 is x*y + z rounded once to float32: math.FMA's float64 result
// rounds correctly to float32 unless it lies on a float32 midpoint (or is
// subnormal there), where math/big decides from the exact value.
func fma32(x, y, z float32) float32 {
	r := math.FMA(float64(x), float64(y), float64(z))
	if b := math.Float64bits(r); b&(1<<29-1) != 1<<28 && math.Abs(r) >= 0x1p-126 || r == 0 || math.IsInf(r, 0) {
		return float32(r)
	}
	p := new(big.Float).SetPrec(2048)
	p.Mul(big.NewFloat(float64(x)), big.NewFloat(float64(y)))
	p.Add(p, big.NewFloat(float64(z)))
	f, _ := p.Float32()
	return f
}

// fmaT is x*y + z rounded once to T.
func fmaT[T float](x, y, z T) T {
	if unsafe.Sizeof(x) == 4 {
		return T(fma32(float32(x), float32(y), float32(z)))
	}
	return T(math.FMA(float64(x), float64(y), float64(z)))
}

// exactTile models the kernels' arithmetic: per element, a chain of fused
// multiply-adds over p in order from 0, times alpha (rounded), then, when
// beta is not ±0, a fused multiply-add of C and beta onto it. It returns
// the whole C buffer after the call.
func exactTile[T float](ek emuKernel, c tileCase, pa, b, c0 []T) []T {
	out := append([]T(nil), c0...)
	base := guard + c.cOff
	alpha, beta := T(c.alpha), T(c.beta)
	for i := range ek.mr {
		for j := range ek.nr {
			var acc T
			for p := range c.k {
				acc = fmaT(b[p*ek.nr+j], pa[p*ek.mr+i], acc)
			}
			v := alpha * acc
			if beta != 0 {
				v = fmaT(out[base+i*c.ldc+j], beta, v)
			}
			out[base+i*c.ldc+j] = v
		}
	}
	return out
}

// goTile computes the tile with the portable Go kernel (4×4 tiles over
// the panels repacked for it; rows past mr padded with zeros).
func goTile[T float](ek emuKernel, c tileCase, pa, b, c0 []T) []T {
	mr4 := roundUp(ek.mr, 4)
	tile := make([]T, mr4*ek.nr)
	for i := range ek.mr {
		copy(tile[i*ek.nr:(i+1)*ek.nr], c0[guard+c.cOff+i*c.ldc:])
	}
	pa4 := make([]T, mr4*c.k+1)
	for p := range c.k {
		for i := range ek.mr {
			pa4[(i/4)*4*c.k+p*4+i%4] = pa[p*ek.mr+i]
		}
	}
	pb4 := make([]T, ek.nr*c.k+1)
	for p := range c.k {
		for j := range ek.nr {
			pb4[(j/4)*4*c.k+p*4+j%4] = b[p*ek.nr+j]
		}
	}
	for s := 0; s < mr4/4; s++ {
		for t := 0; t < ek.nr/4; t++ {
			goKernel4x4(c.k, &pa4[s*4*c.k], &pb4[t*4*c.k], &tile[s*4*ek.nr+t*4], ek.nr, T(c.alpha), T(c.beta))
		}
	}
	return tile[:ek.mr*ek.nr]
}

// args returns the kernel's ABI0 argument words for C buffer cb (two zero
// words follow, so that a corrupted displacement past the last argument
// reads the machine's stack).
func (d *tileData[T]) args(ek emuKernel, cb []T) []uint64 {
	c := d.c
	w := []uint64{uint64(c.k), uint64(uintptr(unsafe.Pointer(&d.a[0]))), uint64(uintptr(unsafe.Pointer(&d.b[0]))),
		uint64(uintptr(unsafe.Pointer(&cb[d.cBase()]))), uint64(c.ldc)}
	if ek.elem == 4 {
		w = append(w, uint64(math.Float32bits(float32(c.alpha)))|uint64(math.Float32bits(float32(c.beta)))<<32)
	} else {
		w = append(w, math.Float64bits(c.alpha), math.Float64bits(c.beta))
	}
	if ek.inPlace {
		w = append(w, uint64(c.rsa), uint64(c.csa))
	}
	return append(w, 0, 0)
}

// scramble fills the machine's registers and flags with random values (a
// kernel must not depend on what they hold).
func scramble(m *x86emu.Machine, r *rand.Rand) {
	for i := range m.R {
		m.R[i] = r.Uint64()
	}
	for i := range m.Z {
		for j := range m.Z[i] {
			m.Z[i][j] = r.Uint32()
		}
	}
	for i := range m.K {
		m.K[i] = r.Uint64()
	}
	m.CF, m.ZF, m.SF, m.OF, m.PF = r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(2) == 0, r.IntN(2) == 0
}

// runEmu runs the kernel in the interpreter on a copy of C: from its
// address in the process (code nil) or from the bytes code.
func (d *tileData[T]) runEmu(m *x86emu.Machine, r *rand.Rand, ek emuKernel, entry uintptr, code []byte) ([]T, error) {
	cb := make([]T, len(d.c0)+zeroSize)
	copy(cb, d.c0)
	scramble(m, r)
	var err error
	if code == nil {
		err = m.CallPC(entry, d.args(ek, cb)...)
	} else {
		err = m.Call(code, 0, d.args(ek, cb)...)
	}
	// The interpreter holds only the buffers' addresses.
	runtime.KeepAlive(d.a)
	runtime.KeepAlive(d.b)
	runtime.KeepAlive(cb)
	return cb, err
}

// runHW runs the kernel on this CPU on a copy of C.
func (d *tileData[T]) runHW(ek emuKernel) []T {
	cb := append([]T(nil), d.c0...)
	c := d.c
	a, b, cp := &d.a[0], &d.b[0], &cb[d.cBase()]
	switch f := ek.fn.(type) {
	case func(int, *float32, *float32, *float32, int, float32, float32):
		f(c.k, any(a).(*float32), any(b).(*float32), any(cp).(*float32), c.ldc, float32(c.alpha), float32(c.beta))
	case func(int, *float64, *float64, *float64, int, float64, float64):
		f(c.k, any(a).(*float64), any(b).(*float64), any(cp).(*float64), c.ldc, c.alpha, c.beta)
	case func(int, *float32, *float32, *float32, int, float32, float32, int, int):
		f(c.k, any(a).(*float32), any(b).(*float32), any(cp).(*float32), c.ldc, float32(c.alpha), float32(c.beta), c.rsa, c.csa)
	default:
		panic(fmt.Sprintf("kernel of type %T", ek.fn))
	}
	return cb
}

func bitsOf[T float](x T) uint64 {
	if unsafe.Sizeof(x) == 4 {
		return uint64(math.Float32bits(float32(x)))
	}
	return math.Float64bits(float64(x))
}

// checkExact compares C after a call with the exact model, bit for bit,
// guards and row padding included.
func (d *tileData[T]) checkExact(ek emuKernel, got []T) error {
	for n, w := range d.exact {
		if bitsOf(got[n]) != bitsOf(w) {
			i, j := (n-d.cBase())/d.c.ldc, (n-d.cBase())%d.c.ldc
			where := fmt.Sprintf("C[%d][%d]", i, j)
			if n < d.cBase() || i >= ek.mr || j >= ek.nr {
				where = fmt.Sprintf("element %d outside the tile", n-d.cBase())
			}
			return fmt.Errorf("%v: %s = %v (%#x), exact model %v (%#x)", d.c, where, got[n], bitsOf(got[n]), w, bitsOf(w))
		}
	}
	return nil
}

// checkGo compares the tile with the Go kernel's within the bound of the
// other tests of the package (TestSgemm, TestDgemm).
func (d *tileData[T]) checkGo(ek emuKernel, got []T) error {
	eps := 2e-6
	if ek.elem == 8 {
		eps = 1e-14
	}
	tol := eps * math.Sqrt(float64(d.c.k)+1) * (math.Abs(d.c.alpha) + math.Abs(d.c.beta) + 1)
	for i := range ek.mr {
		for j := range ek.nr {
			g, w := float64(got[d.cBase()+i*d.c.ldc+j]), float64(d.goRef[i*ek.nr+j])
			if !(math.Abs(g-w) <= tol*(1+math.Abs(w))) {
				return fmt.Errorf("%v: C[%d][%d] = %v, Go kernel %v", d.c, i, j, g, w)
			}
		}
	}
	return nil
}

// kernelCases draws the calls that cover a kernel's paths: every k
// remainder of the unrolled loop with and without whole iterations, k = 0
// and 1, up to the cache block kc, each with beta ±0 and beta ≠ 0, random
// ldc, alpha and C alignment; A in place packed-like, row-major,
// column-major and with odd strides.
func kernelCases(r *rand.Rand, ek emuKernel) []tileCase {
	alphas := []float64{1, -1, 0.5, 0, 1 + r.Float64()}
	betas := []float64{1, -0.5, 2.5, r.Float64() - 2}
	var cs []tileCase
	for _, k := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 31, 64, 101, 255, 384} {
		for z := range 4 {
			c := tileCase{k: k, alpha: alphas[r.IntN(len(alphas))], beta: betas[r.IntN(len(betas))]}
			if z%2 == 0 {
				c.beta = []float64{0, math.Copysign(0, -1)}[r.IntN(2)]
			}
			switch r.IntN(3) {
			case 0:
				c.ldc = ek.nr
			case 1:
				c.ldc = ek.nr + 1 + r.IntN(40)
			default:
				c.ldc = 3*ek.nr + r.IntN(5)
			}
			c.cOff = r.IntN(16)
			if ek.inPlace {
				switch r.IntN(4) {
				case 0: // the packed layout
					c.rsa, c.csa = 1, ek.mr
				case 1: // row-major A, lda ≥ k
					c.rsa, c.csa = k+r.IntN(9), 1
				case 2: // column-major A
					c.rsa, c.csa = 1, ek.mr+r.IntN(9)
				default:
					c.rsa, c.csa = 1+r.IntN(50), 1+r.IntN(50)
				}
			}
			cs = append(cs, c)
		}
	}
	return cs
}

// TestEmuKernels runs every amd64 micro-kernel in the interpreter from its
// address in the process and compares C with the exact model (bit for
// bit), with the Go kernel (within the float bound) and, where the host
// has the feature, with the hardware (bit for bit).
func TestEmuKernels(t *testing.T) {
	for _, ek := range emuKernels() {
		af, err := locateAsm(ek.fn)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(af.name, func(t *testing.T) {
			r := testseed.Rand(t, 40)
			var m x86emu.Machine
			steps := 0
			for _, c := range kernelCases(r, ek) {
				var err error
				if ek.elem == 4 {
					err = emuCheck[float32](t, r, &m, ek, af, c)
				} else {
					err = emuCheck[float64](t, r, &m, ek, af, c)
				}
				if err != nil {
					t.Fatal(err)
				}
				steps += m.Steps
			}
			hw := "not run here"
			if ek.hwRuns() {
				hw = "matched bit for bit"
			}
			t.Logf("%d instructions interpreted; hardware %s", steps, hw)
		})
	}
}

func emuCheck[T float](t *testing.T, r *rand.Rand, m *x86emu.Machine, ek emuKernel, af *asmFunc, c tileCase) error {
	d := newTile[T](r, ek, c)
	got, err := d.runEmu(m, r, ek, af.entry, nil)
	if err != nil {
		return fmt.Errorf("%v: %v", c, err)
	}
	if err := d.checkExact(ek, got); err != nil {
		return err
	}
	if err := d.checkGo(ek, got); err != nil {
		return err
	}
	if ek.hwRuns() {
		hw := d.runHW(ek)
		for n := range hw {
			if bitsOf(hw[n]) != bitsOf(got[n]) {
				return fmt.Errorf("%v: element %d of C: hardware %#x, interpreter %#x", c, n-d.cBase(), bitsOf(hw[n]), bitsOf(got[n]))
			}
		}
	}
	return nil
}

// TestEmuCopyRows64 runs copyRows64 (the SSE row copy of packB) in the
// interpreter and checks it against the copy it documents (and on this
// CPU).
func TestEmuCopyRows64(t *testing.T) {
	af, err := locateAsm(copyRows64)
	if err != nil {
		t.Fatal(err)
	}
	r := testseed.Rand(t, 41)
	var m x86emu.Machine
	for _, rows := range []int{0, 1, 2, 7, 33} {
		stride := 64 + 4*r.IntN(20)
		src := make([]byte, rows*stride+64+zeroSize)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		for _, hw := range []bool{false, true} {
			dst := make([]byte, 64*rows+64+zeroSize)
			if hw {
				copyRows64(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), stride, rows)
			} else {
				scramble(&m, r)
				err := m.CallPC(af.entry, uint64(uintptr(unsafe.Pointer(&dst[0]))), uint64(uintptr(unsafe.Pointer(&src[0]))), uint64(stride), uint64(rows))
				runtime.KeepAlive(src)
				runtime.KeepAlive(dst)
				if err != nil {
					t.Fatal(err)
				}
			}
			for i := range rows {
				if !bytes.Equal(dst[64*i:64*i+64], src[i*stride:i*stride+64]) {
					t.Fatalf("hardware %v: rows %d stride %d: row %d not copied", hw, rows, stride, i)
				}
			}
			if !bytes.Equal(dst[64*rows:], make([]byte, 64)) {
				t.Fatalf("hardware %v: rows %d: wrote past the rows", hw, rows)
			}
		}
	}
}
