package runtime_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// debugNans turns NaN checking on (or off) for one test.
func debugNans(t *testing.T, on bool) {
	was := rt.SetDebugNans(on)
	t.Cleanup(func() { rt.SetDebugNans(was) })
}

// debugInfs turns Inf checking on (or off) for one test.
func debugInfs(t *testing.T, on bool) {
	was := rt.SetDebugInfs(on)
	t.Cleanup(func() { rt.SetDebugInfs(was) })
}

// catch runs f and returns the *trace.Error it panics with, or nil.
func catch(t *testing.T, f func()) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			e, ok := p.(error)
			require.True(t, ok, "panic with %T: %v", p, p)
			err = e
		}
	}()
	f()
	return nil
}

// requireNaNError checks that err is a *trace.Error wrapping a *rt.NaNError
// for op made at this test file's line.
func requireNaNError(t *testing.T, err error, op, value string, line int) *rt.NaNError {
	t.Helper()
	require.Error(t, err)
	t.Log(err)
	var te *trace.Error
	require.True(t, errors.As(err, &te), "%T: %v", err, err)
	var ne *rt.NaNError
	require.True(t, errors.As(err, &ne), "%T: %v", err, err)
	loc := fmt.Sprintf("runtime/debugnans_test.go:%d", line)
	require.Equal(t, op, ne.Op)
	require.Equal(t, value, ne.Value)
	require.Equal(t, loc, ne.Loc)
	require.Equal(t, loc, fmt.Sprintf("%s:%d", te.File, te.Line))
	require.Contains(t, err.Error(), loc+": "+op+": produced "+value)
	env := rt.EnvDebugNans
	if value != "NaN" {
		env = rt.EnvDebugInfs
	}
	require.Contains(t, err.Error(), "("+env+")")
	return ne
}

// positive returns n random values in [0.5, 2).
func positive(t *testing.T, n int) []float32 {
	r := newRand(t)
	s := make([]float32, n)
	for i := range s {
		s[i] = 0.5 + 1.5*r.Float32()
	}
	return s
}

func TestDebugNansEager(t *testing.T) {
	debugNans(t, true)
	x := rt.FromSlice(positive(t, 9))
	var line int
	err := catch(t, func() {
		d := trace.Sub(trace.Sub(x, x), rt.Scalar(1)) // -1, finite
		line = hereLine() + 1
		_ = trace.Log(d)
	})
	ne := requireNaNError(t, err, "log", "NaN", line)
	require.Empty(t, ne.Func)
	require.Zero(t, ne.Index)

	z := trace.Sub(x, x)
	err = catch(t, func() {
		line = hereLine() + 1
		_ = trace.Div(z, z)
	})
	requireNaNError(t, err, "div", "NaN", line)

	// An Inf from finite operands is no NaN, but Inf checking reports it.
	inf := trace.Div(x, z)
	require.True(t, math.IsInf(float64(inf.Float32s()[0]), 1))
	debugInfs(t, true)
	err = catch(t, func() {
		line = hereLine() + 1
		_ = trace.Div(x, z)
	})
	requireNaNError(t, err, "div", "+Inf", line)
	err = catch(t, func() {
		line = hereLine() + 1
		_ = trace.Log(z)
	})
	requireNaNError(t, err, "log", "-Inf", line)
	// Inf checking alone does not look for NaN.
	debugNans(t, false)
	require.True(t, math.IsNaN(float64(trace.Div(z, z).Float32s()[0])))
}

