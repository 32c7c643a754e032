package main

import (
	"errors"
	"math"
	"strings"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
)

// tinyText is a short repeating text: after a few dozen steps a small model
// predicts it far better than its unigram entropy.
var tinyText = strings.Repeat("the cat sat on the mat. ", 40)

func tinyConfig() Config {
	return Config{
		Steps: 60, Batch: 8, Seq: 16, Layers: 2, D: 32, Heads: 2,
		LR: 1e-2, Seed: 1, EvalBatches: 2, LossEvery: 1, WarmupSteps: 5,
	}
}

func TestTrainTinyText(t *testing.T) {
	res, err := Run(tinyConfig(), tinyText)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vocab %d, unigram entropy %.3f, first loss %.3f, final loss %.3f, val loss %.3f, memory %s",
		res.Vocab, res.UnigramEntropy, res.Losses[0], res.FinalLoss, res.ValLoss, res.MemoryString)
	if math.IsNaN(res.ValLoss) || res.ValLoss > 0.3*res.UnigramEntropy {
		t.Errorf("val loss %.3f is not well below 0.3 × unigram entropy %.3f", res.ValLoss, res.UnigramEntropy)
	}
	// Model FLOPs: forward products (q, k, v, o; the MLP; attention; the
	// logits), three times over for forward and backward.
	c := tinyConfig()
	tok := float64(c.Batch * c.Seq)
	fwd := float64(c.Layers)*(8*tok*float64(c.D*c.D)+16*tok*float64(c.D*c.D)+4*tok*float64(c.Seq*c.D)) +
		2*tok*float64(c.D*res.Vocab)
	if want := 3 * fwd / 1e9; math.Abs(res.StepGFLOP-want) > 1e-9*want {
		t.Errorf("step GFLOP %v, want %v", res.StepGFLOP, want)
	}
}

// TestOffloadSameTrajectory checks that remat with activation offload and
// optimizer-state offload train exactly as the plain run does.
func TestOffloadSameTrajectory(t *testing.T) {
	base := tinyConfig()
	base.Steps = 5
	ref, err := Run(base, tinyText)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		change func(*Config)
	}{
		{"remat_offload", func(c *Config) { c.Remat = "offload" }},
		{"remat_nothing", func(c *Config) { c.Remat = "nothing" }},
		{"remat_dots", func(c *Config) { c.Remat = "dots" }},
		{"offload_opt", func(c *Config) { c.OffloadOpt = true }},
		{"offload_params", func(c *Config) { c.OffloadParams = true }},
		{"budget_half", func(c *Config) { c.Budget = 0.5 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base
			c.change(&cfg)
			res, err := Run(cfg, tinyText)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("losses %v (plain %v); memory %s", res.Losses, ref.Losses, res.MemoryString)
			for i := range ref.Losses {
				if d := math.Abs(res.Losses[i] - ref.Losses[i]); d > 1e-4*math.Max(1, ref.Losses[i]) {
					t.Errorf("step %d: loss %v, plain run %v", i, res.Losses[i], ref.Losses[i])
				}
			}
			// Each option moves memory the way it promises.
			m, m0 := res.Memory, ref.Memory
			switch c.name {
			case "remat_offload", "remat_nothing", "remat_dots":
				if m.TempBytes >= m0.TempBytes {
					t.Errorf("%s: device temp %d B, not below the plain run's %d B", c.name, m.TempBytes, m0.TempBytes)
				}
			}
			switch c.name {
			case "remat_offload":
				if m.HostTempBytes == 0 {
					t.Errorf("remat offload: no host temp (offloaded residuals)")
				}
			case "budget_half":
				if m.TotalBytes > res.BudgetBytes || res.PeakDeviceBytes > res.BudgetBytes || res.BudgetBytes >= m0.TotalBytes {
					t.Errorf("%s: device total %d B, measured peak %d B, budget %d B (plain run %d B)", c.name, m.TotalBytes, res.PeakDeviceBytes, res.BudgetBytes, m0.TotalBytes)
				}
			case "offload_opt", "offload_params":
				if m.HostArgumentBytes == 0 || m.ArgumentBytes >= m0.ArgumentBytes {
					t.Errorf("%s: device argument %d B (plain %d B), host argument %d B", c.name, m.ArgumentBytes, m0.ArgumentBytes, m.HostArgumentBytes)
				}
			}
		})
	}
}

// TestBudgetTooSmall: in the tiny model the parameters and the optimizer
// state (which the budget leaves on device) are more than a quarter of the
// step's memory: the error names the smallest budget that fits.
func TestBudgetTooSmall(t *testing.T) {
	cfg := tinyConfig()
	cfg.Steps, cfg.Budget = 1, 0.25
	_, err := Run(cfg, tinyText)
	var be *rt.MemoryBudgetError
	if !errors.As(err, &be) || be.Minimum <= be.Budget {
		t.Fatalf("got %v, want a *rt.MemoryBudgetError", err)
	}
}

func TestUnigramEntropy(t *testing.T) {
	v := newVocab("abab")
	if h := unigramEntropy(v.encode("abab"), len(v.bytes)); math.Abs(h-math.Log(2)) > 1e-12 {
		t.Errorf("entropy %v, want ln 2", h)
	}
}

func TestLoadTextMissing(t *testing.T) {
	if _, err := loadText("/nonexistent/file.txt"); err == nil {
		t.Error("no error for a missing -data file")
	}
}
