package optim_test

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Line is the parameters of the examples: y = W·x + B.
type Line struct{ W, B *trace.Array }

// Data of the examples: y = 2x + 1.
var xs, ys = []float32{0, 1, 2, 3}, []float32{1, 3, 5, 7}

func lineLoss(p Line) *trace.Array {
	x, y := rt.FromSlice(xs), rt.FromSlice(ys)
	d := trace.Sub(trace.Add(trace.Mul(p.W, x), p.B), y)
	return trace.Mean(trace.Square(d))
}

func zeroLine() Line { return Line{W: rt.FromScalar(float32(0)), B: rt.FromScalar(float32(0))} }

// fit runs steps jitted training steps of opt on lineLoss.
func fit[S any](opt optim.Optimizer[Line, S], steps int) Line {
	step := rt.Jit(func(p Line, s S) (Line, S, error) {
		u, s, err := opt.Update(trace.Grad(lineLoss)(p), s, p)
		if err != nil {
			return p, s, err
		}
		p, err = optim.ApplyUpdates(p, u)
		return p, s, err
	}, rt.Donate(0, 1))
	p := zeroLine()
	s, err := opt.Init(p)
	if err != nil {
		panic(err)
	}
	for range steps {
		if p, s, err = step(p, s); err != nil {
			panic(err)
		}
	}
	return p
}

// Fit y = 2x + 1 with clipped Adam under rt.Jit, donating params and optimizer
// state and keeping the state in pinned host memory between steps: InitIn
// makes it there, rt.OutSpace writes the new state back there.
func Example() {
	opt := optim.Chain(optim.ClipByGlobalNorm[Line](1), optim.Adam[Line](optim.Constant(0.1), 0.9, 0.999, 1e-8))
	type State = optim.ChainState[optim.EmptyState, optim.AdamState[Line]]
	step := rt.Jit(func(p Line, s State) (Line, State, error) {
		u, s, err := opt.Update(trace.Grad(lineLoss)(p), s, p)
		if err != nil {
			return p, s, err
		}
		p, err = optim.ApplyUpdates(p, u)
		return p, s, err
	}, rt.Donate(0, 1), rt.OutSpace(1, ir.PinnedHost))

	params := zeroLine()
	state, err := optim.InitIn(opt, params, ir.PinnedHost)
	if err != nil {
		panic(err)
	}
	for range 500 {
		if params, state, err = step(params, state); err != nil {
			panic(err)
		}
	}
	fmt.Printf("w=%.2f b=%.2f loss<1e-4: %v\n", params.W.Item(), params.B.Item(), lineLoss(params).Item() < 1e-4)
	fmt.Println("step", state.Second.Count.Item(), "Mu.W in", state.Second.Mu.W.Space())
	// Output:
	// w=2.00 b=1.00 loss<1e-4: true
	// step 500 Mu.W in pinned_host
}

// InitIn makes an optimizer state directly in pinned host memory: nothing of
// it is ever allocated on the device, so it works where the state does not
// fit beside the parameters.
func ExampleInitIn() {
	params := Line{W: trace.Zeros(ir.Shape{256, 256}, ir.Float32), B: trace.Zeros(ir.Shape{256}, ir.Float32)}
	rt.ResetPeakMemory()
	before := rt.MemoryStats(ir.Device).BytesInUse
	state, err := optim.InitIn(optim.Adam[Line](optim.Constant(1e-3), 0.9, 0.999, 1e-8), params, ir.PinnedHost)
	if err != nil {
		panic(err)
	}
	fmt.Println("Mu.W:", state.Mu.W.Type(), "Count:", state.Count.Type())
	fmt.Println("device bytes allocated:", rt.MemoryStats(ir.Device).PeakBytesInUse-before)
	// Output:
	// Mu.W: f32[256,256]{pinned_host} Count: i32[]{pinned_host}
	// device bytes allocated: 0
}

// Chain composes two optimizers; its state holds both, typed. Nest Chain for
// more than two.
func ExampleChain() {
	opt := optim.Chain(optim.ClipByGlobalNorm[Line](1), optim.Momentum[Line](optim.Constant(0.05), 0.9, false))
	s, _ := opt.Init(zeroLine())
	fmt.Printf("%T\n", s)
	d, _ := trace.Structure(s)
	fmt.Println(d.Paths())
	p := fit(opt, 300)
	fmt.Printf("w=%.2f b=%.2f\n", p.W.Item(), p.B.Item())
	// Output:
	// optim.ChainState[github.com/ferryml/ferry/optim.EmptyState,github.com/ferryml/ferry/optim.MomentumState[github.com/ferryml/ferry/optim_test.Line]]
	// [Second.Count Second.Trace.W Second.Trace.B]
	// w=2.00 b=1.00
}

