package runtime_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// refLinear computes a*x + b*y + c*z (terms with a nil operand left out) in
// float64.
func refLinear(a, b, c float64, x, y, z []float32) []float64 {
	out := make([]float64, len(x))
	for i := range out {
		out[i] = a * float64(x[i])
		if y != nil {
			out[i] += b * float64(y[i])
		}
		if z != nil {
			out[i] += c * float64(z[i])
		}
	}
	return out
}

// TestJitCommonSignatures calls jitted functions of one to three arrays
// returning an array, with and without an error result (the signatures
// called without reflection), and checks results against float64
// references, errors and panics for bad shapes, and a nil result.
func TestJitCommonSignatures(t *testing.T) {
	r := newRand(t)
	n := 2 + r.IntN(8) // bad (n+1 elements) never broadcasts against n
	xs, ys, zs := randSlice(r, n), randSlice(r, n), randSlice(r, n)
	x, y, z := rt.FromSlice(xs, n), rt.FromSlice(ys, n), rt.FromSlice(zs, n)
	two, three := trace.Scalar(2), trace.Scalar(3)

	f1 := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Mul(x, two) })
	f2 := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Sub(x, y) })
	f3 := rt.Jit(func(x, y, z *trace.Array) *trace.Array { return trace.Add(trace.Add(x, y), trace.Mul(z, three)) })
	e1 := rt.Jit(func(x *trace.Array) (*trace.Array, error) { return trace.Neg(x), nil })
	e2 := rt.Jit(func(x, y *trace.Array) (*trace.Array, error) { return trace.Mul(x, y), nil })
	e3 := rt.Jit(func(x, y, z *trace.Array) (*trace.Array, error) { return trace.Sub(trace.Sub(x, y), z), nil })
	for range 3 { // the first call compiles, the others hit the cache
		requireClose(t, refLinear(2, 0, 0, xs, nil, nil), f1(x).Float32s(), 1e-6)
		requireClose(t, refLinear(1, -1, 0, xs, ys, nil), f2(x, y).Float32s(), 1e-6)
		requireClose(t, refLinear(1, 1, 3, xs, ys, zs), f3(x, y, z).Float32s(), 1e-6)
		got, err := e1(x)
		require.NoError(t, err)
		requireClose(t, refLinear(-1, 0, 0, xs, nil, nil), got.Float32s(), 0)
		got, err = e2(x, y)
		require.NoError(t, err)
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(xs[i]) * float64(ys[i])
		}
		requireClose(t, want, got.Float32s(), 1e-6)
		got, err = e3(x, y, z)
		require.NoError(t, err)
		requireClose(t, refLinear(1, -1, -1, xs, ys, zs), got.Float32s(), 1e-6)
	}

	bad := rt.FromSlice(randSlice(r, n+1), n+1)
	_, err := e2(x, bad)
	var te *trace.Error
	require.ErrorAs(t, err, &te)
	_, err = e3(x, y, bad)
	require.ErrorAs(t, err, &te)
	func() {
		defer func() {
			_, ok := recover().(*trace.Error)
			require.True(t, ok, "a *trace.Error panic without an error result")
		}()
		f3(x, y, bad)
	}()
	require.Panics(t, func() { f2(x, nil) }, "a nil argument")

	none := rt.Jit(func(x *trace.Array) *trace.Array { return nil })
	require.Nil(t, none(x))
	first := rt.Jit(func(x, y *trace.Array) (*trace.Array, error) { return trace.Add(x, y), nil })
	got, err := first(x, y)
	require.NoError(t, err)
	requireClose(t, refLinear(1, 1, 0, xs, ys, nil), got.Float32s(), 1e-6)
}

