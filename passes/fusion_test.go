package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// fusions returns the fusion ops of a region, in order.
func fusions(r *ir.Region) []*ir.Op {
	var out []*ir.Op
	for _, op := range r.Ops {
		if op.Code == ir.Fusion {
			out = append(out, op)
		}
	}
	return out
}

func codes(r *ir.Region) []string {
	var out []string
	for _, op := range r.Ops {
		s := op.Code.String()
		if op.Code == ir.Fusion {
			s += ":" + op.Attrs.String("kind")
		}
		out = append(out, s)
	}
	return out
}

// TestFusionGeluEpilogue is the goal: gelu(x @ w + b), tanh and erf
// forms, compiles to one output fusion (the product first, then the
// epilogue), whose only buffer is the program's output.
func TestFusionGeluEpilogue(t *testing.T) {
	for _, approx := range []bool{true, false} {
		f := traceFunc("mlp", func(a ...*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Gelu(trace.Add(trace.MatMul(a[0], a[1]), a[2]), approx)}
		}, ir.TypeOf(ir.Float32, 64, 32), ir.TypeOf(ir.Float32, 32, 128), ir.TypeOf(ir.Float32, 128))
		p := checkSame(t, f, passes.Options{})
		body := p.Func.Body
		require.Equal(t, []string{"fusion:output"}, codes(body), "%s", p.Func)
		fop := body.Ops[0]
		require.Equal(t, ir.DotGeneral, fop.Regions[0].Ops[0].Code, "the product comes first")
		require.Equal(t, body.Params, fop.Args, "operands are x, w, b in order")
		a := p.Analysis
		require.Zero(t, a.TempBytes)
		require.Equal(t, int64(64*128*4), a.OutputBytes)
		require.Equal(t, int64((64*32+32*128+128)*4), a.ArgumentBytes)
		require.Equal(t, passes.BufOutput, p.Plan.Values[body.Results[0]].Kind)
		require.Len(t, p.Plan.Values, 4, "x, w, b and the output: no intermediate gets a buffer")
	}
}

// TestFusionSoftmax: the max and the sum are input fusions with their
// elementwise producers; the normalisation is a loop fusion.
func TestFusionSoftmax(t *testing.T) {
	f := traceFunc("softmax", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Softmax(a[0], -1)}
	}, ir.TypeOf(ir.Float32, 8, 16))
	p := checkSame(t, f, passes.Options{})
	var kinds []string
	for _, op := range fusions(p.Func.Body) {
		kinds = append(kinds, op.Attrs.String("kind"))
	}
	require.Contains(t, kinds, passes.FusionInput, "%s", p.Func)
	require.Equal(t, passes.FusionLoop, kinds[len(kinds)-1], "%s", p.Func)
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Fusion && op.Attrs.String("kind") == passes.FusionInput {
			// Reductions' results leave the group: nothing in it reads them.
			red := map[*ir.Value]bool{}
			for _, in := range op.Regions[0].Ops {
				for _, a := range in.Args {
					require.False(t, red[a], "a reduction result is used inside its group:\n%s", op)
				}
				if in.Code == ir.ReduceSum || in.Code == ir.ReduceMax {
					red[in.Result()] = true
				}
			}
		}
	}
	// exp(x - max) is computed once: an output of the sum's group, read by
	// the normalisation.
	t.Logf("%s", p.Func)
}

// TestFusionSumOfExp: sum(exp(x)*2) is one input fusion whose only output is
// the reduction.
func TestFusionSumOfExp(t *testing.T) {
	f := traceFunc("sumexp", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Sum(trace.Mul(trace.Exp(a[0]), sc(2)), 1)}
	}, ir.TypeOf(ir.Float32, 8, 16))
	p := checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"fusion:input"}, codes(p.Func.Body), "%s", p.Func)
	require.Len(t, p.Func.Body.Ops[0].Results, 1)
	require.Zero(t, p.Analysis.TempBytes)
}

