package cuda

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	_ "github.com/ferryml/ferry/runtime" // executor for trace constants
	"github.com/ferryml/ferry/trace"
)

// traceFn traces fn over parameters of the given types into a function.
func traceFn(t *testing.T, params []ir.Type, fn func(xs []*trace.Array) []*trace.Array) *ir.Func {
	t.Helper()
	tr := trace.NewFuncTracer("f")
	tr.Push()
	var xs []*trace.Array
	for _, p := range params {
		xs = append(xs, tr.Param(p))
	}
	outs := fn(xs)
	for _, o := range outs {
		tr.Func().Body.Results = append(tr.Func().Body.Results, tr.Output(o))
	}
	tr.Pop()
	tr.Close()
	return tr.Func()
}

// compiledOps compiles f and returns the ops of its body that keep accepts,
// failing with "no <what> in" the program when there are none.
func compiledOps(t *testing.T, f *ir.Func, what string, keep func(*ir.Op) bool) []*ir.Op {
	t.Helper()
	p, err := passes.Compile(f, passes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ops []*ir.Op
	for _, op := range p.Func.Body.Ops {
		if keep(op) {
			ops = append(ops, op)
		}
	}
	if len(ops) == 0 {
		t.Fatalf("no %s in\n%v", what, p.Func)
	}
	return ops
}

// loopFusions compiles f and returns its loop fusion ops.
func loopFusions(t *testing.T, f *ir.Func) []*ir.Op {
	t.Helper()
	return compiledOps(t, f, "loop fusion", func(op *ir.Op) bool {
		return op.Code == ir.Fusion && op.Attrs.String("kind") == "loop"
	})
}

type genCase struct {
	name   string
	params []ir.Type
	fn     func(xs []*trace.Array) []*trace.Array
	golden []string // substrings the source must contain
}

var (
	f32 = func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
	f64 = func(d ...int) ir.Type { return ir.TypeOf(ir.Float64, d...) }
	i32 = func(d ...int) ir.Type { return ir.TypeOf(ir.Int32, d...) }
)

var genCases = []genCase{
	{
		name:   "gelu_affine", // gelu(x*w + b), w and b broadcast along rows (gelu lowers to x·logistic(…))
		params: []ir.Type{f32(4, 5), f32(5), f32(5)},
		fn: func(xs []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(xs[0], xs[1]), xs[2]), true)}
		},
		golden: []string{"expf(", "(i % 5LL)", "const float* __restrict__ p0", "float* __restrict__ out0", "long long n"},
	},
	{
		name:   "bias_column", // x + b[:, None], a broadcast along the other axis
		params: []ir.Type{f32(3, 4), f32(3, 1)},
		fn: func(xs []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(xs[0], xs[1])}
		},
		golden: []string{"(i / 4LL)"},
	},
	{
		name:   "chain_f64", // an elementwise chain with compare/select and two outputs
		params: []ir.Type{f64(2, 3, 4), f64(2, 3, 4)},
		fn: func(xs []*trace.Array) []*trace.Array {
			x, y := xs[0], xs[1]
			a := trace.Exp(trace.Neg(trace.Abs(x)))
			b := trace.Where(trace.Greater(x, y), trace.Sqrt(trace.Add(trace.Mul(y, y), trace.Scalar(1))), trace.Log1p(a))
			c := trace.Maximum(trace.Sub(b, trace.Logistic(x)), trace.Pow(a, trace.Scalar(2)))
			return []*trace.Array{c, trace.Tanh(trace.Div(b, trace.Add(a, trace.Scalar(2))))}
		},
		golden: []string{"exp(", "double* __restrict__ out1", "log1p("},
	},
	{
		name:   "int_ops", // integer arithmetic with the zero-division rules, iota and converts
		params: []ir.Type{i32(6, 7), i32(6, 7), f32(6, 7)},
		fn: func(xs []*trace.Array) []*trace.Array {
			a, b := xs[0], xs[1]
			io := trace.Iota(ir.Int32, ir.Shape{6, 7}, 1)
			q := trace.Add(trace.Div(a, b), trace.Rem(a, b))
			s := trace.Add(q, trace.Mul(io, trace.Convert(trace.Floor(xs[2]), ir.Int32)))
			return []*trace.Array{s, trace.Convert(trace.Less(a, b), ir.Float32)}
		},
		golden: []string{"(int)", "== 0 ? (int)-1"},
	},
}

