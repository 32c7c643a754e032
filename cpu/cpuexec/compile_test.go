package cpuexec

import (
	"fmt"
	"testing"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// traceFunc traces fn over parameters of the given types into a function.
func traceFunc(t testing.TB, name string, params []ir.Type, fn func(xs []*trace.Array) []*trace.Array) *ir.Func {
	t.Helper()
	tr := trace.NewFuncTracer(name)
	var xs []*trace.Array
	for _, p := range params {
		xs = append(xs, tr.Param(p))
	}
	tr.Push()
	var ys []*trace.Array
	func() {
		defer tr.Pop()
		ys = fn(xs)
	}()
	f := tr.Func()
	require.Empty(t, tr.Captures(), "the traced function captured concrete arrays")
	for _, y := range ys {
		f.Body.Results = append(f.Body.Results, tr.Output(y))
	}
	return f
}

// fsc and isc are scalar constants recorded in the trace (trace.Scalar would
// need the runtime's eager executor).
func fsc(v float64) *trace.Array { return trace.Full(ir.Shape{}, v, ir.Float32) }
func isc(v int) *trace.Array     { return trace.Full(ir.Shape{}, float64(v), ir.Int32) }

func f32(dims ...int) ir.Type { return ir.TypeOf(ir.Float32, dims...) }

// compiled lists traced programs exercising the compiler's output: fused
// groups of every kind, reductions, products, scans with their gradients,
// while and cond.
var compiled = []struct {
	name   string
	params []ir.Type
	fn     func(xs []*trace.Array) []*trace.Array
}{
	{"gelu", []ir.Type{f32(16, 32), f32(32, 24), f32(24)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.MatMul(x[0], x[1]), x[2]), true)}
	}},
	{"mlp_grad", []ir.Type{f32(8, 12), f32(12, 20), f32(20), f32(20, 5), f32(5), f32(8, 5)}, func(x []*trace.Array) []*trace.Array {
		type P struct{ W1, B1, W2, B2 *trace.Array }
		loss := func(p P) *trace.Array {
			h := trace.Relu(trace.Add(trace.MatMul(x[0], p.W1), p.B1))
			logits := trace.Add(trace.MatMul(h, p.W2), p.B2)
			return trace.Neg(trace.Mean(trace.Sum(trace.Mul(trace.LogSoftmax(logits, 1), x[5]), 1)))
		}
		v, g := trace.ValueAndGrad(loss)(P{x[1], x[2], x[3], x[4]})
		return []*trace.Array{v, g.W1, g.B1, g.W2, g.B2}
	}},
	{"layernorm", []ir.Type{f32(6, 40), f32(40), f32(40)}, func(x []*trace.Array) []*trace.Array {
		m := trace.Mean(x[0], 1)
		c := trace.Sub(x[0], trace.ExpandDims(m, 1))
		v := trace.Mean(trace.Mul(c, c), 1)
		n := trace.Mul(c, trace.ExpandDims(trace.Rsqrt(trace.Add(v, fsc(1e-5))), 1))
		return []*trace.Array{trace.Add(trace.Mul(n, x[1]), x[2]), trace.Sum(x[0], 0), trace.Max(x[0], 0)}
	}},
	{"softmax_big", []ir.Type{f32(300, 500)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Softmax(x[0], 1), trace.LogSumExp(x[0], 0)}
	}},
	{"scan_layers_grad", []ir.Type{f32(4, 8), f32(3, 8, 16), f32(3, 16, 8)}, func(x []*trace.Array) []*trace.Array {
		type L struct{ W1, W2 *trace.Array }
		loss := func(l L) *trace.Array {
			c, _ := trace.Scan(func(c, w []*trace.Array) ([]*trace.Array, []*trace.Array) {
				h := trace.Tanh(trace.MatMul(c[0], w[0]))
				return []*trace.Array{trace.Add(c[0], trace.MatMul(h, w[1]))}, nil
			}, []*trace.Array{x[0]}, []*trace.Array{l.W1, l.W2})
			return trace.Sum(trace.Mul(c[0], c[0]))
		}
		v, g := trace.ValueAndGrad(loss)(L{x[1], x[2]})
		return []*trace.Array{v, g.W1, g.W2}
	}},
	{"scan_swap_reverse", []ir.Type{f32(3), f32(3), f32(7, 3)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{c[1], trace.Add(c[0], xs[0])}, []*trace.Array{trace.Mul(c[0], xs[0]), c[1]}
		}, []*trace.Array{x[0], x[1]}, []*trace.Array{x[2]}, trace.ScanReverse())
		return append(c, ys...)
	}},
	{"while_cond", []ir.Type{f32(5), ir.TypeOf(ir.Int32)}, func(x []*trace.Array) []*trace.Array {
		st := trace.While(func(s []*trace.Array) *trace.Array {
			return trace.Less(s[1], x[1])
		}, func(s []*trace.Array) []*trace.Array {
			odd := trace.Equal(trace.Rem(s[1], isc(2)), isc(1))
			v := trace.Cond(odd, func(o []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Mul(o[0], fsc(0.5))}
			}, func(o []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Add(trace.Exp(o[0]), fsc(-1))}
			}, s[0])
			return []*trace.Array{v[0], trace.Add(s[1], isc(1))}
		}, x[0], isc(0))
		return st
	}},
	{"sgd_step", []ir.Type{f32(64, 64), f32(64), f32(32, 64), f32(32, 64)}, func(x []*trace.Array) []*trace.Array {
		type P struct{ W, B *trace.Array }
		loss := func(p P) *trace.Array {
			d := trace.Sub(trace.Add(trace.MatMul(x[2], p.W), p.B), x[3])
			return trace.Mean(trace.Mul(d, d))
		}
		g := trace.Grad(loss)(P{x[0], x[1]})
		lr := fsc(0.1)
		return []*trace.Array{trace.Sub(x[0], trace.Mul(lr, g.W)), trace.Sub(x[1], trace.Mul(lr, g.B))}
	}},
	{"passthrough", []ir.Type{f32(4), f32(4)}, func(x []*trace.Array) []*trace.Array {
		s := trace.Add(x[0], x[1])
		return []*trace.Array{x[1], s, s, x[0]}
	}},
}

