package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// fromSlice copies xs into pool memory as a concrete array.
func fromSlice(t *testing.T, xs []float32, n int) *trace.Array {
	b, err := newBuffer(f32Literal(t, xs[:n]...))
	require.NoError(t, err)
	return trace.FromBuffer(b)
}

// addOnCPU traces x + y, compiles it with the CPU backend and runs it.
func addOnCPU(t *testing.T, x, y *trace.Array) *trace.Array {
	tr := trace.NewFuncTracer("add")
	px, py := tr.ParamLike(x), tr.ParamLike(y)
	tr.Push()
	r := trace.Add(px, py)
	tr.Pop()
	out := tr.Output(r)
	tr.Close()
	f := tr.Func()
	f.Body.Results = []*ir.Value{out}
	exe, err := cpuBackend{}.Compile(f, backend.CompileOptions{})
	require.NoError(t, err)
	res, err := exe.Execute([]trace.Buffer{x.Buffer(), y.Buffer()}, backend.ExecOptions{})
	require.NoError(t, err)
	return trace.FromBuffer(res[0])
}
