package trace_test

import (
	"fmt"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Linear regression: the gradient of the mean squared error with respect to a
// params struct comes back as a params struct.
func ExampleGrad() {
	type Params struct{ W, B *trace.Array }
	x := rt.FromSlice([]float32{1, 2, 3}, 3)
	y := rt.FromSlice([]float32{3, 5, 7}, 3)
	loss := func(p Params) *trace.Array {
		d := trace.Sub(trace.Add(trace.Mul(p.W, x), p.B), y)
		return trace.Mean(trace.Mul(d, d))
	}
	p := Params{W: rt.FromScalar[float32](1), B: rt.FromScalar[float32](0)}
	g := trace.Grad(loss)(p)
	fmt.Println("dW:", g.W)
	fmt.Println("dB:", g.B)

	// The same, compiled: a jitted gradient step of plain SGD.
	step := rt.Jit(func(p Params) Params {
		g := trace.Grad(loss)(p)
		lr := trace.Scalar(0.05)
		return Params{W: trace.Sub(p.W, trace.Mul(lr, g.W)), B: trace.Sub(p.B, trace.Mul(lr, g.B))}
	})
	for range 500 {
		p = step(p)
	}
	fmt.Printf("fit: y = %.2f x + %.2f\n", p.W.Item(), p.B.Item())
	// Output:
	// dW: f32[] -13.333333
	// dB: f32[] -6
	// fit: y = 2.00 x + 1.00
}

// A running sum and the squares of the inputs, as lax.scan computes them, and
// the gradient through the loop.
func ExampleScan() {
	xs := rt.FromSlice([]float32{1, 2, 3, 4}, 4)
	cumsum := func(xs *trace.Array) (*trace.Array, *trace.Array) {
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			s := trace.Add(c[0], x[0])
			return []*trace.Array{s}, []*trace.Array{s}
		}, []*trace.Array{rt.FromScalar[float32](0)}, []*trace.Array{xs})
		return c[0], ys[0]
	}
	total, running := cumsum(xs)
	fmt.Println(total, running)

	// d/dx_i of the sum of the running sums is the number of sums x_i is in.
	g := trace.Grad(func(xs *trace.Array) *trace.Array {
		_, running := cumsum(xs)
		return trace.Sum(running)
	})(xs)
	fmt.Println(g)
	// Output:
	// f32[] 10 f32[4] [1 3 6 10]
	// f32[4] [4 3 2 1]
}