func TestCompiledPrograms(t *testing.T) {
	for _, c := range compiled {
		for _, opts := range []passes.Options{{}, {FusionInPlace: true}, {Disable: []string{"fusion"}}} {
			t.Run(fmt.Sprintf("%s/%v", c.name, opts), func(t *testing.T) {
				f := traceFunc(t, c.name, c.params, c.fn)
				if c.name == "sgd_step" {
					opts.Donated = []bool{true, true}
				}
				p, err := passes.Compile(f, opts)
				require.NoError(t, err)
				args := randArgs(newRand(), p.Func)
				if c.name == "while_cond" {
					args[1] = ir.Scalar(int32(5))
				}
				runBoth(t, p, args)
			})
		}
	}
}

// TestCompiledFusionModes checks that the compiler's groups run on the block
// program, not the eval fallback.
func TestCompiledFusionModes(t *testing.T) {
	for _, c := range compiled {
		f := traceFunc(t, c.name, c.params, c.fn)
		p, err := passes.Compile(f, passes.Options{})
		require.NoError(t, err)
		e, err := New(p)
		require.NoError(t, err)
		var walk func(g *region)
		walk = func(g *region) {
			for _, st := range g.steps {
				if st.fused != nil && st.fused.mode == modeFallback {
					t.Errorf("%s: %s group falls back to eval: %s", c.name, st.op.Attrs.String("kind"), st.fused.why)
				}
				for _, s := range st.subs {
					walk(s)
				}
			}
		}
		walk(e.body)
	}
}

// TestReluGradCompiles checks that the groups of a ReLU layer's training
// step (max(x·W+b, 0) and its gradient: compares of f32 values read only
// by selects) get compiled chains on AVX2 (the compares as vector masks)
// and compute what the reference executor does, JIT on and off.
func TestReluGradCompiles(t *testing.T) {
	f := traceFunc(t, "relu_step", []ir.Type{f32(64, 96), f32(96), f32(32, 64)}, func(x []*trace.Array) []*trace.Array {
		type P struct{ W, B *trace.Array }
		loss := func(p P) *trace.Array {
			h := trace.Relu(trace.Add(trace.MatMul(x[2], p.W), p.B))
			return trace.Mean(trace.Mul(h, h))
		}
		g := trace.Grad(loss)(P{x[0], x[1]})
		return []*trace.Array{g.W, g.B}
	})
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(t, err)
	args := edgeArgs(newRand(), p.Func)
	for _, on := range []bool{true, false} {
		prev := vmath.SetJIT(on)
		e, err := New(p)
		require.NoError(t, err)
		masked := 0
		for _, st := range e.body.steps {
			if st.fused == nil {
				continue
			}
			require.NotEqual(t, modeFallback, st.fused.mode, st.fused.why)
			for _, bp := range st.fused.progs {
				if bp.chain != nil && hasMaskOps(bp.code) {
					masked++
				}
			}
		}
		if want := on && vmath.JITAvailable(); want != (masked > 0) {
			t.Errorf("JIT %v (%s): %d compiled groups with compares and selects:\n%v", on, vmath.Impl(), masked, p.Func)
		}
		runBoth(t, p, args)
		vmath.SetJIT(prev)
	}
}
