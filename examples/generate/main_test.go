package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func tinyConfig(t *testing.T) Config {
	c := defaultConfig
	c.TrainSteps, c.Seq, c.D, c.Batch, c.MaxNew = 40, 24, 32, 8, 12
	c.Data = filepath.Join(t.TempDir(), "none") // the built-in text
	return c
}

// The character LM trains, is saved, and a second run loads it and
// generates the same greedy text.
func TestCharLMCheckpoint(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Checkpoint = filepath.Join(t.TempDir(), "lm.safetensors")
	var first, second bytes.Buffer
	if err := run(&first, cfg); err != nil {
		t.Fatal(err)
	}
	if err := run(&second, cfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("first run:\n%s\nsecond run:\n%s", first.String(), second.String())
	for _, want := range []string{"trained the character LM", "saved it to", "greedy: ", "sampled (temperature", "tokens/s", "compiled 2 times"} {
		if !strings.Contains(first.String(), want) {
			t.Errorf("the first run does not say %q", want)
		}
	}
	if !strings.Contains(second.String(), "loaded the character LM") {
		t.Errorf("the second run did not load the checkpoint")
	}
	greedy := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "greedy: ") {
				return l
			}
		}
		return ""
	}
	if g1, g2 := greedy(first.String()), greedy(second.String()); g1 == "" || g1 != g2 {
		t.Errorf("greedy text after training %q, after loading %q", g1, g2)
	}
}

// The tiny random Llama and GPT-2 checkpoints of nn/hf (no tokenizer: the
// prompt is token ids).
func TestHFModels(t *testing.T) {
	for _, dir := range []string{"llama", "gpt2"} {
		cfg := tinyConfig(t)
		cfg.Model = filepath.Join("..", "..", "nn", "hf", "testdata", dir)
		cfg.Prompt, cfg.Rows = "5 11 2 40", 5
		var out bytes.Buffer
		if err := run(&out, cfg); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s:\n%s", dir, out.String())
		want := "greedy: \"5 11 2 40 "
		if dir == "gpt2" {
			// nn/hf/testdata/gpt2/golden.json: NumPy's greedy loop from this prompt.
			want += "19 13 13 13 13 13 13 13 13 13 0 0 \""
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("%s: the output has no %s:\n%s", dir, want, out.String())
		}
		// -rows: prompts of 1, 2, 3, 4 and 1 tokens in one batch, each row as alone.
		if want := "a batch of 5 prompts of lengths [1 2 3 4 1]"; !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "5 of 5 rows as decoded alone") {
			t.Errorf("%s: the output has no %q with every row as alone:\n%s", dir, want, out.String())
		}
	}
	cfg := tinyConfig(t)
	cfg.Model, cfg.Prompt = filepath.Join("..", "..", "nn", "hf", "testdata", "llama"), "not ids"
	if err := run(&bytes.Buffer{}, cfg); err == nil || !strings.Contains(err.Error(), "token ids") {
		t.Errorf("a text prompt for a model without tokenizer.json: %v", err)
	}
}
