package runtime_test

import (
	"errors"
	"fmt"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// With NaN checking on, a jitted call whose result holds a NaN says which op
// made it and where.
func ExampleSetDebugNans() {
	defer rt.SetDebugNans(rt.SetDebugNans(true))
	logOf := rt.Jit(func(x *trace.Array) (*trace.Array, error) {
		return trace.Log(trace.Sub(x, rt.Scalar(1))), nil
	})
	_, err := logOf(rt.FromSlice([]float32{2, 0.5, 3}))
	var ne *rt.NaNError
	if errors.As(err, &ne) {
		fmt.Println(ne.Op, ne.Value, "element", ne.Index)
	}
	// Output:
	// log NaN element 1
}
