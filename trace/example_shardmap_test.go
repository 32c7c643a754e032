package trace_test

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A row-parallel matmul (Megatron's pattern) over a mesh of 4 devices: x is
// split along its contracting dimension and w along its rows, so each device
// multiplies its column block of x by its row block of w, a partial product,
// and PSum adds the four partial products: the result, the same on every
// device, is x·w (out spec P(): replicated). Eagerly, the program runs whole
// on one device; jitted, it runs partitioned over the mesh's 4 devices
// (set FERRY_CPU_DEVICES=4 or rt.SetCPUDeviceCount(4) on the CPU), its
// result laid out over the mesh, and the per-device program multiplies one
// device's blocks and sums the four products with one all-reduce.
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
	fmt.Println(rt.Jit(rowParallel)(x, w)) // the same, compiled and partitioned
	fmt.Println(trace.MatMul(x, w))        // the unsharded product

	l, err := rt.Lower(rowParallel, x, w)
	if err != nil {
		panic(err)
	}
	c, err := l.Compile()
	if err != nil {
		panic(err)
	}
	prog := c.OptimizedIR()
	fmt.Println("per device:", strings.Count(prog, "dot_general("), "dot_general,", strings.Count(prog, "all_reduce("), "all_reduce")
	// Output:
	// f32[2,3] [[18 20 22] [2 0 2]]
	// f32[2,3]{sharding<mesh[x=4], [{},{}]>} [[18 20 22] [2 0 2]]
	// f32[2,3] [[18 20 22] [2 0 2]]
	// per device: 1 dot_general, 1 all_reduce
}
