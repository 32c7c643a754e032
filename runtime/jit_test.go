package runtime_test

import (
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func newRand(t *testing.T) *rand.Rand {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 1))
}

// refDense computes tanh(x @ w + b) in float64.
func refDense(x, w, b []float32, m, k, n int) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := float64(b[j])
			for p := 0; p < k; p++ {
				s += float64(x[i*k+p]) * float64(w[p*n+j])
			}
			out[i*n+j] = math.Tanh(s)
		}
	}
	return out
}

func requireClose(t *testing.T, want []float64, got []float32, tol float64) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.InDelta(t, want[i], float64(got[i]), tol*(1+math.Abs(want[i])), "element %d", i)
	}
}

type dense struct {
	W, B *trace.Array
	Name string // static: part of the cache key
}

type model struct {
	Layers []dense
	Scale  map[string]*trace.Array
}

func TestJitStructTree(t *testing.T) {
	r := newRand(t)
	m, k, n := 3, 4, 5
	xs, ws, bs := randSlice(r, m*k), randSlice(r, k*n), randSlice(r, n)
	x := rt.FromSlice(xs, m, k)
	mdl := model{
		Layers: []dense{{W: rt.FromSlice(ws, k, n), B: rt.FromSlice(bs, n), Name: "l0"}},
		Scale:  map[string]*trace.Array{"s": rt.FromSlice([]float32{2}, 1)},
	}
	f := rt.Jit(func(p model, x *trace.Array) (*trace.Array, model) {
		l := p.Layers[0]
		y := trace.Tanh(trace.Add(trace.MatMul(x, l.W), l.B))
		// Return an updated tree: the same structure, scaled weights.
		p2 := model{Layers: []dense{{W: trace.Mul(l.W, p.Scale["s"]), B: l.B, Name: l.Name}}, Scale: p.Scale}
		return y, p2
	})
	y, p2 := f(mdl, x)
	require.Equal(t, ir.Float32, y.DType())
	require.Equal(t, ir.Shape{m, n}, y.Shape())
	require.Equal(t, ir.Device, y.Space())
	requireClose(t, refDense(xs, ws, bs, m, k, n), y.Float32s(), 1e-5)
	require.Equal(t, "l0", p2.Layers[0].Name)
	want := make([]float64, len(ws))
	for i, v := range ws {
		want[i] = 2 * float64(v)
	}
	requireClose(t, want, p2.Layers[0].W.Float32s(), 1e-6)
	require.Equal(t, bs, p2.Layers[0].B.Float32s())
	require.False(t, p2.Layers[0].B == mdl.Layers[0].B, "outputs are new arrays")
}

func TestJitCacheHitsAndMisses(t *testing.T) {
	r := newRand(t)
	j := rt.NewJitted(func(d dense, x *trace.Array) *trace.Array {
		return trace.Add(trace.MatMul(x, d.W), d.B)
	})
	f := j.Fn()
	d := dense{W: rt.FromSlice(randSlice(r, 6), 3, 2), B: rt.FromSlice(randSlice(r, 2), 2), Name: "a"}
	f(d, rt.FromSlice(randSlice(r, 6), 2, 3))
	require.Equal(t, rt.CacheStats{Hits: 0, Misses: 1}, j.Stats())
	f(d, rt.FromSlice(randSlice(r, 6), 2, 3)) // new values, same signature
	require.Equal(t, rt.CacheStats{Hits: 1, Misses: 1}, j.Stats())
	f(d, rt.FromSlice(randSlice(r, 12), 4, 3)) // new shape
	require.Equal(t, rt.CacheStats{Hits: 1, Misses: 2}, j.Stats())
	d.Name = "b" // new static value
	f(d, rt.FromSlice(randSlice(r, 12), 4, 3))
	require.Equal(t, rt.CacheStats{Hits: 1, Misses: 3}, j.Stats())
	f(d, rt.FromSlice(randSlice(r, 12), 4, 3))
	require.Equal(t, rt.CacheStats{Hits: 2, Misses: 3}, j.Stats())
	// f64 inputs are another signature.
	g := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Exp(x) })
	g.Fn()(rt.FromSlice([]float32{1}, 1))
	g.Fn()(rt.FromSlice([]float64{1}, 1))
	require.Equal(t, rt.CacheStats{Hits: 0, Misses: 2}, g.Stats())
}

