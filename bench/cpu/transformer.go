package main

import (
	"log"
	"math/rand/v2"
	"time"

	"github.com/ferryml/ferry/bench/internal/fmapeak"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TransformerRow is the Transformer training-step section: the step's model
// FLOPs (the matrix products of the forward and backward passes, counted
// by rt.Lowered.CostAnalysis) per second, against the FMA peak measured in
// the same run.
type TransformerRow struct {
	Config     string  `json:"config"`
	StepMS     float64 `json:"step_ms"`
	ModelGFLOP float64 `json:"model_gflop_per_step"`
	GFLOPS     float64 `json:"model_gflops"`
	PeakGFLOPS float64 `json:"fma_peak_gflops"`
	PeakISA    string  `json:"fma_peak_isa"`
	OfPeak     float64 `json:"fraction_of_peak"`
	Loss       float64 `json:"final_loss"`
}

// benchTransformer times examples/transformer's training step at its
// defaults (batch 32, seq 64, 4 layers, d 128, 4 heads; vocab 96, about the
// example's character vocabulary): ClipByGlobalNorm then AdamW, parameters
// and optimizer state donated, random token windows. Rounds alternate with
// the FMA peak loop; each keeps its best.
func benchTransformer(steps, rounds int) TransformerRow {
	const vocab, batch, seq, layers, d, heads = 96, 32, 64, 4, 128, 4
	params := rt.Jit(func(k *trace.Array) nn.TransformerLM {
		return nn.NewTransformerLM(k, ir.Float32, vocab, seq, layers, d, heads, 4*d)
	})(random.NewKey(0))
	opt := optim.Chain(
		optim.ClipByGlobalNorm[nn.TransformerLM](1),
		optim.AdamW[nn.TransformerLM](optim.Constant(3e-3), 0.9, 0.95, 1e-8, 0.01),
	)
	state, err := opt.Init(params)
	if err != nil {
		log.Fatal(err)
	}
	type optState = optim.ChainState[optim.EmptyState, optim.AdamState[nn.TransformerLM]]
	step := rt.NewJitted(func(p nn.TransformerLM, s optState, x, y *trace.Array) (nn.TransformerLM, optState, *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.TransformerLM) *trace.Array { return p.Loss(x, y) })(p)
		p2, s2, err := optim.Step(opt, g, s, p)
		return p2, s2, loss, err
	}, rt.Donate(0, 1))
	rng := rand.New(rand.NewPCG(9, 1))
	window := func() (x, y *trace.Array) {
		xs, ys := make([]int32, batch*seq), make([]int32, batch*seq)
		for b := range batch {
			prev := int32(rng.IntN(vocab))
			for t := range seq {
				next := int32(rng.IntN(vocab))
				xs[b*seq+t], ys[b*seq+t] = prev, next
				prev = next
			}
		}
		return rt.FromSlice(xs, batch, seq), rt.FromSlice(ys, batch, seq)
	}
	x, y := window()
	low, err := step.Lower(params, state, x, y)
	if err != nil {
		log.Fatal(err)
	}
	flop := low.CostAnalysis().DotFlops
	fn := step.Fn()
	var loss float64
	run := func() {
		for range steps {
			x, y := window()
			var l *trace.Array
			if params, state, l, err = fn(params, state, x, y); err != nil {
				log.Fatal(err)
			}
			loss = l.Item()
		}
	}
	run() // compile, warm up
	bestT, peak, isa := time.Hour, 0.0, ""
	for range rounds {
		t0 := time.Now()
		run()
		bestT = min(bestT, time.Since(t0)/time.Duration(steps))
		p, i := fmapeak.Peak(time.Second)
		peak, isa = max(peak, p), i
	}
	r := TransformerRow{
		Config: "batch 32, seq 64, 4 layers, d 128, 4 heads, vocab 96, AdamW",
		StepMS: float64(bestT.Microseconds()) / 1000, ModelGFLOP: flop / 1e9,
		PeakGFLOPS: peak, PeakISA: isa, Loss: loss,
	}
	r.GFLOPS = flop / bestT.Seconds() / 1e9
	r.OfPeak = r.GFLOPS / peak
	return r
}
