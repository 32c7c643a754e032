package runtime_test

import (
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// BenchmarkJitScalarAdd measures the dispatch cost of a cached jitted call:
// a+b on two float32 scalars, deleting the result as a user loop would.
func BenchmarkJitScalarAdd(b *testing.B) {
	add := rt.Jit(func(x, y *trace.Array) *trace.Array { return trace.Add(x, y) })
	x, y := rt.FromScalar(float32(1.5)), rt.FromScalar(float32(2.25))
	if got := add(x, y).Float32s(); got[0] != 3.75 {
		b.Fatalf("1.5+2.25 = %v", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := add(x, y).Delete(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEagerAdd measures one eager op on two small concrete arrays,
// deleting the result as a user loop would.
func BenchmarkEagerAdd(b *testing.B) {
	x := rt.FromSlice([]float32{1, 2, 3, 4})
	y := rt.FromSlice([]float32{0.5, 0.25, 0.125, 1})
	if got := trace.Add(x, y).Float32s(); got[3] != 5 {
		b.Fatalf("x+y = %v", got)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := trace.Add(x, y).Delete(); err != nil {
			b.Fatal(err)
		}
	}
}
