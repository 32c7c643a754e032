package passes_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// A dense layer with a tanh activation, y = tanh(x @ w + b) * 1: the multiply
// by one goes, and the matrix product and its epilogue become one output
// fusion. Nothing but the result needs memory of its own.
func ExampleCompile() {
	f, err := ir.Parse(`func @dense(%0: f32[2,4], %1: f32[4,3], %2: f32[3]) -> (f32[2,3]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,3]
  %4 = broadcast_in_dim(%2) {dims=[1], shape=[2,3]} : f32[2,3]
  %5 = add(%3, %4) : f32[2,3]
  %6 = tanh(%5) : f32[2,3]
  %7 = constant() {value=dense<f32[], 1>} : f32[]
  %8 = broadcast_in_dim(%7) {dims=[], shape=[2,3]} : f32[2,3]
  %9 = mul(%6, %8) : f32[2,3]
  return %9
}`)
	if err != nil {
		panic(err)
	}
	p, err := passes.Compile(f, passes.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Print(p.Func)
	fmt.Print(p.PlanString())
	a := p.Analysis
	fmt.Printf("argument %d B, output %d B, temp %d B\n", a.ArgumentBytes, a.OutputBytes, a.TempBytes)
	// Output:
	// func @dense(%0: f32[2,4], %1: f32[4,3], %2: f32[3]) -> (f32[2,3]) {
	//   %13 = fusion(%0, %1, %2) {kind="output"} (
	//     ^(%10: f32[2,4], %11: f32[4,3], %12: f32[3]) {
	//       %3 = dot_general(%10, %11) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,3]
	//       %4 = broadcast_in_dim(%12) {dims=[1], shape=[2,3]} : f32[2,3]
	//       %5 = add(%3, %4) : f32[2,3]
	//       %6 = tanh(%5) : f32[2,3]
	//       return %6
	//     }) : f32[2,3]
	//   return %13
	// }
	// region: arena device 0 B, pinned_host 0 B
	//   %0 f32[2,4] param 0 device 32 B
	//   %1 f32[4,3] param 1 device 48 B
	//   %2 f32[3] param 2 device 12 B
	//   %13 f32[2,3] output 0 device 24 B
	//   return %13
	// argument 92 B, output 24 B, temp 0 B
}

// Sharding propagation on a dense layer whose activations are split over the
// batch (mesh axis x) and whose weights are split over the output features
// (y): the product and the bias follow, and nothing needs a partial sum.
func ExamplePropagateShardings() {
	f, err := ir.Parse(`func @dense(%0: f32[8,4]{sharding<mesh[x=2,y=2], [x,{}]>}, %1: f32[4,6]{sharding<mesh[x=2,y=2], [{},y]>}, %2: f32[6]) -> (f32[8,6]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,6]
  %4 = broadcast_in_dim(%2) {dims=[1], shape=[8,6]} : f32[8,6]
  %5 = add(%3, %4) : f32[8,6]
  %6 = tanh(%5) : f32[8,6]
  return %6
}`)
	if err != nil {
		panic(err)
	}
	a, err := passes.AnalyzeShardings(f)
	if err != nil {
		panic(err)
	}
	if err := passes.PropagateShardings(f); err != nil {
		panic(err)
	}
	fmt.Print(f)
	fmt.Println("partial sums:", len(a.Partial))
	// Output:
	// func @dense(%0: f32[8,4]{sharding<mesh[x=2,y=2], [x,{}]>}, %1: f32[4,6]{sharding<mesh[x=2,y=2], [{},y]>}, %2: f32[6]{sharding<mesh[x=2,y=2], [y]>}) -> (f32[8,6]{sharding<mesh[x=2,y=2], [x,y]>}) {
	//   %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[8,6]{sharding<mesh[x=2,y=2], [x,y]>}
	//   %4 = broadcast_in_dim(%2) {dims=[1], shape=[8,6]} : f32[8,6]{sharding<mesh[x=2,y=2], [x,y]>}
	//   %5 = add(%3, %4) : f32[8,6]{sharding<mesh[x=2,y=2], [x,y]>}
	//   %6 = tanh(%5) : f32[8,6]{sharding<mesh[x=2,y=2], [x,y]>}
	//   return %6
	// }
	// partial sums: 0
}

// Megatron's MLP over 4 devices: w1 split by columns and w2 by rows, the
// activations replicated. Partition gives each device the program over its
// blocks: two local matrix products and one all-reduce of the partial sums.
func ExamplePartition() {
	f, err := ir.Parse(`func @mlp(%0: f32[2,8], %1: f32[8,16]{sharding<mesh[x=4], [{},x]>}, %2: f32[16,8]{sharding<mesh[x=4], [x,{}]>}) -> (f32[2,8]{sharding<mesh[x=4], []>}) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,16]
  %4 = tanh(%3) : f32[2,16]
  %5 = dot_general(%4, %2) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]{sharding<mesh[x=4], []>}
  return %5
}`)
	if err != nil {
		panic(err)
	}
	part, err := passes.Partition(f)
	if err != nil {
		panic(err)
	}
	fmt.Println(part.Mesh, part.Axes)
	fmt.Print(part.Func)
	// Output:
	// mesh[x=4] [x]
	// func @mlp(%0: f32[2,8], %1: f32[8,4], %2: f32[4,8]) -> (f32[2,8]) {
	//   %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,4]
	//   %4 = tanh(%3) : f32[2,4]
	//   %5 = dot_general(%4, %2) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,8]
	//   %6 = all_reduce(%5) {axis="x", reduction="sum", size=4} : f32[2,8]
	//   return %6
	// }
}
