package trace_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A while loop whose predicate depends on the example: the batched loop runs
// until every example is done, and each example keeps the state of its own
// last step.
func ExampleVmap_while() {
	halvings := trace.Vmap(func(x *trace.Array) *trace.Array {
		s := trace.While(func(s []*trace.Array) *trace.Array {
			return trace.GreaterEqual(s[0], trace.Scalar(1))
		}, func(s []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Div(s[0], trace.Scalar(2)), trace.Add(s[1], trace.ScalarAs(1, ir.Int32))}
		}, x, trace.ScalarAs(0, ir.Int32))
		return s[1]
	})
	fmt.Println(halvings(rt.FromSlice([]float32{0.5, 3, 100, 1}, 4)).Int32s())
	// Output: [0 2 7 1]
}

// Per-example gradients through a scan (Vmap of Grad): c = c*w + x over the
// steps of each example, with the weights w shared by every example, and the
// gradient of |c|² with respect to each step's x.
func ExampleVmap_scanGrad() {
	w := rt.FromSlice([]float32{0.5, 2}, 2)
	loss := func(xs *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Add(trace.Mul(c[0], w), x[0])}, nil
		}, []*trace.Array{trace.ZerosLike(w)}, []*trace.Array{xs})
		return trace.Sum(trace.Mul(c[0], c[0]))
	}
	perExample := trace.Vmap(trace.Grad(loss))
	xs := rt.FromSlice([]float32{1, 0, 0, 0, 0, 1, 0, 0}, 2, 2, 2) // 2 examples of 2 steps
	fmt.Println(perExample(xs))
	// Output: f32[2,2,2] [[[0.5 0] [1 0]] [[0 8] [0 4]]]
}
