package vmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

func needJIT(t *testing.T) {
	t.Helper()
	if !JITAvailable() {
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
	OpTanh: Tanh, OpLogistic: Logistic, OpErf: Erf}
var kernel2 = map[int32]func(dst, a, b []float32){OpAdd: Add, OpSub: Sub, OpMul: Mul, OpDiv: Div, OpMax: Max, OpMin: Min}

// randChain builds a random SSA chain over nin inputs (the first nuni of
// them uniform) with nins instructions, every opcode used at least once when
// nins allows; operands are drawn from all earlier values (so many stay live
// and the allocator must spill when there are many).
func randChain(r *rand.Rand, nin, nuni, nins int) (code []Instr, uniform []bool) {
	uniform = make([]bool, nin+nins)
	for i := 0; i < nuni; i++ {
		uniform[i] = true
	}
	for k := 0; k < nins; k++ {
		op := OpAdd + int32(k)%(OpErf-OpAdd+1)
		if k >= int(OpErf) {
			op = OpAdd + int32(r.IntN(int(OpErf)))
		}
		nv := nin + k
		pick := func() int32 {
			if r.IntN(2) == 0 && nv > nin {
				return int32(nv - 1 - r.IntN(min(3, nv-nin))) // a recent result
			}
			return int32(r.IntN(nv))
		}
		in := Instr{Op: op, Dst: int32(nv), A: pick(), B: pick()}
		if r.IntN(3) == 0 {
			in.Op |= NoStore
		}
		code = append(code, in)
	}
	return code, uniform
}

// runChainRef computes the chain with the kernels, one op after the other.
func runChainRef(code []Instr, vals [][]float32, n int) {
	for _, in := range code {
		dst, a, b := vals[in.Dst][:n], vals[in.A][:n], vals[in.B][:n]
		if f := kernel1[in.Code()]; f != nil {
			f(dst, a)
		} else {
			kernel2[in.Code()](dst, a, b)
		}
	}
}

// TestChainMatchesKernels checks that compiled chains compute, bit for bit,
// what the kernels compute op by op, over random chains of every op, fresh
// random inputs with edge values, uniform inputs, lengths around the vector
// and per-call boundaries, and chains long and wide enough to spill.
func TestChainMatchesKernels(t *testing.T) {
	needJIT(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), 7))
	shapes := []struct{ nin, nuni, nins int }{
		{1, 0, 1}, {2, 0, 14}, {3, 1, 20}, {2, 2, 14}, {12, 3, 40}, {30, 4, 60}, {4, 0, 120},
	}
	lengths := []int{1, 7, 15, 16, 17, 31, 64, 100, 1024, 1031, chainMaxPerCall + 33}
	spilled, hoisted := false, false
	defer func() {
		if !t.Failed() && (!spilled || !hoisted) {
			t.Errorf("no chain spilled (%v) or hoisted constants (%v): the tests miss a path", spilled, hoisted)
		}
	}()
	for _, sh := range shapes {
		for trial := 0; trial < 3; trial++ {
			code, uniform := randChain(r, sh.nin, sh.nuni, sh.nins)
			ch, err := CompileChain(code, len(uniform), uniform)
			if err != nil {
				t.Fatal(err)
			}
			spilled = spilled || ch.spills > 0
			hoisted = hoisted || ch.hoisted > 0
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
				runChainRef(code, want, n)
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
						if math.Float32bits(g) != math.Float32bits(w) {
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
	needJIT(t)
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
}

// TestChainSwitch checks that SetJIT(false) makes Run refuse and
// CompileChain fail, and that bad programs are rejected.
func TestChainSwitch(t *testing.T) {
	needJIT(t)
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
}
