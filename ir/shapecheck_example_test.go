package ir_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// CheckShape refuses shapes whose element count or byte size would wrap
// around an int.
func ExampleCheckShape() {
	fmt.Println(ir.CheckShape(ir.Shape{1024, 1024}, ir.Float32))
	fmt.Println(ir.CheckShape(ir.Shape{(1 << 62) + 1, 4}, ir.Float32))
	fmt.Println(ir.CheckShape(ir.Shape{1 << 61}, ir.Float32))
	// Output:
	// <nil>
	// shape [4611686018427387905,4] has more elements than an int holds (9223372036854775807)
	// shape [2305843009213693952] of f32 is larger than 9223372036854775807 bytes
}
