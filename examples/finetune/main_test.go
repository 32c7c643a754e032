package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/tokenizer"
)

// tinyConfig is a run of the small random BERT (the model directory given
// does not exist), short enough for a test and long enough that the loss
// leaves its plateau near ln 2 whatever the seed (160 steps did not for
// about one seed in five).
func tinyConfig(t *testing.T) Config {
	cfg := defaultConfig()
	cfg.Model = filepath.Join(t.TempDir(), "all-MiniLM-L6-v2")
	cfg.Out = filepath.Join(t.TempDir(), "finetuned")
	cfg.Steps, cfg.Batch, cfg.Warmup, cfg.LR, cfg.Measure = 320, 16, 10, 3e-3, 4
	cfg.Seed = testseed.Uint64(t)
	return cfg
}

// TestFinetuneTiny runs the program on the small random BERT and checks
// what it claims: the fallback is announced, the loss goes down, the
// budgeted program fits its budget (analysed and measured) and computes
// the losses of the unconstrained one, and the saved directory holds the
// original tensor names, the untrained pooler as it was, a changed
// encoder, and outputs that reload equal.
func TestFinetuneTiny(t *testing.T) {
	cfg := tinyConfig(t)
	var out bytes.Buffer
	rep, err := run(&out, cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"does not hold all-MiniLM-L6-v2", "Falling back to the small random BERT", "memory plan for a budget", "held-out accuracy after"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q", want)
		}
	}
	if !rep.Tiny || len(rep.Losses) != cfg.Steps {
		t.Fatalf("tiny %v, %d losses", rep.Tiny, len(rep.Losses))
	}
	q := cfg.Steps / 4
	first, last := mean(rep.Losses[:q]), mean(rep.Losses[len(rep.Losses)-q:])
	if !(last < first-0.02) {
		t.Errorf("the loss did not go down: %.4f over the first %d steps, %.4f over the last", first, q, last)
	}

	if !(rep.PlannedBytes <= rep.Budget && rep.Budget < rep.TotalBytes) {
		t.Errorf("budget %d: planned total %d, unconstrained %d", rep.Budget, rep.PlannedBytes, rep.TotalBytes)
	}
	// The measured peak holds the step's arguments and temporaries, and
	// the pool rounds allocations up.
	const rounding = 64 << 10
	if rep.Budgeted.Peak <= 0 || rep.Budgeted.Peak > rep.Budget+rounding || rep.Unconstrained.Peak <= rep.Budgeted.Peak {
		t.Errorf("measured peaks: %d under the budget %d, %d unconstrained", rep.Budgeted.Peak, rep.Budget, rep.Unconstrained.Peak)
	}
	if rep.MaxLossDiff > 1e-6 || len(rep.Unconstrained.Losses) != cfg.Measure {
		t.Errorf("the unconstrained program's %d losses differ from the budgeted run's by %g", len(rep.Unconstrained.Losses), rep.MaxLossDiff)
	}
	checkSaved(t, cfg.Out, tinyModel())
}

// checkSaved compares the saved model.safetensors with the original's.
func checkSaved(t *testing.T, out, orig string) {
	t.Helper()
	saved, err := checkpoint.Open(filepath.Join(out, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer saved.Close()
	src, err := checkpoint.Open(filepath.Join(orig, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	want := slices.DeleteFunc(slices.Clone(src.Names()), func(n string) bool { return strings.HasSuffix(n, "position_ids") })
	got := slices.Clone(saved.Names())
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("saved tensors %v, want the original's %v", got, want)
	}
	changed := map[string]bool{}
	for _, n := range want {
		a, err := saved.Read(n, ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		b, err := src.Read(n, ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		changed[n] = !slices.Equal(a.Float64s(), b.Float64s())
	}
	for _, n := range []string{"pooler.dense.weight", "pooler.dense.bias"} {
		if changed[n] {
			t.Errorf("%s changed; the pooler is not trained", n)
		}
	}
	for _, n := range []string{"embeddings.word_embeddings.weight", "encoder.layer.1.attention.self.query.weight", "encoder.layer.0.output.dense.weight"} {
		if !changed[n] {
			t.Errorf("%s is the original's; fine-tuning did not change it", n)
		}
	}
	for _, f := range []string{"config.json", "tokenizer.json", "head.safetensors"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(out, "embeddings.json"))
	if err != nil {
		t.Fatal(err)
	}
	var p Probe
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Embeddings) != len(probeSentences) || len(p.Logits) != len(probeSentences) {
		t.Fatalf("embeddings.json: %d embeddings, %d logits", len(p.Embeddings), len(p.Logits))
	}
	for i, e := range p.Embeddings {
		n := 0.0
		for _, v := range e {
			n += v * v
		}
		if math.Abs(n-1) > 1e-5 {
			t.Errorf("embedding %d: |e|² = %v", i, n)
		}
	}
}

// TestReviews: the splits have the sizes asked for, the held-out reviews
// are about subjects training never mentions, a label is the adjective's
// polarity flipped by "not", and every word is in the small model's
// tokenizer.
func TestReviews(t *testing.T) {
	train, test := Reviews(300, 100, testseed.Uint64(t))
	if len(train) != 300 || len(test) != 100 {
		t.Fatalf("%d and %d reviews", len(train), len(test))
	}
	polarity := map[string]int32{}
	for _, a := range positive {
		polarity[a] = 1
	}
	for _, a := range negative {
		polarity[a] = 0
	}
	for i, e := range append(slices.Clone(train), test...) {
		words := strings.Fields(strings.ToLower(strings.TrimSuffix(e.Text, ".")))
		want := polarity[words[len(words)-1]]
		if slices.Contains(words, "not") {
			want = 1 - want
		}
		if e.Label != want {
			t.Errorf("%q: label %d, want %d", e.Text, e.Label, want)
		}
		inTest := slices.Contains(testSubjects, words[1])
		if inTest != (i >= len(train)) {
			t.Errorf("review %d %q is in the wrong split", i, e.Text)
		}
	}
	j, err := tinyTokenizer(40)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(j)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range append(train, test...) {
		enc, err := tok.Encode(e.Text)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(enc.Tokens, "[UNK]") || len(enc.Tokens) > 12 {
			t.Errorf("%q: tokens %v", e.Text, enc.Tokens)
		}
	}
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
