package cpuexec

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// TestMain runs the package's tests with the contraction of multiplies into
// fused multiply-adds off (vmath.SetContract), so that every executor result
// can be compared byte for byte with the reference executor's; the
// TestContracted tests turn it on and compare within float32 tolerance.
func TestMain(m *testing.M) {
	vmath.SetContract(false)
	os.Exit(m.Run())
}

// jitOps are the f32 ops a compiled chain covers.
var (
	jitUnary  = []ir.Code{ir.Neg, ir.Abs, ir.Sqrt, ir.Exp, ir.Log, ir.Tanh, ir.Logistic, ir.Erf}
	jitBinary = []ir.Code{ir.Add, ir.Sub, ir.Mul, ir.Div, ir.Max, ir.Min}
	// jitCompare: compares whose bools only selects read compile too (as
	// f32 masks), on AVX2.
	jitCompare = []ir.Code{ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge}
)

// jitExpr returns a random f32 expression of the chain's ops over
// parameters (some broadcast rows or scalars) and scalar constants.
func (g *groupGen) jitExpr(shape []int, depth int) *ir.Value {
	r := g.r
	if depth <= 0 || r.IntN(6) == 0 {
		switch r.IntN(4) {
		case 0:
			c := constant(g.t, g.rg, float32(r.NormFloat64()*2))
			return bcast(g.t, g.rg, c, shape)
		case 1: // a row broadcast over the leading axis
			row := g.param(shape[len(shape)-1:])
			return bcast(g.t, g.rg, row, shape, len(shape)-1)
		}
		return g.param(shape)
	}
	switch r.IntN(5) {
	case 0, 1:
		return g.op(jitUnary[r.IntN(len(jitUnary))], nil, g.jitExpr(shape, depth-1))
	case 2: // a select by a compare (as ReLU and its gradient trace)
		var c *ir.Value
		switch cmp := jitCompare[r.IntN(len(jitCompare))]; r.IntN(4) {
		case 0: // of integers: a causal mask's iotas
			io := func(dim int) *ir.Value {
				return g.op(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": shape, "dim": dim})
			}
			c = g.op(cmp, nil, io(0), io(len(shape)-1))
		case 1: // of constants: one bool for every element
			x, y := constant(g.t, g.rg, float32(r.IntN(3))), constant(g.t, g.rg, float32(r.IntN(3)))
			c = bcast(g.t, g.rg, g.op(cmp, nil, x, y), shape)
		default:
			c = g.op(cmp, nil, g.jitExpr(shape, depth-1), g.jitExpr(shape, depth-1))
		}
		return g.op(ir.Select, nil, c, g.jitExpr(shape, depth-1), g.jitExpr(shape, depth-1))
	}
	return g.op(jitBinary[r.IntN(len(jitBinary))], nil, g.jitExpr(shape, depth-1), g.jitExpr(shape, depth-1))
}

// edgeArgs fills f32 operands with random values mixed with NaN, ±Inf,
// ±0, subnormals and large magnitudes.
func edgeArgs(r *rand.Rand, f *ir.Func) []*ir.Literal {
	edges := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		1e-45, -2e-39, 3e38, -3e38, 1e10, -88, 89.5, -104.5, 0.625, 9.2}
	return f32Args(f, func() float32 {
		switch r.IntN(5) {
		case 0:
			return edges[r.IntN(len(edges))]
		case 1:
			return float32(r.NormFloat64() * 20)
		}
		return float32(r.NormFloat64())
	})
}

// f32Args fills f's f32 operands with values drawn from next.
func f32Args(f *ir.Func, next func() float32) []*ir.Literal {
	var args []*ir.Literal
	for _, p := range f.Body.Params {
		l := ir.NewLiteral(p.Type)
		v := ir.ViewBytes[float32](l.Data)
		for i := range v {
			v[i] = next()
		}
		args = append(args, l)
	}
	return args
}