// TestFusionLongChain: a long elementwise chain with broadcast constants is
// one loop group with one result.
func TestFusionLongChain(t *testing.T) {
	f := traceFunc("chain", func(a ...*trace.Array) []*trace.Array {
		x := a[0]
		for i := range 20 {
			switch i % 4 {
			case 0:
				x = trace.Add(x, sc(float64(i)))
			case 1:
				x = trace.Tanh(x)
			case 2:
				x = trace.Mul(x, a[1])
			case 3:
				x = trace.Maximum(x, sc(0.25))
			}
		}
		return []*trace.Array{x}
	}, ir.TypeOf(ir.Float32, 16, 16), ir.TypeOf(ir.Float32, 16))
	p := checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"fusion:loop"}, codes(p.Func.Body), "%s", p.Func)
	require.Len(t, p.Func.Body.Ops[0].Results, 1)
	require.Zero(t, p.Analysis.TempBytes)
}

// TestFusionOutsideUse: a value of a group that is also used outside it (by
// a matrix product, and returned) becomes a result of the fusion op.
func TestFusionOutsideUse(t *testing.T) {
	f := traceFunc("outside", func(a ...*trace.Array) []*trace.Array {
		h := trace.Tanh(trace.Mul(a[0], sc(3)))
		y := trace.Exp(trace.Add(h, sc(1)))
		return []*trace.Array{y, trace.MatMul(h, a[1])}
	}, ir.TypeOf(ir.Float32, 4, 8), ir.TypeOf(ir.Float32, 8, 2))
	p := checkSame(t, f, passes.Options{})
	body := p.Func.Body
	require.Equal(t, []string{"fusion:loop", "dot_general"}, codes(body), "%s", p.Func)
	fop := body.Ops[0]
	require.Len(t, fop.Results, 2, "h and y")
	require.Same(t, fop.Results[1], body.Results[0])
	require.Same(t, fop.Results[0], body.Ops[1].Args[0])
}

// TestFusionTranspose: a transpose between elementwise ops joins their loop
// group (read through an index map), so the transposed intermediate is never
// materialised: vmap's OutAxes move and a cast after it cost no buffer.
func TestFusionTranspose(t *testing.T) {
	f := traceFunc("transpose", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Convert(trace.Transpose(trace.Tanh(a[0]), 1, 0, 2), ir.BFloat16)}
	}, ir.TypeOf(ir.Float32, 3, 4, 5))
	p := checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"fusion:loop"}, codes(p.Func.Body), "%s", p.Func)
	require.Zero(t, p.Analysis.TempBytes, "%s", p.Func)
}

// TestFusionNoCycle: exp(x) feeds both a matrix product and the product's
// epilogue; fusing exp with the epilogue would make a cycle, so exp stays
// out and the product and epilogue form the output group.
func TestFusionNoCycle(t *testing.T) {
	f := traceFunc("cycle", func(a ...*trace.Array) []*trace.Array {
		e := trace.Exp(a[0])
		d := trace.MatMul(e, a[1])
		return []*trace.Array{trace.Add(trace.Tanh(d), e)}
	}, ir.TypeOf(ir.Float32, 4, 4), ir.TypeOf(ir.Float32, 4, 4))
	p := checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"exp", "fusion:output"}, codes(p.Func.Body), "%s", p.Func)
}

