package backendtest

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// program is a traced function and how to fill its inputs.
type program struct {
	name   string
	params []ir.Type
	fn     func(xs []*trace.Array) []*trace.Array
}

func traceFn(t *testing.T, p program) *ir.Func {
	t.Helper()
	tr := trace.NewFuncTracer(p.name)
	tr.Push()
	var xs []*trace.Array
	for _, ty := range p.params {
		xs = append(xs, tr.Param(ty))
	}
	for _, o := range p.fn(xs) {
		tr.Func().Body.Results = append(tr.Func().Body.Results, tr.Output(o))
	}
	tr.Pop()
	tr.Close()
	return tr.Func()
}

func f32(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }

var programs = []program{
	{"ops", []ir.Type{f32(8, 16), f32(16, 4), f32(4)}, func(x []*trace.Array) []*trace.Array {
		h := trace.Add(trace.MatMul(x[0], x[1]), x[2])
		s := trace.Softmax(trace.Tanh(h), 1)
		return []*trace.Array{s, trace.Sum(trace.Mul(h, h), 0), trace.ArgMax(h, 1), trace.Transpose(h, 1, 0)}
	}},
	{"autodiff", []ir.Type{f32(6, 5), f32(5, 3)}, func(x []*trace.Array) []*trace.Array {
		loss := func(ps []*trace.Array) []*trace.Array {
			y := trace.Gelu(trace.MatMul(ps[0], ps[1]), true)
			return []*trace.Array{trace.Sum(trace.Mul(y, y))}
		}
		out, pb := trace.VJP(loss, x)
		gs := pb([]*trace.Array{trace.OnesLike(out[0])})
		return append(out, gs...)
	}},
	{"scan", []ir.Type{f32(4), f32(10, 4, 4)}, func(x []*trace.Array) []*trace.Array {
		carry, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			n := trace.Tanh(trace.MatMul(xs[0], c[0]))
			return []*trace.Array{n}, []*trace.Array{trace.Sum(n)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(carry, ys...)
	}},
	// Control flow on the device: a reverse scan with a const, two carries
	// (swapped each iteration) and two xs; a scan over pinned_host xs
	// writing pinned_host ys (the offload plan's per-iteration copies); a
	// cond inside a scan body; a while loop; a cond.
	{"scan_reverse_consts", []ir.Type{f32(3), f32(3), f32(3, 3), f32(6, 3), f32(6, 3)}, func(x []*trace.Array) []*trace.Array {
		w := x[2]
		carry, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			n := trace.Tanh(trace.Add(trace.MatMul(w, c[0]), trace.Mul(xs[0], c[1])))
			return []*trace.Array{trace.Add(c[1], xs[1]), n}, []*trace.Array{n, trace.Sum(n)}
		}, []*trace.Array{x[0], x[1]}, []*trace.Array{x[3], x[4]}, trace.ScanReverse())
		return append(carry, ys...)
	}},
	{"scan_offload", []ir.Type{f32(4, 4), f32(5, 4, 4).WithSpace(ir.PinnedHost)}, func(x []*trace.Array) []*trace.Array {
		carry, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			wd := trace.DevicePut(xs[0], ir.Device)
			n := trace.Tanh(trace.MatMul(c[0], wd))
			return []*trace.Array{n}, []*trace.Array{trace.DevicePut(n, ir.PinnedHost)}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(carry, ys...)
	}},
	{"scan_cond", []ir.Type{f32(3), f32(4, 3)}, func(x []*trace.Array) []*trace.Array {
		carry, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			r := trace.Cond(trace.Greater(trace.Sum(xs[0]), trace.Scalar(0)),
				func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Add(o[0], o[1])} },
				func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Mul(o[0], o[1])} },
				c[0], xs[0])
			return r, []*trace.Array{trace.Sum(r[0])}
		}, []*trace.Array{x[0]}, []*trace.Array{x[1]})
		return append(carry, ys...)
	}},
	{"while", []ir.Type{f32(4), f32(4)}, func(x []*trace.Array) []*trace.Array {
		return trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Less(s[0], trace.ScalarAs(6, ir.Int32))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Add(s[0], trace.ScalarAs(1, ir.Int32)), trace.Add(trace.Mul(s[1], x[1]), trace.Scalar(0.5))}
		}, trace.ScalarAs(0, ir.Int32), x[0])
	}},
	{"cond", []ir.Type{f32(5), f32(5)}, func(x []*trace.Array) []*trace.Array {
		return trace.Cond(trace.Greater(trace.Sum(x[0]), trace.Sum(x[1])),
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Sub(o[0], o[1]), o[1]} },
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{o[1], trace.Tanh(o[0])} },
			x[0], x[1])
	}},
	// Dots in the layouts cuBLASLt takes (batched, contracting either
	// operand's either axis) and its dtypes, plus an output fusion.
	{"batched_dots", []ir.Type{f32(3, 5, 4), f32(3, 6, 4), f32(4, 7)}, func(x []*trace.Array) []*trace.Array {
		a := trace.Einsum("bij,bkj->bik", x[0], x[1])
		c := trace.Einsum("bij,jk->bik", x[0], x[2])
		d := trace.Einsum("bji,bjk->bik", x[0], x[0])
		return []*trace.Array{a, trace.Tanh(c), d}
	}},
	{"bf16_dense", []ir.Type{ir.TypeOf(ir.BFloat16, 8, 16), ir.TypeOf(ir.BFloat16, 16, 8)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.MatMul(x[0], x[1])}
	}},
	{"f64_dense", []ir.Type{ir.TypeOf(ir.Float64, 9, 5), ir.TypeOf(ir.Float64, 7, 5)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Einsum("ik,jk->ij", x[0], x[1])}
	}},
	{"remat_offload", []ir.Type{f32(8, 8), f32(8, 8)}, func(x []*trace.Array) []*trace.Array {
		h := trace.Tanh(trace.MatMul(x[0], x[1]))
		off := trace.DevicePut(h, ir.PinnedHost)
		back := trace.DevicePut(off, ir.Device)
		return []*trace.Array{trace.Add(trace.CheckpointName(back, "h"), x[0]), off}
	}},
}