// programSteps compiles f and returns the ops of its body that GenerateOp
// handles (fusions and plain ops; not constants, sort or region ops).
func programSteps(t *testing.T, f *ir.Func) []*ir.Op {
	t.Helper()
	return compiledOps(t, f, "generated step", func(op *ir.Op) bool {
		return !(op.Code == ir.Constant || op.Code == ir.Sort || op.Code == ir.DevicePut || op.Code.Info().Class == ir.ClassRegion && op.Code != ir.Fusion)
	})
}

func TestGenerateTraced(t *testing.T) {
	for _, c := range genCases {
		t.Run(c.name, func(t *testing.T) {
			var all strings.Builder
			for _, op := range programSteps(t, traceFn(t, c.params, c.fn)) {
				k, err := GenerateOp(op)
				if err != nil {
					t.Fatal(err)
				}
				all.WriteString(k.Source)
				checkWellFormed(t, k)
				k2, err := GenerateOp(op)
				if err != nil || k2.Source != k.Source {
					t.Fatalf("output is not deterministic")
				}
			}
			for _, g := range c.golden {
				if !strings.Contains(all.String(), g) {
					t.Errorf("source lacks %q", g)
				}
			}
		})
	}
}

// checkWellFormed checks brackets balance, every entry has its signature,
// every used operand is read and every result is stored by some entry.
func checkWellFormed(t *testing.T, k *Kernel) {
	t.Helper()
	src := k.Source
	depth := map[rune]int{}
	for _, r := range src {
		switch r {
		case '{', '(', '[':
			depth[r]++
		case '}':
			depth['{']--
		case ')':
			depth['(']--
		case ']':
			depth['[']--
		}
		for c, d := range depth {
			if d < 0 {
				t.Fatalf("unbalanced %c", c)
			}
		}
	}
	for c, d := range depth {
		if d != 0 {
			t.Fatalf("unbalanced %c (%d open)", c, d)
		}
	}
	body := src[len(Prelude):]
	for _, e := range k.Entries {
		if !strings.Contains(body, "FERRY_KERNEL "+e.Name+"(") {
			t.Fatalf("no kernel signature for %s", e.Name)
		}
	}
	for i := range k.Params {
		if strings.Contains(body, fmt.Sprintf("p%d /* unused */", i)) {
			continue
		}
		if !regexp.MustCompile(fmt.Sprintf(`\bp%d\[`, i)).MatchString(body) {
			t.Errorf("parameter p%d is not read", i)
		}
	}
	for i := range k.Results {
		if !regexp.MustCompile(fmt.Sprintf(`out%d\[\w+\] = |&out%d\[`, i, i)).MatchString(body) {
			t.Errorf("result out%d is not stored", i)
		}
	}
}