// TestFusionReductionConsumer: what reads a reduction is not in the
// reduction's group. Without the recompute pass exp(x) is a second result of
// the reduction's fusion; with it, the division's fusion recomputes exp(x)
// from x and the reduction's fusion returns the sum only.
func TestFusionReductionConsumer(t *testing.T) {
	f := traceFunc("norm", func(a ...*trace.Array) []*trace.Array {
		e := trace.Exp(a[0])
		s := trace.KeepDims(trace.Sum(e, 1), e.Type().Shape, 1)
		return []*trace.Array{trace.Div(e, s)}
	}, ir.TypeOf(ir.Float32, 4, 8))
	p := checkSame(t, f, passes.Options{Disable: []string{"recompute"}})
	require.Equal(t, []string{"fusion:input", "fusion:loop"}, codes(p.Func.Body), "%s", p.Func)
	in := p.Func.Body.Ops[0]
	require.Len(t, in.Results, 2, "the sum and exp(x)")

	p = checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"fusion:input", "fusion:loop"}, codes(p.Func.Body), "%s", p.Func)
	in, loop := p.Func.Body.Ops[0], p.Func.Body.Ops[1]
	require.Len(t, in.Results, 1, "the sum only")
	require.Contains(t, loop.Args, p.Func.Body.Params[0], "the division's fusion reads x")
}

// TestFusionInScan: fusion happens inside scan bodies, not across the
// region boundary.
func TestFusionInScan(t *testing.T) {
	f := traceFunc("scanfuse", func(a ...*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Add(trace.MatMul(c[0], x[0]), sc(1)))
			return []*trace.Array{h}, []*trace.Array{trace.Exp(h)}
		}, []*trace.Array{trace.Exp(a[0])}, []*trace.Array{a[1]})
		return []*trace.Array{c[0], ys[0]}
	}, ir.TypeOf(ir.Float32, 4, 4), ir.TypeOf(ir.Float32, 3, 4, 4))
	p := checkSame(t, f, passes.Options{})
	var scan *ir.Op
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Scan {
			scan = op
		}
	}
	require.NotNil(t, scan)
	require.Equal(t, []string{"fusion:output"}, codes(scan.Regions[0]), "%s", p.Func)
	require.Len(t, scan.Regions[0].Ops[0].Results, 2)
}

// TestFusionDisabled: with fusion disabled no fusion op appears and results
// are the same.
func TestFusionDisabled(t *testing.T) {
	f := traceFunc("mlp", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.MatMul(a[0], a[1]), a[2]), true)}
	}, ir.TypeOf(ir.Float32, 4, 8), ir.TypeOf(ir.Float32, 8, 16), ir.TypeOf(ir.Float32, 16))
	p := checkSame(t, f, passes.Options{Disable: []string{"fusion"}})
	require.Empty(t, fusions(p.Func.Body))
	require.Positive(t, p.Analysis.TempBytes)
}

// sc records an f32 scalar constant in the function being traced.
func sc(v float64) *trace.Array {
	return trace.Apply1(ir.Constant, ir.Attrs{"value": ir.Scalar(float32(v))})
}

// TestFusionCopiesCausalMask: a comparison of iotas (a causal mask) is cheap:
// it is copied into every group that reads it, as iotas are, so no buffer of
// the mask exists, even when a reduction's group and a group that depends on
// the reduction both read it.
func TestFusionCopiesCausalMask(t *testing.T) {
	const n = 16
	f := traceFunc("mask", func(a ...*trace.Array) []*trace.Array {
		s := ir.Shape{n, n}
		mask := trace.BroadcastTo(trace.GreaterEqual(trace.Iota(ir.Int32, s, 0), trace.Iota(ir.Int32, s, 1)), 2, n, n)
		masked := trace.Where(mask, a[0], trace.ZerosLike(a[0]))
		sum := trace.Sum(masked, 2)
		scaled := trace.Div(a[0], trace.KeepDims(sum, ir.Shape{2, n, n}, 2))
		return []*trace.Array{trace.Where(mask, scaled, trace.ZerosLike(a[0]))}
	}, ir.TypeOf(ir.Float32, 2, n, n))
	p := checkSame(t, f, passes.Options{FusionInPlace: true})
	for _, op := range p.Func.Body.Ops {
		for _, v := range op.Results {
			require.NotEqual(t, ir.Bool, v.Type.DType, "the mask %v is stored:\n%s", v, p.Func)
		}
	}
}