func TestJitShapeErrorNamesCallersLine(t *testing.T) {
	_, _, line, _ := goruntime.Caller(0)
	f := rt.Jit(func(x, y *trace.Array) (*trace.Array, error) {
		return trace.Add(x, y), nil // line+2: the bad call
	})
	_, err := f(rt.FromSlice([]float32{1, 2, 3}, 3), rt.FromSlice([]float32{1, 2}, 2))
	require.Error(t, err)
	var te *trace.Error
	require.True(t, errors.As(err, &te), "error %T is a *trace.Error", err)
	require.Contains(t, err.Error(), fmt.Sprintf("jit_test.go:%d", line+2))

	// Without an error result the jitted function panics with the *trace.Error.
	g := rt.Jit(func(x, y *trace.Array) *trace.Array {
		return trace.Add(x, y) // line+12
	})
	func() {
		defer func() {
			r := recover()
			require.NotNil(t, r)
			e, ok := r.(*trace.Error)
			require.True(t, ok, "panic value %T", r)
			require.Contains(t, e.Error(), fmt.Sprintf("jit_test.go:%d", line+12))
		}()
		g(rt.FromSlice([]float32{1, 2, 3}, 3), rt.FromSlice([]float32{1, 2}, 2))
	}()

	// The error-returning Call.
	_, err = rt.NewJitted(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) }).
		Call(rt.FromSlice([]float32{1, 2, 3}, 3), rt.FromSlice([]float32{1, 2}, 2))
	require.ErrorAs(t, err, &te)
}

func TestJitUserErrorResult(t *testing.T) {
	sentinel := errors.New("negative input")
	f := rt.Jit(func(x *trace.Array, fail bool) (*trace.Array, error) {
		if fail {
			return nil, sentinel
		}
		return trace.Neg(x), nil
	})
	_, err := f(rt.FromSlice([]float32{1}, 1), true)
	require.ErrorIs(t, err, sentinel)
	y, err := f(rt.FromSlice([]float32{1}, 1), false)
	require.NoError(t, err)
	require.Equal(t, []float32{-1}, y.Float32s())
}

func TestLowerAndCompile(t *testing.T) {
	r := newRand(t)
	fn := func(x, w, b *trace.Array) *trace.Array { return trace.Tanh(trace.Add(trace.MatMul(x, w), b)) }
	xs, ws, bs := randSlice(r, 8), randSlice(r, 12), randSlice(r, 3)
	x, w, b := rt.FromSlice(xs, 2, 4), rt.FromSlice(ws, 4, 3), rt.FromSlice(bs, 3)
	low, err := rt.Lower(fn, x, w, b)
	require.NoError(t, err)
	text := low.IR()
	for _, op := range []string{"dot_general", "broadcast_in_dim", "add", "tanh", "f32[2,4]", "f32[4,3]"} {
		require.Contains(t, text, op)
	}
	parsed, err := ir.Parse(text)
	require.NoError(t, err)
	require.Equal(t, text, parsed.String())
	c, err := low.Compile()
	require.NoError(t, err)
	outs, err := c.Call(x, w, b)
	require.NoError(t, err)
	requireClose(t, refDense(xs, ws, bs, 2, 4, 3), outs[0].(*trace.Array).Float32s(), 1e-5)
	// Wrong signature.
	_, err = c.Call(x, w, rt.FromSlice(bs[:2], 2))
	require.ErrorContains(t, err, "compiled for f32[3]")
}

