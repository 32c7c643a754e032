package trace_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// layerParams and modelParams are an ordinary Go parameter tree.
type layerParams struct {
	W, B *trace.Array
}

type modelParams struct {
	Layers []layerParams
	Scale  map[string]*trace.Array
	Act    string // static: kept in the TreeDef
}

func ExampleFlatten() {
	// Arrays standing for values being traced; concrete arrays work the same way.
	tr := trace.NewFuncTracer("init")
	tr.Push()
	defer tr.Pop()
	f32 := func(dims ...int) *trace.Array { return tr.Param(ir.TypeOf(ir.Float32, dims...)) }

	params := modelParams{
		Layers: []layerParams{{W: f32(4, 8), B: f32(8)}, {W: f32(8, 2)}}, // the last B is nil
		Scale:  map[string]*trace.Array{"out": f32(), "in": f32()},
		Act:    "relu",
	}
	leaves, def, err := trace.Flatten(params)
	if err != nil {
		panic(err)
	}
	fmt.Println(def.NumLeaves(), "leaves")
	for i, p := range def.Paths() {
		fmt.Println(p, leaves[i].Type())
	}

	// Rebuild the same Go type with other leaves: here bf16 copies.
	bf16, err := trace.MapAs(params, func(a *trace.Array) *trace.Array {
		return tr.Param(a.Type().WithDType(ir.BFloat16))
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(bf16.Layers[0].W.Type(), bf16.Layers[1].B == nil, bf16.Act)

	// The structure does not depend on the leaves.
	_, def2, _ := trace.Flatten(bf16)
	fmt.Println(def.Equal(def2), def.String() == def2.String())
	// Output:
	// 5 leaves
	// Layers[0].W f32[4,8]
	// Layers[0].B f32[8]
	// Layers[1].W f32[8,2]
	// Scale["in"] f32[]
	// Scale["out"] f32[]
	// bf16[4,8] true relu
	// true true
}

func ExampleTreeDef_String() {
	tr := trace.NewFuncTracer("t")
	tr.Push()
	defer tr.Pop()
	x := tr.Param(ir.TypeOf(ir.Float32, 3))

	_, def, _ := trace.Flatten([]any{x, nil, (*trace.Array)(nil), 0.5, map[string]*trace.Array{"b": x}})
	fmt.Println(def)
	// Output:
	// []interface {}{*, nil, None, float64(0.5), map[string]*github.com/ferryml/ferry/trace.Array{"b": *}}
}
