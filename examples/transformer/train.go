package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/progress"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

const fortuneDir = "/usr/share/games/fortunes"

// Config is one training run.
type Config struct {
	Data              string
	Steps, Batch, Seq int
	Layers, D, Heads  int
	LR                float64
	Seed              uint64
	Remat             string // none|nothing|dots|offload
	// Budget, when positive, jits the train step with rt.MemoryBudget of
	// this fraction of its device total without a budget (0.5: half).
	Budget                float64
	OffloadParams         bool
	OffloadOpt            bool
	EvalBatches           int
	Samples               int
	Prompt                string
	Temperature           float64
	Log                   *progress.Reporter // what Run is doing and how far it is; nil: silent
	LossEvery             int                // record the training loss every LossEvery steps in Result.Losses (0: never)
	WarmupSteps           int                // 0: min(100, Steps/10)
	ValFraction           float64            // 0: 0.05
	WeightDecay, ClipNorm float64            // 0: 0.01 and 1.0
	// SaveHF, when set, is a directory the trained model is saved into as
	// a Hugging Face GPT-2 (SaveHF).
	SaveHF string
	// KeepModel returns the trained model in Result.Model (its arrays then
	// stay alive, and in the device's memory, as long as the Result does).
	KeepModel bool
}

var defaultConfig = Config{
	Steps: 2000, Batch: 32, Seq: 64, Layers: 4, D: 128, Heads: 4,
	LR: 3e-3, Seed: 0, EvalBatches: 16,
}

// Memory is a compiled program's memory analysis in bytes.
type Memory struct {
	ArgumentBytes     int64 `json:"argument_bytes"`
	OutputBytes       int64 `json:"output_bytes"`
	AliasBytes        int64 `json:"alias_bytes"`
	TempBytes         int64 `json:"temp_bytes"`
	TotalBytes        int64 `json:"total_bytes"`
	HostArgumentBytes int64 `json:"host_argument_bytes"`
	HostOutputBytes   int64 `json:"host_output_bytes"`
	HostAliasBytes    int64 `json:"host_alias_bytes"`
	HostTempBytes     int64 `json:"host_temp_bytes"`
	HostTotalBytes    int64 `json:"host_total_bytes"`
}

func memoryOf(m passes.MemoryAnalysis) Memory {
	return Memory{
		ArgumentBytes: m.ArgumentBytes, OutputBytes: m.OutputBytes, AliasBytes: m.AliasBytes,
		TempBytes: m.TempBytes, TotalBytes: m.TotalBytes(),
		HostArgumentBytes: m.HostArgumentBytes, HostOutputBytes: m.HostOutputBytes,
		HostAliasBytes: m.HostAliasBytes, HostTempBytes: m.HostTempBytes, HostTotalBytes: m.HostTotalBytes(),
	}
}

// Result is what a run measured.
type Result struct {
	ValLoss        float64 `json:"val_loss"`
	UnigramEntropy float64 `json:"unigram_entropy"`
	Steps          int     `json:"steps"`
	Seconds        float64 `json:"seconds"`
	TrainSeconds   float64 `json:"train_seconds"`
	MsPerStep      float64 `json:"ms_per_step"`
	// StepGFLOP is the train step's model FLOPs (forward and backward
	// matrix products, rt.Lowered.CostAnalysis) in billions.
	StepGFLOP float64 `json:"step_gflop"`
	// HostSteps lists the train step's steps that an accelerator backend
	// runs on the host (rt.Compiled.HostSteps; none on the CPU backend).
	HostSteps    []string  `json:"host_steps,omitempty"`
	FinalLoss    float64   `json:"final_train_loss"`
	Losses       []float64 `json:"train_losses,omitempty"`
	Memory       Memory    `json:"memory"`
	MemoryString string    `json:"-"`
	Vocab        int       `json:"vocab"`
	Params       int       `json:"params"`
	TrainChars   int       `json:"train_chars"`
	ValChars     int       `json:"val_chars"`
	Config       string    `json:"config"`
	SampleText   string    `json:"samples,omitempty"`
	// With a budget (Config.Budget): the budget in bytes, the device total
	// without it, and the plan's estimate of a step.
	BudgetBytes        int64   `json:"budget_bytes,omitempty"`
	BaselineTotalBytes int64   `json:"baseline_total_bytes,omitempty"`
	EstimatedMsPerStep float64 `json:"estimated_ms_per_step,omitempty"`
	// PeakDeviceBytes is the allocator's device peak over the training
	// steps (parameters, optimizer state and batches included).
	PeakDeviceBytes int64 `json:"peak_device_bytes"`
	// Model is the trained model (with Config.KeepModel) and Chars its
	// vocabulary (token id i is the byte Chars[i]).
	Model Model  `json:"-"`
	Chars []byte `json:"-"`
}

