package checkpoint_test

import (
	"bytes"
	"fmt"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Save parameters and an optimizer state together, inspect the header, and
// load them back into a tree of the same shape.
func Example() {
	type Params struct{ W, B *trace.Array }
	type TrainState struct {
		Params Params
		Opt    optim.State
	}
	params := Params{W: rt.FromSlice([]float32{1, 2, 3, 4}, 2, 2), B: rt.FromSlice([]float32{0.5, -0.5})}
	opt := optim.SGD(optim.Constant(0.1))
	st, _ := opt.Init(params)

	var buf bytes.Buffer // or checkpoint.SaveFile("model.safetensors", ...)
	if err := checkpoint.Save(&buf, TrainState{params, st}, map[string]string{"epoch": "3"}); err != nil {
		panic(err)
	}

	infos, meta, _ := checkpoint.ReadHeader(bytes.NewReader(buf.Bytes()))
	fmt.Println(infos["Params.W"].DType, infos["Params.W"].Shape, infos["Opt.Count"].DType, meta["epoch"])

	like := TrainState{
		Params: Params{W: trace.Zeros([]int{2, 2}, params.W.DType()), B: trace.Zeros([]int{2}, params.B.DType())},
		Opt:    optim.CountState{Count: rt.ScalarOf(int32(0))},
	}
	got, err := checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	if err != nil {
		panic(err)
	}
	fmt.Println(got.Params.W.Float32s(), got.Params.B.Float32s())

	like.Params.W = trace.Zeros([]int{3}, params.W.DType())
	_, err = checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	fmt.Println(err)
	// Output:
	// F32 [2 2] I32 3
	// [1 2 3 4] [0.5 -0.5]
	// checkpoint.Load: tensor "Params.W" is f32[2,2] in the file, want f32[3]
}
