package vmath

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// forJIT runs f with each implementation whose chains this machine runs
// (AVX-512 and AVX2 code where the CPU has AVX-512, AVX2 code where it has
// AVX2 and FMA only); the kernels chains are compared with are that
// implementation's: the same generator's one-op chains of the same width,
// themselves checked against float64 references (TestAccuracy) and, on
// AVX-512 machines, against the other width (TestImplsAgree).
func forJIT(t *testing.T, f func(t *testing.T)) {
	ran := false
	for _, im := range available() {
		prev := use(im)
		if JITAvailable() {
			ran = true
			t.Run(im.name, f)
		}
		use(prev)
	}
	if !ran {
		t.Skip("run-time code generation not available here: ", Impl())
	}
}

// edgeValues are inputs every chain test mixes in.
var edgeValues = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0.5, -0.5, 1e-45, -1e-45, 1e-39, -3e-39,
	1.1754944e-38, 3.4028235e38, -3.4028235e38, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
	0.625, -0.625, 0.875, 3.9375, -3.9375, 9.1, -9.1, 88.7, 89, -103.9, -104, 1e10, -1e10, 1e-10, 0.70710677}

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch r.IntN(4) {
		case 0:
			x[i] = edgeValues[r.IntN(len(edgeValues))]
		case 1:
			x[i] = float32(r.NormFloat64())
		case 2:
			x[i] = float32(r.NormFloat64() * 10)
		default:
			x[i] = math.Float32frombits(r.Uint32())
		}
	}
	return x
}

var kernel1 = map[int32]func(dst, x []float32){OpNeg: Neg, OpAbs: Abs, OpSqrt: Sqrt, OpExp: Exp, OpLog: Log,
	OpTanh: Tanh, OpLogistic: Logistic, OpErf: Erf, OpRsqrt: Rsqrt}
var kernel2 = map[int32]func(dst, a, b []float32){OpAdd: Add, OpSub: Sub, OpMul: Mul, OpDiv: Div, OpMax: Max, OpMin: Min}

// randChain builds a random SSA chain over nin inputs (the first nuni of
// them uniform) with nins instructions, every opcode used at least once when
// nins allows; operands are drawn from all earlier values (so many stay live
// and the allocator must spill when there are many).
//
// Half the multiplies are NoStore and read by the next instruction, an add
// or subtract (as A or B): candidates for contraction into multiply-adds.
func randChain(r *rand.Rand, nin, nuni, nins int, last int32) (code []Instr, uniform []bool) {
	uniform = make([]bool, nin+nins)
	for i := 0; i < nuni; i++ {
		uniform[i] = true
	}
	for k := 0; k < nins; k++ {
		op := OpAdd + int32(k)%(last-OpAdd+1)
		if k >= int(last) {
			op = OpAdd + int32(r.IntN(int(last)))
		}
		if k > 0 && code[k-1].Code() == OpMul && code[k-1].Op&NoStore != 0 {
			in := Instr{Op: OpAdd + int32(r.IntN(2)), Dst: int32(nin + k), A: code[k-1].Dst, B: int32(r.IntN(nin + k))}
			if r.IntN(2) == 0 {
				in.A, in.B = in.B, in.A
			}
			code = append(code, in)
			continue
		}
		nv := nin + k
		pick := func() int32 {
			if r.IntN(2) == 0 && nv > nin {
				return int32(nv - 1 - r.IntN(min(3, nv-nin))) // a recent result
			}
			return int32(r.IntN(nv))
		}
		in := Instr{Op: op, Dst: int32(nv), A: pick(), B: pick()}
		if r.IntN(3) == 0 || op == OpMul && k+1 < nins && r.IntN(2) == 0 {
			in.Op |= NoStore
		}
		code = append(code, in)
	}
	return code, uniform
}

// runChainRef computes the chain with the kernels, one op after the other.
func runChainRef(code []Instr, vals [][]float32, n int) {
	cc := make([]cins, len(code))
	for i, in := range code {
		cc[i] = cins{Instr: in}
	}
	runContractedRef(cc, vals, n)
}

// runContractedRef computes code as the generator sees it with the
// kernels, and contracted multiply-adds with fma32.
func runContractedRef(code []cins, vals [][]float32, n int) {
	_ = refChain(code, vals, n, func(op int32, dst, a, b []float32) error {
		if kernel1[op] != nil {
			kernel1[op](dst, a)
		} else {
			kernel2[op](dst, a, b)
		}
		return nil
	})
}