// TestJitConcurrentCalls calls one jitted function from several goroutines
// with fresh arrays of two shapes (the two compiles race with cached calls)
// and checks every result: the per-call scratch memory and the executor's
// frames are never shared between calls in flight. Run it with -race too.
func TestJitConcurrentCalls(t *testing.T) {
	f := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Tanh(trace.Add(trace.Mul(x, y), x)) })
	seed := newRand(t).Uint64()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			for it := range 20 {
				n := 3 + (g+it)%2 // two shapes
				xs, ys := randSlice(r, n), randSlice(r, n)
				out := f(rt.FromSlice(xs, n), rt.FromSlice(ys, n))
				got := out.Float32s()
				for i := range xs {
					want := math.Tanh(float64(xs[i])*float64(ys[i]) + float64(xs[i]))
					if math.Abs(float64(got[i])-want) > 1e-5 {
						errs <- fmt.Errorf("goroutine %d, call %d: element %d = %v, want %v", g, it, i, got[i], want)
						return
					}
				}
				if it%2 == 0 {
					if err := out.Delete(); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestJitResultsFreedWhenUnreachable drops the results of jitted calls
// without deleting them: results of the common signatures, of a function
// with two results (called through reflection), and of a chain of donated
// steps all return their memory to the pool once unreachable, and a
// deleted one at once.
func TestJitResultsFreedWhenUnreachable(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	r := newRand(t)
	xs, ys := randSlice(r, 100), randSlice(r, 100)
	x, y := rt.FromSlice(xs, 100), rt.FromSlice(ys, 100)
	inputs := deviceStats().BytesInUse // two arrays of 448 bytes
	require.Equal(t, int64(2*448), inputs)

	add := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	both := rt.Jit(func(x, y *trace.Array) (*trace.Array, *trace.Array) { return trace.Mul(x, y), trace.Sub(x, y) })
	step := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Mul(x, trace.Scalar(0.5)) }, rt.Donate(0))
	func() {
		for range 10 {
			s := add(x, y)
			p, d := both(x, y)
			c := step(add(x, y))
			for range 3 {
				c = step(c)
			}
			for i := range xs {
				require.InDelta(t, float64(xs[i])+float64(ys[i]), float64(s.Float32s()[i]), 1e-6)
				require.InDelta(t, float64(xs[i])*float64(ys[i]), float64(p.Float32s()[i]), 1e-6)
				require.InDelta(t, float64(xs[i])-float64(ys[i]), float64(d.Float32s()[i]), 1e-6)
				require.InDelta(t, (float64(xs[i])+float64(ys[i]))/16, float64(c.Float32s()[i]), 1e-6)
			}
		}
	}()
	require.Greater(t, deviceStats().BytesInUse, inputs)
	waitFreed(t, inputs)

	s := add(x, y)
	require.Equal(t, inputs+448, deviceStats().BytesInUse)
	require.NoError(t, s.Delete())
	require.Equal(t, inputs, deviceStats().BytesInUse)
	require.Empty(t, rt.LiveArrays()[2:], "only x and y are live")
}