func TestDebugNansOffOrFromInputs(t *testing.T) {
	x := rt.FromSlice(positive(t, 5))
	debugNans(t, false)
	y := trace.Log(trace.Sub(trace.Sub(x, x), rt.Scalar(1)))
	for _, v := range y.Float32s() {
		require.True(t, math.IsNaN(float64(v)))
	}
	f := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Log(trace.Neg(x)) })
	require.True(t, math.IsNaN(float64(f(x).Float32s()[0])))

	debugNans(t, true)
	debugInfs(t, true)
	xs := positive(t, 5)
	xs[2] = float32(math.NaN())
	xn := rt.FromSlice(xs)
	// NaN in, NaN out: no error, eager or jitted.
	e := trace.Mul(trace.Log(xn), rt.Scalar(2))
	require.True(t, math.IsNaN(float64(e.Float32s()[2])))
	g := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Exp(trace.Log(trace.Add(x, x))) })
	out := g(xn).Float32s()
	require.True(t, math.IsNaN(float64(out[2])))
	require.InDelta(t, 2*float64(xs[0]), float64(out[0]), 1e-5)
	// A -inf constant (an attention mask, say) is no error, nor what it flows into.
	m := rt.Jit(func(x *trace.Array) *trace.Array {
		neg := trace.FullLike(x, math.Inf(-1))
		return trace.Where(trace.Greater(x, rt.Scalar(1)), x, neg)
	})
	// Nor is the -Inf that reduce_max gives an empty axis (Softmax's maximum).
	require.Equal(t, ir.Shape{0, 3}, trace.Softmax(rt.FromSlice([]float32{}, 0, 3), 0).Shape())
	masked := trace.Where(trace.Greater(x, rt.Scalar(1)), x, trace.FullLike(x, math.Inf(-1)))
	for k, v := range m(x).Float32s() {
		want := float32(math.Inf(-1))
		if xs := x.Float32s(); xs[k] > 1 {
			want = xs[k]
		}
		require.Equal(t, want, v)
		require.Equal(t, want, masked.Float32s()[k])
	}
}

func TestDebugNansJit(t *testing.T) {
	debugNans(t, true)
	xs := positive(t, 16)
	var line int
	f := rt.Jit(func(x *trace.Array) (*trace.Array, error) {
		d := trace.Sub(trace.Sub(x, x), rt.Scalar(1))
		line = hereLine() + 1
		l := trace.Log(d)
		return trace.Add(trace.Exp(x), trace.Mul(l, rt.Scalar(3))), nil
	})
	callLine := hereLine() + 1
	_, err := f(rt.FromSlice(xs))
	ne := requireNaNError(t, err, "log", "NaN", line)
	require.Contains(t, ne.Func, "TestDebugNansJit")
	require.Equal(t, fmt.Sprintf("runtime/debugnans_test.go:%d", callLine), ne.Call)
	require.Contains(t, err.Error(), "in jitted function "+ne.Func+" called at "+ne.Call)

	// 0/0 in a jitted function that also returns a finite result.
	var divLine int
	g := rt.Jit(func(x *trace.Array) (*trace.Array, *trace.Array) {
		z := trace.Sub(x, x)
		divLine = hereLine() + 1
		return trace.Tanh(x), trace.Div(z, z)
	})
	err = catch(t, func() { g(rt.FromSlice(xs)) })
	ne = requireNaNError(t, err, "div", "NaN", divLine)
	require.Zero(t, ne.Result) // div's only result
	require.Contains(t, err.Error(), "(element 0)")

	// The same through Lower and Compile, with the argument donated.
	h := rt.NewJitted(func(x *trace.Array) *trace.Array {
		return trace.Sqrt(trace.Sub(rt.Scalar(-1), x))
	}, rt.Donate(0))
	l, err := h.Lower(rt.FromSlice(xs))
	require.NoError(t, err)
	c, err := l.Compile()
	require.NoError(t, err)
	_, err = c.Call(rt.FromSlice(xs))
	var nerr *rt.NaNError
	require.ErrorAs(t, err, &nerr)
	require.Equal(t, "sqrt", nerr.Op)

	// A NaN made by the backward pass names the forward op it differentiates:
	// d/dx sqrt(x) at 0 is +Inf.
	debugInfs(t, true)
	var sqrtLine int
	gr := rt.Jit(trace.Grad(func(x *trace.Array) *trace.Array {
		sqrtLine = hereLine() + 1
		return trace.Sum(trace.Sqrt(x))
	}))
	xz := append([]float32{0}, xs[1:]...)
	err = catch(t, func() { gr(rt.FromSlice(xz)) })
	var gne *rt.NaNError
	require.ErrorAs(t, err, &gne)
	requireNaNError(t, err, gne.Op, "+Inf", sqrtLine) // whichever op of sqrt's VJP divides by 0
	t.Log("backward op:", gne.Op)

	// Off again: the same call returns its NaN.
	rt.SetDebugNans(false)
	rt.SetDebugInfs(false)
	out, err := f(rt.FromSlice(xs))
	require.NoError(t, err)
	require.True(t, math.IsNaN(float64(out.Float32s()[0])))
}