func ExampleSGD() {
	p := fit(optim.SGD[Line](optim.Constant(0.1)), 300)
	fmt.Printf("w=%.2f b=%.2f\n", p.W.Item(), p.B.Item())
	// Output: w=2.00 b=1.00
}

func ExampleMomentum() {
	p := fit(optim.Momentum[Line](optim.Constant(0.05), 0.9, true), 300)
	fmt.Printf("w=%.2f b=%.2f\n", p.W.Item(), p.B.Item())
	// Output: w=2.00 b=1.00
}

func ExampleAdam() {
	opt := optim.Adam[Line](optim.Constant(0.1), 0.9, 0.999, 1e-8)
	s, _ := opt.Init(zeroLine())
	fmt.Println("Mu.W:", s.Mu.W.Type())
	p := fit(opt, 500)
	fmt.Printf("w=%.2f b=%.2f\n", p.W.Item(), p.B.Item())
	// Output:
	// Mu.W: f32[]
	// w=2.00 b=1.00
}

// AdamW's weight decay pulls the weights towards 0 a little.
func ExampleAdamW() {
	p := fit(optim.AdamW[Line](optim.WarmupCosine(0.1, 10, 500, 0.001), 0.9, 0.999, 1e-8, 0.1), 500)
	fmt.Printf("w=%.2f b=%.2f\n", p.W.Item(), p.B.Item())
	// Output: w=1.87 b=1.13
}

func ExampleClipByGlobalNorm() {
	clip := optim.ClipByGlobalNorm[Line](1)
	g := Line{W: rt.FromScalar(float32(3)), B: rt.FromScalar(float32(4))}
	u, _, _ := clip.Update(g, optim.EmptyState{}, Line{})
	fmt.Printf("%.1f %.1f\n", u.W.Item(), u.B.Item())
	// Output: 0.6 0.8
}

func ExampleApplyUpdates() {
	p := Line{W: rt.FromScalar(float32(1)), B: rt.FromScalar(float32(2))}
	q, _ := optim.ApplyUpdates(p, Line{W: rt.FromScalar(float32(0.5)), B: rt.FromScalar(float32(-1))})
	fmt.Println(q.W.Item(), q.B.Item())
	// Output: 1.5 1
}

// Step is the body of a training step: the optimizer's updates applied to the
// parameters.
func ExampleStep() {
	opt := optim.SGD[Line](optim.Constant(0.1))
	p := Line{W: rt.FromScalar(float32(1)), B: rt.FromScalar(float32(2))}
	s, _ := opt.Init(p)
	g := Line{W: rt.FromScalar(float32(3)), B: rt.FromScalar(float32(-4))}
	p, s, _ = optim.Step(opt, g, s, p)
	fmt.Printf("%.2f %.2f %d\n", p.W.Item(), p.B.Item(), int(s.Count.Item()))
	// Output: 0.70 2.40 1
}

func ExampleGlobalNorm() {
	fmt.Println(optim.GlobalNorm(Line{W: rt.FromScalar(float32(3)), B: rt.FromScalar(float32(4))}).Item())
	// Output: 5
}

// ToSpace moves a tree between memory spaces: here an offloaded state back to
// the device.
func ExampleToSpace() {
	s, _ := optim.InitIn(optim.SGD[Line](optim.Constant(0.1)), zeroLine(), ir.PinnedHost)
	back, _ := optim.ToSpace(s, ir.Device)
	fmt.Println(s.Count.Space(), "->", back.Count.Space())
	// Output: pinned_host -> device
}

func ExampleWarmupCosine() {
	lr := optim.WarmupCosine(1, 2, 6, 0)
	for step := range 7 {
		fmt.Printf("%.2f ", lr(rt.FromScalar(int32(step))).Item())
	}
	fmt.Println()
	// Output: 0.00 0.50 1.00 0.85 0.50 0.15 0.00
}

// Pick an optimizer at run time (here from a list, say from a flag): the
// training loop, fit, is generic in the state type S, so each case calls it
// with its own optimizer and nothing is type-asserted.
func Example_runTimeChoice() {
	for _, name := range []string{"sgd", "adam"} {
		var p Line
		switch name {
		case "sgd":
			p = fit(optim.SGD[Line](optim.Constant(0.1)), 300)
		case "adam":
			p = fit(optim.Chain(optim.ClipByGlobalNorm[Line](1), optim.Adam[Line](optim.Constant(0.1), 0.9, 0.999, 1e-8)), 500)
		}
		fmt.Printf("%s: w=%.2f b=%.2f\n", name, p.W.Item(), p.B.Item())
	}
	// Output:
	// sgd: w=2.00 b=1.00
	// adam: w=2.00 b=1.00
}