// TestJitSignatureChangesBetweenCalls alternates the argument signature of
// one jitted function call by call (shape, dtype, weak or strong scalar):
// a call never runs the executable of the previous call's signature.
func TestJitSignatureChangesBetweenCalls(t *testing.T) {
	r := newRand(t)
	f := rt.NewJitted(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	add := f.Fn()
	xs3, xs4 := randSlice(r, 3), randSlice(r, 4)
	x3, x4 := rt.FromSlice(xs3, 3), rt.FromSlice(xs4, 4)
	ds := make([]float64, 3)
	for i := range ds {
		ds[i] = r.NormFloat64()
	}
	d3 := rt.FromSlice(ds, 3)
	weak, strong := rt.Scalar(0.5), rt.FromScalar(0.5) // f32 (weak) and f64
	for range 3 {
		got := add(x3, weak)
		require.Equal(t, ir.Float32, got.DType())
		requireClose(t, refLinear(1, 0, 0, xs3, nil, nil), trace.Sub(got, weak).Float32s(), 1e-6)
		got = add(x3, strong)
		require.Equal(t, ir.Float64, got.DType())
		require.Equal(t, ir.Shape{3}, got.Shape())
		got = add(x4, weak)
		require.Equal(t, ir.Shape{4}, got.Shape())
		requireClose(t, refLinear(1, 0, 0, xs4, nil, nil), trace.Sub(got, weak).Float32s(), 1e-6)
		// Weak and strong f32 scalars differ only in weakness, which is
		// part of the signature: two entries (see the misses below).
		h := trace.Convert(x3, ir.Float16)
		add(h, weak)
		add(h, rt.FromScalar(float32(0.5)))
		got = add(d3, weak)
		require.Equal(t, ir.Float64, got.DType())
		for i, v := range got.Float64s() {
			require.Equal(t, ds[i]+0.5, v)
		}
	}
	require.Equal(t, rt.CacheStats{Hits: 12, Misses: 6}, f.Stats())
}

// TestEagerOpsConcurrent runs eager ops from several goroutines on fresh
// arrays of a few shapes and dtypes (compiles racing with cached calls;
// pooled per-op memory never shared) and checks every result against
// float64 references. Run it with -race too.
func TestEagerOpsConcurrent(t *testing.T) {
	seed := newRand(t).Uint64()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			for it := range 20 {
				n := 2 + (g+it)%3
				xs, ys := randSlice(r, n), randSlice(r, n)
				x, y := rt.FromSlice(xs, n), rt.FromSlice(ys, n)
				sum := trace.Add(x, y).Float32s()
				prod := trace.Mul(x, trace.Scalar(3)).Float32s() // promotes the weak scalar
				red := trace.Sum(trace.Mul(x, y)).Float32s()
				var dot float64
				for i := range xs {
					dot += float64(xs[i]) * float64(ys[i])
					if math.Abs(float64(sum[i])-(float64(xs[i])+float64(ys[i]))) > 1e-6 ||
						math.Abs(float64(prod[i])-3*float64(xs[i])) > 1e-5 {
						errs <- fmt.Errorf("goroutine %d, op %d: element %d: sum %v, product %v", g, it, i, sum[i], prod[i])
						return
					}
				}
				if math.Abs(float64(red[0])-dot) > 1e-5 {
					errs <- fmt.Errorf("goroutine %d, op %d: sum of products %v, want %v", g, it, red[0], dot)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestEagerBadOperandsNameTheLine applies an op to operands it does not
// accept, twice: each time the error names the caller's line, and the
// failed compile is not cached.
func TestEagerBadOperandsNameTheLine(t *testing.T) {
	x, y := rt.FromSlice([]float32{1, 2, 3}, 3), rt.FromSlice([]float32{1, 2}, 2)
	for range 2 {
		_, _, line, _ := goruntime.Caller(0)
		func() {
			defer func() {
				e, ok := recover().(*trace.Error)
				require.True(t, ok, "a *trace.Error panic")
				require.Contains(t, e.Error(), fmt.Sprintf("dispatch_test.go:%d", line+8))
				require.Contains(t, e.Error(), "add")
			}()
			trace.Apply1(ir.Add, nil, x, y) // no broadcasting at this level
		}()
	}
}

// TestDispatchAllocations pins down what a cached dispatch allocates (the
// result array and its buffer, which holds the literal and a finalizer; the
// pool recycles records): a jitted call of a two-array function and an
// eager op.
func TestDispatchAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random")
	}
	add := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	x, y := rt.FromSlice([]float32{1, 2, 3, 4}), rt.FromSlice([]float32{4, 3, 2, 1})
	jit := func() { require.NoError(t, add(x, y).Delete()) }
	eager := func() { require.NoError(t, trace.Add(x, y).Delete()) }
	jit()
	eager()
	require.LessOrEqual(t, testing.AllocsPerRun(200, jit), 2.0, "jitted call")
	require.LessOrEqual(t, testing.AllocsPerRun(200, eager), 2.0, "eager op")
}

// TestLiveArraysTypesAreCopies modifies the shapes LiveArrays reports for
// jitted results (whose records share the executable's result types): the
// next report and the next call's result are unchanged.
func TestLiveArraysTypesAreCopies(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	twice := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Add(x, x) })
	x := rt.FromSlice([]float32{1, 2, 3}, 3)
	y := twice(x)
	for _, l := range rt.LiveArrays() {
		require.Equal(t, ir.Shape{3}, l.Type.Shape)
		l.Type.Shape[0] = 99
	}
	for _, l := range rt.LiveArrays() {
		require.Equal(t, ir.Shape{3}, l.Type.Shape)
	}
	require.Equal(t, []float32{2, 4, 6}, twice(x).Float32s())
	require.Equal(t, []float32{2, 4, 6}, y.Float32s())
}
