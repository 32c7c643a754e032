package runtime_test

import (
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// BenchmarkScanIteration measures what a scan costs per iteration beyond
// its body: a jitted scan of 1024 steps whose body adds one f32[8] row of
// xs to an f32[8] carry and emits the sum as a row of ys. b.N counts
// iterations (ns/op is the cost of one), so the figure is the per-iteration
// set-up of the scan (slicing xs, writing ys, running the body's program)
// that the training-step speed goals measure.
func BenchmarkScanIteration(b *testing.B) {
	const steps, width = 1024, 8
	xs := make([]float32, steps*width)
	for i := range xs {
		xs[i] = float32(i % 7)
	}
	x := rt.FromSlice(xs, steps, width)
	c0 := rt.FromSlice(make([]float32, width), width)
	f := rt.Jit(func(c, x *trace.Array) (*trace.Array, *trace.Array) {
		cs, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			s := trace.Add(c[0], x[0])
			return []*trace.Array{s}, []*trace.Array{s}
		}, []*trace.Array{c}, []*trace.Array{x})
		return cs[0], ys[0]
	})
	c, y := f(c0, x) // compile
	for j, got := range c.Float32s() {
		want := float32(0)
		for i := range steps {
			want += xs[i*width+j]
		}
		if got != want {
			b.Fatalf("carry[%d] = %v, want %v", j, got, want)
		}
	}
	del := func(as ...*trace.Array) {
		for _, a := range as {
			if err := a.Delete(); err != nil {
				b.Fatal(err)
			}
		}
	}
	del(c, y)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += steps {
		del(f(c0, x))
	}
}