func TestJitClosureAndNesting(t *testing.T) {
	r := newRand(t)
	cs := randSlice(r, 4)
	c := rt.FromSlice(cs, 4) // captured by the closure
	inner := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Mul(x, c) })
	outer := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Add(inner(x), x) })
	xs := randSlice(r, 4)
	y := outer.Fn()(rt.FromSlice(xs, 4))
	want := make([]float64, 4)
	for i := range xs {
		want[i] = float64(xs[i])*float64(cs[i]) + float64(xs[i])
	}
	requireClose(t, want, y.Float32s(), 1e-6)
	low, err := outer.Lower(rt.FromSlice(xs, 4))
	require.NoError(t, err)
	require.Len(t, low.Captured(), 1)
	require.Equal(t, 2, len(low.Func.Body.Params), "x and the captured c")
	// Eager call of the inner jitted function works too.
	y2 := inner(rt.FromSlice(xs, 4))
	require.Equal(t, ir.Shape{4}, y2.Shape())
}

func TestJitIdentityOutputIsACopy(t *testing.T) {
	x := rt.FromSlice([]float32{1, 2}, 2)
	y := rt.Jit(func(x *trace.Array) *trace.Array { return x })(x)
	require.Equal(t, []float32{1, 2}, y.Float32s())
	lx, _ := x.Literal()
	ly, _ := y.Literal()
	require.NotSame(t, &lx.Data[0], &ly.Data[0])
}

func TestLeakedTracerIsAnError(t *testing.T) {
	var leaked *trace.Array
	f := rt.Jit(func(x *trace.Array) *trace.Array {
		leaked = trace.Exp(x)
		return leaked
	})
	f(rt.FromSlice([]float32{1}, 1))
	g := rt.NewJitted(func(x *trace.Array) *trace.Array { return trace.Add(x, leaked) })
	_, err := g.Call(rt.FromSlice([]float32{1}, 1))
	require.ErrorContains(t, err, "leaked tracer")
	// Eager use of a leaked tracer is an error too.
	require.Panics(t, func() { trace.Exp(leaked) })
}

func TestEagerMatchesJit(t *testing.T) {
	r := newRand(t)
	fn := func(x, w *trace.Array) *trace.Array {
		return trace.Sum(trace.Logistic(trace.MatMul(x, w)), 1)
	}
	x, w := rt.FromSlice(randSlice(r, 12), 3, 4), rt.FromSlice(randSlice(r, 8), 4, 2)
	eager := fn(x, w)
	jit := rt.Jit(fn)(x, w)
	require.Equal(t, eager.Shape(), jit.Shape())
	require.InDeltaSlice(t, eager.Float64s(), jit.Float64s(), 1e-6)
	hits, _ := rt.EagerCacheStats()
	fn(x, w)
	hits2, _ := rt.EagerCacheStats()
	require.Greater(t, hits2, hits, "second eager run hits the per-op cache")
}

func TestArrayConstructionErrors(t *testing.T) {
	_, err := rt.NewArray([]float32{1, 2, 3}, 2, 2)
	require.ErrorContains(t, err, "holds 4 elements, got 3")
	require.Panics(t, func() { rt.FromSlice([]int32{1}, 2) })
	s := rt.FromScalar(float64(2.5))
	require.Equal(t, 0, s.Rank())
	require.Equal(t, 2.5, s.Item())
	require.True(t, strings.HasPrefix(rt.FromSlice([]int32{1, 2, 3, 4}, 2, 2).String(), "i32[2,2] [[1 2] [3 4]]"))
}

func TestDevices(t *testing.T) {
	d := rt.Devices()
	require.NotEmpty(t, d)
	require.Equal(t, "cpu", rt.DefaultBackend().Name())
}

func TestJitRejectsNonFunc(t *testing.T) {
	require.Panics(t, func() { rt.Jit(42) })
	_, err := rt.Lower(42)
	require.Error(t, err)
}
