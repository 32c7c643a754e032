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
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestFinetuneDecoder fine-tunes the small random GPT-2 and Llama of
// nn/hf/testdata for a short run and checks what the program claims: the
// training and held-out losses go down, the budgeted program fits its
// budget (analysed and measured) and computes the unconstrained one's
// losses, and the saved directory holds the original tensor names with
// new values, a float32 config and logits that reload equal (run fails
// otherwise).
func TestFinetuneDecoder(t *testing.T) {
	for _, model := range []string{"gpt2", "llama"} {
		t.Run(model, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.Model = filepath.Join(filepath.Dir(tinyModel()), model)
			cfg.Out = filepath.Join(t.TempDir(), "finetuned")
			cfg.Steps, cfg.Warmup, cfg.Measure = 120, 10, 3
			if testing.Short() {
				cfg.Steps = 60
			}
			cfg.Seed = testseed.Uint64(t)
			var out bytes.Buffer
			rep, err := runModel(&out, cfg, map[string]bool{"steps": true, "warmup": true, "measure": true})
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{"gpt2": "GPT-2", "llama": "Llama"}[model]; rep.Family != want || len(rep.Losses) != cfg.Steps {
				t.Fatalf("family %q, %d losses; want %s, %d", rep.Family, len(rep.Losses), want, cfg.Steps)
			}
			q := cfg.Steps / 4
			first, last := mean(rep.Losses[:q]), mean(rep.Losses[len(rep.Losses)-q:])
			if !(last < 0.8*first) {
				t.Errorf("the loss did not go down: %.4f over the first %d steps, %.4f over the last", first, q, last)
			}
			if !(rep.HeldAfter.Loss < 0.8*rep.HeldBefore.Loss) {
				t.Errorf("held-out answers: before %v, after %v", rep.HeldBefore, rep.HeldAfter)
			}
			if !(rep.PlannedBytes <= rep.Budget && rep.Budget < rep.TotalBytes) {
				t.Errorf("budget %d: planned total %d, unconstrained %d", rep.Budget, rep.PlannedBytes, rep.TotalBytes)
			}
			const rounding = 64 << 10 // the pool rounds allocations up
			if rep.Budgeted.Peak <= 0 || rep.Budgeted.Peak > rep.Budget+rounding || rep.Unconstrained.Peak <= rep.Budgeted.Peak {
				t.Errorf("measured peaks: %d under the budget %d, %d unconstrained", rep.Budgeted.Peak, rep.Budget, rep.Unconstrained.Peak)
			}
			if rep.MaxLossDiff > 1e-6 || len(rep.Unconstrained.Losses) != cfg.Measure {
				t.Errorf("the unconstrained program's %d losses differ from the budgeted run's by %g", len(rep.Unconstrained.Losses), rep.MaxLossDiff)
			}
			checkSavedDecoder(t, cfg.Out, cfg.Model)
		})
	}
}