// refChain computes code as the generator sees it over elements [0, n) of
// vals: contracted multiply-adds by fma32, compares (float64 predicates,
// every bit set for true), selects (on an all-ones mask) and joined
// compare-selects directly, and every op of the table by kernel.
func refChain(code []cins, vals [][]float32, n int, kernel func(op int32, dst, a, b []float32) error) error {
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
		case cd == opCmpSel: // Pred(A, B) ? C : D
			c, d := vals[in.C][:n], vals[in.D][:n]
			for j := range dst {
				dst[j] = d[j]
				if cmp64(in.Pred, a[j], b[j]) {
					dst[j] = c[j]
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
		default:
			if err := kernel(cd, dst, a, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// fma32 returns a*b + c rounded once to float32: exactly (math/big) for
// finite operands, by float64 arithmetic (exact here) for infinities and
// NaNs.
func fma32(a, b, c float32) float32 {
	for _, v := range []float32{a, b, c} {
		if math.IsInf(float64(v), 0) || v != v {
			return float32(float64(a)*float64(b) + float64(c))
		}
	}
	if a == 0 || b == 0 || c == 0 {
		return float32(float64(a)*float64(b) + float64(c)) // exact: one term, or a product of 48 bits
	}
	z := new(big.Float).SetPrec(1024)
	z.Mul(big.NewFloat(float64(a)), big.NewFloat(float64(b)))
	z.Add(z, big.NewFloat(float64(c)))
	f, _ := z.Float32()
	return f
}

// TestChainMatchesKernels checks that compiled chains compute, bit for bit,
// what the kernels compute op by op, over random chains of every op, fresh
// random inputs with edge values, uniform inputs, lengths around the vector
// and per-call boundaries, and chains long and wide enough to spill. With
// contraction on, the multiplies it contracts are computed with their adds
// in one rounding (fma32) and every other op as the kernels do it (NaNs
// may then differ in payload).
func TestChainMatchesKernels(t *testing.T) {
	forJIT(t, func(t *testing.T) {
		for _, fuse := range []bool{false, true} {
			t.Run(map[bool]string{false: "separate", true: "contracted"}[fuse], func(t *testing.T) {
				defer SetContract(SetContract(fuse))
				testChainMatches(t, fuse)
			})
		}
	})
}

func testChainMatches(t *testing.T, fuse bool) {
	r := testseed.Rand(t, 7)
	shapes := []struct{ nin, nuni, nins int }{
		{1, 0, 1}, {2, 0, 14}, {3, 1, 20}, {2, 2, 14}, {12, 3, 40}, {30, 4, 60}, {4, 0, 120},
	}
	lengths := []int{1, 7, 15, 16, 17, 31, 64, 100, 1024, 1031, chainMaxPerCall + 33}
	spilled, hoisted, fused := false, false, false
	defer func() {
		if !t.Failed() && (!spilled || !hoisted || fuse != fused) {
			t.Errorf("no chain spilled (%v), hoisted constants (%v) or contracted (%v, want %v): the tests miss a path",
				spilled, hoisted, fused, fuse)
		}
	}()
	// Every shape three times, then more chains of the widest shapes until
	// each path (spills, hoisted constants, contraction) has been taken: a
	// seed's first chains need not spill.
	type chainCase struct {
		nin, nuni, nins, trial int
	}
	var cases []chainCase
	for _, sh := range shapes {
		for trial := 0; trial < 3; trial++ {
			cases = append(cases, chainCase{sh.nin, sh.nuni, sh.nins, trial})
		}
	}
	for k := 0; k < len(cases); k++ {
		sh, trial := cases[k], cases[k].trial
		if k == len(cases)-1 && (!spilled || !hoisted || fuse != fused) && k < 400 {
			wide := shapes[len(shapes)-1-k%2] // the longest and the widest
			cases = append(cases, chainCase{wide.nin, wide.nuni, wide.nins, k})
		}
		{
			code, uniform := randChain(r, sh.nin, sh.nuni, sh.nins, opEnd-1)
			ch, err := CompileChain(code, len(uniform), uniform)
			if err != nil {
				t.Fatal(err)
			}
			spilled = spilled || ch.spills > 0
			hoisted = hoisted || ch.hoisted > 0
			fused = fused || ch.fused > 0
			vals, err := checkChain(code, len(uniform), uniform)
			if err != nil {
				t.Fatal(err)
			}
			cc, nf := contract(code, vals, fuse)
			if nf != ch.fused {
				t.Fatalf("contract: %d multiply-adds, the chain has %d", nf, ch.fused)
			}
			for _, n := range lengths {
				if n > 2000 && sh.nins > 20 {
					continue
				}
				nv := len(uniform)
				got, want := make([][]float32, nv), make([][]float32, nv)
				// Run, RunNT over 64-byte aligned memory (non-temporal
				// stores), RunNT over misaligned memory (ordinary stores).
				mode := (trial + n) % 3
				for i := range got {
					got[i] = aligned32(n+16, 4*(mode/2))
					if i < sh.nin {
						copy(got[i], randVec(r, n+16))
						if uniform[i] {
							for j := range got[i] {
								got[i][j] = got[i][0]
							}
						}
					} else {
						for j := range got[i] {
							got[i][j] = 12345 // guard: past n must stay
						}
					}
					want[i] = append([]float32(nil), got[i]...)
				}
				ptrs := make([]*float32, nv)
				for i := range ptrs {
					ptrs[i] = &got[i][0]
				}
				if ran := mode == 0 && ch.Run(ptrs, n) || mode > 0 && ch.RunNT(ptrs, n); !ran {
					t.Fatal("Run refused")
				}
				Fence()
				runContractedRef(cc, want, n)
				for k, in := range code {
					v := int(in.Dst)
					stored := in.Op&NoStore == 0
					for j := 0; j < n+16; j++ {
						g, w := got[v][j], want[v][j]
						if j >= n {
							w = 12345
						} else if !stored {
							continue
						}
						if math.Float32bits(g) != math.Float32bits(w) && !(fuse && g != g && w != w) {
							t.Fatalf("chain %v n=%d: instruction %d (op %d, a=%v b=%v) element %d: got %v (%#x), want %v (%#x)",
								sh, n, k, in.Code(), want[in.A][j], want[in.B][j], j, g, math.Float32bits(g), w, math.Float32bits(w))
						}
					}
				}
			}
		}
	}
}

// aligned32 returns n float32 starting off bytes past a 64-byte boundary.
func aligned32(n, off int) []float32 {
	b := make([]float32, n+32)
	skip := (64 - int(uintptrOf(&b[0])%64) + off) % 64 / 4
	return b[skip : skip+n]
}

// TestChainAccuracy runs each transcendental op alone as a compiled chain
// over a dense sample of float32 (every 97th bit pattern) and checks 2 ulp
// against Go's math in float64.
func TestChainAccuracy(t *testing.T) {
	forJIT(t, func(t *testing.T) {
		const step = 97
		n := int((1<<32 - 1) / step)
		if testing.Short() {
			n /= 8
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(uint32(i * step))
		}
		y := make([]float32, n)
		for _, c := range []struct {
			op  int32
			ref func(float64) float64
		}{{OpExp, math.Exp}, {OpLog, math.Log}, {OpTanh, math.Tanh}, {OpLogistic, logistic64}, {OpErf, math.Erf}} {
			ch, err := CompileChain([]Instr{{Op: c.op, Dst: 1, A: 0, B: 0}}, 2, nil)
			if err != nil {
				t.Fatal(err)
			}
			ch.Run([]*float32{&x[0], &y[0]}, n)
			worst := int64(0)
			for i, v := range x {
				w := float32(c.ref(float64(v)))
				if d := ulps(y[i], w); d > worst {
					worst = d
					if d > 2 {
						t.Fatalf("op %d: x=%v (%#x): got %v, want %v (%d ulp)", c.op, v, math.Float32bits(v), y[i], w, d)
					}
				}
			}
			t.Logf("op %d: worst %d ulp over %d inputs", c.op, worst, n)
		}
	})
}

// TestChainSwitch checks that SetJIT(false) makes Run refuse and
// CompileChain fail, and that bad programs are rejected.
func TestChainSwitch(t *testing.T) {
	forJIT(t, func(t *testing.T) {
		code := []Instr{{Op: OpMul, Dst: 2, A: 0, B: 1}}
		ch, err := CompileChain(code, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		prev := SetJIT(false)
		defer SetJIT(prev)
		x := []float32{1, 2}
		if ch.Run([]*float32{&x[0], &x[0], &x[1]}, 1) {
			t.Fatal("Run ran with the JIT off")
		}
		if _, err := CompileChain(code, 3, nil); err != ErrNoJIT {
			t.Fatalf("CompileChain with the JIT off: %v", err)
		}
		SetJIT(true)
		for _, bad := range [][]Instr{
			{{Op: OpMul, Dst: 3, A: 0, B: 1}},                                  // out of range
			{{Op: 99, Dst: 2, A: 0, B: 1}},                                     // unknown op
			{{Op: OpMul, Dst: 2, A: 0, B: 1}, {Op: OpAdd, Dst: 2, A: 0, B: 1}}, // written twice
			{{Op: OpMul, Dst: 1, A: 2, B: 0}, {Op: OpAdd, Dst: 2, A: 0, B: 0}}, // read before written
			{{Op: OpNeg, Dst: 2, A: 2, B: 2}},                                  // reads itself
		} {
			if _, err := CompileChain(bad, 3, nil); err == nil {
				t.Errorf("accepted %+v", bad)
			}
		}
	})
}

// TestChainContractionForms compiles a multiply and the add or subtract
// reading it, in each operand order, with the addend, the factors, both or
// neither read again later (so the multiply-add overwrites the addend's
// register, a factor's, or a copy), and checks the results against one
// rounding of a*b ± c, and that a stored or twice-read product is not
// contracted.
func TestChainContractionForms(t *testing.T) {
	forJIT(t, func(t *testing.T) {
		defer SetContract(SetContract(true))
		r := testseed.Rand(t, 11)
		const x, y, c, m, s = 0, 1, 2, 3, 4 // inputs x, y, c; m = x*y; s = m ± c (or c ± m)
		for _, form := range []Instr{{Op: OpAdd, A: m, B: c}, {Op: OpAdd, A: c, B: m}, {Op: OpSub, A: m, B: c}, {Op: OpSub, A: c, B: m}} {
			for keep := 0; keep < 8; keep++ { // bit 0: c read later, bit 1: x, bit 2: y
				for _, variant := range []string{"", "stored", "twice"} {
					mul := Instr{Op: OpMul | NoStore, Dst: m, A: x, B: y}
					if variant == "stored" {
						mul.Op = OpMul
					}
					form.Dst = s
					code := []Instr{mul, form}
					next := int32(s + 1)
					for i, v := range []int32{c, x, y} {
						if keep>>i&1 != 0 {
							code = append(code, Instr{Op: OpMul, Dst: next, A: next - 1, B: v})
							next++
						}
					}
					if variant == "twice" {
						code = append(code, Instr{Op: OpAdd, Dst: next, A: next - 1, B: m})
						next++
					}
					ch, err := CompileChain(code, int(next), nil)
					if err != nil {
						t.Fatal(err)
					}
					if want := map[bool]int{true: 1, false: 0}[variant == ""]; ch.fused != want {
						t.Fatalf("%v: %d multiply-adds, want %d", code, ch.fused, want)
					}
					const n = 37
					got, want := make([][]float32, next), make([][]float32, next)
					ptrs := make([]*float32, next)
					for i := range got {
						got[i] = make([]float32, n)
						if i < 3 {
							copy(got[i], randVec(r, n))
						}
						want[i] = append([]float32(nil), got[i]...)
						ptrs[i] = &got[i][0]
					}
					ch.Run(ptrs, n)
					vals, _ := checkChain(code, int(next), nil)
					cc, _ := contract(code, vals, true)
					runContractedRef(cc, want, n)
					for _, in := range code[1:] {
						for j := range n {
							g, w := got[in.Dst][j], want[in.Dst][j]
							if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
								t.Fatalf("%v keep %03b %s: value %d element %d: got %v, want %v (x=%v y=%v c=%v)",
									form, keep, variant, in.Dst, j, g, w, want[x][j], want[y][j], want[c][j])
							}
						}
					}
				}
			}
		}
	})
}

// TestKernelChainsCompile checks that every op compiles alone, so that the
// AVX2 kernels (one-op chains) never fall back to Go unnoticed.
func TestKernelChainsCompile(t *testing.T) {
	forJIT(t, func(t *testing.T) {
		for op := OpAdd; op < opEnd; op++ {
			if _, err := CompileChain([]Instr{{Op: op, Dst: 2, A: 0, B: 1}}, 3, nil); err != nil {
				t.Errorf("op %d: %v", op, err)
			}
		}
	})
}

// geluCode is gelu(x*w+b) as the trace writes it (x·logistic(2u), u =
// √(2/π)(x+0.044715x³)): values 0..2 inputs, 3..5 uniform constants.
func geluCode() ([]Instr, int, []bool) {
	code := []Instr{{OpMul, 6, 0, 1, 0}, {OpAdd, 7, 6, 2, 0}, {OpMul, 8, 7, 7, 0}, {OpMul, 9, 8, 7, 0}, {OpMul, 10, 3, 9, 0},
		{OpAdd, 11, 7, 10, 0}, {OpMul, 12, 4, 11, 0}, {OpLogistic, 13, 12, 12, 0}, {OpMul, 14, 7, 13, 0}}
	for i := range code[:len(code)-1] {
		code[i].Op |= NoStore
	}
	uni := make([]bool, 15)
	for i := 3; i < 6; i++ {
		uni[i] = true
	}
	return code, 15, uni
}