func TestGenerateErrors(t *testing.T) {
	f := ir.NewFunc("f")
	x := f.Body.AddParam(f32(4, 5))
	srt, err := f.Body.AddOp(ir.Sort, []*ir.Value{x}, ir.Attrs{"dimension": 1, "num_keys": 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := GenerateOp(srt); err == nil || !strings.Contains(err.Error(), "sort") {
		t.Errorf("sort: %v", err)
	}
	l := ir.NewLiteral(f32(2))
	cst, _ := f.Body.AddOp(ir.Constant, nil, ir.Attrs{"value": l})
	if _, err := GenerateOp(cst); err == nil || !strings.Contains(err.Error(), "constant") {
		t.Errorf("constant: %v", err)
	}
	if _, err := GenerateOp(nil); err == nil {
		t.Errorf("nil op accepted")
	}
}

// TestGenerateTracedHostC runs every generated step of the traced cases on
// the host and compares with the reference executor.
func TestGenerateTracedHostC(t *testing.T) {
	b := newHostBatch(needGCC(t))
	defer b.run()
	rng := testseed.Rand(t, 2)
	for _, c := range genCases {
		t.Run(c.name, func(t *testing.T) {
			var checks []*hostCheck
			for _, op := range programSteps(t, traceFn(t, c.params, c.fn)) {
				checks = append(checks, queueOnHost(t, b, rng, op))
			}
			t.Parallel()
			for _, hc := range checks {
				hc.check(t, b)
			}
		})
	}
}

// kernelInputs is the distribution of the kernels' test inputs: floats in
// [-3, 3), signed integers in [-10, 10] (zeros and -1 divisors included),
// u8 over its whole range, u32 below 40.
var kernelInputs = randprog.Values{
	Float:   randprog.Range{Lo: -3, Hi: 3},
	Int:     randprog.Range{Lo: -10, Hi: 11},
	Uint:    randprog.Range{Lo: 0, Hi: 40},
	ByDType: map[ir.DType]randprog.Range{ir.Uint8: {Lo: 0, Hi: 256}},
}

func randomLiteral(rng *rand.Rand, t ir.Type) *ir.Literal { return kernelInputs.Literal(rng, t) }

// compare fails t when got and want differ by more than want's dtype's
// tolerance in some element.
func compare(t *testing.T, what string, got, want *ir.Literal) {
	t.Helper()
	if msg := mismatch(got, want); msg != "" {
		t.Fatalf("%s: %s", what, msg)
	}
}

// compareKernel is compare for a result of k, printing k's source on failure.
func compareKernel(t *testing.T, what string, k *Kernel, got, want *ir.Literal) {
	t.Helper()
	if msg := mismatch(got, want); msg != "" {
		t.Fatalf("%s: %s\n%s", what, msg, numbered(k.Source))
	}
}

// mismatch describes the first element of got that differs from want by
// more than want's dtype's tolerance, or is "" when there is none.
//
// The tolerance is relative to 1+|want| (an absolute one near zero, where
// a sum's cancellation leaves only rounding). Against JAX's
// (jax/_src/public_test_util.py, _default_tolerance: f64 1e-15, f32 1e-6,
// f16 1e-3, bf16 1e-2, for an op checked against NumPy), and why ours is
// wider:
//
//   - f32, 1e-5: eval computes each elementwise op from its float64
//     reference and rounds once; a kernel calls CUDA's f32 functions (expf,
//     tanhf, powf: up to 2–4 ulps, 2.4e-7 to 4.8e-7), NVRTC contracts a
//     product and a sum into one FMA (--fmad=true, its default: one
//     rounding less, up to an ulp per contraction), and a fused chain
//     compounds these over a few ops; a reduction adds in a tree of its
//     threads and blocks where eval keeps float64 lanes, an error of up to
//     log2(n)·6e-8 of Σ|x| (n ≤ a few hundred here). JAX itself raises the
//     f32 tolerance of transcendental ops on accelerators (lax_test's
//     testOpAgainstNumpy: 2e-4 on TPU).
//   - f16, 2e-3 and bf16, 1.6e-2: two ulps at 1 (f16's ulp is 9.8e-4,
//     bf16's 7.8e-3). The kernel computes in f32 and rounds to 16 bits at
//     every stored value, as eval does, but an f32 intermediate an ulp off
//     (above) can round to the neighbouring 16-bit value; JAX allows 1e-3
//     and 1e-2, about one ulp.
//   - f64, 1e-12: CUDA's double functions are within 1–2 ulps (1.1e-16
//     each) and FMA contraction and tree reductions apply as for f32: a
//     reduction of n ≤ 1e3 terms is off by up to n·1.1e-16·Σ|x| ≈ 1e-13.
//     JAX's 1e-15 is for one op without reductions.
func mismatch(got, want *ir.Literal) string {
	tol := map[ir.DType]float64{ir.Float64: 1e-12, ir.Float32: 1e-5, ir.Float16: 2e-3, ir.BFloat16: 1.6e-2}[want.Type.DType]
	for i := range want.Type.Size() {
		g, w := got.Float64At(i), want.Float64At(i)
		if math.IsNaN(w) && math.IsNaN(g) {
			continue
		}
		if math.IsInf(w, 0) && g == w {
			continue
		}
		if math.Abs(g-w) > tol*(1+math.Abs(w)) {
			return fmt.Sprintf("element %d = %v, want %v", i, g, w)
		}
	}
	return ""
}
