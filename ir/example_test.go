package ir_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Build a function, print it, parse the text back and verify the result.
func ExampleParse() {
	f := ir.NewFunc("main")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 2, 3))
	b := f.Body.AddParam(ir.TypeOf(ir.Float32, 3))
	bc, _ := f.Body.AddOp(ir.BroadcastInDim, []*ir.Value{b}, ir.Attrs{"shape": []int{2, 3}, "dims": []int{1}})
	bc.Loc = "quick.go:12"
	sum, _ := f.Body.AddOp(ir.Add, []*ir.Value{x, bc.Result()}, nil)
	half, _ := f.Body.AddOp(ir.Constant, nil, ir.Attrs{"value": ir.Scalar[float32](0.5)})
	hb, _ := f.Body.AddOp(ir.BroadcastInDim, []*ir.Value{half.Result()}, ir.Attrs{"shape": []int{2, 3}, "dims": []int{}})
	out, _ := f.Body.AddOp(ir.Mul, []*ir.Value{sum.Result(), hb.Result()}, nil)
	f.Body.Results = []*ir.Value{out.Result()}

	text := f.String()
	fmt.Print(text)

	g, err := ir.Parse(text)
	if err != nil {
		panic(err)
	}
	fmt.Println(ir.Verify(g) == nil, g.String() == text)

	_, err = ir.Parse("func @f(%0: f32[2]) -> (f32[2]) {\n  %1 = exp(%0) : f32[3]\n  return %1\n}")
	fmt.Println(err)
	// Output:
	// func @main(%0: f32[2,3], %1: f32[3]) -> (f32[2,3]) {
	//   %2 = broadcast_in_dim(%1) {dims=[1], shape=[2,3]} : f32[2,3] loc("quick.go:12")
	//   %3 = add(%0, %2) : f32[2,3]
	//   %4 = constant() {value=dense<f32[], 0.5>} : f32[]
	//   %5 = broadcast_in_dim(%4) {dims=[], shape=[2,3]} : f32[2,3]
	//   %6 = mul(%3, %5) : f32[2,3]
	//   return %6
	// }
	// true true
	// 2:18: result 0 of exp is written f32[3], but its shape rule gives f32[2]
}
