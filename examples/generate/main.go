// Command generate decodes text with a KV cache (nn.Generator): one jitted
// prefill of the prompt and a jitted one-token decode step that donates the
// cache, so the step compiles once and memory stays flat. It generates
// greedily and sampled (temperature, top-k, an explicit key) and prints the
// decoding rate in tokens per second.
//
//	go run ./examples/generate                              # train the LM of examples/transformer briefly, generate
//	go run ./examples/generate -checkpoint lm.safetensors   # the same, kept: the next run loads it
//	go run ./examples/generate -model nn/hf/testdata/llama -prompt "5 11 2 40"
//	go run ./examples/generate -layers 4 -d 128 -seq 64   # examples/transformer's default shape
//	go run ./examples/generate -model nn/hf/testdata/llama -prompt "5 11 2 40 7" -rows 8  # a batch of prompts of 1 to 5 tokens
//
// Without -model it uses the character-level nn.TransformerLM of
// examples/transformer (decoded as the GPT2 it is, TransformerLM.GPT2):
// loaded from -checkpoint when that file exists, otherwise trained for
// -train-steps on -data (default: the fortunes under
// /usr/share/games/fortunes, or a short built-in text) and saved to
// -checkpoint when one is given. With -model DIR it loads a Hugging Face
// GPT-2 or Llama directory (hf.LoadGPT2, hf.LoadLlama); the prompt is
// tokenized with DIR's tokenizer.json, or is a list of token ids when DIR
// has none.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	cfg := defaultConfig
	flag.StringVar(&cfg.Model, "model", "", "a Hugging Face GPT-2 or Llama directory (default: the character LM)")
	flag.StringVar(&cfg.Checkpoint, "checkpoint", "", "the character LM's checkpoint: loaded if it exists, else written after training")
	flag.StringVar(&cfg.Data, "data", "", "text to train the character LM on (default: the fortunes, or a built-in text)")
	flag.IntVar(&cfg.TrainSteps, "train-steps", cfg.TrainSteps, "training steps of the character LM")
	flag.StringVar(&cfg.Prompt, "prompt", cfg.Prompt, "the prompt (token ids separated by spaces for a model without tokenizer.json)")
	flag.IntVar(&cfg.MaxNew, "max-new", cfg.MaxNew, "the most tokens to generate")
	flag.Float64Var(&cfg.Temperature, "temperature", cfg.Temperature, "the sampling temperature")
	flag.IntVar(&cfg.TopK, "top-k", cfg.TopK, "sample among the k most likely tokens (0: all)")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "the random seed of training and sampling")
	flag.IntVar(&cfg.Seq, "seq", cfg.Seq, "the character LM's positions (its context)")
	flag.IntVar(&cfg.Layers, "layers", cfg.Layers, "the character LM's blocks")
	flag.IntVar(&cfg.D, "d", cfg.D, "the character LM's width")
	flag.IntVar(&cfg.Heads, "heads", cfg.Heads, "the character LM's attention heads")
	flag.IntVar(&cfg.Rows, "rows", 0, "also decode a batch of this many prompts of different lengths (the prompt's prefixes)")
	flag.Parse()
	if err := run(os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

// out writes to w, keeping the first error.
type out struct {
	w   io.Writer
	err error
}

func (o *out) printf(format string, args ...any) {
	if o.err == nil {
		_, o.err = fmt.Fprintf(o.w, format, args...)
	}
}
