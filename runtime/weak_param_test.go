package runtime_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// TestJitWeakScalarArgument checks that a weakly typed scalar argument
// (rt.Scalar) takes the other operand's dtype inside a jitted function as it
// does eagerly, and a strong one (rt.FromScalar) promotes, with the values of
// float64 math.
func TestJitWeakScalarArgument(t *testing.T) {
	add := rt.Jit(func(x, s *trace.Array) *trace.Array { return trace.Add(x, s) })
	for _, dt := range []ir.DType{ir.Float16, ir.BFloat16, ir.Float32, ir.Float64} {
		x := trace.Convert(rt.FromSlice([]float32{1, -2.5, 4}, 3), dt)
		for _, s := range []*trace.Array{rt.Scalar(0.5), rt.FromScalar(float32(0.5))} {
			eager := trace.Add(x, s)
			jitted := add(x, s)
			require.Equal(t, eager.Type(), jitted.Type(), "%v + scalar (weak %v)", dt, s.IsWeak())
			want := dt
			if !s.IsWeak() && (dt == ir.Float16 || dt == ir.BFloat16) {
				want = ir.Float32
			}
			require.Equal(t, want, jitted.DType(), "%v + scalar (weak %v)", dt, s.IsWeak())
			got := trace.Convert(jitted, ir.Float64).Float64s()
			require.Equal(t, []float64{1.5, -2, 4.5}, got)
		}
	}
}
