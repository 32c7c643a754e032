package passes_test

import (
	"fmt"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// TestExecScanText lowers a scan whose fused body reads a broadcast of a
// const, and reads the plan's text form: the loop's bindings (carry init,
// const, carry and xs parameters, the ys result computed in place in its
// slice) and the view of the broadcast leaf, composed from the view op.
func TestExecScanText(t *testing.T) {
	const L, n = 5, 4
	f := traceFunc("scan", func(a ...*trace.Array) []*trace.Array {
		w := a[0]
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			wb := trace.BroadcastInDim(w, ir.Shape{2, n}, []int{1})
			h := trace.Add(c[0], trace.Mul(x[0], wb)) // [2, n]
			return []*trace.Array{h}, []*trace.Array{trace.Neg(h)}
		}, []*trace.Array{a[1]}, []*trace.Array{a[2]})
		return append(c, ys...)
	}, ir.TypeOf(ir.Float32, n), ir.TypeOf(ir.Float32, 2, n), ir.TypeOf(ir.Float32, L, 2, n))
	p := compile(t, f, passes.Options{})
	ex, err := passes.Lower(p)
	require.NoError(t, err)
	text := ex.String()
	var loop *passes.Step
	for i := range ex.Top.Steps {
		if ex.Top.Steps[i].Kind == passes.StepLoop {
			loop = &ex.Top.Steps[i]
		}
	}
	require.NotNil(t, loop, "%s", text)
	lp := loop.Loop
	require.Equal(t, ir.Scan, lp.Code)
	require.Equal(t, L, lp.Length)
	for _, want := range []string{
		"init out0 <- arg1",
		"param 0 <- arg0",
		"param 1 <- out0",
		"param 2 <- arg2 slice i*32", // 2·n f32 of xs per iteration
		"result 0 -> out0",
		"result 1 -> out1 slice i*32 (in place)",
		"= arg0 view 0+[2:0,4:1]", // w broadcast along the leading axis
		"= kernel fusion loop(",
	} {
		require.Contains(t, text, want, "%s\n%s", p.Func, text)
	}
	require.Len(t, lp.Blocks, 1)
	require.Len(t, lp.Params, 3)
	require.Equal(t, passes.BindSlice, lp.Params[2].Kind)
	require.Equal(t, int64(2*n*4), lp.Params[2].Stride)
	require.Equal(t, int64(2*n*4), lp.Results[1].Stride)
}

// TestExecSteps: every op of the op table is either rendered as a kernel
// node (inside a fused group) or maps to a step kind outside one.
func TestExecSteps(t *testing.T) {
	for _, c := range ir.AllCodes() {
		info := c.Info()
		node := info.Elementwise || passes.IsReduce(c) || passes.KernelNodeOp(c)
		step := passes.StepKindOf(c)
		if info.NumRegions > 0 && c != ir.Fusion {
			require.Equal(t, passes.StepLoop, step, "%s", info.Name)
		}
		require.True(t, node || step != 0, "%s is neither a kernel node nor a step", info.Name)
		if step == passes.StepOp {
			require.Zero(t, info.NumRegions, "%s: a region op as a plain step", info.Name)
		}
	}
	require.Equal(t, passes.StepKernel, passes.StepKindOf(ir.Fusion))
	require.Equal(t, passes.StepMatmul, passes.StepKindOf(ir.DotGeneral))
	require.Equal(t, passes.StepCollective, passes.StepKindOf(ir.AllReduce))
}

// TestExecStagedCarries: a scan body returning its carries swapped reads
// each result from the other's destination, so the plan stages both; a
// carry returned unchanged is in place; a computed carry is neither.
func TestExecStagedCarries(t *testing.T) {
	const L, n = 3, 8
	f := traceFunc("swap", func(a ...*trace.Array) []*trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{c[1], c[0], c[2], trace.Add(c[3], x[0])}, nil
		}, []*trace.Array{a[0], a[1], a[2], a[3]}, []*trace.Array{a[4]})
		return c
	}, ir.TypeOf(ir.Float32, n), ir.TypeOf(ir.Float32, n), ir.TypeOf(ir.Float32, n), ir.TypeOf(ir.Float32, n), ir.TypeOf(ir.Float32, L, n))
	ex, err := passes.Lower(compile(t, f, passes.Options{}))
	require.NoError(t, err)
	var lp *passes.Loop
	for _, st := range ex.Top.Steps {
		if st.Loop != nil {
			lp = st.Loop
		}
	}
	require.NotNil(t, lp, "%s", ex)
	text := ex.String()
	want := []passes.ResultBind{{Out: 0, Stage: true}, {Out: 1, Stage: true}, {Out: 2, InPlace: true}, {Out: 3}}
	require.Equal(t, want, lp.Results, "%s", text)
	require.Contains(t, text, "result 0 -> out0 (staged)")
	require.Contains(t, text, "result 2 -> out2 (in place)")
}

// TestLowerOutputs: the plan says how each result gets its memory: its own
// buffer, a donated parameter's, or a copy (a parameter returned as it is,
// a value returned twice).
func TestLowerOutputs(t *testing.T) {
	f := ir.NewFunc("outs")
	x, y := f.Body.AddParam(ir.TypeOf(ir.Float32, 4)), f.Body.AddParam(ir.TypeOf(ir.Float32, 4))
	a, err := f.Body.AddOp(ir.Add, []*ir.Value{x, y}, nil)
	require.NoError(t, err)
	m, err := f.Body.AddOp(ir.Mul, []*ir.Value{x, y}, nil)
	require.NoError(t, err)
	f.Body.Results = []*ir.Value{a.Result(), m.Result(), y, m.Result()}
	ex, err := passes.Lower(compile(t, f, passes.Options{Donated: []bool{true, false}}))
	require.NoError(t, err)
	require.Len(t, ex.Outputs, 4)
	for i, o := range ex.Outputs {
		require.Equal(t, ex.Top.Results[i], o.Slot, "result %d", i)
	}
	got := make([]string, len(ex.Outputs))
	for i, o := range ex.Outputs {
		switch {
		case o.Alias >= 0:
			got[i] = fmt.Sprintf("alias %d", o.Alias)
		case o.Copy:
			got[i] = "copy"
		default:
			got[i] = "own"
		}
	}
	// The donated x takes the product (its last reader: the sum, computed
	// while x is still to be read, cannot); the product returned again is a
	// copy, and so is y, a parameter.
	require.Equal(t, []string{"own", "alias 0", "copy", "copy"}, got, "%s", ex)
	require.Contains(t, ex.String(), "result 1 = s3 in donated param 0")
	require.Contains(t, ex.String(), "result 3 = copy of s")
}
