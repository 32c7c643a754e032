package trace_test

// Shared helpers of the op tests: a float64 reference tensor with row-major
// index arithmetic written here (no Ferry ops), random inputs, and comparison.

import (
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// The runtime registers the eager executor in its init.
var _ = rt.FromSlice[float32]

// otTensor is the float64 reference of an array: shape and row-major data.
type otTensor struct {
	shape []int
	data  []float64
}

func otNumel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func otNew(shape ...int) otTensor {
	return otTensor{shape: append([]int{}, shape...), data: make([]float64, otNumel(shape))}
}

// otUnravel converts a flat row-major index into a multi-index.
func otUnravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// otRavel converts a multi-index into a flat row-major index.
func otRavel(idx, shape []int) int {
	f := 0
	for d := range shape {
		f = f*shape[d] + idx[d]
	}
	return f
}

func (t otTensor) at(idx ...int) float64 { return t.data[otRavel(idx, t.shape)] }

// otBcastAt reads t at an index of a broadcast result (right-aligned, size-1
// dims repeat).
func (t otTensor) bcastAt(out []int) float64 {
	off := len(out) - len(t.shape)
	idx := make([]int, len(t.shape))
	for d := range t.shape {
		if t.shape[d] != 1 {
			idx[d] = out[off+d]
		}
	}
	return t.at(idx...)
}

// otBcastShape is NumPy broadcasting of shapes (ok false when incompatible).
func otBcastShape(shapes ...[]int) ([]int, bool) {
	r := 0
	for _, s := range shapes {
		r = max(r, len(s))
	}
	out := make([]int, r)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		for i, d := range s {
			j := r - len(s) + i
			if d == out[j] || d == 1 {
				continue
			}
			if out[j] != 1 {
				return nil, false
			}
			out[j] = d
		}
	}
	return out, true
}

// otMap2 is the reference of a broadcasting binary op.
func otMap2(a, b otTensor, f func(x, y float64) float64) otTensor {
	s, ok := otBcastShape(a.shape, b.shape)
	if !ok {
		panic("otMap2: shapes do not broadcast")
	}
	out := otNew(s...)
	for i := range out.data {
		idx := otUnravel(i, s)
		out.data[i] = f(a.bcastAt(idx), b.bcastAt(idx))
	}
	return out
}

func otMap1(a otTensor, f func(float64) float64) otTensor {
	out := otNew(a.shape...)
	for i, v := range a.data {
		out.data[i] = f(v)
	}
	return out
}

// otRand returns a generator seeded from the test's seed (internal/testkit/testseed:
// fresh, or $FERRY_TEST_SEED; printed when the test fails).
func otRand(t testing.TB) *rand.Rand {
	return testseed.Rand(t, 0x9e3779b97f4a7c15)
}

type otGen func(r *rand.Rand) float64

func otNormal(r *rand.Rand) float64 { return r.NormFloat64() }

func otUniform(lo, hi float64) otGen {
	return func(r *rand.Rand) float64 { return lo + (hi-lo)*r.Float64() }
}

func otInts(lo, hi int) otGen {
	return func(r *rand.Rand) float64 { return float64(lo + r.IntN(hi-lo+1)) }
}

// otNonZero draws magnitudes in [lo, hi] with a random sign.
func otNonZero(lo, hi float64) otGen {
	return func(r *rand.Rand) float64 {
		v := lo + (hi-lo)*r.Float64()
		if r.IntN(2) == 0 {
			return -v
		}
		return v
	}
}

// otMake returns a concrete array of dtype dt with elements from gen, and its
// exact values (after rounding to dt) as the reference.
func otMake(r *rand.Rand, dt ir.DType, gen otGen, shape ...int) (*trace.Array, otTensor) {
	l := ir.NewLiteral(ir.TypeOf(dt, shape...))
	for i := 0; i < otNumel(shape); i++ {
		l.SetFloat64At(i, gen(r))
	}
	return trace.FromLiteral(l), otTensor{shape: append([]int{}, shape...), data: l.Float64s()}
}

// otFrom returns a concrete array of dtype dt holding vals.
func otFrom(dt ir.DType, vals []float64, shape ...int) *trace.Array {
	l := ir.NewLiteral(ir.TypeOf(dt, shape...))
	for i, v := range vals {
		l.SetFloat64At(i, v)
	}
	return trace.FromLiteral(l)
}

