package cpu_test

import (
	"fmt"
	"sync"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/collective"
	_ "github.com/ferryml/ferry/cpu" // registers the CPU backend
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// A per-device program with a collective is compiled once, with its axis
// bound, and run by every rank of the group at the same time (here four
// goroutines sharing the default device), each with its own argument and
// its own communicator for the axis.
func Example_collectives() {
	f, err := ir.Parse(`func @psum(%0: f32[2]) -> (f32[2]) {
  %1 = all_reduce(%0) {axis="x", reduction="sum", size=4} : f32[2]
  %2 = axis_index() {axis="x", size=4} : i32[]
  %3 = convert(%2) {dtype=f32} : f32[]
  %4 = broadcast_in_dim(%3) {dims=[], shape=[2]} : f32[2]
  %5 = add(%1, %4) : f32[2]
  return %5
}`)
	if err != nil {
		panic(err)
	}
	be := backend.Lookup("cpu")
	exe, err := be.Compile(f, backend.CompileOptions{BoundAxes: []string{"x"}})
	if err != nil {
		panic(err)
	}
	ranks, err := collective.NewLocal(4)
	if err != nil {
		panic(err)
	}
	out := make([]string, len(ranks))
	var wg sync.WaitGroup
	for r := range ranks {
		x, _ := ir.LiteralOf(ir.Shape{2}, []float32{float32(r), 10})
		arg, err := be.FromLiteral(x)
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			res, err := exe.Execute([]trace.Buffer{arg}, backend.ExecOptions{
				Comms: map[string]collective.Communicator{"x": ranks[r]},
			})
			if err != nil {
				out[r] = err.Error()
				return
			}
			l, _ := res[0].Literal()
			out[r] = fmt.Sprint(ir.View[float32](l))
		})
	}
	wg.Wait()
	for r, s := range out {
		fmt.Println("rank", r, s)
	}
	// Output:
	// rank 0 [6 40]
	// rank 1 [7 41]
	// rank 2 [8 42]
	// rank 3 [9 43]
}
