package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// charlmDir is the small trained checkpoint of this model saved as a
// Hugging Face GPT-2, and charlmConfig the run that made it (see
// nn/hf/testdata/gen_transformers.py).
var charlmDir = filepath.Join("..", "..", "nn", "hf", "testdata", "charlm")

func charlmConfig() Config {
	return Config{Steps: 150, Batch: 8, Seq: 32, Layers: 2, D: 32, Heads: 2, LR: 1e-2, Seed: 1, EvalBatches: 2}
}

// charlmGolden is transformers' greedy continuations of the checkpoint.
type charlmGolden struct {
	Model        string `json:"model"`
	Transformers string `json:"transformers"`
	Greedy       struct {
		Prompt [][]int32 `json:"prompt"`
		Tokens [][]int32 `json:"tokens"`
		MinGap float64   `json:"min_gap"`
	} `json:"greedy"`
	GreedyPadded struct {
		Prompts [][]int32 `json:"prompts"`
		Tokens  [][]int32 `json:"tokens"`
		MinGap  float64   `json:"min_gap"`
	} `json:"greedy_padded"`
}

// The trained model saved under GPT-2's names (testdata charlm) and loaded
// by hf.LoadGPT2 decodes greedily the tokens transformers'
// FlaxGPT2LMHeadModel generates from the same directory: prompts of one
// length, and of different lengths in one batch (left-padded with an
// attention mask there, right-padded here).
func TestCharLMAgainstTransformers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(charlmDir, "..", "transformers", "charlm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g charlmGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	m, c, err := hf.LoadGPT2(charlmDir, ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	gen := nn.NewGenerator(m, c.MaxPositions, 8)
	for _, run := range []struct {
		name            string
		prompts, tokens [][]int32
		gap             float64
	}{
		{"one length", g.Greedy.Prompt, g.Greedy.Tokens, g.Greedy.MinGap},
		{"different lengths", g.GreedyPadded.Prompts, g.GreedyPadded.Tokens, g.GreedyPadded.MinGap},
	} {
		if len(run.tokens) == 0 {
			t.Fatalf("%s: the golden has no tokens (regenerate with gen_transformers.py)", run.name)
		}
		res, err := gen.Generate(run.prompts, nn.GenerateConfig{MaxNewTokens: len(run.tokens[0])})
		if err != nil {
			t.Fatal(err)
		}
		for b, want := range run.tokens {
			if !slices.Equal(res.Tokens[b], want) {
				t.Errorf("%s, prompt %v: greedy tokens %v, transformers' %s generate %v", run.name, run.prompts[b], res.Tokens[b], g.Model, want)
			}
		}
		t.Logf("%s: %d prompts × %d tokens as transformers %s (smallest top-2 logit gap %.3g)", run.name, len(run.prompts), len(run.tokens[0]), g.Transformers, run.gap)
	}
}

// The checkpoint is what this command trains: the same run gives the same
// weights (within float32 rounding of 150 steps), and the model as an
// nn.GPT2 (AsGPT2) has the TransformerLM's logits.
func TestCharLMCheckpointIsTrained(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 150 steps")
	}
	text, err := loadText(filepath.Join(charlmDir, "train.txt"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := charlmConfig()
	cfg.KeepModel = true
	res, err := Run(cfg, text)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := checkpoint.LoadMappedFile(filepath.Join(charlmDir, "model.safetensors"), AsGPT2(res.Model), hf.GPT2Mapping())
	if err != nil {
		t.Fatal(err)
	}
	got, want := trace.Leaves(AsGPT2(res.Model)), trace.Leaves(saved)
	for i := range want {
		g, w := got[i].Float32s(), want[i].Float32s()
		big, worst := 0.0, 0.0
		for j := range w {
			big = math.Max(big, math.Abs(float64(w[j])))
			worst = math.Max(worst, math.Abs(float64(g[j]-w[j])))
		}
		if worst > 1e-3*math.Max(big, 1e-3) {
			t.Errorf("leaf %d %v: trained again, differs from the checkpoint by %.3g (largest magnitude %.3g)", i, want[i].Shape(), worst, big)
		}
	}
	ids := rt.FromSlice(slices.Repeat([]int32{1, 5, 9, 2}, 8), 1, 32)
	lm := rt.Jit(func(m Model, ids *trace.Array) *trace.Array { return m.Logits(ids) })(res.Model, ids).Float32s()
	gp := rt.Jit(func(m nn.GPT2, ids *trace.Array) *trace.Array { return m.Logits(ids, nn.Context{}) })(AsGPT2(res.Model), ids).Float32s()
	for i := range lm {
		if math.Abs(float64(lm[i]-gp[i])) > 1e-5*math.Max(1, math.Abs(float64(lm[i]))) {
			t.Fatalf("logit %d: TransformerLM %v, as GPT-2 %v", i, lm[i], gp[i])
		}
	}
}
