package trace_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// ScalarAs makes a scalar of a dtype given as a value, converting v as the
// convert op does; Scalar's dtype yields to the array it meets.
func ExampleScalarAs() {
	fmt.Println(trace.ScalarAs(0.5, ir.BFloat16))
	fmt.Println(trace.ScalarAs(-3.7, ir.Int32)) // truncated
	x := rt.FromSlice([]float32{1, 2})
	fmt.Println(trace.Add(x, trace.ScalarAs(1, ir.Float64)).DType()) // a strong f64 promotes
	fmt.Println(trace.Add(x, trace.Scalar(1)).DType())               // a weak scalar does not
	// Output:
	// bf16[] 0.5
	// i32[] -3
	// f64
	// f32
}
