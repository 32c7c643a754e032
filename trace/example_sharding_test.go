package trace_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A sharding constraint inside a jitted function lays a value out over a
// mesh of 4 devices (here: the rows of the product); the compiler
// propagates it to the operands and the result, and each device computes
// its block. The result comes back sharded.
func ExampleWithShardingConstraint() {
	mesh, err := ir.NewMesh([]int{4}, []string{"x"})
	if err != nil {
		panic(err)
	}
	rows, err := ir.NewNamedSharding(mesh, ir.P("x", ""))
	if err != nil {
		panic(err)
	}
	f := rt.Jit(func(a, b *trace.Array) *trace.Array {
		return trace.WithShardingConstraint(trace.MatMul(a, b), rows)
	})
	a := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6, 7, 8}, 4, 2)
	b := rt.FromSlice([]float32{1, 0, 0, 1}, 2, 2)
	y := f(a, b)
	fmt.Println(y)
	shards, err := rt.Shards(y)
	if err != nil {
		panic(err)
	}
	for _, s := range shards {
		fmt.Println(s.Device.ID, s.Start, s.Limit, s.Array.Float32s())
	}
	// Output:
	// f32[4,2]{sharding<mesh[x=4], [x,{}]>} [[1 2] [3 4] [5 6] [7 8]]
	// 0 [0 0] [1 2] [1 2]
	// 1 [1 0] [2 2] [3 4]
	// 2 [2 0] [3 2] [5 6]
	// 3 [3 0] [4 2] [7 8]
}
