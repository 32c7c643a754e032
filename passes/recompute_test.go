package passes_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// withoutRecompute is the full pipeline (as the CPU backend runs it) with the
// recompute pass disabled.
func withoutRecompute() passes.Options {
	return passes.Options{FusionInPlace: true, Disable: []string{"recompute"}}
}

// TestRecomputeSoftmaxAndLayerNorm: the full-size value a reduction reads and
// the ops after it read again (exp(x − max) of a softmax, x − max of a log
// softmax, x − mean of a layer norm) is recomputed in the consumers' fusion
// instead of stored: the temps are the row vectors only. The results match
// the unoptimised function's, run by the reference interpreter and by the
// plan.
func TestRecomputeSoftmaxAndLayerNorm(t *testing.T) {
	const rows, cols = 64, 256
	row := int64(rows * 4)
	for _, c := range []struct {
		name  string
		fn    func(x *trace.Array) *trace.Array
		temps int64 // row vectors at the peak with recompute
	}{
		{"softmax", func(x *trace.Array) *trace.Array { return trace.Softmax(x, 1) }, 2},
		{"log_softmax", func(x *trace.Array) *trace.Array { return trace.LogSoftmax(x, 1) }, 2},
		{"layernorm", func(x *trace.Array) *trace.Array {
			mu := trace.ExpandDims(trace.Mean(x, 1), 1)
			xc := trace.Sub(x, mu)
			v := trace.ExpandDims(trace.Mean(trace.Mul(xc, xc), 1), 1)
			return trace.Mul(xc, trace.Rsqrt(v))
		}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := traceFunc(c.name, func(a ...*trace.Array) []*trace.Array { return []*trace.Array{c.fn(a[0])} }, ir.TypeOf(ir.Float32, rows, cols))
			before := checkSame(t, f, withoutRecompute())
			require.GreaterOrEqual(t, before.Analysis.TempBytes, int64(rows*cols*4), "without recompute a full-size value is stored:\n%s", before.Func)
			after := checkSame(t, f, passes.Options{FusionInPlace: true})
			require.LessOrEqual(t, after.Analysis.TempBytes, c.temps*row, "%s\n%s", after.Func, after.PlanString())
		})
	}
}

// TestRecomputeFromStoredProduct: the softmax of a matrix product recomputes
// the scaled scores and their exponentials from the product, which only elementwise chains and
// reductions read: the product is the one full-size temp (before, the scores
// and their exponentials were stored beside it).
func TestRecomputeFromStoredProduct(t *testing.T) {
	const m, n = 32, 128
	f := traceFunc("softmax_of_product", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Softmax(trace.Mul(trace.MatMul(a[0], a[1]), a[2]), 1)}
	}, ir.TypeOf(ir.Float32, m, 64), ir.TypeOf(ir.Float32, 64, n), ir.TypeOf(ir.Float32))
	before := checkSame(t, f, withoutRecompute())
	after := checkSame(t, f, passes.Options{FusionInPlace: true})
	require.Greater(t, before.Analysis.TempBytes, int64(m*n*4), "%s", before.PlanString())
	require.LessOrEqual(t, after.Analysis.TempBytes, int64(m*n*4+2*m*4), "%s\n%s", after.Func, after.PlanString())
}

// TestRecomputeKeepsSharedProduct: a product that another matrix product also
// reads is no leaf of a recomputed chain (keeping it longer would cost
// memory); the program is the same as without the pass.
func TestRecomputeKeepsSharedProduct(t *testing.T) {
	f := traceFunc("shared_product", func(a ...*trace.Array) []*trace.Array {
		p := trace.MatMul(a[0], a[1])
		return []*trace.Array{trace.Softmax(trace.Exp(p), 1), trace.MatMul(p, a[2])}
	}, ir.TypeOf(ir.Float32, 32, 64), ir.TypeOf(ir.Float32, 64, 128), ir.TypeOf(ir.Float32, 128, 8))
	before := checkSame(t, f, withoutRecompute())
	after := checkSame(t, f, passes.Options{FusionInPlace: true})
	require.Equal(t, before.Func.String(), after.Func.String())
	require.Equal(t, before.Analysis, after.Analysis)
}

// TestRecomputeNotFromDonated: a donated parameter is no leaf of a recomputed
// chain (reading it later would keep it from being reused for a result).
func TestRecomputeNotFromDonated(t *testing.T) {
	f := traceFunc("softmax", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Softmax(a[0], 1)}
	}, ir.TypeOf(ir.Float32, 64, 256))
	before := checkSame(t, f, passes.Options{FusionInPlace: true, Donated: []bool{true}, Disable: []string{"recompute"}})
	after := checkSame(t, f, passes.Options{FusionInPlace: true, Donated: []bool{true}})
	require.Equal(t, before.Func.String(), after.Func.String())
}

// TestRecomputeNotThroughSelect: a chain with a comparison or a select (a
// masked softmax) is not recomputed, since the CPU backend's fused loops
// evaluate those element by element: the program is the same as without the
// pass.
func TestRecomputeNotThroughSelect(t *testing.T) {
	f := traceFunc("masked_softmax", func(a ...*trace.Array) []*trace.Array {
		x := a[0]
		return []*trace.Array{trace.Softmax(trace.Where(trace.Greater(x, a[1]), x, a[1]), 1)}
	}, ir.TypeOf(ir.Float32, 32, 128), ir.TypeOf(ir.Float32, 32, 128))
	before := checkSame(t, f, withoutRecompute())
	after := checkSame(t, f, passes.Options{FusionInPlace: true})
	require.Equal(t, before.Func.String(), after.Func.String())
}
