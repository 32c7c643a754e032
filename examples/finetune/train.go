package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	goruntime "runtime"
	"sort"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// Classifier is the model fine-tuned: the pretrained BERT encoder (its
// pooler left out, nil, as sentence-transformers leaves it out) and a
// linear head [2, D] on the mean of the hidden states over the real
// tokens.
type Classifier struct {
	Bert nn.Bert
	Head nn.Linear
}

// Embed returns the mean-pooled hidden states [B, D] of ids [B, T] under
// the attention mask (sentence-transformers' Pooling module); opts apply to
// the encoder's scan.
func (c Classifier) Embed(ids, mask *trace.Array) *trace.Array {
	h := c.Bert.Encode(ids, nil, nn.Context{Padding: mask})
	w := trace.ExpandDims(trace.Convert(mask, h.DType()), 2)
	return trace.Div(trace.Sum(trace.Mul(h, w), 1), trace.Maximum(trace.Sum(w, 1), trace.Scalar(1e-9)))
}

// Logits returns the head's logits [B, 2].
func (c Classifier) Logits(ids, mask *trace.Array) *trace.Array {
	return c.Head.Apply(c.Embed(ids, mask))
}

// normalize returns the rows of e [B, D] scaled to unit length, the
// sentence-transformers embedding (its Normalize module).
func normalize(e *trace.Array) *trace.Array {
	n := trace.Sqrt(trace.Sum(trace.Mul(e, e), 1))
	return trace.Div(e, trace.ExpandDims(trace.Maximum(n, trace.Scalar(1e-12)), 1))
}

// State is AdamW's state over a Classifier: the step count and the two
// moments, each a Classifier-shaped tree.
type State = optim.AdamState[Classifier]

// optimizer is AdamW with weight decay wd and a schedule that warms up
// linearly to lr over warmup steps and decays along a half cosine to 0 at
// step steps.
func optimizer(lr float64, warmup, steps int, wd float64) optim.Optimizer[Classifier, State] {
	return optim.AdamW[Classifier](optim.WarmupCosine(lr, warmup, steps, 0), 0.9, 0.999, 1e-8, wd)
}

// stepFunc returns the training step: the cross-entropy of the head's
// logits against labels, its gradient, and the AdamW update. The caller
// donates the classifier and the state (arguments 0 and 1).
func stepFunc(opt optim.Optimizer[Classifier, State]) func(Classifier, State, *trace.Array, *trace.Array, *trace.Array) (Classifier, State, *trace.Array) {
	return func(c Classifier, s State, ids, mask, labels *trace.Array) (Classifier, State, *trace.Array) {
		loss, g := trace.ValueAndGrad(func(c Classifier) *trace.Array {
			return nn.SoftmaxCrossEntropy(c.Logits(ids, mask), labels)
		})(c)
		c, s, err := optim.Step(opt, g, s, c)
		if err != nil {
			panic(err)
		}
		return c, s, loss
	}
}

// Batches are the reviews tokenized, padded to one length: ids and
// attention masks [n, T] and labels [n], row-major.
type Batches struct {
	N, T         int
	IDs, Mask    []int32
	Labels       []int32
	Texts        []string
	tokensPerRow []int
}

// encode tokenizes examples with tok, padded to seq tokens.
func encode(tok *tokenizer.Tokenizer, examples []Example, seq int) (*Batches, error) {
	tok, err := tok.WithPadding(&tokenizer.Padding{Token: "[PAD]", Length: seq})
	if err != nil {
		return nil, err
	}
	texts := make([]string, len(examples))
	for i, e := range examples {
		texts[i] = e.Text
	}
	encs, err := tok.EncodeBatch(texts)
	if err != nil {
		return nil, err
	}
	b := &Batches{N: len(examples), T: seq, Texts: texts}
	for i, e := range encs {
		if e.Len() != seq {
			return nil, fmt.Errorf("%q is %d tokens, longer than %d", texts[i], e.Len(), seq)
		}
		for j := range e.IDs {
			b.IDs = append(b.IDs, int32(e.IDs[j]))
			b.Mask = append(b.Mask, int32(e.AttentionMask[j]))
		}
		b.Labels = append(b.Labels, examples[i].Label)
	}
	return b, nil
}

