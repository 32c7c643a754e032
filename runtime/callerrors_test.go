package runtime_test

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// An argument of the wrong Go type is an error naming its position, the
// type given and the type the function takes, at the caller's line; not a
// reflect panic.
func TestCallWrongArgumentType(t *testing.T) {
	f := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Neg(x) })
	_, _, line, _ := goruntime.Caller(0)
	_, err := f.Call(3.0)
	require.Error(t, err)
	require.Contains(t, err.Error(), fmt.Sprintf("callerrors_test.go:%d", line+1))
	require.Contains(t, err.Error(), "argument 0 has type float64, but the function takes *trace.Array there")
	require.NotContains(t, err.Error(), "reflect")

	g := rt.NewJitted(func(x *trace.Array, n int, ys []*trace.Array) *trace.Array { return trace.Add(x, ys[n]) })
	x := rt.FromSlice([]float32{1, 2}, 2)
	_, err = g.Call(x, "one", []*trace.Array{x})
	require.ErrorContains(t, err, "argument 1 has type string, but the function takes int there")
	_, err = g.Call(x, 0, x)
	require.ErrorContains(t, err, "argument 2 has type *trace.Array, but the function takes []*trace.Array there")
	out, err := g.Call(x, 0, []*trace.Array{x})
	require.NoError(t, err)
	require.Equal(t, []float32{2, 4}, out[0].(*trace.Array).Float32s())
}

// A budget no plan fits is returned by Call and by a jitted function with an
// error result, and is the *trace.Error (wrapping the *MemoryBudgetError) a
// function without one panics with, as Jit documents.
func TestImpossibleBudgetErrorPaths(t *testing.T) {
	x := trace.Full(ir.Shape{32, 32}, 1, ir.Float32)
	fn := func(x *trace.Array) *trace.Array { return trace.Sum(trace.MatMul(x, x)) }
	var mbe *rt.MemoryBudgetError
	_, err := rt.NewJitted(fn, rt.MemoryBudget(16)).Call(x)
	require.True(t, errors.As(err, &mbe), "%T %v", err, err)
	// Every figure is printed in a unit that fits it: the budget in bytes,
	// the 4 KiB matrices in KiB, never as "0.00 MiB".
	require.Contains(t, err.Error(), "no plan fits the memory budget of 16 B: the smallest budget that fits is ")
	require.Contains(t, err.Error(), "argument 4 KiB + output ")
	require.NotContains(t, err.Error(), "0.00")
	require.NotContains(t, err.Error(), "MiB")
	withErr := rt.Jit(func(x *trace.Array) (*trace.Array, error) { return fn(x), nil }, rt.MemoryBudget(16))
	_, err = withErr(x)
	require.True(t, errors.As(err, &mbe), "%T %v", err, err)
	for name, call := range map[string]func(){
		"one array": func() { rt.Jit(fn, rt.MemoryBudget(16))(x) },
		"two results": func() {
			rt.Jit(func(x *trace.Array) (*trace.Array, *trace.Array) { return fn(x), x }, rt.MemoryBudget(16))(x)
		},
	} {
		func() {
			defer func() {
				r := recover()
				te, ok := r.(*trace.Error)
				require.True(t, ok, "%s: panicked with %T, want *trace.Error", name, r)
				require.True(t, errors.As(te, &mbe), name)
				require.Contains(t, te.Error(), "callerrors_test.go", name)
				require.Contains(t, te.Error(), "no plan fits the memory budget of 16 B:", name)
				require.NotContains(t, te.Error(), "rt.Jit: rt.Jit", name)
			}()
			call()
		}()
	}
}
