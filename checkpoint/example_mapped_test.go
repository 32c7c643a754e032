package checkpoint_test

import (
	"fmt"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

func ExampleOpen() {
	// A directory holding model.safetensors, or a sharded set with
	// model.safetensors.index.json: only the headers are read.
	r, err := checkpoint.Open("../nn/hf/testdata/llama")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	info, _ := r.Info("model.layers.0.self_attn.k_proj.weight")
	fmt.Println(len(r.Names()), "tensors; k_proj:", info.DType, info.Shape)

	// One tensor, converted from f16, read at its offset in its file.
	w, err := r.Read("model.norm.weight", ir.Float32)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(w.Type)
	// Output:
	// 21 tensors; k_proj: F16 [16 32]
	// f32[32]
}

// Layers holds two layers' query weights stacked on axis 0.
type Layers struct {
	Q struct{ W *trace.Array }
}

func ExampleLoadMapped() {
	r, err := checkpoint.Open("../nn/hf/testdata/llama")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	// Each layer's q_proj.weight [out, in] goes to its index of Q.W's layer
	// axis; the like tree gives dtypes and shapes only.
	m := checkpoint.Mapping{Rules: []checkpoint.Rule{
		{File: "model.layers.{i}.self_attn.q_proj.weight", Tree: "Q.W[{i}]"},
	}}
	var like Layers
	like.Q.W = trace.Abstract(ir.TypeOf(ir.Float32, 2, 32, 32))
	// The file holds more than this tree: ignore the rest.
	got, err := checkpoint.LoadMapped(r, like, m, checkpoint.IgnoreTensors("lm_head.*", "model.embed_tokens.*", "model.norm.*",
		"*_layernorm.*", "*.k_proj.*", "*.v_proj.*", "*.o_proj.*", "*.mlp.*"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(got.Q.W.Type())

	// Without the ignore list, one error lists every tensor not mapped.
	_, err = checkpoint.LoadMapped(r, like, m)
	fmt.Println(err != nil)
	// Output:
	// f32[2,32,32]
	// true
}
