package cuda

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
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
				k, err := GenerateOp(op, GenerateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				all.WriteString(k.Source)
				checkWellFormed(t, k)
				k2, err := GenerateOp(op, GenerateOptions{})
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
	if _, err := GenerateOp(srt, GenerateOptions{}); err == nil || !strings.Contains(err.Error(), "sort") {
		t.Errorf("sort: %v", err)
	}
	l := ir.NewLiteral(f32(2))
	cst, _ := f.Body.AddOp(ir.Constant, nil, ir.Attrs{"value": l})
	if _, err := GenerateOp(cst, GenerateOptions{}); err == nil || !strings.Contains(err.Error(), "scalar") {
		t.Errorf("constant: %v", err)
	}
	if _, err := GenerateOp(nil, GenerateOptions{}); err == nil {
		t.Errorf("nil op accepted")
	}
}

// hostShim maps the CUDA names the generated source uses onto C11 with POSIX
// threads: blocks run one after another; in a LaunchReduce entry each thread
// of a block is a thread, __syncthreads a block barrier and a warp shuffle an
// exchange through memory between two warp barriers; loop entries run their
// threads in sequence. Atomics are plain updates (one thread at a time).
const hostShim = `#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define FERRY_KERNEL static void
#define FD static inline
#define __restrict__ restrict
#define __shared__ static
struct dim3 { long long x; };
static _Thread_local struct dim3 threadIdx;
static struct dim3 blockIdx, blockDim, gridDim;
static pthread_barrier_t ferry_block_bar, ferry_warp_bar[32];
static unsigned long long ferry_slots[32][32];
static void __syncthreads(void) { pthread_barrier_wait(&ferry_block_bar); }
static unsigned long long ferry_shfl(unsigned long long v, int d) {
  int t = (int)threadIdx.x, w = t >> 5, l = t & 31;
  ferry_slots[w][l] = v;
  pthread_barrier_wait(&ferry_warp_bar[w]);
  unsigned long long r = l + d < 32 ? ferry_slots[w][l + d] : v;
  pthread_barrier_wait(&ferry_warp_bar[w]);
  return r;
}
#define SHFL(T, sfx) static T ferry_shfl_down_##sfx(T v, int d) { unsigned long long u = 0; memcpy(&u, &v, sizeof v); u = ferry_shfl(u, d); memcpy(&v, &u, sizeof v); return v; }
SHFL(float, f32) SHFL(double, f64) SHFL(int, i32) SHFL(unsigned int, u32) SHFL(long long, i64) SHFL(unsigned long long, u64)
static unsigned int ferry_fbits(float x) { unsigned int b; memcpy(&b, &x, 4); return b; }
static float ferry_bitsf(unsigned int b) { float x; memcpy(&x, &b, 4); return x; }
static unsigned long long ferry_dbits(double x) { unsigned long long b; memcpy(&b, &x, 8); return b; }
static double ferry_bitsd(unsigned long long b) { double x; memcpy(&x, &b, 8); return x; }
static unsigned int atomicCAS(unsigned int* p, unsigned int cmp, unsigned int v) { unsigned int o = *p; if (o == cmp) *p = v; return o; }
static void ferry_aadd_f32(float* p, float v) { *p += v; }
static void ferry_aadd_f64(double* p, double v) { *p += v; }
static void ferry_aadd_i32(int* p, int v) { *p = (int)((unsigned int)*p + (unsigned int)v); }
static void ferry_aadd_u32(unsigned int* p, unsigned int v) { *p += v; }
static void ferry_aadd_u64(unsigned long long* p, unsigned long long v) { *p += v; }
#define atomicAdd(p, v) _Generic((p), float*: ferry_aadd_f32, double*: ferry_aadd_f64, int*: ferry_aadd_i32, unsigned int*: ferry_aadd_u32, unsigned long long*: ferry_aadd_u64)(p, v)
static void (*ferry_fn)(void);
static void* ferry_thread(void* a) { threadIdx.x = (long long)a; ferry_fn(); return 0; }
static void ferry_launch(void (*fn)(void), int grid, int block, int threaded) {
  gridDim.x = grid; blockDim.x = block; ferry_fn = fn;
  for (int b = 0; b < grid; b++) {
    blockIdx.x = b;
    if (!threaded) { for (int t = 0; t < block; t++) { threadIdx.x = t; fn(); } continue; }
    pthread_barrier_init(&ferry_block_bar, 0, block);
    for (int w = 0; w < block / 32; w++) pthread_barrier_init(&ferry_warp_bar[w], 0, 32);
    pthread_t th[1024];
    for (long long t = 0; t < block; t++) pthread_create(&th[t], 0, ferry_thread, (void*)t);
    for (int t = 0; t < block; t++) pthread_join(th[t], 0);
    pthread_barrier_destroy(&ferry_block_bar);
    for (int w = 0; w < block / 32; w++) pthread_barrier_destroy(&ferry_warp_bar[w]);
  }
}
`

