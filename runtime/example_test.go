package runtime_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Jit a function over a struct of arrays; the second call hits the compile cache.
func ExampleJit() {
	type params struct{ W, B *trace.Array }
	predict := rt.NewJitted(func(p params, x *trace.Array) *trace.Array {
		return trace.Add(trace.MatMul(x, p.W), p.B)
	})
	p := params{W: rt.FromSlice([]float32{1, 0, 0, 2}, 2, 2), B: rt.FromSlice([]float32{10, 20}, 2)}
	y := predict.Fn()(p, rt.FromSlice([]float32{1, 2}, 1, 2))
	fmt.Println(y)
	y = predict.Fn()(p, rt.FromSlice([]float32{3, 4}, 1, 2))
	fmt.Println(y)
	fmt.Printf("%+v\n", predict.Stats())
	// Output:
	// f32[1,2] [[11 24]]
	// f32[1,2] [[13 28]]
	// {Hits:1 Misses:1}
}

// Lower gives the traced IR without running it.
func ExampleLower() {
	x := rt.FromSlice([]float32{1, 2, 3}, 3)
	low, err := rt.Lower(func(x *trace.Array) *trace.Array { return trace.Exp(trace.Neg(x)) }, x)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(low.Func.Body.Ops), "ops:", low.Func.Body.Ops[0].Code, low.Func.Body.Ops[1].Code)
	// Output:
	// 2 ops: neg exp
}

// Scalar is weakly typed, like a Python float in JAX: it takes the dtype of the
// array it meets. FromScalar has the dtype of its Go type.
func ExampleFromScalar() {
	x := rt.FromSlice([]float32{1, 2}, 2)
	fmt.Println(trace.Add(x, rt.Scalar(0.5)).DType())              // stays f32
	fmt.Println(trace.Add(x, rt.FromScalar(float64(0.5))).DType()) // promoted to f64
	fmt.Println(rt.FromScalar(int32(7)).DType(), rt.FromScalar(int32(7)).Item())
	// Output:
	// f32
	// f64
	// i32 7
}

// CostAnalysis counts a training step's arithmetic before it runs: here the
// forward products (2·8·16·32 + 2·8·32·4 = 10240 FLOPs) and the backward ones
// (the gradients of both weights and of the hidden layer, 12288; the input
// needs none), so that a step time becomes a FLOP rate.
func ExampleLowered_CostAnalysis() {
	type params struct{ W1, W2 *trace.Array }
	loss := func(p params, x *trace.Array) *trace.Array {
		return trace.Sum(trace.MatMul(trace.Tanh(trace.MatMul(x, p.W1)), p.W2))
	}
	step := func(p params, x *trace.Array) (*trace.Array, params) {
		return trace.ValueAndGrad(func(p params) *trace.Array { return loss(p, x) })(p)
	}
	p := params{W1: trace.Zeros(ir.Shape{16, 32}, ir.Float32), W2: trace.Zeros(ir.Shape{32, 4}, ir.Float32)}
	low, err := rt.Lower(step, p, trace.Zeros(ir.Shape{8, 16}, ir.Float32))
	if err != nil {
		panic(err)
	}
	c := low.CostAnalysis()
	fmt.Printf("matmul FLOPs %.0f, tanh %.0f\n", c.DotFlops, c.Transcendentals)
	// Output:
	// matmul FLOPs 22528, tanh 256
}