// TestJITRandomChains runs random f32 chains of every op the compiled
// chains cover (with broadcast rows, scalar constants, several results, and
// sizes with and without a partial last vector and block, and sizes split
// across workers in the middle of a row) through the fused executor with
// run-time code generation on and off, comparing every result byte for byte
// with the reference executor, and checks the chain was compiled where the
// CPU allows and ran over spans (with periodic rows shorter and longer than
// spanTarget) in some groups.
func TestJITRandomChains(t *testing.T) {
	r := testseed.Rand(t, 11)
	sizes := [][]int{{3, 5}, {4, 16}, {7, 33}, {2, 1024}, {3, 1000}, {5, 4099}, {257, 129}, {9, 5000}}
	compiled, spans, masked, boolMasked := 0, 0, 0, 0
	defer func() {
		if !t.Failed() && vmath.JITAvailable() && (compiled < 20 || spans < 5 || (masked < 10 || boolMasked < 5)) {
			t.Errorf("only %d groups got a compiled chain (%d with compares and selects, %d conditions made masks), %d ran over spans",
				compiled, masked, boolMasked, spans)
		}
	}()
	for it := range 64 {
		shape := sizes[it%len(sizes)]
		f := ir.NewFunc(fmt.Sprintf("jit%d", it))
		g := &groupGen{t: t, r: r, f: f, rg: f.NewRegion(), dt: ir.Float32}
		res := []*ir.Value{g.jitExpr(shape, 3+r.IntN(4))}
		if it%3 == 0 {
			res = append(res, g.jitExpr(shape, 3))
		}
		g.rg.Results = res
		op := addOp(t, f.Body, ir.Fusion, g.out, ir.Attrs{"kind": "loop"}, g.rg)
		f.Body.Results = op.Results
		p := naivePlan(f, planOpts{})
		args := edgeArgs(r, f)
		for _, on := range []bool{true, false} {
			prev := vmath.SetJIT(on)
			e, err := New(p)
			require.NoError(t, err)
			k := e.body.steps[0].fused
			require.NotEqual(t, modeFallback, k.mode, "%s: %s", f.Name, k.why)
			for _, bp := range k.progs {
				if bp.chain != nil {
					compiled++
					if hasMaskOps(bp.code) {
						masked++
					}
					for _, nd := range bp.nodes {
						if nd.boolMask {
							boolMasked++
						}
					}
				}
				if bp.spans {
					spans++
				}
				if bp.code != nil && (bp.chain != nil) != (on && vmath.JITAvailable() && true) {
					t.Fatalf("%s: JIT %v, available %v, chain compiled %v", f.Name, on, vmath.JITAvailable(), bp.chain != nil)
				}
			}
			t.Run(fmt.Sprintf("%s/jit=%v", f.Name, on), func(t *testing.T) { runBoth(t, p, args) })
			vmath.SetJIT(prev)
			if t.Failed() {
				t.Logf("%v", f)
				return
			}
		}
	}
}

// TestJITGelu checks that a gelu(x*w+b) group (as the benchmark traces it)
// gets a compiled chain where the CPU allows and matches the reference
// executor byte for byte.
func TestJITGelu(t *testing.T) {
	f := traceFunc(t, "gelu_small", []ir.Type{f32(37, 203), f32(37, 203), f32(203)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(x[0], x[1]), x[2]), true)}
	})
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(t, err)
	if chains, _ := compiledChains(t, p); vmath.JITAvailable() && chains == 0 {
		t.Fatal("no compiled chain for gelu")
	}
	runBoth(t, p, edgeArgs(testseed.Rand(t, 3), p.Func))
}

// TestJITGeluLarge is TestJITGelu with a result above ntMinBytes (stored
// with non-temporal stores, by the compiled chain where it runs) and a
// partial last vector.
func TestJITGeluLarge(t *testing.T) {
	f := traceFunc(t, "gelu_large", []ir.Type{f32(1031, 2053), f32(1031, 2053), f32(2053)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(x[0], x[1]), x[2]), true)}
	})
	require.GreaterOrEqual(t, 1031*2053*4, ntMinBytes)
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(t, err)
	runBoth(t, p, edgeArgs(testseed.Rand(t, 5), p.Func))
}

// normalArgs fills f32 operands with standard normal values.
func normalArgs(r *rand.Rand, f *ir.Func) []*ir.Literal {
	return f32Args(f, func() float32 { return float32(r.NormFloat64()) })
}

// compiledChains builds p's executor and returns how many compiled chains
// its fused groups hold and how many multiply-adds were contracted in them.
func compiledChains(t *testing.T, p *passes.Program) (chains, fused int) {
	t.Helper()
	e, err := New(p)
	require.NoError(t, err)
	for _, st := range e.body.steps {
		if st.fused != nil {
			for _, bp := range st.fused.progs {
				if bp.chain != nil {
					chains++
					fused += bp.chain.Fused()
				}
			}
		}
	}
	return chains, fused
}

