// Command transformer trains a character-level Transformer language model on
// the text of Debian's fortunes package (/usr/share/games/fortunes, `apt-get
// install fortunes`) or on any text file given with -data.
//
// The model is a token embedding plus a learned positional embedding, a stack
// of pre-norm Transformer blocks (nn.Stack: parameters stacked on axis 0,
// applied with one scan step per layer), a final LayerNorm and the output
// logits tied to the token embedding (nn.Embedding.Attend). It is trained with
// AdamW under a warmup-cosine schedule and global-norm clipping; the train step
// is jitted with params and optimizer state donated.
//
//	go run ./examples/transformer                       # default run
//	go run ./examples/transformer -remat offload -offload-opt -steps 20
//	go run ./examples/transformer -json -samples 300
//
// -remat picks what the backward pass keeps of each block: none (everything),
// nothing (recompute the block), dots (keep matrix products) or offload (keep
// the block input in pinned_host memory, trace.SaveAndOffloadOnlyTheseNames).
// -offload-params keeps the stacked block parameters in pinned_host (each scan
// step copies its layer in); -offload-opt keeps the optimizer state in
// pinned_host (made there by optim.InitIn, and rt.OutSpace(1, ir.PinnedHost)
// on the step).
//
// The model is GPT-2's architecture exactly (nn.TransformerLM.GPT2; the
// attention projections have no biases, GPT-2's are zero, and its
// LayerNorms an epsilon of 1e-6): -hf DIR saves the trained model there as
// a Hugging Face GPT-2 directory (config.json, model.safetensors under
// GPT-2's names, vocab.json with the character of each token id) that
// transformers' GPT2LMHeadModel and hf.LoadGPT2 load. Its tests check
// transformers' greedy continuation of a small trained checkpoint
// (nn/hf/testdata/charlm) against Ferry's.
//
// While it runs it says on standard error what it is doing (loading the text,
// compiling the training step: the first call takes a while) and how far
// training is ("step 120/2000, loss 2.1034, 3.21 steps/s"): in place on a
// terminal, as lines otherwise (internal/progress; -quiet or FERRY_PROGRESS=0
// silences it).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/progress"
)

func main() {
	var cfg Config
	flag.StringVar(&cfg.Data, "data", "", "text file to train on (default: the fortunes under "+fortuneDir+")")
	flag.IntVar(&cfg.Steps, "steps", defaultConfig.Steps, "training steps")
	flag.IntVar(&cfg.Batch, "batch", defaultConfig.Batch, "sequences per batch")
	flag.IntVar(&cfg.Seq, "seq", defaultConfig.Seq, "sequence length (context)")
	flag.IntVar(&cfg.Layers, "layers", defaultConfig.Layers, "Transformer blocks")
	flag.IntVar(&cfg.D, "d", defaultConfig.D, "model width")
	flag.IntVar(&cfg.Heads, "heads", defaultConfig.Heads, "attention heads")
	flag.Float64Var(&cfg.LR, "lr", defaultConfig.LR, "peak learning rate")
	flag.Uint64Var(&cfg.Seed, "seed", defaultConfig.Seed, "random seed")
	flag.StringVar(&cfg.Remat, "remat", "none", "remat policy per block: none|nothing|dots|offload")
	flag.Float64Var(&cfg.Budget, "budget", 0, "jit the train step with rt.MemoryBudget of this fraction of its device total (0.5: half)")
	flag.BoolVar(&cfg.OffloadParams, "offload-params", false, "keep the stacked block parameters in pinned_host")
	flag.BoolVar(&cfg.OffloadOpt, "offload-opt", false, "keep the optimizer state in pinned_host")
	flag.IntVar(&cfg.EvalBatches, "eval-batches", defaultConfig.EvalBatches, "validation batches for val_loss")
	flag.IntVar(&cfg.Samples, "samples", 0, "print this many sampled characters at the end")
	flag.StringVar(&cfg.Prompt, "prompt", "The ", "prompt for -samples")
	flag.Float64Var(&cfg.Temperature, "temperature", 0.8, "sampling temperature for -samples")
	flag.IntVar(&cfg.LossEvery, "loss-every", 0, "record the training loss every N steps (train_losses in -json)")
	flag.StringVar(&cfg.SaveHF, "hf", "", "save the trained model into this directory as a Hugging Face GPT-2")
	jsonOut := flag.Bool("json", false, "print one final JSON object")
	quiet := flag.Bool("quiet", false, "no progress lines on standard error")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	flag.Parse()
	cfg.Log = progress.New(os.Stderr).SetQuiet(*quiet)
	from := cfg.Data
	if from == "" {
		from = "the fortunes under " + fortuneDir
	}
	cfg.Log.Phase("loading the text from %s…", from)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "transformer:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}

	text, err := loadText(cfg.Data)
	if err != nil {
		cfg.Log.Clear()
		fmt.Fprintln(os.Stderr, "transformer:", err)
		os.Exit(1)
	}
	start := time.Now()
	res, err := Run(cfg, text)
	cfg.Log.Clear()
	if err != nil {
		fmt.Fprintln(os.Stderr, "transformer:", err)
		os.Exit(1)
	}
	res.Seconds = time.Since(start).Seconds()
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "transformer:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("text: %d chars, vocab %d; params %d\n", res.TrainChars+res.ValChars, res.Vocab, res.Params)
	fmt.Printf("train step memory: %v\n", res.MemoryString)
	for _, h := range res.HostSteps {
		fmt.Printf("train step runs on the host: %s\n", h)
	}
	fmt.Printf("val_loss %.4f nats/char, unigram entropy %.4f nats/char (ratio %.3f), %d steps in %.1f s (%.1f ms/step)\n",
		res.ValLoss, res.UnigramEntropy, res.ValLoss/res.UnigramEntropy, res.Steps, res.Seconds, res.MsPerStep)
	if res.BudgetBytes > 0 {
		fmt.Printf("memory budget %s (%.0f%% of %s): planned step %.1f ms (estimate), measured %.1f ms\n", backend.FormatBytes(res.BudgetBytes), 100*cfg.Budget, backend.FormatBytes(res.BaselineTotalBytes), res.EstimatedMsPerStep, res.MsPerStep)
	}
	if res.MsPerStep > 0 {
		fmt.Printf("model FLOPs: %.2f GFLOP a step, %.1f GFLOP/s\n", res.StepGFLOP, res.StepGFLOP/res.MsPerStep*1000)
	}
	if res.SampleText != "" {
		fmt.Printf("sample:\n%s%s\n", cfg.Prompt, res.SampleText)
	}
}
