// Command gomlx runs the training step of bench/cpu's MLP section (batch
// 128, 784→512→512→10, ReLU, softmax cross-entropy, SGD with learning rate
// 0.01, float32) in GoMLX with its pure-Go backend ("simplego", registered
// as "go"), so that Ferry's step time can be compared with it. The
// parameters are donated to every step, as bench/cpu does with rt.Donate.
//
//	go run .               # ms per step
//	go run . -json         # {"gomlx_step_ms": ...}
//
// It is its own module so that the main module does not depend on GoMLX.
// ../mlp-vs-gomlx.sh runs both back to back and prints the ratio.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/gomlx/gomlx/backends/simplego"
	. "github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
)

func randF32(n int, seed uint64, scale float32) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := make([]float32, n)
	for i := range s {
		s[i] = (rng.Float32()*2 - 1) * scale
	}
	return s
}

// Result is the report.
type Result struct {
	Backend string  `json:"backend"`
	Threads int     `json:"threads"`
	Grad    string  `json:"grad"`
	Batch   int     `json:"batch"`
	StepMS  float64 `json:"gomlx_step_ms"`
	Loss    float64 `json:"final_loss"`
}

func main() {
	jsonOut := flag.Bool("json", false, "print one JSON object")
	rounds := flag.Int("rounds", 3, "rounds (best of N)")
	steps := flag.Int("steps", 20, "training steps per round")
	grad := flag.String("grad", "autodiff", "gradients from GoMLX's autodiff (Gradient) or written by hand with DotGeneral (manual)")
	flag.Parse()

	backend, err := simplego.New("")
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Finalize()

	const batch = 128
	sizes := []int{784, 512, 512, 10}
	nl := len(sizes) - 1
	const lr = 0.01
	var stepFn func(in []*Node) []*Node
	switch *grad {
	case "autodiff":
		stepFn = func(in []*Node) []*Node { return autodiffStep(in, nl, lr) }
	case "manual":
		stepFn = func(in []*Node) []*Node { return manualStep(in, nl, lr) }
	default:
		log.Fatalf("-grad must be autodiff or manual, got %q", *grad)
	}
	step, err := NewExec(backend, stepFn)
	if err != nil {
		log.Fatal(err)
	}

	params := make([]*tensors.Tensor, 0, 2*nl)
	for i := 0; i < nl; i++ {
		in, out := sizes[i], sizes[i+1]
		scale := float32(math.Sqrt(6 / float64(in)))
		params = append(params,
			tensors.FromFlatDataAndDimensions(randF32(in*out, uint64(10+i), scale), in, out),
			tensors.FromFlatDataAndDimensions(make([]float32, out), out))
	}
	x := tensors.FromFlatDataAndDimensions(randF32(batch*sizes[0], 7, 1), batch, sizes[0])
	labels := make([]float32, batch*sizes[nl])
	for i := 0; i < batch; i++ {
		labels[i*sizes[nl]+i%sizes[nl]] = 1
	}
	y := tensors.FromFlatDataAndDimensions(labels, batch, sizes[nl])

	var loss float64
	run := func() {
		for s := 0; s < *steps; s++ {
			args := make([]any, 0, len(params)+2)
			for _, p := range params {
				d, err := DonateTensorBuffer(p, backend, 0)
				if err != nil {
					log.Fatal(err)
				}
				args = append(args, d)
			}
			args = append(args, x, y)
			outs, err := step.Exec(args...)
			if err != nil {
				log.Fatal(err)
			}
			params = outs[:len(params)]
			l := outs[len(params)]
			loss = float64(tensors.ToScalar[float32](l))
			l.MustFinalizeAll()
		}
	}
	run() // compile, warm up
	best := time.Hour
	for r := 0; r < *rounds; r++ {
		t0 := time.Now()
		run()
		best = min(best, time.Since(t0)/time.Duration(*steps))
	}
	res := Result{Backend: backend.Name(), Threads: runtime.GOMAXPROCS(0), Grad: *grad, Batch: batch,
		StepMS: float64(best.Microseconds()) / 1000, Loss: loss}
	if *jsonOut {
		if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
			log.Fatal(err)
		}
		return
	}
	fmt.Printf("GoMLX (%s backend, %s gradients), MLP training step, batch %d, 784→512→512→10: %.2f ms/step (loss %.4f)\n",
		res.Backend, res.Grad, res.Batch, res.StepMS, res.Loss)
}

// autodiffStep is the step with GoMLX's reverse-mode autodiff. In v0.26
// the VJP of Dot multiplies broadcast operands and reduces (an [i,j,k]
// temporary per matrix product), which XLA fuses away but the Go backend
// executes as written.
func autodiffStep(in []*Node, nl int, lr float64) []*Node {
	params, x, y := in[:2*nl], in[2*nl], in[2*nl+1]
	h := x
	for i := 0; i < nl; i++ {
		h = Add(MatMul(h, params[2*i]), ExpandAxes(params[2*i+1], 0)) // bias broadcast over the batch
		if i < nl-1 {
			h = Max(h, ZerosLike(h))
		}
	}
	loss := Neg(ReduceAllMean(ReduceSum(Mul(y, LogSoftmax(h, -1)), 1)))
	grads := Gradient(loss, params...)
	out := make([]*Node, 0, len(params)+1)
	for i, p := range params {
		out = append(out, Sub(p, MulScalar(grads[i], lr)))
	}
	return append(out, loss)
}

// manualStep is the same step with the backward pass written by hand, every
// matrix product a DotGeneral (the form Ferry's autodiff produces), so that
// the Go backend's matrix products are what is measured.
func manualStep(in []*Node, nl int, lr float64) []*Node {
	params, x, y := in[:2*nl], in[2*nl], in[2*nl+1]
	batch := x.Shape().Dimensions[0]
	acts := []*Node{x} // inputs of each layer
	var pre []*Node    // pre-activations of the hidden layers
	h := x
	for i := 0; i < nl; i++ {
		z := Add(DotGeneral(h, []int{1}, nil, params[2*i], []int{0}, nil), ExpandAxes(params[2*i+1], 0))
		if i < nl-1 {
			pre = append(pre, z)
			h = Max(z, ZerosLike(z))
			acts = append(acts, h)
		} else {
			h = z
		}
	}
	logp := LogSoftmax(h, -1)
	loss := Neg(ReduceAllMean(ReduceSum(Mul(y, logp), 1)))
	// d loss / d logits = (softmax - y) / batch
	d := DivScalar(Sub(Exp(logp), y), float64(batch))
	grads := make([]*Node, 2*nl)
	for i := nl - 1; i >= 0; i-- {
		grads[2*i] = DotGeneral(acts[i], []int{0}, nil, d, []int{0}, nil) // a^T d
		grads[2*i+1] = ReduceSum(d, 0)
		if i > 0 {
			dh := DotGeneral(d, []int{1}, nil, params[2*i], []int{1}, nil) // d W^T
			z := pre[i-1]
			d = Where(GreaterThan(z, ZerosLike(z)), dh, ZerosLike(dh))
		}
	}
	out := make([]*Node, 0, len(params)+1)
	for i, p := range params {
		out = append(out, Sub(p, MulScalar(grads[i], lr)))
	}
	return append(out, loss)
}
