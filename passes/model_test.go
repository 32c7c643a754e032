package passes_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

// layers is the model of REFERENCES.md §1: ten layers scanned over axis 0,
// each y = x @ w1[i]; x = y @ w2[i]; the loss is sum(final x).
type layers struct{ W1, W2 *trace.Array }

func layersLoss(x *trace.Array, p layers) *trace.Array {
	c, _ := trace.Scan(func(c, w []*trace.Array) ([]*trace.Array, []*trace.Array) {
		y := trace.MatMul(c[0], w[0])
		return []*trace.Array{trace.MatMul(y, w[1])}, nil
	}, []*trace.Array{x}, []*trace.Array{p.W1, p.W2})
	return trace.Sum(c[0])
}

// layersTypes are x f32[b,d], w1 f32[n,d,h], w2 f32[n,h,d].
func layersTypes(n, b, d, h int) []ir.Type {
	return []ir.Type{ir.TypeOf(ir.Float32, b, d), ir.TypeOf(ir.Float32, n, d, h), ir.TypeOf(ir.Float32, n, h, d)}
}

func layersForward(n, b, d, h int) *ir.Func {
	return traceFunc("layers", func(a ...*trace.Array) []*trace.Array {
		return []*trace.Array{layersLoss(a[0], layers{a[1], a[2]})}
	}, layersTypes(n, b, d, h)...)
}

// layersGrad is jit(grad(loss)) with respect to (w1, w2).
func layersGrad(n, b, d, h int) *ir.Func {
	return traceFunc("layers_grad", func(a ...*trace.Array) []*trace.Array {
		x := a[0]
		g := trace.Grad(func(p layers) *trace.Array { return layersLoss(x, p) })(layers{a[1], a[2]})
		return []*trace.Array{g.W1, g.W2}
	}, layersTypes(n, b, d, h)...)
}

// TestLayersForward checks the forward model's figures: the arguments are
// exactly 20.25 MiB; the temps are the carry and one layer's activations.
func TestLayersForward(t *testing.T) {
	f := layersForward(10, 256, 256, 1024)
	p := compile(t, f, passes.Options{})
	a := p.Analysis
	require.Equal(t, int64(20*mib+mib/4), a.ArgumentBytes)
	require.Equal(t, int64(4), a.OutputBytes)
	require.Zero(t, a.AliasBytes)
	require.Zero(t, a.HostTempBytes+a.HostArgumentBytes+a.HostOutputBytes)
	t.Logf("forward: %v", a)
	t.Logf("%s", passes.PeakLive(p, ir.Device))
	// The carry (256 KiB) plus the body's y (1 MiB) and new carry (256 KiB).
	require.LessOrEqual(t, a.TempBytes, int64(mib+mib/2))

	// The same program, small, computes what the traced one does, also when
	// run by the plan.
	checkSame(t, layersForward(3, 4, 5, 6), passes.Options{})
}

// TestLayersGrad compiles jit(grad(loss)) and checks the figures of
// REFERENCES.md §1: 20.25 MiB of arguments, 20 MiB of outputs (the
// gradients), no alias, and temps no larger than XLA's 17.25 MiB.
func TestLayersGrad(t *testing.T) {
	f := layersGrad(10, 256, 256, 1024)
	p := compile(t, f, passes.Options{})
	a := p.Analysis
	t.Logf("gradient: %v", a)
	pk := passes.PeakLive(p, ir.Device)
	t.Logf("%s", pk)
	require.Equal(t, a.TempBytes, pk.Bytes, "the arena is exactly its peak")
	require.Equal(t, int64(20*mib+mib/4), a.ArgumentBytes)
	require.Equal(t, int64(20*mib), a.OutputBytes)
	require.Zero(t, a.AliasBytes)
	require.LessOrEqual(t, a.TempBytes, int64(17*mib+mib/4))

	checkSame(t, layersGrad(3, 4, 5, 6), passes.Options{})
}

// checkSame compiles f and checks that the compiled function, and a run that
// follows the plan, give the original's results bit for bit.
func checkSame(t *testing.T, f *ir.Func, opts passes.Options) *passes.Program {
	t.Helper()
	p := compile(t, f, opts)
	rng := rand.New(rand.NewPCG(1, 2))
	args := randprog.Args(rng, f)
	want, err := eval.Run(f, args)
	require.NoError(t, err)
	got, err := eval.Run(p.Func, args)
	require.NoError(t, err)
	require.NoError(t, sameResults(want, got), "compiled\n%s", p.Func)
	planned, err := runPlan(p, args)
	require.NoError(t, err)
	require.NoError(t, sameResults(want, planned), "by the plan\n%s\n%s", p.Func, p.PlanString())
	return p
}