// batch returns rows (indices into b) as arrays: ids, mask [len(rows), T],
// labels [len(rows)].
func (b *Batches) batch(rows []int) (ids, mask, labels *trace.Array) {
	n := len(rows)
	id, m, l := make([]int32, 0, n*b.T), make([]int32, 0, n*b.T), make([]int32, 0, n)
	for _, r := range rows {
		id = append(id, b.IDs[r*b.T:(r+1)*b.T]...)
		m = append(m, b.Mask[r*b.T:(r+1)*b.T]...)
		l = append(l, b.Labels[r])
	}
	return rt.FromSlice(id, n, b.T), rt.FromSlice(m, n, b.T), rt.FromSlice(l, n)
}

// accuracy is the share of b's reviews whose arg-max logit is their label,
// computed batch rows at a time (the last batch padded with row 0).
func accuracy(logits func(Classifier, *trace.Array, *trace.Array) *trace.Array, c Classifier, b *Batches, batch int) float64 {
	right := 0
	for start := 0; start < b.N; start += batch {
		rows := make([]int, batch)
		for i := range rows {
			if start+i < b.N {
				rows[i] = start + i
			}
		}
		ids, mask, _ := b.batch(rows)
		pred := trace.ArgMax(logits(c, ids, mask), 1).Int64s()
		for i := range min(batch, b.N-start) {
			if int32(pred[i]) == b.Labels[start+i] {
				right++
			}
		}
	}
	return float64(right) / float64(b.N)
}

// newClassifier returns the classifier of the encoder bert (its pooler
// dropped) with a new head, normal of standard deviation 0.02 with key
// seed, and AdamW's initial state.
func newClassifier(bert nn.Bert, seed uint64, opt optim.Optimizer[Classifier, State]) (Classifier, State, error) {
	bert.Pooler = nn.Linear{}
	d := bert.Word.Table.Shape()[1]
	head := nn.NewLinearLayout(random.NewKey(seed), bert.Word.Table.DType(), d, 2, nn.LayoutOutIn, nn.NormalInit(0.02), nn.Zeros)
	c := Classifier{Bert: bert, Head: head}
	s, err := opt.Init(c)
	return c, s, err
}

// compileStep compiles a training step (arguments: the parameters, the
// optimizer state, then the batch's arrays) for args with opts, donating
// the parameters and the state.
func compileStep[F any](step F, args []any, opts ...rt.Option) (*rt.Compiled, error) {
	opts = append([]rt.Option{rt.WithName("finetune_step"), rt.Donate(0, 1)}, opts...)
	low, err := rt.NewJitted(step, opts...).Lower(args...)
	if err != nil {
		return nil, err
	}
	return low.Compile()
}

// planBudget compiles the step without a budget and under frac of its
// device total, or under the smallest budget the planner reaches when
// frac's is below it.
func planBudget[F any](step F, args []any, frac float64) (base, planned *rt.Compiled, budget int64, note string, err error) {
	if base, err = compileStep(step, args); err != nil {
		return nil, nil, 0, "", err
	}
	budget = int64(frac * float64(base.MemoryAnalysis().TotalBytes()))
	planned, err = compileStep(step, args, rt.MemoryBudget(budget))
	var be *rt.MemoryBudgetError
	if errors.As(err, &be) {
		note = fmt.Sprintf("%.0f%% of the total (%s) is below the smallest budget the planner reaches; using that, %s", 100*frac, mib(budget), mib(be.Minimum))
		budget = be.Minimum
		planned, err = compileStep(step, args, rt.MemoryBudget(budget))
	}
	return base, planned, budget, note, err
}

