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

// loopFusions compiles f and returns its loop fusion ops.
func loopFusions(t *testing.T, f *ir.Func) []*ir.Op {
	t.Helper()
	p, err := passes.Compile(f, passes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ops []*ir.Op
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Fusion && op.Attrs.String("kind") == "loop" {
			ops = append(ops, op)
		}
	}
	if len(ops) == 0 {
		t.Fatalf("no loop fusion in\n%v", p.Func)
	}
	return ops
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
		name:   "gelu_affine", // gelu(x*w + b), w and b broadcast along rows
		params: []ir.Type{f32(4, 5), f32(5), f32(5)},
		fn: func(xs []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(xs[0], xs[1]), xs[2]), true)}
		},
		golden: []string{"tanhf(", "(i % 5LL)", "const float* __restrict__ p0", "float* __restrict__ out0", "long long n"},
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
		golden: []string{"(int)", "== 0 ? -1"},
	},
}

func TestGenerateFusion(t *testing.T) {
	for _, c := range genCases {
		t.Run(c.name, func(t *testing.T) {
			var all strings.Builder
			for _, op := range loopFusions(t, traceFn(t, c.params, c.fn)) {
				name, src, err := GenerateFusion(op)
				if err != nil {
					t.Fatal(err)
				}
				all.WriteString(src)
				t.Logf("%s:\n%s", name, src)
				checkWellFormed(t, op, name, src)
				name2, src2, err := GenerateFusion(op)
				if err != nil || name2 != name || src2 != src {
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

func checkWellFormed(t *testing.T, op *ir.Op, name, src string) {
	t.Helper()
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
		for k, d := range depth {
			if d < 0 {
				t.Fatalf("unbalanced %c", k)
			}
		}
	}
	for k, d := range depth {
		if d != 0 {
			t.Fatalf("unbalanced %c (%d open)", k, d)
		}
	}
	if !strings.Contains(src, `extern "C" __global__ void `+name+"(") {
		t.Fatalf("no kernel signature for %s", name)
	}
	r := op.Regions[0]
	body := src[strings.Index(src, "{"):]
	for i := range r.Params {
		if !regexp.MustCompile(fmt.Sprintf(`\bp%d\[`, i)).MatchString(body) {
			t.Errorf("parameter p%d is not used", i)
		}
	}
	for i := range r.Results {
		if !strings.Contains(body, fmt.Sprintf("out%d[i] = ", i)) {
			t.Errorf("result out%d is not stored", i)
		}
	}
	// One statement per computed region value (index maps need none).
	for _, o := range r.Ops {
		if o.Code == ir.BroadcastInDim || o.Code == ir.Reshape {
			continue
		}
		for _, v := range o.Results {
			n := len(regexp.MustCompile(fmt.Sprintf(`(?m)^\s+\w+ v%d(_\w+)? = `, v.ID)).FindAllString(body, -1))
			if n != 1 {
				t.Errorf("value %v (%s) has %d statements, want 1", v, o.Info().Name, n)
			}
		}
	}
}

func TestGenerateFusionErrors(t *testing.T) {
	f := traceFn(t, []ir.Type{f32(4, 5)}, func(xs []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Add(trace.Exp(xs[0]), xs[0])}
	})
	op := loopFusions(t, f)[0]
	in := *op
	in.Attrs = ir.Attrs{"kind": "input"}
	if _, _, err := GenerateFusion(&in); err == nil || !strings.Contains(err.Error(), `"input"`) {
		t.Errorf("kind input: %v", err)
	}
	// A transpose inside the region is not an elementwise op.
	r := op.Regions[0]
	tr, err := r.Func().NewOp(ir.Transpose, []*ir.Value{r.Params[0]}, ir.Attrs{"perm": []int{1, 0}})
	if err != nil {
		t.Fatal(err)
	}
	bad := &ir.Op{Code: ir.Fusion, Attrs: ir.Attrs{"kind": "loop"}, Regions: []*ir.Region{{Params: r.Params, Ops: []*ir.Op{tr}, Results: tr.Results}}}
	if _, _, err := GenerateFusion(bad); err == nil || !strings.Contains(err.Error(), "transpose") {
		t.Errorf("transpose: %v", err)
	}
	if _, _, err := GenerateFusion(tr); err == nil {
		t.Errorf("non-fusion op accepted")
	}
	u8 := &ir.Op{Code: ir.Fusion, Attrs: ir.Attrs{"kind": "loop"}, Regions: []*ir.Region{{Params: []*ir.Value{{ID: 1, Type: ir.TypeOf(ir.Uint8, 3)}}}}}
	u8.Regions[0].Results = u8.Regions[0].Params
	if _, _, err := GenerateFusion(u8); err == nil || !strings.Contains(err.Error(), "u8") {
		t.Errorf("u8: %v", err)
	}
}

// hostPrelude maps the CUDA names the generated source uses onto C: one block
// of one thread, so the grid-stride loop visits every index in order.
const hostPrelude = `#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define __global__
#define __restrict__ restrict
struct dim3 { long long x; };
static const struct dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
static int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
`

// TestGenerateFusionHostC compiles each generated kernel as C with gcc, runs it
// on random inputs and compares with the reference executor.
func TestGenerateFusionHostC(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range genCases {
		t.Run(c.name, func(t *testing.T) {
			for k, op := range loopFusions(t, traceFn(t, c.params, c.fn)) {
				name, src, err := GenerateFusion(op)
				if err != nil {
					t.Fatal(err)
				}
				r := op.Regions[0]
				var ins []*ir.Literal
				var stdin bytes.Buffer
				for _, p := range r.Params {
					l := randomLiteral(rng, p.Type)
					ins = append(ins, l)
					stdin.Write(l.Data)
				}
				want, err := eval.RunRegion(r, ins)
				if err != nil {
					t.Fatal(err)
				}
				prog := hostProgram(r, name, src)
				dir := t.TempDir()
				cfile, bin := filepath.Join(dir, "k.c"), filepath.Join(dir, "k")
				if err := os.WriteFile(cfile, []byte(prog), 0o644); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command(gcc, "-std=c11", "-O1", "-Wall", "-Werror", "-Wno-unused-variable", "-Wno-unused-function", "-o", bin, cfile, "-lm").CombinedOutput(); err != nil {
					t.Fatalf("gcc: %v\n%s\n%s", err, out, prog)
				}
				cmd := exec.Command(bin)
				cmd.Stdin = &stdin
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				for i, w := range want {
					nb := len(w.Data)
					if len(out) < nb {
						t.Fatalf("short output")
					}
					got := &ir.Literal{Type: w.Type, Data: out[:nb]}
					out = out[nb:]
					compare(t, fmt.Sprintf("fusion %d result %d", k, i), got, w)
				}
			}
		})
	}
}

func hostProgram(r *ir.Region, name, src string) string {
	var b strings.Builder
	b.WriteString(hostPrelude)
	b.WriteString(strings.Replace(src, `extern "C" `, "", 1))
	b.WriteString("int main(void) {\n")
	var args []string
	n := r.Results[0].Type.Size()
	for i, p := range r.Params {
		ct, _ := CType(p.Type.DType)
		fmt.Fprintf(&b, "  %s* p%d = malloc(%d);\n  if (fread(p%d, 1, %d, stdin) != %d) return 1;\n", ct, i, p.Type.Bytes()+1, i, p.Type.Bytes(), p.Type.Bytes())
		args = append(args, fmt.Sprintf("p%d", i))
	}
	for i, v := range r.Results {
		ct, _ := CType(v.Type.DType)
		fmt.Fprintf(&b, "  %s* out%d = malloc(%d);\n", ct, i, v.Type.Bytes()+1)
		args = append(args, fmt.Sprintf("out%d", i))
	}
	fmt.Fprintf(&b, "  %s(%s, %dLL);\n", name, strings.Join(args, ", "), n)
	for i, v := range r.Results {
		fmt.Fprintf(&b, "  fwrite(out%d, 1, %d, stdout);\n", i, v.Type.Bytes())
	}
	b.WriteString("  return 0;\n}\n")
	return b.String()
}

func randomLiteral(rng *rand.Rand, t ir.Type) *ir.Literal {
	t.Space = ir.Device
	l := ir.NewLiteral(t)
	for i := range t.Size() {
		var v float64
		switch t.DType {
		case ir.Int32:
			v = float64(rng.IntN(21) - 10) // includes zeros and -1 divisors
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
	tol := 1e-5
	if want.Type.DType == ir.Float64 {
		tol = 1e-12
	}
	for i := range want.Type.Size() {
		g, w := got.Float64At(i), want.Float64At(i)
		if math.IsNaN(w) && math.IsNaN(g) {
			continue
		}
		if math.Abs(g-w) > tol*(1+math.Abs(w)) {
			t.Fatalf("%s: element %d = %v, want %v", what, i, g, w)
		}
	}
}
