package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// probeSentences are embedded by the saved model into embeddings.json,
// which nn/hf/testdata/gen.py --finetuned recomputes in NumPy.
var probeSentences = []string{
	"The hotel was really wonderful.",
	"The pizza was not good.",
	"The concert is very boring.",
	"The coffee was not bad.",
	"A man is eating food.",
}

// Probe is embeddings.json: sentences, their token ids and attention masks
// as Ferry's tokenizer made them (padded to the longest), and the saved
// model's unit embeddings (mean-pooled, normalised) and head logits.
type Probe struct {
	Sentences  []string    `json:"sentences"`
	IDs        [][]int32   `json:"ids"`
	Mask       [][]int32   `json:"mask"`
	Embeddings [][]float64 `json:"embeddings"`
	Logits     [][]float64 `json:"logits"`
}

// saveAndReload saves the fine-tuned encoder (with the pooler it was
// loaded with, which mean pooling leaves untrained) and its head into out, reloads them, checks that the
// reloaded model's outputs equal cls's and writes embeddings.json.
func saveAndReload(w io.Writer, out string, src *Source, cls Classifier, rep *Report) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	orig, err := src.Bert.Tree()
	if err != nil {
		return err
	}
	bert := cls.Bert
	bert.Pooler = orig.Pooler
	orig.Pooler = nn.Linear{}
	deleteTree(orig)
	if err := hf.Save(filepath.Join(out, "model.safetensors"), bert, hf.BertMapping()); err != nil {
		return err
	}
	deleteTree(bert.Pooler)
	config, err := os.ReadFile(filepath.Join(src.Dir, "config.json"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), config, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "tokenizer.json"), src.TokJSON, 0o644); err != nil {
		return err
	}
	if err := checkpoint.SaveFile(filepath.Join(out, "head.safetensors"), cls.Head, nil); err != nil {
		return err
	}
	r, err := checkpoint.Open(filepath.Join(out, "model.safetensors"))
	if err != nil {
		return err
	}
	rep.Saved = len(r.Names())
	r.Close()
	fmt.Fprintf(w, "saved %s: model.safetensors (%d tensors under Hugging Face's BertModel names), config.json and tokenizer.json (copied), head.safetensors (the head)\n", out, rep.Saved)

	// Reload as a user would: the directory through hf.LoadBert.
	back, _, err := hf.LoadBert(out, ir.Float32)
	if err != nil {
		return err
	}
	back.Pooler = nn.Linear{}
	head, err := checkpoint.LoadFile(filepath.Join(out, "head.safetensors"), cls.Head)
	if err != nil {
		return err
	}
	reloaded := Classifier{Bert: back, Head: head}
	probe, err := probeOutputs(src.Tok, reloaded)
	if err != nil {
		return err
	}
	trained, err := probeOutputs(src.Tok, cls)
	if err != nil {
		return err
	}
	for i := range probe.Embeddings {
		for j := range probe.Embeddings[i] {
			rep.Reload = math.Max(rep.Reload, math.Abs(probe.Embeddings[i][j]-trained.Embeddings[i][j]))
		}
		for j := range probe.Logits[i] {
			rep.Reload = math.Max(rep.Reload, math.Abs(probe.Logits[i][j]-trained.Logits[i][j]))
		}
	}
	if err := writeJSON(filepath.Join(out, "embeddings.json"), probe); err != nil {
		return err
	}
	fmt.Fprintf(w, "reloaded with hf.LoadBert: the embeddings and logits of %d sentences differ from the trained model's by at most %g\n", len(probeSentences), rep.Reload)
	fmt.Fprintf(w, "wrote %s (check it in Python: nn/hf/testdata/gen.py --finetuned %s)\n", filepath.Join(out, "embeddings.json"), out)
	if rep.Reload != 0 {
		return fmt.Errorf("the reloaded model's outputs differ from the trained one's by %g", rep.Reload)
	}
	return nil
}

// writeJSON writes v as the JSON file path.
func writeJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// probeOutputs runs c on probeSentences, padded to the longest.
func probeOutputs(tok *tokenizer.Tokenizer, c Classifier) (*Probe, error) {
	tok, err := tok.WithPadding(&tokenizer.Padding{Token: "[PAD]"})
	if err != nil {
		return nil, err
	}
	encs, err := tok.EncodeBatch(probeSentences)
	if err != nil {
		return nil, err
	}
	p := &Probe{Sentences: probeSentences}
	b, t := len(encs), encs[0].Len()
	var ids, mask []int32
	for _, e := range encs {
		var ri, rm []int32
		for j := range e.IDs {
			ri, rm = append(ri, int32(e.IDs[j])), append(rm, int32(e.AttentionMask[j]))
		}
		p.IDs, p.Mask = append(p.IDs, ri), append(p.Mask, rm)
		ids, mask = append(ids, ri...), append(mask, rm...)
	}
	emb, logits := rt.Jit(func(c Classifier, ids, mask *trace.Array) (*trace.Array, *trace.Array) {
		e := c.Embed(ids, mask)
		return normalize(e), c.Head.Apply(e)
	})(c, rt.FromSlice(ids, b, t), rt.FromSlice(mask, b, t))
	p.Embeddings, p.Logits = rows(emb), rows(logits)
	return p, nil
}

// rows returns the rows of a [n, d] array.
func rows(a *trace.Array) [][]float64 {
	v, d := a.Float64s(), a.Shape()[1]
	out := make([][]float64, a.Shape()[0])
	for i := range out {
		out[i] = v[i*d : (i+1)*d]
	}
	return out
}