// planStep plans the step of a batch of cfg.Batch×cfg.Seq tokens under
// cfg.Budget (planBudget), records the two programs' device totals and the
// budget in rep, and prints them with the plan.
func planStep[F any](w io.Writer, cfg Config, rep *Report, step F, args []any) (base, planned *rt.Compiled, err error) {
	base, planned, budget, note, err := planBudget(step, args, cfg.Budget)
	if err != nil {
		return nil, nil, err
	}
	rep.TotalBytes, rep.Budget, rep.PlannedBytes = base.MemoryAnalysis().TotalBytes(), budget, planned.MemoryAnalysis().TotalBytes()
	fmt.Fprintf(w, "training step (batch %d, %d tokens each): unconstrained device total %s; budget %s (%.0f%%)\n",
		cfg.Batch, cfg.Seq, mib(rep.TotalBytes), mib(budget), 100*float64(budget)/float64(rep.TotalBytes))
	if note != "" {
		fmt.Fprintln(w, note)
	}
	printPlan(w, cfg, planned)
	return base, planned, nil
}

// Run is what one compiled step did over some calls: the measured device
// peak (the pool's, arguments included) over the calls after the first,
// the median time of those calls, and every loss.
type Run struct {
	Peak    int64
	Seconds float64
	Losses  []float64
}

// median is the median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// trainLoop runs c (a compiled step) for steps steps from (p, s), the
// batch of each step made by next, measuring after the first call, and
// returns the trained parameters and state. The loss is read after each
// step (which waits for it) and passed to every when it is not nil.
func trainLoop[P, S any](c *rt.Compiled, p P, s S, steps int, next func() []*trace.Array, every func(i int, loss float64)) (P, S, Run, error) {
	var run Run
	var times []float64
	for i := range steps {
		batch := next()
		if i > 0 {
			collect()
			rt.ResetPeakMemory()
		}
		start := time.Now()
		args := []any{p, s}
		for _, a := range batch {
			args = append(args, a)
		}
		outs, err := c.Call(args...)
		if err != nil {
			return p, s, run, err
		}
		p, s = outs[0].(P), outs[1].(S)
		loss := outs[2].(*trace.Array)
		l := loss.Item() // waits for the step
		if i > 0 {
			times = append(times, time.Since(start).Seconds())
			run.Peak = max(run.Peak, rt.MemoryStats(ir.Device).PeakBytesInUse)
		}
		run.Losses = append(run.Losses, l)
		if every != nil {
			every(i, l)
		}
		deleteTree(batch, loss)
	}
	run.Seconds = median(times)
	return p, s, run, nil
}

// reviewBatches returns the next function of trainLoop over train: batch
// reviews a step, in an order shuffled with seed each epoch.
func reviewBatches(train *Batches, batch int, seed uint64) func() []*trace.Array {
	order := shuffler(train.N, seed)
	return func() []*trace.Array {
		ids, mask, labels := train.batch(order.next(batch))
		return []*trace.Array{ids, mask, labels}
	}
}

// shuffle walks 0..n-1 in a new random order each epoch.
type shuffle struct {
	r     *rand.Rand
	order []int
	pos   int
}

func shuffler(n int, seed uint64) *shuffle {
	s := &shuffle{r: rand.New(rand.NewPCG(seed, 1)), order: make([]int, n)}
	for i := range s.order {
		s.order[i] = i
	}
	s.r.Shuffle(n, func(i, j int) { s.order[i], s.order[j] = s.order[j], s.order[i] })
	return s
}

// next returns the next k indices, reshuffling at the end of an epoch.
func (s *shuffle) next(k int) []int {
	out := make([]int, 0, k)
	for len(out) < k {
		if s.pos == len(s.order) {
			s.r.Shuffle(len(s.order), func(i, j int) { s.order[i], s.order[j] = s.order[j], s.order[i] })
			s.pos = 0
		}
		out = append(out, s.order[s.pos])
		s.pos++
	}
	return out
}

// collect lets garbage buffers go back to the pools before a measurement.
func collect() {
	for range 2 {
		goruntime.GC()
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// deleteTree frees every array of trees.
func deleteTree(trees ...any) {
	for _, t := range trees {
		for _, a := range trace.Leaves(t) {
			_ = a.Delete()
		}
	}
}