// checkSavedDecoder compares the saved directory with the original model
// directory orig.
func checkSavedDecoder(t *testing.T, out, orig string) {
	t.Helper()
	saved, err := checkpoint.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer saved.Close()
	src, err := checkpoint.Open(orig)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	want, got := slices.Sorted(slices.Values(src.Names())), slices.Sorted(slices.Values(saved.Names()))
	if !slices.Equal(got, want) {
		t.Fatalf("saved tensors %v, want the original's %v", got, want)
	}
	for _, n := range want {
		a, err := saved.Read(n, ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		b, err := src.Read(n, ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		if info, _ := saved.Info(n); info.DType != "F32" {
			t.Errorf("%s saved as %s, want F32", n, info.DType)
		}
		if slices.Equal(a.Float64s(), b.Float64s()) {
			t.Errorf("%s is the original's; fine-tuning did not change it", n)
		}
	}
	var config map[string]any
	data, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err == nil {
		err = json.Unmarshal(data, &config)
	}
	if err != nil || config["torch_dtype"] != "float32" {
		t.Errorf("config.json: torch_dtype %v (%v), want float32", config["torch_dtype"], err)
	}
	var p LMProbe
	data, err = os.ReadFile(filepath.Join(out, "logits.json"))
	if err == nil {
		err = json.Unmarshal(data, &p)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Logits) != probeCount || len(p.IDs) != probeCount || len(p.Logits[0]) != len(p.IDs[0]) {
		t.Fatalf("logits.json: %d sequences of logits, %d of ids", len(p.Logits), len(p.IDs))
	}
}

// TestReversals: the splits have the sizes asked for and no string in
// common, and every sequence is <s>, the digits, ">", the digits in
// reverse and </s>, with Answer at the first reversed digit.
func TestReversals(t *testing.T) {
	train, test := Reversals(500, 100, 5, testseed.Uint64(t))
	if len(train) != 500 || len(test) != 100 {
		t.Fatalf("%d and %d examples", len(train), len(test))
	}
	seen := map[string]int{}
	for _, e := range append(slices.Clone(train), test...) {
		seen[e.Digits]++
		d := e.Digits
		if len(d) < 2 || len(d) > 5 || strings.Trim(d, "0123456789") != "" {
			t.Fatalf("digits %q", d)
		}
		rev := []byte(d)
		slices.Reverse(rev)
		if want := "<s>" + d + ">" + string(rev) + "</s>"; e.Text() != want {
			t.Errorf("%q: %s, want %s", d, e.Text(), want)
		}
		if got := lmTokens[e.IDs[e.Answer()]]; got != d[len(d)-1:] || lmTokens[e.IDs[e.Answer()-1]] != ">" {
			t.Errorf("%s: the answer starts at %d (%q)", e.Text(), e.Answer(), got)
		}
	}
	for d, n := range seen {
		if n > 1 {
			t.Errorf("%q drawn %d times", d, n)
		}
	}
	b, err := encodeLM(test, 13)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range test {
		row := b.Mask[i*13 : (i+1)*13]
		if n := slices.Index(append(slices.Clone(row), 0), 0); n != len(e.IDs) {
			t.Errorf("%s: mask %v", e.Text(), row)
		}
	}
}

// TestCausalLoss compares the padding-masked next-token cross-entropy and
// the arg-max predictions with a float64 reference on random logits.
func TestCausalLoss(t *testing.T) {
	r := testseed.Rand(t, 1)
	const B, T, V = 3, 7, 11
	logits := make([]float32, B*T*V)
	for i := range logits {
		logits[i] = float32(3 * r.NormFloat64())
	}
	ids, mask := make([]int32, B*T), make([]int32, B*T)
	for b := range B {
		n := 2 + r.IntN(T-1) // real tokens, then padding
		for j := range T {
			if j < n {
				ids[b*T+j], mask[b*T+j] = int32(r.IntN(V)), 1
			}
		}
	}
	var want, count float64
	wantPred := make([]int32, B*(T-1))
	for b := range B {
		for j := range T - 1 {
			row := logits[(b*T+j)*V : (b*T+j+1)*V]
			m, arg := math.Inf(-1), 0
			for v, x := range row {
				if float64(x) > m {
					m, arg = float64(x), v
				}
			}
			wantPred[b*(T-1)+j] = int32(arg)
			if mask[b*T+j+1] == 0 {
				continue
			}
			s := 0.0
			for _, x := range row {
				s += math.Exp(float64(x) - m)
			}
			want += m + math.Log(s) - float64(row[ids[b*T+j+1]])
			count++
		}
	}
	want /= count
	l, id, mk := rt.FromSlice(logits, B, T, V), rt.FromSlice(ids, B, T), rt.FromSlice(mask, B, T)
	got := rt.Jit(causalLoss)(l, id, mk).Item()
	if math.Abs(got-want) > 1e-5*math.Max(1, math.Abs(want)) {
		t.Errorf("loss %v, want %v", got, want)
	}
	_, pred := rt.Jit(func(l, id *trace.Array) (*trace.Array, *trace.Array) { return nextToken(l, id) })(l, id)
	for i, p := range pred.Int64s() {
		if int32(p) != wantPred[i] {
			t.Errorf("prediction %d: %d, want %d", i, p, wantPred[i])
		}
	}
}
