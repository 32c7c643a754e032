// Command mlp trains a two-layer perceptron (784 → 512 → 10, ReLU) on
// Fashion-MNIST with Adam: minibatches reshuffled every epoch, the training step
// jitted with the parameters and the optimizer state donated (rt.Donate(0, 1)),
// evaluation jitted too.
//
//	sudo apt-get install dataset-fashion-mnist   # or -data DIR
//	go run ./examples/mlp                         # progress per epoch
//	go run ./examples/mlp -json                   # one JSON object at the end
//
// It first says what it is doing (loading the data, tracing and compiling the
// training step: the first call takes a while). On a terminal each epoch is
// then a progress line updated in place; otherwise one line per epoch (and a
// line every 10 s within a long epoch). With -json the progress goes to stderr
// and stdout holds only the final JSON object (test_accuracy, epochs,
// seconds, ...). -quiet (or FERRY_PROGRESS=0) prints only the result
// (internal/progress).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/ferryml/ferry/datasets"
	"github.com/ferryml/ferry/internal/progress"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Config is a training run's settings.
type Config struct {
	Hidden    int     // hidden width
	Classes   int     // number of classes
	Epochs    int     // passes over the training set
	Batch     int     // minibatch size (the last partial batch of an epoch is dropped)
	EvalBatch int     // evaluation batch size
	LR        float64 // Adam learning rate
	Seed      uint64  // parameter initialisation and shuffling
}

// Progress is reported during training: either a Phase that starts, or how
// far an epoch is.
type Progress struct {
	Phase         string // when not empty, the work that starts ("compiling the training step…"); the other fields are unset
	Epoch, Epochs int
	Step, Steps   int     // steps done in this epoch, of Steps
	Loss          float64 // mean training loss of the epoch so far
	StepsPerSec   float64 // this epoch's speed
	TestAccuracy  float64 // set when Done
	Done          bool    // the epoch is finished and evaluated
}

// Result is the summary of a run, printed by -json.
type Result struct {
	TestAccuracy   float64 `json:"test_accuracy"`
	TestLoss       float64 `json:"test_loss"`
	TrainLoss      float64 `json:"train_loss"` // mean over the last epoch
	Epochs         int     `json:"epochs"`
	Steps          int     `json:"steps"`
	Batch          int     `json:"batch"`
	LR             float64 `json:"lr"`
	Hidden         int     `json:"hidden"`
	Seed           uint64  `json:"seed"`
	Seconds        float64 `json:"seconds"`       // the whole run: compile, train, evaluate
	TrainSeconds   float64 `json:"train_seconds"` // training steps only
	StepsPerSecond float64 `json:"steps_per_second"`
	TrainExamples  int     `json:"train_examples"`
	TestExamples   int     `json:"test_examples"`
}

// Model is the network: an nn.MLP with ReLU between its two layers.
type Model = nn.MLP

