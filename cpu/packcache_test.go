package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/cpu/gemm"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// compileOnCPU traces f over parameters like args and compiles it.
func compileOnCPU(t *testing.T, f func(ps []*trace.Array) []*trace.Array, donated []bool, args ...*trace.Array) backend.Executable {
	tr := trace.NewFuncTracer("f")
	var ps []*trace.Array
	for _, a := range args {
		ps = append(ps, tr.ParamLike(a))
	}
	tr.Push()
	rs := f(ps)
	tr.Pop()
	var outs []*ir.Value
	for _, r := range rs {
		outs = append(outs, tr.Output(r))
	}
	tr.Close()
	fn := tr.Func()
	fn.Body.Results = outs
	exe, err := cpuBackend{}.Compile(fn, backend.CompileOptions{Donated: donated})
	require.NoError(t, err)
	return exe
}

// TestPackedWeightsForgotten runs products whose weight is a call argument
// often enough for the matrix products to keep it packed, then reuses its
// memory for other values, by deleting it and allocating another array in
// its place and by donating it to a call that writes over it: every product
// must read the new values.
func TestPackedWeightsForgotten(t *testing.T) {
	SetMemoryForTest(t, backend.MemoryConfig{})
	r := testseed.Rand(t, 47)
	const m, k, n = 4, 48, 80
	rnd := func(size int) []float32 {
		s := make([]float32, size)
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
		return s
	}
	arr := func(xs []float32, shape ...int) *trace.Array {
		l, err := ir.LiteralOf(ir.Shape(shape), xs)
		require.NoError(t, err)
		b, err := newBuffer(l)
		require.NoError(t, err)
		return trace.FromBuffer(b)
	}
	x := arr(rnd(m*k), m, k)
	matmul := compileOnCPU(t, func(ps []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.DotGeneral(ps[0], ps[1], nil, nil, []int{1}, []int{0})}
	}, nil, x, arr(rnd(k*n), k, n))
	check := func(w []float32, wa *trace.Array, what string) {
		t.Helper()
		want := make([]float64, m*n) // the product in float64
		xs := x.Float32s()
		for i := range m {
			for p := range k {
				for j := range n {
					want[i*n+j] += float64(xs[i*k+p]) * float64(w[p*n+j])
				}
			}
		}
		for call := range 3 {
			res, err := matmul.Execute([]ir.Buffer{x.Buffer(), wa.Buffer()}, backend.ExecOptions{})
			require.NoError(t, err)
			got := trace.FromBuffer(res[0]).Float32s()
			for i, g := range got {
				if math.Abs(float64(g)-want[i]) > 1e-4 {
					t.Fatalf("%s, call %d: c[%d] = %v, want %v", what, call, i, g, want[i])
				}
			}
		}
	}
	w0 := rnd(k * n)
	a0 := arr(w0, k, n)
	hits := gemm.PackCache().Hits
	check(w0, a0, "first weight")
	require.Greater(t, gemm.PackCache().Hits, hits, "the weight was not kept packed")

	// Deleted, and its memory taken by another array.
	addr := addrOf(a0.Buffer().(*cpuBuffer).lit.Data)
	require.NoError(t, a0.Delete())
	w1 := rnd(k * n)
	a1 := arr(w1, k, n)
	require.Equal(t, addr, addrOf(a1.Buffer().(*cpuBuffer).lit.Data), "the allocator did not reuse the memory")
	check(w1, a1, "a new array in a deleted one's memory")

	// Donated to a call that writes its result over it.
	bump := compileOnCPU(t, func(ps []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Add(ps[0], trace.Full(ir.Shape{k, n}, 1, ir.Float32))}
	}, []bool{true}, a1)
	res, err := bump.Execute([]ir.Buffer{a1.Buffer()}, backend.ExecOptions{})
	require.NoError(t, err)
	a2 := trace.FromBuffer(res[0])
	require.Equal(t, addr, addrOf(a2.Buffer().(*cpuBuffer).lit.Data), "the donated memory was not reused")
	w2 := a2.Float32s()
	check(w2, a2, "a donated weight's memory")
}
