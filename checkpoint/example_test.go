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
		Opt    optim.AdamState[Params]
	}
	params := Params{W: rt.FromSlice([]float32{1, 2, 3, 4}, 2, 2), B: rt.FromSlice([]float32{0.5, -0.5})}
	opt := optim.Adam[Params](optim.Constant(0.1), 0.9, 0.999, 1e-8)
	st, _ := opt.Init(params)
	_, st, _ = opt.Update(params, st, params) // one step: Count 1, nonzero moments

	var buf bytes.Buffer // or checkpoint.SaveFile("model.safetensors", ...)
	if err := checkpoint.Save(&buf, TrainState{params, st}, map[string]string{"epoch": "3"}); err != nil {
		panic(err)
	}

	infos, meta, _ := checkpoint.ReadHeader(bytes.NewReader(buf.Bytes()))
	fmt.Println(infos["Params.W"].DType, infos["Params.W"].Shape, infos["Opt.Count"].DType, infos["Opt.Mu.W"].Shape, meta["epoch"])

	// A tree to load into: zero parameters and a fresh state for them.
	like := TrainState{Params: Params{W: trace.Zeros([]int{2, 2}, params.W.DType()), B: trace.Zeros([]int{2}, params.B.DType())}}
	like.Opt, _ = opt.Init(like.Params)
	got, err := checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	if err != nil {
		panic(err)
	}
	fmt.Println(got.Params.W.Float32s(), got.Params.B.Float32s(), got.Opt.Count.Item(), got.Opt.Nu.B.Float32s())

	like.Params.W = trace.Zeros([]int{3}, params.W.DType())
	_, err = checkpoint.Load(bytes.NewReader(buf.Bytes()), like)
	fmt.Println(err)
	// Output:
	// F32 [2 2] I32 [2 2] 3
	// [1 2 3 4] [0.5 -0.5] 1 [0.00025 0.00025]
	// checkpoint.Load: tensor "Params.W" is f32[2,2] in the file, want f32[3]
}