// hostProgram is the shim, the kernel source and a main that reads the
// operands from stdin, runs every entry and writes the results to stdout.
func hostProgram(k *Kernel) string {
	var b strings.Builder
	b.WriteString(hostShim)
	b.WriteString(k.Source)
	var args []string
	for i, p := range k.Params {
		ct, _ := CType(p.DType)
		fmt.Fprintf(&b, "static %s* p%d;\n", ct, i)
		args = append(args, fmt.Sprintf("p%d", i))
	}
	for i, r := range k.Results {
		ct, _ := CType(r.DType)
		fmt.Fprintf(&b, "static %s* out%d;\n", ct, i)
		args = append(args, fmt.Sprintf("out%d", i))
	}
	b.WriteString("static long long ferry_n;\n")
	for i, e := range k.Entries {
		fmt.Fprintf(&b, "static void thunk%d(void) { %s(%s, ferry_n); }\n", i, e.Name, strings.Join(args, ", "))
	}
	b.WriteString("int main(void) {\n")
	for i, p := range k.Params {
		fmt.Fprintf(&b, "  p%d = malloc(%d);\n  if (fread(p%d, 1, %d, stdin) != %d) return 1;\n", i, p.Bytes()+8, i, p.Bytes(), p.Bytes())
	}
	for i, r := range k.Results {
		fmt.Fprintf(&b, "  out%d = calloc(1, %d);\n", i, r.Bytes()+8)
	}
	for i, e := range k.Entries {
		if e.Kind == LaunchReduce {
			fmt.Fprintf(&b, "  ferry_n = %d; ferry_launch(thunk%d, 2, 64, 1);\n", e.N, i)
		} else {
			fmt.Fprintf(&b, "  ferry_n = %d; ferry_launch(thunk%d, 3, 5, 0);\n", e.N, i)
		}
	}
	for i, r := range k.Results {
		fmt.Fprintf(&b, "  fwrite(out%d, 1, %d, stdout);\n", i, r.Bytes())
	}
	b.WriteString("  return 0;\n}\n")
	return b.String()
}

// runHost compiles k's host program with gcc and runs it on ins.
func runHost(t *testing.T, gcc string, k *Kernel, ins []*ir.Literal) []*ir.Literal {
	t.Helper()
	prog := hostProgram(k)
	dir := t.TempDir()
	cfile, bin := filepath.Join(dir, "k.c"), filepath.Join(dir, "k")
	if err := os.WriteFile(cfile, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-std=gnu11", "-O1", "-pthread", "-Wall", "-Werror", "-Wno-unused-variable", "-Wno-unused-function", "-Wno-unused-but-set-variable", "-Wno-tautological-compare", "-o", bin, cfile, "-lm").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s\n%s", err, out, numbered(prog))
	}
	var stdin bytes.Buffer
	for _, l := range ins {
		stdin.Write(l.Data)
	}
	cmd := exec.Command(bin)
	cmd.Stdin = &stdin
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var res []*ir.Literal
	for _, rt := range k.Results {
		nb := int(rt.Bytes())
		if len(out) < nb {
			t.Fatalf("short output")
		}
		l := ir.NewLiteral(rt)
		copy(l.Data, out[:nb])
		out = out[nb:]
		res = append(res, l)
	}
	return res
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%4d %s\n", i+1, l)
	}
	return b.String()
}

// checkOnHost generates op, runs it on the host on fresh random operands and
// compares every result with internal/eval.
func checkOnHost(t *testing.T, gcc string, rng *rand.Rand, op *ir.Op) {
	t.Helper()
	k, err := GenerateOp(op, GenerateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkWellFormed(t, k)
	var ins []*ir.Literal
	for _, a := range op.Args {
		ins = append(ins, randomLiteral(rng, a.Type))
	}
	want, err := eval.EvalOp(op, ins)
	if err != nil {
		t.Fatal(err)
	}
	got := runHost(t, gcc, k, ins)
	for i, w := range want {
		if !got[i].Type.Shape.Equal(w.Type.Shape) || got[i].Type.DType != w.Type.DType {
			t.Fatalf("result %d is %v, want %v", i, got[i].Type, w.Type)
		}
		compare(t, fmt.Sprintf("%v result %d", op.Code, i), got[i], w)
	}
}

func needGCC(t *testing.T) string {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	return gcc
}

// TestGenerateTracedHostC runs every generated step of the traced cases on
// the host and compares with the reference executor.
func TestGenerateTracedHostC(t *testing.T) {
	gcc := needGCC(t)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	for _, c := range genCases {
		t.Run(c.name, func(t *testing.T) {
			for _, op := range programSteps(t, traceFn(t, c.params, c.fn)) {
				checkOnHost(t, gcc, rng, op)
			}
		})
	}
}

func randomLiteral(rng *rand.Rand, t ir.Type) *ir.Literal {
	l := ir.NewLiteral(t)
	for i := range t.Size() {
		var v float64
		switch t.DType {
		case ir.Int32, ir.Int64:
			v = float64(rng.IntN(21) - 10) // includes zeros and -1 divisors
		case ir.Uint8:
			v = float64(rng.IntN(256))
		case ir.Uint32:
			v = float64(rng.IntN(40))
		case ir.Bool:
			v = float64(rng.IntN(2))
		default:
			v = rng.Float64()*6 - 3
		}
		l.SetFloat64At(i, v)
	}
	return l
}

func compare(t *testing.T, what string, got, want *ir.Literal) {
	t.Helper()
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
			t.Fatalf("%s: element %d = %v, want %v", what, i, g, w)
		}
	}
}