// loadText reads path, or with path "" concatenates the plain-text fortune
// files (those without .dat/.u8 extensions).
func loadText(path string) (string, error) {
	if path != "" {
		b, err := os.ReadFile(path)
		return string(b), err
	}
	ents, err := os.ReadDir(fortuneDir)
	if err != nil {
		return "", fmt.Errorf("no training text: %v; install it with `apt-get install fortunes` or give a text file with -data FILE", err)
	}
	var sb strings.Builder
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || strings.HasSuffix(n, ".dat") || strings.HasSuffix(n, ".u8") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(fortuneDir, n))
		if err != nil {
			continue
		}
		sb.Write(b)
	}
	if sb.Len() == 0 {
		return "", fmt.Errorf("no fortune files in %s; install them with `apt-get install fortunes` or give a text file with -data FILE", fortuneDir)
	}
	return sb.String(), nil
}

// Vocab maps the bytes present in a text to ids 0..n-1.
type Vocab struct {
	id    [256]int32
	bytes []byte
}

func newVocab(text string) *Vocab {
	var seen [256]bool
	for i := 0; i < len(text); i++ {
		seen[text[i]] = true
	}
	v := &Vocab{}
	for b := range 256 {
		v.id[b] = -1
		if seen[b] {
			v.id[b] = int32(len(v.bytes))
			v.bytes = append(v.bytes, byte(b))
		}
	}
	return v
}

func (v *Vocab) encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		id := v.id[s[i]]
		if id < 0 {
			id = 0
		}
		out[i] = id
	}
	return out
}

// unigramEntropy is −Σ p log p over the symbol frequencies of ids, in nats.
func unigramEntropy(ids []int32, n int) float64 {
	counts := make([]float64, n)
	for _, id := range ids {
		counts[id]++
	}
	h := 0.0
	for _, c := range counts {
		if c > 0 {
			p := c / float64(len(ids))
			h -= p * math.Log(p)
		}
	}
	return h
}

// Model is the language model: nn.TransformerLM (tied token embedding,
// learned positions, scanned pre-norm blocks, final LayerNorm).
type Model = nn.TransformerLM

func rematPolicy(name string) (trace.CheckpointPolicy, error) {
	switch name {
	case "", "none":
		return nil, nil
	case "nothing":
		return trace.NothingSaveable, nil
	case "dots":
		return trace.DotsSaveable, nil
	case "offload":
		return trace.SaveAndOffloadOnlyTheseNames(nil, []string{nn.BlockInput}, ir.Device, ir.PinnedHost), nil
	}
	return nil, fmt.Errorf("unknown -remat %q (want none, nothing, dots or offload)", name)
}

// batcher draws random windows of seq+1 symbols.
type batcher struct {
	ids      []int32
	batch    int
	seq      int
	r        *rand.Rand
	xs, ys   []int32
	position int // for sequential (validation) batches
}

func newBatcher(ids []int32, batch, seq int, seed uint64) *batcher {
	return &batcher{ids: ids, batch: batch, seq: seq, r: rand.New(rand.NewPCG(seed, 0x7f4a7c15)),
		xs: make([]int32, batch*seq), ys: make([]int32, batch*seq)}
}

