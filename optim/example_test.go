package optim_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Fit y = 2x + 1 with Adam under rt.Jit, donating params and optimizer state
// and keeping the state in pinned host memory between steps.
func Example() {
	type Params struct{ W, B *trace.Array }
	x := rt.FromSlice([]float32{0, 1, 2, 3})
	y := rt.FromSlice([]float32{1, 3, 5, 7})
	loss := func(p Params) *trace.Array {
		d := trace.Sub(trace.Add(trace.Mul(p.W, x), p.B), y)
		return trace.Mean(trace.Square(d))
	}
	opt := optim.Chain(optim.ClipByGlobalNorm(1), optim.Adam(optim.Constant(0.1), 0.9, 0.999, 1e-8))
	step := rt.Jit(func(p Params, s optim.State) (Params, optim.State, error) {
		g := trace.Grad(loss)(p)
		u, s, err := opt.Update(g, s, p)
		if err != nil {
			return p, s, err
		}
		p, err = optim.ApplyUpdates(p, u)
		return p, s, err
	}, rt.Donate(0, 1), rt.OutSpace(1, ir.PinnedHost))

	params := Params{W: rt.ScalarOf(float32(0)), B: rt.ScalarOf(float32(0))}
	state, _ := opt.Init(params)
	state, _ = optim.ToSpace(state, ir.PinnedHost) // offload the state
	for range 500 {
		var err error
		if params, state, err = step(params, state); err != nil {
			panic(err)
		}
	}
	fmt.Printf("w=%.2f b=%.2f loss<1e-4: %v\n", params.W.Item(), params.B.Item(), loss(params).Item() < 1e-4)
	fmt.Println("state in", trace.Leaves(state)[0].Space())
	// Output:
	// w=2.00 b=1.00 loss<1e-4: true
	// state in pinned_host
}
