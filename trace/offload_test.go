package trace_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"reflect"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// hostWeights returns a fresh random f32[n,d,h] array in pinned_host and its
// values.
func hostWeights(t *testing.T, n, d, h int) (*trace.Array, []float32) {
	rng := testseed.Rand(t, 1)
	v := make([]float32, n*d*h)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return trace.DevicePut(rt.FromSlice(v, n, d, h), ir.PinnedHost), v
}

// Computing on a pinned_host array is an error at trace time (as in JAX),
// traced or eager, that names the op, the operand, the memory space and the
// caller's line and says what to do, instead of a silent copy to device.
func TestHostOperandErrors(t *testing.T) {
	w, _ := hostWeights(t, 3, 4, 5)
	x := rt.FromSlice([]float32{1, 2, 3, 4}, 4)
	m := trace.DevicePut(rt.FromSlice(make([]float32, 20), 5, 4), ir.PinnedHost)
	dev := trace.DevicePut(w, ir.Device)
	for _, c := range []struct {
		name, op string
		f        func(w *trace.Array) *trace.Array
		want     []string
	}{
		{"add", "add", func(w *trace.Array) *trace.Array { return trace.Add(w, w) }, nil},
		{"matmul", "dot_general", func(*trace.Array) *trace.Array { return trace.MatMul(trace.Index(dev, 0), m) }, nil},
		{"index along axis 0", "slice", func(w *trace.Array) *trace.Array { return trace.Index(w, 0) }, nil},
		{"sum", "reduce_sum", func(w *trace.Array) *trace.Array { return trace.Sum(w) }, nil},
		{"transpose to scan axis 1", "transpose", func(w *trace.Array) *trace.Array { return trace.Transpose(w, 1, 0, 2) }, []string{"axis 1", "scanned over axis 0 only"}},
		{"slice along axis 2", "slice", func(w *trace.Array) *trace.Array { return trace.SliceAxis(w, 2, 0, 1) }, []string{"axis 2"}},
		{"take along axis 1", "gather", func(w *trace.Array) *trace.Array { return trace.Take(w, rt.FromSlice([]int32{1}, 1), 1) }, []string{"axis 1"}},
	} {
		check := func(mode string, e *trace.Error, line int) {
			t.Helper()
			require.NotNil(t, e, "%s (%s): no error", c.name, mode)
			require.Equal(t, c.op, e.Op, "%s (%s): %v", c.name, mode, e)
			require.True(t, strings.HasSuffix(e.File, "offload_test.go"), "%s (%s): located at %s:%d", c.name, mode, e.File, e.Line)
			require.Equal(t, line, e.Line, "%s (%s): %v", c.name, mode, e)
			for _, s := range append([]string{"pinned_host", "trace.DevicePut(x, ir.Device)", "Scan"}, c.want...) {
				require.Contains(t, e.Msg, s, "%s (%s)", c.name, mode)
			}
		}
		// The op is called on the closure's (single) line.
		pc := reflect.ValueOf(c.f).Pointer()
		_, line := goruntime.FuncForPC(pc).FileLine(pc)
		// Eager, on the concrete array.
		check("eager", otCatch(func() { c.f(w) }), line)
		// Traced by Jit: the error comes back from Call.
		_, err := rt.NewJitted(func(w, x *trace.Array) *trace.Array { return c.f(w) }).Call(w, x)
		var te *trace.Error
		require.ErrorAs(t, err, &te, c.name)
		require.Contains(t, te.Msg, "pinned_host")
		check("traced", te, line)
	}
}

// What stays allowed on pinned_host arrays: DevicePut both ways, and
// Scan over them (axis 0), whose body moves each slice to device; the
// result is the float64 reference's.
func TestHostOperandScanAxis0(t *testing.T) {
	const n, d, h = 3, 2, 4
	w, wv := hostWeights(t, n, d, h)
	x := []float32{0.5, -1}
	got, err := rt.Jit(func(w, x *trace.Array) (*trace.Array, error) {
		c, _ := trace.Scan(func(c, ws []*trace.Array) ([]*trace.Array, []*trace.Array) {
			s := trace.Sum(trace.MatMul(trace.Reshape(c[0], 1, d), trace.DevicePut(ws[0], ir.Device)))
			return []*trace.Array{trace.Add(c[0], s)}, nil
		}, []*trace.Array{x}, []*trace.Array{w})
		return c[0], nil
	})(w, rt.FromSlice(x, d))
	require.NoError(t, err)
	c := []float64{float64(x[0]), float64(x[1])}
	for l := 0; l < n; l++ {
		var s float64
		for i := 0; i < d; i++ {
			for j := 0; j < h; j++ {
				s += c[i] * float64(wv[l*d*h+i*h+j])
			}
		}
		c[0], c[1] = c[0]+s, c[1]+s
	}
	require.Equal(t, ir.Device, got.Space())
	require.InDeltaSlice(t, c, got.Float64s(), 1e-4)
	back := trace.DevicePut(w, ir.Device)
	require.Equal(t, wv, back.Float32s())
}
