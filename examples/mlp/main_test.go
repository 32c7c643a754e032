package main

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ferryml/ferry/datasets"
)

// blobs returns n points of dimension d in 2 classes: Gaussian blobs around
// ±0.5 in every coordinate, well separated.
func blobs(rng *rand.Rand, n, d int) *datasets.ImageSet {
	s := &datasets.ImageSet{N: n, Rows: 1, Cols: d, Images: make([]float32, n*d), Labels: make([]int32, n)}
	for i := range n {
		c := int32(i % 2)
		s.Labels[i] = c
		center := float32(-0.5)
		if c == 1 {
			center = 0.5
		}
		for j := range d {
			s.Images[i*d+j] = center + float32(rng.NormFloat64())*0.5
		}
	}
	return s
}

func TestTrainSeparable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	train, test := blobs(rng, 256, 16), blobs(rng, 128, 16)
	cfg := Config{Hidden: 32, Classes: 2, Epochs: 3, Batch: 32, EvalBatch: 64, LR: 1e-2, Seed: 7}
	var losses []float64
	var lines bytes.Buffer
	report := printer(&lines, false)
	res, model, err := Train(train, test, cfg, func(p Progress) {
		if p.Step == 1 && !p.Done {
			losses = append(losses, p.Loss) // the first step's loss
		}
		if p.Done {
			losses = append(losses, p.Loss)
		}
		report(p)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(losses) < 2 || losses[len(losses)-1] >= losses[0]/2 {
		t.Errorf("loss did not go down: %v", losses)
	}
	if res.TestAccuracy <= 0.9 {
		t.Errorf("test accuracy %.3f, want > 0.9", res.TestAccuracy)
	}
	if res.Steps != 3*(256/32) || res.Epochs != 3 || res.StepsPerSecond <= 0 {
		t.Errorf("result %+v", res)
	}
	if len(model.Layers) != 2 || model.Layers[0].W.Shape()[1] != 32 {
		t.Errorf("model %v", model.Layers)
	}
	if n := strings.Count(lines.String(), "test accuracy"); n != 3 {
		t.Errorf("%d epoch lines, want one per epoch:\n%s", n, lines.String())
	}
	if !strings.HasPrefix(lines.String(), "initialising the parameters") || !strings.Contains(lines.String(), "\ntracing and compiling the training step") {
		t.Errorf("the phases are not reported before the epochs:\n%s", lines.String())
	}
	if strings.ContainsAny(lines.String(), "\r\x1b") {
		t.Errorf("carriage return or escape in the lines for a log:\n%q", lines.String())
	}
	t.Logf("losses %v, accuracy %.3f\n%s", losses, res.TestAccuracy, lines.String())
}

func TestPrinterTerminal(t *testing.T) {
	var b bytes.Buffer
	p := printer(&b, true)
	p(Progress{Epoch: 1, Epochs: 2, Step: 5, Steps: 10, Loss: 0.5, StepsPerSec: 100})
	p(Progress{Epoch: 1, Epochs: 2, Step: 10, Steps: 10, Loss: 0.4, StepsPerSec: 100, TestAccuracy: 0.9, Done: true})
	out := b.String()
	if !strings.HasPrefix(out, "\r") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "test accuracy 90.00%") ||
		!strings.Contains(out, "5/10") || !strings.Contains(out, "steps/s") {
		t.Errorf("terminal output %q", out)
	}
}

func TestTrainBadBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := blobs(rng, 8, 4)
	if _, _, err := Train(s, s, Config{Hidden: 4, Classes: 2, Epochs: 1, Batch: 9, EvalBatch: 8, LR: 1e-2}, nil); err == nil {
		t.Error("batch larger than the training set: no error")
	}
}
