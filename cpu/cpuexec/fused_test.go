package cpuexec

import (
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// TestFusedUnrendered: the plan's kernels of single ops that block programs
// do not render (a gather's index rule, an arg reduction) run as the
// fallback, the oracle's kernel of the group, and give the oracle's result
// on fresh random operands; an elementwise op's kernel is rendered.
func TestFusedUnrendered(t *testing.T) {
	rng := testseed.Rand(t, 31)
	f := ir.NewFunc("f")
	x, ix := f.Body.AddParam(f32(5, 3)), f.Body.AddParam(ir.TypeOf(ir.Int32, 4))
	gather, err := f.Body.AddOp(ir.Gather, []*ir.Value{x, ix}, ir.Attrs{"axis": 0})
	require.NoError(t, err)
	argmax, err := f.Body.AddOp(ir.ArgMax, []*ir.Value{x}, ir.Attrs{"axis": 1, "dtype": ir.Int32})
	require.NoError(t, err)
	exp, err := f.Body.AddOp(ir.Exp, []*ir.Value{x}, nil)
	require.NoError(t, err)
	for _, op := range []*ir.Op{gather, argmax, exp} {
		pk, ok := passes.LowerOp(op)
		require.True(t, ok, "%v", op.Code)
		k, err := compileFusion(pk)
		require.NoError(t, err)
		if op == exp {
			require.Equal(t, modeLoop, k.mode)
			continue
		}
		require.Equal(t, modeFallback, k.mode, "%v", op.Code)
		args := randArgs(rng, f)[:len(op.Args)]
		want, err := eval.EvalOp(op, args)
		require.NoError(t, err)
		got := []*ir.Literal{ir.NewLiteral(op.Result().Type)}
		require.NoError(t, k.run(args, got))
		require.Equal(t, want[0].Data, got[0].Data, "%v", op.Code)
	}
}
