package passes_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// The executable plan of a dense layer, tanh(x @ w + b): one output-fusion
// kernel whose product fills the result's buffer, then the epilogue reads
// the bias through a view broadcasting it along the rows.
func ExampleLower() {
	f, err := ir.Parse(`func @dense(%0: f32[2,4], %1: f32[4,3], %2: f32[3]) -> (f32[2,3]) {
  %3 = dot_general(%0, %1) {lhs_batch=[], lhs_contract=[1], rhs_batch=[], rhs_contract=[0]} : f32[2,3]
  %4 = broadcast_in_dim(%2) {dims=[1], shape=[2,3]} : f32[2,3]
  %5 = add(%3, %4) : f32[2,3]
  %6 = tanh(%5) : f32[2,3]
  return %6
}`)
	if err != nil {
		panic(err)
	}
	p, err := passes.Compile(f, passes.Options{})
	if err != nil {
		panic(err)
	}
	ex, err := passes.Lower(p)
	if err != nil {
		panic(err)
	}
	fmt.Print(ex)
	// Output:
	// block params(s0, s1, s2) results(s3) arena 0/0
	//   s0 %0 f32[2,4]: param 0 device 32 B
	//   s1 %1 f32[4,3]: param 1 device 48 B
	//   s2 %2 f32[3]: param 2 device 12 B
	//   s3 %10 f32[2,3]: output 0 device 24 B
	//   s3 = kernel fusion output(s0, s1, s2)
	//     dot of arg0, arg1 into result 0
	//       layout batch []/[] contract [1]/[0]: 1 x [2 x 4] . [4 x 3]
	//     program of 6 elements
	//       n0 f32 = dot
	//       n1 f32 = arg2 view 0+[2:0,3:1]
	//       n2 f32 = add(n0, n1)
	//       n3 f32 = tanh(n2)
	//       result 0 = n3
}