// TestDebugNansOnlyFloats: integer division by zero is defined (-1) and no
// error; f64 and bf16 NaNs are found.
func TestDebugNansDTypes(t *testing.T) {
	debugNans(t, true)
	i := rt.FromSlice([]int32{3, 4})
	require.Equal(t, []int32{-1, -1}, trace.Div(i, trace.Sub(i, i)).Int32s())
	for _, dt := range []ir.DType{ir.Float64, ir.BFloat16, ir.Float16} {
		x := trace.Convert(rt.FromSlice(positive(t, 3)), dt)
		var line int
		err := catch(t, func() {
			line = hereLine() + 1
			_ = trace.Sqrt(trace.Neg(x))
		})
		requireNaNError(t, err, "sqrt", "NaN", line)
	}
}

// TestDebugNansScan: a NaN made inside a scan's body is reported at the op in
// the body that made it, with the scan and the iteration.
func TestDebugNansScan(t *testing.T) {
	debugNans(t, true)
	v := positive(t, 12)
	for i := range v { // every x above 1.25 but one in a random row
		v[i] = 1.5 + v[i]
	}
	firstRow := newRand(t).IntN(4)
	v[firstRow*3+1] = 1
	var line, scanLine int
	f := rt.Jit(func(xs *trace.Array) (*trace.Array, error) {
		init := trace.ZerosLike(trace.Index(xs, 0))
		scanLine = hereLine() + 1
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			// log(x - 1.25) is NaN in the first row with an x below 1.25
			line = hereLine() + 1
			l := trace.Log(trace.Sub(x[0], rt.Scalar(1.25)))
			return []*trace.Array{trace.Add(c[0], l)}, nil
		}, []*trace.Array{init}, []*trace.Array{xs})
		return c[0], nil
	})
	_, err := f(rt.FromSlice(v, 4, 3))
	ne := requireNaNError(t, err, "log", "NaN", line)
	require.Equal(t, 1, ne.Index) // within the row the body sees
	require.Equal(t, fmt.Sprintf("scan iteration %d at runtime/debugnans_test.go:%d", firstRow, scanLine), ne.Region)
	require.Contains(t, err.Error(), "in "+ne.Region)
}

// TestDebugNansEnv runs this test binary again with FERRY_DEBUG_NANS and
// FERRY_DEBUG_INFS set.
func TestDebugNansEnv(t *testing.T) {
	if settings.TestDebugNansChild.Get() {
		x := rt.FromSlice([]float32{1, 2})
		nanErr := catch(t, func() { _ = trace.Log(trace.Neg(x)) }) != nil
		infErr := catch(t, func() { _ = trace.Log(trace.Sub(x, x)) }) != nil
		fmt.Printf("nans=%v/%v infs=%v/%v\n", rt.DebugNans(), nanErr, rt.DebugInfs(), infErr)
		return
	}
	for _, tc := range []struct {
		env        []string
		nans, infs bool
	}{
		{[]string{rt.EnvDebugNans + "=1"}, true, false},
		{[]string{rt.EnvDebugNans + "=true", rt.EnvDebugInfs + "=1"}, true, true},
		{[]string{rt.EnvDebugInfs + "=1"}, false, true},
		{[]string{rt.EnvDebugNans + "=0", rt.EnvDebugInfs + "=false"}, false, false},
		{nil, false, false},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDebugNansEnv$", "-test.v")
		cmd.Env = append(os.Environ(), "FERRY_TEST_DEBUG_NANS_CHILD=1", rt.EnvDebugNans+"=", rt.EnvDebugInfs+"=")
		cmd.Env = append(cmd.Env, tc.env...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), fmt.Sprintf("nans=%v/%v infs=%v/%v", tc.nans, tc.nans, tc.infs, tc.infs), "%v", tc.env)
	}
}
