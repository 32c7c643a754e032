package trace_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A row-parallel matmul (Megatron's pattern) over a mesh of 4 devices: x is
// split along its contracting dimension and w along its rows, so each device
// multiplies its column block of x by its row block of w, a partial product,
// and PSum adds the four partial products: the result, the same on every
// device, is x·w (out spec P(): replicated).
func ExampleShardMap() {
	mesh, err := ir.NewMesh([]int{4}, []string{"x"})
	if err != nil {
		panic(err)
	}
	rowParallel := trace.ShardMap(func(x, w *trace.Array) *trace.Array {
		// Here x is f32[2,2] and w f32[2,3]: one device's blocks.
		return trace.PSum(trace.MatMul(x, w), "x")
	}, mesh, []ir.PartitionSpec{ir.P("", "x"), ir.P("x", "")}, []ir.PartitionSpec{ir.P()})

	x := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6, 7, 8, 1, 0, 1, 0, 1, 0, 1, 0}, 2, 8)
	w := rt.FromSlice([]float32{
		1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1,
		1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, 8, 3)
	fmt.Println(rowParallel(x, w))
	fmt.Println(rt.Jit(rowParallel)(x, w)) // the same, compiled
	fmt.Println(trace.MatMul(x, w))        // the unsharded product
	// Output:
	// f32[2,3] [[18 20 22] [2 0 2]]
	// f32[2,3] [[18 20 22] [2 0 2]]
	// f32[2,3] [[18 20 22] [2 0 2]]
}
