package main

import (
	"fmt"
	"io"
	"math"

	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// lmDefaults are the settings of the decoder mode where the flags left
// Config's (BERT's) defaults: the small random decoders of nn/hf/testdata
// learn the task from scratch, at a larger learning rate and for more
// steps than a pretrained encoder, from more examples; GPT-2's has 16
// positions.
func lmDefaults(cfg Config, set map[string]bool) Config {
	def := map[string]func(){
		"lr":    func() { cfg.LR = 1e-2 },
		"steps": func() { cfg.Steps = 1000 },
		"seq":   func() { cfg.Seq = 16 },
	}
	for name, f := range def {
		if !set[name] {
			f()
		}
	}
	cfg.Train, cfg.Test = 2000, 256
	return cfg
}

// runDecoder fine-tunes the causal LM of cfg.Model (a directory of family
// dec), under the budget, saves it with dec's mapping and reloads it.
func runDecoder[M any](w io.Writer, cfg Config, dec Decoder[M]) (*Report, error) {
	if 2*cfg.MaxDigits+3 > cfg.Seq || cfg.MaxDigits < 2 {
		return nil, fmt.Errorf("strings of 2 to %d digits do not fit %d tokens", cfg.MaxDigits, cfg.Seq)
	}
	// AdamW's step count is read while its new value is computed, so its
	// donated buffer cannot be reused: nothing to warn about.
	defer rt.SetWarnings(rt.SetWarnings(nil))
	loaded, describe, err := dec.Load(cfg.Model)
	if err != nil {
		return nil, err
	}
	src, err := toHost(loaded)
	if err != nil {
		return nil, err
	}
	rep := &Report{Family: dec.Family}
	fmt.Fprintf(w, "model %s: %s, %d parameters\n", cfg.Model, describe, src.Params())
	trainEx, testEx := Reversals(cfg.Train, cfg.Test, cfg.MaxDigits, cfg.Seed)
	train, err := encodeLM(trainEx, cfg.Seq)
	if err != nil {
		return nil, err
	}
	test, err := encodeLM(testEx, cfg.Seq)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "task: reverse 2 to %d digits, %d training and %d held-out strings (none in both), e.g. %s\n",
		cfg.MaxDigits, train.N, test.N, testEx[0].Text())

	opt := optim.AdamW[M](optim.WarmupCosine(cfg.LR, cfg.Warmup, cfg.Steps, 0), 0.9, 0.999, 1e-8, cfg.WeightDecay)
	step := lmStepFunc(dec, opt)
	fresh := func() (M, LMState[M], error) {
		m, err := src.Tree()
		if err != nil {
			return m, LMState[M]{}, err
		}
		s, err := opt.Init(m)
		return m, s, err
	}
	m, st, err := fresh()
	if err != nil {
		return nil, err
	}
	eval := rt.Jit(func(m M, ids, mask *trace.Array) (*trace.Array, *trace.Array) {
		return nextToken(dec.Logits(m, ids, mask), ids)
	})
	rep.HeldBefore = evaluate(eval, m, test, cfg.Batch)
	fmt.Fprintf(w, "held-out answers before fine-tuning: %v\n\n", rep.HeldBefore)

	ids, mask := train.batch(make([]int, cfg.Batch))
	base, planned, err := planStep(w, cfg, rep, step, []any{m, st, ids, mask})
	deleteTree(ids, mask)
	if err != nil {
		return nil, err
	}

	if cfg.Measure > 0 {
		m0, s0, run0, err := trainLoop(base, m, st, cfg.Measure, lmBatches(train, cfg.Batch, cfg.Seed), nil)
		if err != nil {
			return nil, err
		}
		deleteTree(m0, s0)
		rep.Unconstrained = run0
		fmt.Fprintf(w, "unconstrained step, %d steps: measured device peak %s, median step %.4f s\n", cfg.Measure, mib(run0.Peak), run0.Seconds)
		if m, st, err = fresh(); err != nil {
			return nil, err
		}
	}

	fmt.Fprintf(w, "\nfine-tuning %d steps at batch %d under the budget (loss: next-token cross-entropy over the real tokens):\n", cfg.Steps, cfg.Batch)
	m, st, rep.Budgeted, err = trainLoop(planned, m, st, cfg.Steps, lmBatches(train, cfg.Batch, cfg.Seed), lossPrinter(w, cfg.Steps))
	if err != nil {
		return nil, err
	}
	deleteTree(st)
	rep.Losses = rep.Budgeted.Losses
	for i := range min(len(rep.Unconstrained.Losses), len(rep.Losses)) {
		rep.MaxLossDiff = math.Max(rep.MaxLossDiff, math.Abs(rep.Unconstrained.Losses[i]-rep.Losses[i]))
	}
	rep.HeldAfter = evaluate(eval, m, test, cfg.Batch)
	fmt.Fprintf(w, "held-out answers after fine-tuning:  %v\n\n", rep.HeldAfter)
	printMemory(w, rep)

	if err := saveDecoder(w, cfg, dec, m, testEx, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// lossPrinter returns trainLoop's every: it prints the mean loss of each
// tenth of steps.
func lossPrinter(w io.Writer, steps int) func(i int, l float64) {
	window, every := 0.0, max(steps/10, 1)
	return func(i int, l float64) {
		window += l
		if (i+1)%every == 0 || i == steps-1 {
			n := (i % every) + 1
			fmt.Fprintf(w, "  step %4d  loss %.4f (mean of the last %d)\n", i+1, window/float64(n), n)
			window = 0
		}
	}
}

// printPlan prints the planner's plan, in full with -plan.
func printPlan(w io.Writer, cfg Config, planned *rt.Compiled) {
	if cfg.FullPlan {
		fmt.Fprintf(w, "the planner's plan:\n%s\n", planned.MemoryPlan())
	} else {
		fmt.Fprintf(w, "the planner's plan (-plan lists every value):\n%s", planSummary(planned.MemoryPlan()))
	}
}

// printMemory prints the two programs' measured peaks and step times.
func printMemory(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "memory and time of a step (measured over the steps after the first):\n")
	if len(rep.Unconstrained.Losses) == 0 {
		fmt.Fprintf(w, "  unconstrained:   not run (-measure 0), analysed total %s\n", mib(rep.TotalBytes))
	} else {
		fmt.Fprintf(w, "  unconstrained:   device peak %s (analysed total %s), median step %.4f s\n", mib(rep.Unconstrained.Peak), mib(rep.TotalBytes), rep.Unconstrained.Seconds)
	}
	fmt.Fprintf(w, "  budget %s: device peak %s (analysed total %s), median step %.4f s\n", mib(rep.Budget), mib(rep.Budgeted.Peak), mib(rep.PlannedBytes), rep.Budgeted.Seconds)
	fmt.Fprintf(w, "  the first %d losses of the two programs differ by at most %.2g\n\n", min(len(rep.Unconstrained.Losses), len(rep.Losses)), rep.MaxLossDiff)
}
