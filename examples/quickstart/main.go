// Command quickstart jits a small function, calls it twice (the second call is a
// compile cache hit), and prints the results and the traced IR.
//
//	go run ./examples/quickstart
package main

import (
	"fmt"
	"log"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// layer is a dense layer with a tanh activation: tanh(x @ w + b).
func layer(x, w, b *trace.Array) *trace.Array {
	return trace.Tanh(trace.Add(trace.MatMul(x, w), b))
}

func main() {
	f := rt.NewJitted(layer)

	x := rt.FromSlice([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	w := rt.FromSlice([]float32{0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, 3, 2)
	b := rt.FromSlice([]float32{0.01, -0.01}, 2)

	y := f.Fn()(x, w, b) // traced, compiled, run
	fmt.Println("y  =", y)

	x2 := rt.FromSlice([]float32{-1, 0, 1, 2, 0.5, -0.5}, 2, 3)
	y2 := f.Fn()(x2, w, b) // same signature: compile cache hit
	fmt.Println("y2 =", y2)
	st := f.Stats()
	fmt.Printf("compile cache: %d miss, %d hit\n", st.Misses, st.Hits)

	low, err := f.Lower(x, w, b)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("\nIR:")
	fmt.Print(low.IR())
}
