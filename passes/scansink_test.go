package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// TestScanSink: a cast (and a negation before it) of a scan's stacked output
// moves into the body, so the scan stacks bf16 values and no f32 stack is
// ever stored: the program's temps drop from the f32 stack to one layer's
// worth. A stack also read elsewhere, or a carry, stays as it is.
func TestScanSink(t *testing.T) {
	const L, n = 6, 1024
	stack := func(a ...*trace.Array) []*trace.Array {
		_, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Add(c[0], x[0]))
			return []*trace.Array{h}, []*trace.Array{trace.Mul(h, h)}
		}, []*trace.Array{a[0]}, []*trace.Array{a[1]})
		return ys
	}
	types := []ir.Type{ir.TypeOf(ir.Float32, n), ir.TypeOf(ir.Float32, L, n)}
	f := traceFunc("sink", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Convert(trace.Neg(stack(a...)[0]), ir.BFloat16)}
	}, types...)
	p := checkSame(t, f, passes.Options{})
	require.Equal(t, []string{"scan"}, codes(p.Func.Body), "%s", p.Func)
	scan := p.Func.Body.Ops[0]
	require.Equal(t, ir.BFloat16, scan.Results[1].Type.DType, "%s", p.Func)
	require.Less(t, p.Analysis.TempBytes, int64(L*n*4), "no f32 stack: %s", p.Func)
	off := checkSame(t, f, passes.Options{Disable: []string{"scan-sink"}})
	require.GreaterOrEqual(t, off.Analysis.TempBytes, int64(L*n*4), "without the pass the f32 stack is stored: %s", off.Func)

	// The f32 stack is returned too: nothing moves.
	g := traceFunc("shared", func(a ...*trace.Array) []*trace.Array {
		ys := stack(a...)[0]
		return []*trace.Array{trace.Convert(ys, ir.BFloat16), ys}
	}, types...)
	p = checkSame(t, g, passes.Options{})
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Scan {
			require.Equal(t, ir.Float32, op.Results[1].Type.DType, "%s", p.Func)
		}
	}
}
