package main

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Report is what a run measured.
type Report struct {
	Tiny bool
	// Family is the decoder's family ("GPT-2", "Llama"), "" for BERT.
	Family string
	// Losses are every training step's loss, under the budget.
	Losses []float64
	// AccBefore and AccAfter are the held-out accuracies before and after
	// fine-tuning (BERT).
	AccBefore, AccAfter float64
	// HeldBefore and HeldAfter are the decoder's held-out answers before
	// and after fine-tuning.
	HeldBefore, HeldAfter HeldOut
	// TotalBytes is the unconstrained step's analysed device total;
	// Budget the budget; PlannedBytes the plan's analysed total.
	TotalBytes, Budget, PlannedBytes int64
	// Unconstrained and Budgeted are the measured runs of the two
	// programs (device peak, fastest step).
	Unconstrained, Budgeted Run
	// MaxLossDiff is the largest |loss| difference between the
	// unconstrained program's steps and the budgeted run's first steps,
	// from the same start.
	MaxLossDiff float64
	// Reload is the reloaded model's largest |difference| from the
	// trained one (embeddings and logits, or the decoder's logits).
	Reload float64
	// Saved is the number of tensors in the saved model.safetensors.
	Saved int
}

// run fine-tunes, prints as it goes to w, saves and reloads.
func run(w io.Writer, cfg Config) (*Report, error) {
	defer rt.SetWarnings(rt.SetWarnings(nil)) // the pooler's absence is not a donation to warn about
	src, err := loadSource(w, cfg.Model)
	if err != nil {
		return nil, err
	}
	rep := &Report{Tiny: src.Tiny}
	fmt.Fprintf(w, "model %s\n", src.Describe)
	trainEx, testEx := Reviews(cfg.Train, cfg.Test, cfg.Seed)
	train, err := encode(src.Tok, trainEx, cfg.Seq)
	if err != nil {
		return nil, err
	}
	test, err := encode(src.Tok, testEx, cfg.Seq)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "task: positive or negative review; %d training reviews, %d held-out about %v (never in training), e.g. %q\n",
		train.N, test.N, testSubjects, testEx[0].Text)

	opt := optimizer(cfg.LR, cfg.Warmup, cfg.Steps, cfg.WeightDecay)
	step := stepFunc(opt)
	fresh := func() (Classifier, State, error) {
		bert, err := src.Bert.Tree()
		if err != nil {
			return Classifier{}, State{}, err
		}
		deleteTree(bert.Pooler)
		return newClassifier(bert, cfg.Seed, opt)
	}
	cls, st, err := fresh()
	if err != nil {
		return nil, err
	}
	logits := rt.Jit(func(c Classifier, ids, mask *trace.Array) *trace.Array { return c.Logits(ids, mask) })
	rep.AccBefore = accuracy(logits, cls, test, cfg.Batch)
	fmt.Fprintf(w, "held-out accuracy before fine-tuning (a new head): %.3f\n\n", rep.AccBefore)

	ids, mask, labels := train.batch(make([]int, cfg.Batch))
	base, planned, err := planStep(w, cfg, rep, step, []any{cls, st, ids, mask, labels})
	deleteTree(ids, mask, labels)
	if err != nil {
		return nil, err
	}

	// The unconstrained program, measured from the same start and thrown away.
	if cfg.Measure > 0 {
		c0, s0, run0, err := trainLoop(base, cls, st, cfg.Measure, reviewBatches(train, cfg.Batch, cfg.Seed), nil)
		if err != nil {
			return nil, err
		}
		deleteTree(c0, s0)
		rep.Unconstrained = run0
		fmt.Fprintf(w, "unconstrained step, %d steps: measured device peak %s, median step %.3f s\n",
			cfg.Measure, mib(run0.Peak), run0.Seconds)
		if cls, st, err = fresh(); err != nil {
			return nil, err
		}
	}

	fmt.Fprintf(w, "\nfine-tuning %d steps at batch %d under the budget:\n", cfg.Steps, cfg.Batch)
	cls, st, rep.Budgeted, err = trainLoop(planned, cls, st, cfg.Steps, reviewBatches(train, cfg.Batch, cfg.Seed), lossPrinter(w, cfg.Steps))
	if err != nil {
		return nil, err
	}
	rep.Losses = rep.Budgeted.Losses
	for i := range min(len(rep.Unconstrained.Losses), len(rep.Losses)) {
		rep.MaxLossDiff = math.Max(rep.MaxLossDiff, math.Abs(rep.Unconstrained.Losses[i]-rep.Losses[i]))
	}
	rep.AccAfter = accuracy(logits, cls, test, cfg.Batch)
	fmt.Fprintf(w, "held-out accuracy after fine-tuning: %.3f (before %.3f)\n\n", rep.AccAfter, rep.AccBefore)
	printMemory(w, rep)

	if err := saveAndReload(w, cfg.Out, src, cls, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// planSummary is the plan's first line and, per action, how many values
// it applies to and their bytes.
func planSummary(p *passes.MemoryPlan) string {
	head, _, _ := strings.Cut(p.String(), "\n")
	type sum struct {
		n     int
		bytes int64
	}
	acts := map[string]*sum{}
	var order []string
	for _, v := range p.Values {
		if acts[v.Action] == nil {
			acts[v.Action] = &sum{}
			order = append(order, v.Action)
		}
		acts[v.Action].n++
		acts[v.Action].bytes += v.Bytes
	}
	var b strings.Builder
	b.WriteString(head + "\n")
	for _, a := range order {
		what := "residuals of the layers' scan"
		switch a {
		case passes.ActionHostArgument:
			what = "parameter leaves in pinned_host, streamed into the scan"
		case passes.ActionHostState:
			what = "optimizer-state leaves in pinned_host, copied in where used and their new values out"
		}
		fmt.Fprintf(&b, "  %-13s %3d %s, %s\n", a, acts[a].n, what, mib(acts[a].bytes))
	}
	return b.String()
}
