package runtime_test

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// catchTraceError runs f and returns the *trace.Error it panics with (nil if none).
func catchTraceError(t *testing.T, f func()) (err *trace.Error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(*trace.Error)
			require.True(t, ok, "a *trace.Error panic, got %T %v", r, r)
			err = e
		}
	}()
	f()
	return nil
}

// Shapes whose element count or byte size wraps around an int are refused,
// naming the shape, wherever a user's shape makes an array.
func TestShapeOverflowRefused(t *testing.T) {
	_, err := rt.NewArray([]float32{1, 2, 3, 4}, (1<<62)+1, 4)
	require.ErrorContains(t, err, "shape [4611686018427387905,4] has more elements than an int holds")
	_, err = rt.NewArray([]float32{1}, 1<<32, 1<<32)
	require.ErrorContains(t, err, "[4294967296,4294967296]")
	_, err = rt.NewArray([]float32{1, 2, 3, 4}, 1<<61, 4) // 2^63 elements
	require.Error(t, err)
	_, err = rt.NewArray([]int64{}, 1<<61, 0) // no elements: fine
	require.NoError(t, err)
	_, err = rt.NewArray([]float32{1}, -1, -1)
	require.ErrorContains(t, err, "negative dimension")

	l := &ir.Literal{Type: ir.TypeOf(ir.Float32, 1<<62, 4), Data: make([]byte, 0)}
	_, err = rt.FromLiteral(l)
	require.ErrorContains(t, err, "shape [4611686018427387904,4]")
	_, err = ir.LiteralOf(ir.Shape{(1 << 62) + 1, 4}, []float32{1, 2, 3, 4})
	require.ErrorContains(t, err, "more elements than an int holds")

	x := rt.FromSlice([]float32{1, 2, 3, 4}, 4)
	for name, f := range map[string]func(){
		"Full":         func() { trace.Full(ir.Shape{1 << 62, 4}, 7, ir.Float32) },
		"Full bytes":   func() { trace.Full(ir.Shape{1 << 61}, 7, ir.Float32) }, // 2^63 bytes
		"Zeros":        func() { trace.Zeros(ir.Shape{1 << 40, 1 << 40}, ir.Int32) },
		"Ones":         func() { trace.Ones(ir.Shape{3, math.MaxInt}, ir.Bool) },
		"Iota":         func() { trace.Iota(ir.Int32, ir.Shape{1 << 40, 1 << 40}, 0) },
		"Reshape":      func() { trace.Reshape(x, (1<<62)+1, 4) },
		"Reshape -1":   func() { trace.Reshape(x, 1<<62, 1<<62, -1) },
		"BroadcastTo":  func() { trace.BroadcastTo(x, 1<<62, 4) },
		"BroadcastInD": func() { trace.BroadcastInDim(x, ir.Shape{1 << 62, 4}, []int{1}) },
	} {
		err := catchTraceError(t, f)
		require.NotNil(t, err, name)
		require.Contains(t, err.Error(), "overflow_test.go", name)
		require.Regexp(t, `shape \[.*\] (has more elements than an int holds|of f32|of i32|of bool)`, err.Error(), name)
	}
	// A traced op whose result would overflow: the concatenation of two
	// abstract arrays of 2^62 bytes each.
	big := trace.Abstract(ir.TypeOf(ir.Float32, 1<<60))
	_, err = rt.Lower(func(a, b *trace.Array) *trace.Array { return trace.Concatenate(0, a, b) }, big, big)
	require.Error(t, err)
	require.Contains(t, err.Error(), "shape [2305843009213693952] of f32 is larger than")
	var te *trace.Error
	require.True(t, errors.As(err, &te))
}

// ParseMemoryBudget refuses values that are not a positive byte count that
// fits in an int64, naming the value.
func TestParseMemoryBudgetRefusesOverflow(t *testing.T) {
	for _, s := range []string{"1e30T", "NaN K", "Inf G", "+Inf T", "nan", "inf", "1e300", "9223372036854775808", "8192P", "0.0000001K", "1e-9M", "-0K", "1e19"} {
		v, err := rt.ParseMemoryBudget(s)
		require.Error(t, err, "%q gave %d", s, v)
		require.Contains(t, err.Error(), s)
		require.Contains(t, err.Error(), rt.EnvMemoryBudget)
	}
	v, err := rt.ParseMemoryBudget("8191P") // ParseMemorySize: no P unit
	require.Error(t, err, "%d", v)
	v, err = rt.ParseMemoryBudget("7T")
	require.NoError(t, err)
	require.Equal(t, int64(7)<<40, v)
	v, err = rt.ParseMemoryBudget("0.5K")
	require.NoError(t, err)
	require.Equal(t, int64(512), v)
}
