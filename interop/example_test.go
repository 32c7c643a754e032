package interop_test

import (
	"fmt"

	"github.com/ferryml/ferry/interop"
	"gorgonia.org/tensor"
)

// A program imports the runtime for its executor:
//
//	import _ "github.com/ferryml/ferry/runtime"
//
// (these examples run with the tests' host executor instead).
func Example() {
	d := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}))
	if err := d.T(); err != nil { // a transposed view: FromDense reads it in its logical order
		panic(err)
	}
	a, err := interop.FromDense(d)
	if err != nil {
		panic(err)
	}
	fmt.Println(a)

	back, err := interop.ToDense(a)
	if err != nil {
		panic(err)
	}
	fmt.Println(back.Shape(), back.Dtype(), back.Data())

	s, _ := interop.FromDense(tensor.New(tensor.FromScalar(int(7)))) // Go int becomes int64
	fmt.Println(s)
	// Output:
	// f32[3,2] [[1 4] [2 5] [3 6]]
	// (3, 2) float32 [1 4 2 5 3 6]
	// i64[] 7
}