// Train trains a fresh model on train for cfg.Epochs epochs, evaluating on test
// after each; progress (if not nil) is called every few steps and after each
// epoch.
func Train(train, test *datasets.ImageSet, cfg Config, progress func(Progress)) (Result, Model, error) {
	start := time.Now()
	features := train.Features()
	if test.Features() != features {
		return Result{}, Model{}, fmt.Errorf("train has %d features, test %d", features, test.Features())
	}
	if cfg.Batch <= 0 || cfg.Batch > train.N {
		return Result{}, Model{}, fmt.Errorf("batch %d: want 1..%d (the training set size)", cfg.Batch, train.N)
	}
	phase := func(what string) {
		if progress != nil {
			progress(Progress{Phase: what})
		}
	}
	sizes := []int{features, cfg.Hidden, cfg.Classes}
	phase("initialising the parameters (jitted)…")
	params := rt.Jit(func(key *trace.Array) Model {
		return nn.NewMLP(key, ir.Float32, sizes, nn.Relu)
	})(random.NewKey(cfg.Seed))

	opt := optim.Adam[Model](optim.Constant(cfg.LR), 0.9, 0.999, 1e-8)
	state, err := opt.Init(params)
	if err != nil {
		return Result{}, Model{}, err
	}
	step := rt.Jit(func(p Model, s optim.AdamState[Model], x, y *trace.Array) (Model, optim.AdamState[Model], *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p Model) *trace.Array {
			return nn.SoftmaxCrossEntropy(p.Apply(x), y)
		})(p)
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, loss, err
	}, rt.Donate(0, 1), rt.WithName("mlp_train_step"))
	// eval returns the number of correct predictions and the summed loss.
	eval := rt.Jit(func(p Model, x, y *trace.Array) (correct, lossSum *trace.Array) {
		logits := p.Apply(x)
		hit := trace.Equal(trace.Convert(trace.ArgMax(logits, 1), ir.Int32), y)
		n := float64(x.Shape()[0])
		return trace.Sum(trace.Convert(hit, ir.Float32)),
			trace.Mul(nn.SoftmaxCrossEntropy(logits, y), trace.Scalar(n))
	}, rt.WithName("mlp_eval"))

	evaluate := func(p Model, set *datasets.ImageSet) (acc, loss float64) {
		var correct, lossSum float64
		eb := max(1, min(cfg.EvalBatch, set.N))
		for lo := 0; lo < set.N; lo += eb {
			hi := min(lo+eb, set.N)
			x := rt.FromSlice(set.Images[lo*features:hi*features], hi-lo, features)
			y := rt.FromSlice(set.Labels[lo:hi], hi-lo)
			c, l := eval(p, x, y)
			correct += c.Item()
			lossSum += l.Item()
			for _, a := range []*trace.Array{x, y, c, l} {
				a.Delete()
			}
		}
		return correct / float64(set.N), lossSum / float64(set.N)
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	steps := train.N / cfg.Batch
	xb := make([]float32, cfg.Batch*features)
	yb := make([]int32, cfg.Batch)
	res := Result{Epochs: cfg.Epochs, Batch: cfg.Batch, LR: cfg.LR, Hidden: cfg.Hidden, Seed: cfg.Seed,
		TrainExamples: train.N, TestExamples: test.N}
	var trainTime time.Duration
	for epoch := 1; epoch <= cfg.Epochs; epoch++ {
		perm := rng.Perm(train.N)
		epochStart := time.Now()
		var lossSum float64
		lastReport := time.Time{}
		for s := range steps {
			if epoch == 1 && s == 0 {
				phase("tracing and compiling the training step (the first call takes a while)…")
			}
			for i, j := range perm[s*cfg.Batch : (s+1)*cfg.Batch] {
				copy(xb[i*features:(i+1)*features], train.Image(j))
				yb[i] = train.Labels[j]
			}
			x := rt.FromSlice(xb, cfg.Batch, features)
			y := rt.FromSlice(yb, cfg.Batch)
			var loss *trace.Array
			params, state, loss, err = step(params, state, x, y)
			if err != nil {
				return res, params, fmt.Errorf("epoch %d step %d: %w", epoch, s+1, err)
			}
			lossSum += loss.Item()
			for _, a := range []*trace.Array{x, y, loss} {
				a.Delete()
			}
			if progress != nil && (s+1 == steps || time.Since(lastReport) > 100*time.Millisecond) {
				lastReport = time.Now()
				progress(Progress{Epoch: epoch, Epochs: cfg.Epochs, Step: s + 1, Steps: steps,
					Loss: lossSum / float64(s+1), StepsPerSec: float64(s+1) / time.Since(epochStart).Seconds()})
			}
		}
		elapsed := time.Since(epochStart)
		trainTime += elapsed
		res.Steps += steps
		res.TrainLoss = lossSum / float64(steps)
		if epoch == 1 {
			phase(fmt.Sprintf("epoch 1/%d: compiling the evaluation and evaluating on %d test examples…", cfg.Epochs, test.N))
		}
		res.TestAccuracy, res.TestLoss = evaluate(params, test)
		if progress != nil {
			progress(Progress{Epoch: epoch, Epochs: cfg.Epochs, Step: steps, Steps: steps, Loss: res.TrainLoss,
				StepsPerSec: float64(steps) / elapsed.Seconds(), TestAccuracy: res.TestAccuracy, Done: true})
		}
	}
	res.TrainSeconds = trainTime.Seconds()
	if res.TrainSeconds > 0 {
		res.StepsPerSecond = float64(res.Steps) / res.TrainSeconds
	}
	res.Seconds = time.Since(start).Seconds()
	return res, params, nil
}

