package trace_test

import (
	"fmt"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Per-example gradients: Vmap of Grad over the examples, the parameters
// shared (closed over, so not mapped). The loss of one example is (w·x)², so
// its gradient is 2(w·x)x.
func ExampleVmap() {
	w := rt.FromSlice([]float32{1, 2}, 2)
	xs := rt.FromSlice([]float32{1, 0, 0, 1, 1, 1}, 3, 2) // three examples
	perExample := trace.Vmap(func(x *trace.Array) *trace.Array {
		return trace.Grad(func(w *trace.Array) *trace.Array {
			return trace.Square(trace.Dot(w, x))
		})(w)
	})
	fmt.Println(perExample(xs))
	fmt.Println(rt.Jit(perExample)(xs)) // the same, compiled
	// Output:
	// f32[3,2] [[2 0] [0 4] [6 6]]
	// f32[3,2] [[2 0] [0 4] [6 6]]
}

// InAxes and OutAxes place the mapped axis per leaf: here the examples are
// the columns of m, v is shared, and the results are stacked as columns.
func ExampleInAxes() {
	m := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3) // 3 examples of size 2
	v := rt.FromSlice([]float32{10, 100}, 2)
	scaled := trace.Vmap(func(x, v *trace.Array) *trace.Array { return trace.Mul(x, v) },
		trace.InAxes(1, trace.NotMapped), trace.OutAxes(1))
	fmt.Println(scaled(m, v))
	// Output:
	// f32[2,3] [[10 20 30] [400 500 600]]
}

// Collectives under a Vmap with an axis name (jax.vmap(f, axis_name='i')):
// each example is normalised by the sum over the batch, sees the whole batch
// with AllGather, and takes its left neighbour's value with PPermute (the
// first example, which no pair targets, gets zeros).
func ExamplePSum() {
	xs := rt.FromSlice([]float32{1, 3, 4}, 3)
	f := trace.Vmap(func(x *trace.Array) []*trace.Array {
		return []*trace.Array{
			trace.Div(x, trace.PSum(x, "batch")),
			trace.AllGather(x, "batch", 0, false),
			trace.PPermute(x, "batch", [][2]int{{0, 1}, {1, 2}}),
		}
	}, trace.AxisName("batch"))
	for _, y := range f(xs) {
		fmt.Println(y)
	}
	// Output:
	// f32[3] [0.125 0.375 0.5]
	// f32[3,3] [[1 3 4] [1 3 4] [1 3 4]]
	// f32[3] [0 1 3]
}
