package runtime_test

import (
	"fmt"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A donated argument that no result can reuse is reported once, when the
// function is compiled for its signature. SetWarnings captures the warnings
// (or, with nil, silences them; by default they go to standard error).
func ExampleSetWarnings() {
	prev := rt.SetWarnings(func(msg string) { fmt.Println("warning:", msg) })
	defer rt.SetWarnings(prev)
	f := rt.Jit(func(x, y *trace.Array) *trace.Array {
		return trace.Add(y, trace.Sum(x))
	}, rt.Donate(0), rt.WithName("f"))
	for range 2 {
		out := f(rt.FromSlice([]float32{1, 2, 3}, 3), rt.FromSlice([]float32{10, 20}, 2))
		fmt.Println(out.Float32s())
	}
	// Output:
	// warning: f: some donated buffers were not usable: args[0] f32[3] (no result has its size and memory space)
	// [16 26]
	// [16 26]
}