// printer returns a progress reporter writing to w, a terminal if tty (see
// report).
func printer(w io.Writer, tty bool) func(Progress) {
	return report(progress.NewWriter(w, tty))
}

// report returns a progress reporter writing through r: phases as they start;
// on a terminal one line per epoch redrawn in place, otherwise a line per
// finished epoch (and one every 10 s within an epoch).
func report(r *progress.Reporter) func(Progress) {
	const width = 20 // the line fits 80 columns
	return func(p Progress) {
		if p.Phase != "" {
			r.Phase("%s", p.Phase)
			return
		}
		if !r.Terminal() {
			if p.Done {
				r.Done("epoch %d/%d: %d steps, train loss %.4f, %.1f steps/s, test accuracy %.2f%%",
					p.Epoch, p.Epochs, p.Steps, p.Loss, p.StepsPerSec, 100*p.TestAccuracy)
			} else {
				r.Update("epoch %d/%d: step %d/%d, train loss %.4f, %.1f steps/s", p.Epoch, p.Epochs, p.Step, p.Steps, p.Loss, p.StepsPerSec)
			}
			return
		}
		filled := width * p.Step / max(1, p.Steps)
		bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
		if filled < width {
			bar = bar[:filled] + ">" + bar[filled+1:]
		}
		line := fmt.Sprintf("epoch %d/%d [%s] %d/%d loss %.4f %.1f steps/s",
			p.Epoch, p.Epochs, bar, p.Step, p.Steps, p.Loss, p.StepsPerSec)
		if p.Done {
			r.Done("%s test accuracy %.2f%%", line, 100*p.TestAccuracy)
		} else {
			r.Update("%s", line)
		}
	}
}

func main() {
	var (
		dir    = flag.String("data", datasets.DefaultFashionMNISTDir, "directory holding the Fashion-MNIST IDX files")
		epochs = flag.Int("epochs", 15, "epochs")
		batch  = flag.Int("batch", 128, "minibatch size")
		lr     = flag.Float64("lr", 1e-3, "Adam learning rate")
		hidden = flag.Int("hidden", 512, "hidden layer width")
		seed   = flag.Uint64("seed", 0, "random seed (initialisation and shuffling)")
		asJSON = flag.Bool("json", false, "print one JSON object with the results (progress goes to stderr)")
		quiet  = flag.Bool("quiet", false, "print only the result, no progress")
	)
	flag.Parse()
	start := time.Now()
	out := os.Stdout
	if *asJSON {
		out = os.Stderr
	}
	rep := progress.New(out).SetQuiet(*quiet)
	where := *dir
	if where == "" {
		where = datasets.DefaultFashionMNISTDir
	}
	rep.Phase("loading Fashion-MNIST from %s…", where)
	train, test, err := datasets.LoadFashionMNIST(*dir)
	if err != nil {
		rep.Clear()
		fmt.Fprintln(os.Stderr, "mlp:", err)
		os.Exit(1)
	}
	if !*asJSON {
		rep.Clear()
		fmt.Fprintf(out, "Fashion-MNIST: %d train, %d test; MLP %d-%d-10 ReLU, Adam lr %g, batch %d, %d epochs\n",
			train.N, test.N, train.Features(), *hidden, *lr, *batch, *epochs)
	}
	cfg := Config{Hidden: *hidden, Classes: 10, Epochs: *epochs, Batch: *batch, EvalBatch: 1000, LR: *lr, Seed: *seed}
	res, _, err := Train(train, test, cfg, report(rep))
	if err != nil {
		rep.Clear()
		fmt.Fprintln(os.Stderr, "mlp:", err)
		os.Exit(1)
	}
	res.Seconds = time.Since(start).Seconds() // include loading the data
	if *asJSON {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("test accuracy %.2f%% after %d epochs (%d steps, %.1f steps/s) in %.1f s\n",
		100*res.TestAccuracy, res.Epochs, res.Steps, res.StepsPerSecond, res.Seconds)
}
