package trace_test

import (
	"fmt"
	"math"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

func ExampleAdd() {
	x := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	row := rt.FromSlice([]float32{10, 20, 30}) // broadcasts over the rows
	fmt.Println(trace.Add(x, row))
	// A weakly typed scalar takes the array's dtype.
	fmt.Println(trace.Mul(x, trace.Scalar(0.5)))
	// An integer array with a float array promotes to the float.
	fmt.Println(trace.Add(rt.FromSlice([]int32{1, 2}), rt.FromSlice([]float64{0.25, 0.5})))
	// Output:
	// f32[2,3] [[11 22 33] [14 25 36]]
	// f32[2,3] [[0.5 1 1.5] [2 2.5 3]]
	// f64[2] [1.25 2.5]
}

func ExampleMatMul() {
	a := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	b := rt.FromSlice([]float32{1, 0, 0, 1, 1, 1}, 3, 2)
	fmt.Println(trace.MatMul(a, b))
	// A vector on the right is a column vector; its axis is dropped.
	fmt.Println(trace.MatMul(a, rt.FromSlice([]float32{1, 1, 1})))
	// Leading axes are batch axes and broadcast.
	batch := trace.Stack(0, a, trace.Neg(a))
	fmt.Println(trace.MatMul(batch, b).Type())
	// Output:
	// f32[2,2] [[4 5] [10 11]]
	// f32[2] [6 15]
	// f32[2,2,2]
}

func ExampleEinsum() {
	a := rt.FromSlice([]float32{1, 2, 3, 4}, 2, 2)
	b := rt.FromSlice([]float32{5, 6, 7, 8}, 2, 2)
	fmt.Println(trace.Einsum("ij,jk->ik", a, b)) // matrix product
	fmt.Println(trace.Einsum("ij->ji", a))       // transpose
	fmt.Println(trace.Einsum("ii", a))           // trace (implicit output)
	fmt.Println(trace.Einsum("ij,ij->i", a, b))  // row-wise dot products
	// Output:
	// f32[2,2] [[19 22] [43 50]]
	// f32[2,2] [[1 3] [2 4]]
	// f32[] 5
	// f32[2] [17 53]
}

func ExampleSoftmax() {
	logits := rt.FromSlice([]float32{1, 2, 3, 1000, 1000, 1000}, 2, 3)
	p := trace.Softmax(logits, -1) // stable: no overflow for large logits
	fmt.Printf("%.4f\n", p.Float32s())
	fmt.Printf("%.4f\n", trace.Sum(p, -1).Float32s())
	// Output:
	// [0.0900 0.2447 0.6652 0.3333 0.3333 0.3333]
	// [1.0000 1.0000]
}

func ExampleSort() {
	x := rt.FromSlice([]float32{3, float32(math.NaN()), -1, 2, 0, 2}, 2, 3)
	fmt.Println(trace.Sort(x, 1))    // NaN sorts last
	fmt.Println(trace.Argsort(x, 1)) // stable: equal keys keep their order
	// Sort values by keys (lax.sort with num_keys=1).
	keys := rt.FromSlice([]int32{2, 0, 1}, 3)
	vals := rt.FromSlice([]float32{20, 0, 10}, 3)
	fmt.Println(trace.SortMulti([]*trace.Array{keys, vals}, 0, 1)[1])
	// Output:
	// f32[2,3] [[-1 3 NaN] [0 2 2]]
	// i32[2,3] [[2 0 1] [1 0 2]]
	// f32[3] [0 10 20]
}