func (b *batcher) fill(start func(i int) int) (x, y *trace.Array) {
	for i := range b.batch {
		s := start(i)
		copy(b.xs[i*b.seq:(i+1)*b.seq], b.ids[s:s+b.seq])
		copy(b.ys[i*b.seq:(i+1)*b.seq], b.ids[s+1:s+b.seq+1])
	}
	return rt.FromSlice(b.xs, b.batch, b.seq), rt.FromSlice(b.ys, b.batch, b.seq)
}

func (b *batcher) random() (x, y *trace.Array) {
	return b.fill(func(int) int { return b.r.IntN(len(b.ids) - b.seq - 1) })
}

// evenly returns batch k of n batches whose windows are spread evenly over ids.
func (b *batcher) evenly(k, n int) (x, y *trace.Array) {
	total := n * b.batch
	span := len(b.ids) - b.seq - 1
	return b.fill(func(i int) int { return (k*b.batch + i) * span / total })
}

// Run trains a model on text as cfg says.
func Run(cfg Config, text string) (res Result, err error) {
	defer trace.Recover(&err)
	if cfg.Steps < 0 || cfg.Batch <= 0 || cfg.Seq <= 0 || cfg.Layers <= 0 || cfg.D <= 0 || cfg.Heads <= 0 {
		return res, errors.New("steps, batch, seq, layers, d and heads must be positive")
	}
	policy, err := rematPolicy(cfg.Remat)
	if err != nil {
		return res, err
	}
	valFrac := cfg.ValFraction
	if valFrac == 0 {
		valFrac = 0.05
	}
	vocab := newVocab(text)
	ids := vocab.encode(text)
	nVal := int(float64(len(ids)) * valFrac)
	train, val := ids[:len(ids)-nVal], ids[len(ids)-nVal:]
	if len(train) < cfg.Seq+2 {
		return res, fmt.Errorf("text too short: %d training symbols for -seq %d", len(train), cfg.Seq)
	}
	if len(val) < cfg.Seq+2 {
		val = train // tiny texts: validate on the training text
	}
	V := len(vocab.bytes)
	res.Vocab, res.TrainChars, res.ValChars = V, len(train), len(val)
	res.UnigramEntropy = unigramEntropy(train, V)
	res.Config = fmt.Sprintf("layers=%d d=%d heads=%d seq=%d batch=%d steps=%d lr=%g remat=%s offload_params=%v offload_opt=%v budget=%g tied=true",
		cfg.Layers, cfg.D, cfg.Heads, cfg.Seq, cfg.Batch, cfg.Steps, cfg.LR, cfg.Remat, cfg.OffloadParams, cfg.OffloadOpt, cfg.Budget)

	warmup := cfg.WarmupSteps
	if warmup == 0 {
		warmup = min(100, cfg.Steps/10)
	}
	wd, clip := cfg.WeightDecay, cfg.ClipNorm
	if wd == 0 {
		wd = 0.01
	}
	if clip == 0 {
		clip = 1
	}
	opt := optim.Chain(
		optim.ClipByGlobalNorm[Model](clip),
		optim.AdamW[Model](optim.WarmupCosine(cfg.LR, warmup, max(cfg.Steps, warmup+1), cfg.LR/10), 0.9, 0.95, 1e-8, wd),
	)

	key := random.NewKey(cfg.Seed)
	ks := random.Keys(key, 2)
	cfg.Log.Phase("initialising the parameters (jitted)…")
	params := rt.Jit(func(k *trace.Array) Model {
		return nn.NewTransformerLM(k, ir.Float32, V, cfg.Seq, cfg.Layers, cfg.D, cfg.Heads, 4*cfg.D)
	})(ks[0])
	for _, l := range trace.Leaves(params) {
		res.Params += l.Shape().Size()
	}
	// The optimizer state, made directly in pinned_host with -offload-opt.
	space := ir.Device
	if cfg.OffloadOpt {
		space = ir.PinnedHost
	}
	state, err := optim.InitIn(opt, params, space)
	if err != nil {
		return res, err
	}
	var stackOpts []nn.StackOption
	if policy != nil {
		stackOpts = append(stackOpts, nn.WithRemat(policy))
	}
	if cfg.OffloadParams {
		stackOpts = append(stackOpts, nn.WithParamOffload())
		if params.Blocks, err = optim.ToSpace(params.Blocks, ir.PinnedHost); err != nil {
			return res, err
		}
	}

	type optState = optim.ChainState[optim.EmptyState, optim.AdamState[Model]]
	step := func(p Model, s optState, x, y *trace.Array) (Model, optState, *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p Model) *trace.Array { return p.Loss(x, y, stackOpts...) })(p)
		if cfg.OffloadParams {
			// The update runs on device; the new stacked parameters go back to host.
			p.Blocks = toSpace(p.Blocks, ir.Device)
			g.Blocks = toSpace(g.Blocks, ir.Device)
		}
		upd, s2, err := opt.Update(g, s, p)
		if err != nil {
			return Model{}, optState{}, nil, err
		}
		p2, err := optim.ApplyUpdates(p, upd)
		if err != nil {
			return Model{}, optState{}, nil, err
		}
		if cfg.OffloadParams {
			p2.Blocks = toSpace(p2.Blocks, ir.PinnedHost)
		}
		return p2, s2, loss, nil
	}
	jopts := []rt.Option{rt.Donate(0, 1)}
	if cfg.OffloadOpt {
		jopts = append(jopts, rt.OutSpace(1, ir.PinnedHost))
	}
	jstep := rt.NewJitted(step, jopts...)
	tb := newBatcher(train, cfg.Batch, cfg.Seq, cfg.Seed+1)

	// The train step's memory analysis.
	cfg.Log.Phase("tracing and compiling the training step (the first call takes a while)…")
	x0, y0 := tb.random()
	low, err := jstep.Lower(params, state, x0, y0)
	if err != nil {
		return res, err
	}
	comp, err := low.Compile()
	if err != nil {
		return res, err
	}
	if cfg.Budget > 0 {
		// The same step under a budget: a fraction of this one's total.
		res.BaselineTotalBytes = comp.MemoryAnalysis().TotalBytes()
		res.BudgetBytes = int64(cfg.Budget * float64(res.BaselineTotalBytes))
		cfg.Log.Phase("planning and compiling the training step under a budget of %s…", backend.FormatBytes(res.BudgetBytes))
		jstep = rt.NewJitted(step, append(jopts, rt.MemoryBudget(res.BudgetBytes))...)
		if low, err = jstep.Lower(params, state, x0, y0); err != nil {
			return res, err
		}
		if comp, err = low.Compile(); err != nil {
			return res, err
		}
		res.EstimatedMsPerStep = 1000 * comp.MemoryPlan().StepSeconds
	}
	res.StepGFLOP = low.CostAnalysis().DotFlops / 1e9
	res.HostSteps = comp.HostSteps()
	ma := comp.MemoryAnalysis()
	res.Memory, res.MemoryString = memoryOf(ma), ma.String()

	fn := jstep.Fn()
	cfg.Log.Phase("training %d steps…", cfg.Steps)
	rt.ResetPeakMemory()
	t0 := time.Now()
	var tFirst time.Time
	for i := range cfg.Steps {
		x, y := tb.random()
		var loss *trace.Array
		if params, state, loss, err = fn(params, state, x, y); err != nil {
			return res, err
		}
		if i == 0 {
			tFirst = time.Now() // the first step compiles
		}
		last := i == cfg.Steps-1
		record := cfg.LossEvery > 0 && i%cfg.LossEvery == 0
		// Reading the loss waits for the step: only every tenth (the
		// Reporter shows at most ten lines a second on a terminal, one
		// every 10 s in a log).
		show := !cfg.Log.Quiet() && (i%10 == 0 || last)
		if record || show || last {
			l := loss.Item()
			if record {
				res.Losses = append(res.Losses, l)
			}
			res.FinalLoss = l
			if show {
				el := time.Since(t0).Seconds()
				sps := float64(i+1) / el
				if i > 0 {
					sps = float64(i) / time.Since(tFirst).Seconds()
				}
				if last {
					cfg.Log.Done("step %d/%d, loss %.4f, %.2f steps/s; trained in %s", i+1, cfg.Steps, l, sps, progress.Seconds(time.Since(t0)))
				} else {
					cfg.Log.Update("step %d/%d, loss %.4f, %.2f steps/s", i+1, cfg.Steps, l, sps)
				}
			}
		}
		loss.Delete()
	}
	res.Steps = cfg.Steps
	res.TrainSeconds = time.Since(t0).Seconds()
	res.PeakDeviceBytes = rt.MemoryStats(ir.Device).PeakBytesInUse
	if cfg.Steps > 1 {
		res.MsPerStep = 1000 * time.Since(tFirst).Seconds() / float64(cfg.Steps-1)
	}

	// Validation: the mean loss over EvalBatches batches spread over the split.
	evalParams := params
	if cfg.OffloadParams {
		evalParams.Blocks = toSpace(params.Blocks, ir.Device)
	}
	cfg.Log.Phase("evaluating on %d validation batches…", max(cfg.EvalBatches, 1))
	evalLoss := rt.Jit(func(p Model, x, y *trace.Array) *trace.Array { return p.Loss(x, y) })
	vb := newBatcher(val, cfg.Batch, cfg.Seq, 0)
	nb := max(cfg.EvalBatches, 1)
	sum := 0.0
	for k := range nb {
		x, y := vb.evenly(k, nb)
		sum += evalLoss(evalParams, x, y).Item()
	}
	res.ValLoss = sum / float64(nb)

	res.Chars = vocab.bytes
	if cfg.KeepModel {
		res.Model = evalParams
	}
	if cfg.SaveHF != "" {
		cfg.Log.Phase("saving the model as a Hugging Face GPT-2 into %s…", cfg.SaveHF)
		if err := SaveHF(cfg.SaveHF, evalParams, vocab); err != nil {
			return res, err
		}
	}
	if cfg.Samples > 0 {
		cfg.Log.Phase("sampling %d characters…", cfg.Samples)
		res.SampleText = sample(evalParams, vocab, cfg, ks[1])
	}
	return res, nil
}