// otRound rounds v to dt as the convert op does.
func otRound(v float64, dt ir.DType) float64 {
	l := ir.NewLiteral(ir.TypeOf(dt))
	l.SetFloat64At(0, v)
	return l.Float64At(0)
}

// otTol is the relative tolerance of results in dt (computed through at most a
// few roundings).
func otTol(dt ir.DType) float64 {
	switch dt {
	case ir.Float64:
		return 1e-12
	case ir.Float32:
		return 2e-6
	case ir.Float16:
		return 2e-3
	case ir.BFloat16:
		return 1.6e-2
	}
	return 0
}

// otCheck compares got with the reference want rounded to dt: dtype, shape and
// every value (NaN matches NaN; tolerance tol relative to max(1, |want|)).
func otCheck(t *testing.T, name string, got *trace.Array, dt ir.DType, want otTensor, tol float64) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: got a nil array", name)
		return
	}
	if got.DType() != dt {
		t.Errorf("%s: dtype %v, want %v", name, got.DType(), dt)
		return
	}
	if !got.Shape().Equal(ir.Shape(want.shape)) {
		t.Errorf("%s: shape %v, want %v", name, got.Shape(), ir.Shape(want.shape))
		return
	}
	vals := got.Float64s()
	bad := 0
	for i, g := range vals {
		w := otRound(want.data[i], dt)
		if !otClose(g, w, tol) {
			if bad < 5 {
				t.Errorf("%s: element %v = %v, want %v", name, otUnravel(i, want.shape), g, w)
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d elements differ", name, bad)
	}
}

func otClose(g, w, tol float64) bool {
	switch {
	case math.IsNaN(w) || math.IsNaN(g):
		return math.IsNaN(w) && math.IsNaN(g)
	case math.IsInf(w, 0) || math.IsInf(g, 0):
		return g == w
	}
	return math.Abs(g-w) <= tol*math.Max(1, math.Abs(w))
}

// otCatch runs f and returns the *trace.Error it panicked with (nil if none).
func otCatch(f func()) (err *trace.Error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		e, ok := r.(*trace.Error)
		if !ok {
			if er, isErr := r.(error); isErr && errors.As(er, &e) {
				return
			}
			panic(r)
		}
		err = e
	}()
	f()
	return nil
}

// otCatchLine runs f, which must be written on the caller's line, and returns
// the error it panicked with and that line.
func otCatchLine(f func()) (*trace.Error, int) {
	_, _, line, _ := goruntime.Caller(1)
	return otCatch(f), line
}

// otExpectError checks that f panics with a *trace.Error of op whose message
// contains every fragment.
func otExpectError(t *testing.T, op string, f func(), fragments ...string) {
	t.Helper()
	err := otCatch(f)
	if err == nil {
		t.Errorf("%s: no error, want one containing %q", op, fragments)
		return
	}
	if err.Op != op {
		t.Errorf("error op %q, want %q (%v)", err.Op, op, err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s: error %q does not contain %q", op, err.Error(), f)
		}
	}
}

// otShapes are shapes used across tests: scalars, size-1 and empty dims.
var otShapes = [][]int{{}, {1}, {5}, {0}, {2, 3}, {3, 1, 4}, {2, 0, 3}}

func otName(parts ...any) string {
	s := make([]string, len(parts))
	for i, p := range parts {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, "/")
}

// otTrace traces f on parameters of the given types and returns the ops
// recorded in the function body and f's result.
func otTrace(f func(args ...*trace.Array) *trace.Array, types ...ir.Type) ([]*ir.Op, *trace.Array) {
	tr := trace.NewFuncTracer("test")
	params := make([]*trace.Array, len(types))
	for i, ty := range types {
		params[i] = tr.Param(ty)
	}
	tr.Push()
	defer tr.Close()
	defer tr.Pop()
	out := f(params...)
	return tr.Func().Body.Ops, out
}

// otCodes returns the op codes in ops.
func otCodes(ops []*ir.Op) map[ir.Code]int {
	m := map[ir.Code]int{}
	for _, op := range ops {
		m[op.Code]++
	}
	return m
}
