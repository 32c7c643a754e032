package runtime_test

import (
	"fmt"

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
// array it meets. ScalarOf has the dtype of its Go type.
func ExampleScalarOf() {
	x := rt.FromSlice([]float32{1, 2}, 2)
	fmt.Println(trace.Add(x, rt.Scalar(0.5)).DType())            // stays f32
	fmt.Println(trace.Add(x, rt.ScalarOf(float64(0.5))).DType()) // promoted to f64
	fmt.Println(rt.ScalarOf(int32(7)).DType(), rt.ScalarOf(int32(7)).Item())
	// Output:
	// f32
	// f64
	// i32 7
}
