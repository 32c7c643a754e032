package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
)

// probeCount is how many held-out sequences logits.json holds.
const probeCount = 4

// LMProbe is logits.json: held-out sequences of the task, their token ids
// and attention masks (right-padded to the longest), and the saved model's
// logits [sequence][position][vocabulary] (at padded positions too).
// examples/finetune/reload_lm.py compares them with transformers' at the
// real tokens.
type LMProbe struct {
	Family string        `json:"family"`
	Tokens []string      `json:"tokens"`
	Texts  []string      `json:"texts"`
	IDs    [][]int32     `json:"ids"`
	Mask   [][]int32     `json:"mask"`
	Logits [][][]float64 `json:"logits"`
}

// saveDecoder saves m into cfg.Out with hf.Save under dec's names, beside
// the source's config.json (its torch_dtype made float32, what was
// saved), reloads the directory with dec.Load, checks that the reloaded
// model's logits equal m's and writes logits.json.
func saveDecoder[M any](w io.Writer, cfg Config, dec Decoder[M], m M, heldOut []LMExample, rep *Report) error {
	out := cfg.Out
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	file := filepath.Join(out, "model.safetensors")
	if err := hf.Save(file, m, dec.Mapping); err != nil {
		return err
	}
	if err := writeConfig(cfg.Model, out); err != nil {
		return err
	}
	r, err := checkpoint.Open(file)
	if err != nil {
		return err
	}
	rep.Saved = len(r.Names())
	r.Close()
	fmt.Fprintf(w, "saved %s: model.safetensors (%d tensors under Hugging Face's %s names), config.json\n", out, rep.Saved, dec.Family)

	back, _, err := dec.Load(out)
	if err != nil {
		return err
	}
	probes := heldOut[:min(probeCount, len(heldOut))]
	trained, err := probeLogits(dec, m, probes)
	if err != nil {
		return err
	}
	probe, err := probeLogits(dec, back, probes)
	if err != nil {
		return err
	}
	deleteTree(back)
	for i := range probe.Logits {
		for t := range probe.Logits[i] {
			for v := range probe.Logits[i][t] {
				rep.Reload = math.Max(rep.Reload, math.Abs(probe.Logits[i][t][v]-trained.Logits[i][t][v]))
			}
		}
	}
	if err := writeJSON(filepath.Join(out, "logits.json"), probe); err != nil {
		return err
	}
	fmt.Fprintf(w, "reloaded the directory: the logits of %d held-out sequences differ from the trained model's by at most %g\n", len(probes), rep.Reload)
	fmt.Fprintf(w, "wrote %s (check it with transformers: examples/finetune/reload_lm.py %s)\n", filepath.Join(out, "logits.json"), out)
	if rep.Reload != 0 {
		return fmt.Errorf("the reloaded model's logits differ from the trained one's by %g", rep.Reload)
	}
	return nil
}

// writeConfig copies src's config.json into dir with torch_dtype float32.
func writeConfig(src, dir string) error {
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return err
	}
	var c map[string]any
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(src, "config.json"), err)
	}
	c["torch_dtype"] = "float32"
	if data, err = json.MarshalIndent(c, "", "  "); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), append(data, '\n'), 0o644)
}

// probeLogits runs m on examples, right-padded to the longest.
func probeLogits[M any](dec Decoder[M], m M, examples []LMExample) (*LMProbe, error) {
	t := 0
	for _, e := range examples {
		t = max(t, len(e.IDs))
	}
	b, err := encodeLM(examples, t)
	if err != nil {
		return nil, err
	}
	p := &LMProbe{Family: dec.Family, Tokens: lmTokens}
	for i, e := range examples {
		p.Texts = append(p.Texts, e.Text())
		p.IDs = append(p.IDs, b.IDs[i*t:(i+1)*t])
		p.Mask = append(p.Mask, b.Mask[i*t:(i+1)*t])
	}
	ids, mask := rt.FromSlice(b.IDs, b.N, t), rt.FromSlice(b.Mask, b.N, t)
	logits := rt.Jit(dec.Logits)(m, ids, mask)
	v := logits.Shape()[2]
	vals := logits.Float64s()
	deleteTree(ids, mask, logits)
	for i := range b.N {
		var rows [][]float64
		for j := range t {
			rows = append(rows, vals[(i*t+j)*v:(i*t+j+1)*v])
		}
		p.Logits = append(p.Logits, rows)
	}
	return p, nil
}