// sample generates cfg.Samples characters after cfg.Prompt with temperature
// sampling (random.Categorical over logits/temperature).
func sample(p Model, v *Vocab, cfg Config, key *trace.Array) string {
	T := cfg.Seq
	temp := cfg.Temperature
	if temp <= 0 {
		temp = 1
	}
	next := rt.Jit(func(p Model, ids, pos, key *trace.Array) *trace.Array {
		lg := p.Logits(ids)                                         // [1, T, V]
		sel := trace.OneHot(pos, T, ir.Float32)                     // [T]
		lt := trace.Sum(trace.Mul(lg, trace.ExpandDims(sel, 1)), 1) // [1, V]
		lt = trace.Mul(lt, trace.Scalar(1/temp))
		return random.Categorical(key, lt, 1)
	})
	ctx := v.encode(cfg.Prompt)
	if len(ctx) == 0 {
		ctx = []int32{0}
	}
	var out []byte
	buf := make([]int32, T)
	for i := range cfg.Samples {
		w := ctx
		if len(w) > T {
			w = w[len(w)-T:]
		}
		clear(buf)
		copy(buf, w)
		k := random.FoldIn(key, uint32(i))
		tok := next(p, rt.FromSlice(buf, 1, T), rt.FromScalar(int32(len(w)-1)), k).Int32s()[0]
		ctx = append(ctx, tok)
		out = append(out, v.bytes[tok])
	}
	return string(out)
}

// toSpace puts every leaf of tree in memory space sp (trace.DevicePut).
func toSpace[T any](tree T, sp ir.MemorySpace) T {
	t, err := trace.MapAs(tree, func(a *trace.Array) *trace.Array { return trace.DevicePut(a, sp) })
	if err != nil {
		panic(err)
	}
	return t
}