// TestContractedGelu runs gelu(x*w+b) with multiplies contracted into fused
// multiply-adds (the default outside this package's tests): x*w+b and the
// cubic's a+b·x² become multiply-adds where the CPU compiles chains, and the
// results stay within float32 tolerance of the reference executor's.
func TestContractedGelu(t *testing.T) {
	defer vmath.SetContract(vmath.SetContract(true))
	f := traceFunc(t, "gelu_fma", []ir.Type{f32(37, 203), f32(37, 203), f32(203)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(x[0], x[1]), x[2]), true)}
	})
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(t, err)
	if _, fused := compiledChains(t, p); vmath.JITAvailable() && fused < 2 {
		t.Fatalf("%d multiply-adds in the gelu chain, want 2", fused)
	}
	runClose(t, p, normalArgs(testseed.Rand(t, 13), p.Func), 1e-5, 1e-6)
}

// TestContractedRandomChains runs random chains of multiplies read by adds
// and subtracts (either side) over random subexpressions of well-conditioned
// ops (no division, logarithm, square root or exponential, which magnify one
// rounding's difference without bound) over normal inputs with contraction
// on, within float32 tolerance of the reference executor.
func TestContractedRandomChains(t *testing.T) {
	defer vmath.SetContract(vmath.SetContract(true))
	r := testseed.Rand(t, 17)
	saveU, saveB := jitUnary, jitBinary
	defer func() { jitUnary, jitBinary = saveU, saveB }()
	jitUnary = []ir.Code{ir.Neg, ir.Abs, ir.Tanh, ir.Logistic, ir.Erf}
	jitBinary = []ir.Code{ir.Add, ir.Sub, ir.Mul, ir.Mul, ir.Max, ir.Min}
	fused := 0
	for it := range 24 {
		shape := [][]int{{3, 5}, {7, 33}, {257, 129}}[it%3]
		f := ir.NewFunc(fmt.Sprintf("fma%d", it))
		g := &groupGen{t: t, r: r, f: f, rg: f.NewRegion(), dt: ir.Float32}
		// a*b ± c and c - a*b over random subexpressions, nested.
		var fmaExpr func(depth int) *ir.Value
		fmaExpr = func(depth int) *ir.Value {
			if depth == 0 {
				return g.jitExpr(shape, r.IntN(3))
			}
			m := g.op(ir.Mul, nil, fmaExpr(depth-1), g.jitExpr(shape, 1))
			args := []*ir.Value{m, fmaExpr(depth - 1)}
			if r.IntN(2) == 0 {
				args[0], args[1] = args[1], args[0]
			}
			return g.op([]ir.Code{ir.Add, ir.Sub}[r.IntN(2)], nil, args...)
		}
		g.rg.Results = []*ir.Value{fmaExpr(1 + r.IntN(3))}
		op := addOp(t, f.Body, ir.Fusion, g.out, ir.Attrs{"kind": "loop"}, g.rg)
		f.Body.Results = op.Results
		p := naivePlan(f, planOpts{})
		_, n := compiledChains(t, p)
		fused += n
		runClose(t, p, normalArgs(r, f), 1e-4, 1e-4)
		if t.Failed() {
			t.Logf("%v", f)
			return
		}
	}
	if vmath.JITAvailable() && fused < 24 {
		t.Fatalf("%d multiplies contracted in 24 chains", fused)
	}
}

// hasMaskOps reports whether code holds compares or selects.
func hasMaskOps(code []vmath.Instr) bool {
	for _, in := range code {
		if in.Code() == vmath.OpSelect || vmath.CompareByName("eq") <= in.Code() && in.Code() < vmath.OpSelect {
			return true
		}
	}
	return false
}

// boolMasks gives every bit set for any nonzero byte and zero for zero.
func TestBoolMasks(t *testing.T) {
	src := make([]byte, 256)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]float32, len(src))
	boolMasks(dst, src)
	for i, v := range dst {
		want := uint32(0xffffffff)
		if i == 0 {
			want = 0
		}
		if math.Float32bits(v) != want {
			t.Fatalf("byte %d: mask %#x, want %#x", i, math.Float32bits(v), want)
		}
	}
}