// inputs draws the programs' (float) arguments uniformly from [-1, 1).
var inputs = randprog.Values{Float: randprog.Range{Lo: -1, Hi: 1}, Int: randprog.Range{Lo: -5, Hi: 6}, Uint: randprog.Range{Lo: 0, Hi: 11}}

// Every program runs on every backend and matches eval: values, dtypes,
// shapes and memory spaces; no step of a backend that reports host steps
// (CUDA: ops without a device kernel, run by eval) runs on the host.
func TestProgramsOnBackends(t *testing.T) {
	for _, be := range Backends() {
		t.Run(be.Name, func(t *testing.T) {
			if be.Backend == nil {
				t.Skipf("%s backend unavailable: %v", be.Name, be.Err)
			}
			for _, p := range programs {
				t.Run(p.name, func(t *testing.T) {
					rng := testseed.Rand(t, 1)
					f := traceFn(t, p)
					var ins []*ir.Literal
					var bufs []trace.Buffer
					for _, prm := range f.Body.Params {
						l := inputs.Literal(rng, prm.Type)
						ins = append(ins, l)
						b, err := be.Backend.FromLiteral(l)
						if err != nil {
							t.Fatal(err)
						}
						bufs = append(bufs, b)
					}
					want, err := eval.Run(f, ins)
					if err != nil {
						t.Fatal(err)
					}
					exe, err := be.Backend.Compile(f, rt.CompileOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if hs, ok := exe.(interface{ HostSteps() []string }); ok && len(hs.HostSteps()) > 0 {
						t.Errorf("steps on the host: %q", hs.HostSteps())
					}
					outs, err := exe.Execute(bufs, rt.ExecOptions{})
					if err != nil {
						t.Fatal(err)
					}
					for i, w := range want {
						got, err := outs[i].Literal()
						if err != nil {
							t.Fatal(err)
						}
						if !got.Type.Equal(w.Type) {
							t.Fatalf("result %d is %v, want %v", i, got.Type, w.Type)
						}
						tol := 1e-4
						switch w.Type.DType {
						case ir.BFloat16:
							tol = 1.6e-2 // one bf16 ulp of the rounded result
						case ir.Float16:
							tol = 2e-3
						}
						for j := range w.Type.Size() {
							g, x := got.Float64At(j), w.Float64At(j)
							if math.Abs(g-x) > tol*(1+math.Abs(x)) {
								t.Fatalf("result %d element %d = %v, want %v", i, j, g, x)
							}
						}
					}
				})
			}
		})
	}
}
