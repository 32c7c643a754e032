package hf_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// TestMiniLM runs the real all-MiniLM-L6-v2 from $FERRY_HF_MODELS
// against the reference of gen.py --minilm (NumPy, the sentences
// tokenized by Python's tokenizers): the same ids from package tokenizer,
// and embeddings within 1e-5. bash .ci/hf.sh installs the model and runs
// it.
func TestMiniLM(t *testing.T) {
	root := settings.HFModels.Get()
	if root == "" {
		t.Skip("FERRY_HF_MODELS is not set (bash .ci/hf.sh gets all-MiniLM-L6-v2 and runs this test)")
	}
	dir := filepath.Join(root, "all-MiniLM-L6-v2")
	data, err := os.ReadFile(dir + ".golden.json")
	if err != nil {
		t.Fatalf("%v (gen.py --minilm %s %s.golden.json writes it)", err, dir, dir)
	}
	var ref struct {
		Sentences  []string  `json:"sentences"`
		IDs        [][]int32 `json:"ids"`
		Types      [][]int32 `json:"types"`
		Mask       [][]int32 `json:"mask"`
		Embeddings tensor    `json:"embeddings"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.IDs) != len(ref.Sentences) || len(ref.Types) != len(ref.IDs) || len(ref.Mask) != len(ref.IDs) {
		t.Fatalf("%s.golden.json: %d sentences, %d ids, %d types, %d masks", dir, len(ref.Sentences), len(ref.IDs), len(ref.Types), len(ref.Mask))
	}

	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok, err = tok.WithPadding(&tokenizer.Padding{Token: "[PAD]"}); err != nil {
		t.Fatal(err)
	}
	encs, err := tok.EncodeBatch(ref.Sentences)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range encs {
		var ids, types, mask []int32
		for j := range e.IDs {
			ids, types, mask = append(ids, int32(e.IDs[j])), append(types, int32(e.TypeIDs[j])), append(mask, int32(e.AttentionMask[j]))
		}
		if !slices.Equal(ids, ref.IDs[i]) || !slices.Equal(types, ref.Types[i]) || !slices.Equal(mask, ref.Mask[i]) {
			t.Fatalf("sentence %q: ids %v, Python's tokenizers %v", ref.Sentences[i], ids, ref.IDs[i])
		}
	}

	m, cfg, err := hf.LoadBert(dir, ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Layers != 6 || cfg.D != 384 {
		t.Errorf("config %+v", cfg)
	}
	emb := rt.Jit(func(m nn.Bert, ids, types, mask *trace.Array) *trace.Array {
		return meanPool(m.Encode(ids, types, nn.Context{Padding: mask}), mask)
	})(m, matrix(ref.IDs), matrix(ref.Types), matrix(ref.Mask))
	compare(t, "embeddings", emb, ref.Embeddings)
	// Cosine similarities: the embeddings are unit vectors.
	g, w := emb.Float64s(), ref.Embeddings.Data
	n, d := len(ref.Sentences), 384
	worst := 0.0
	for i := range n {
		for j := range n {
			var a, b float64
			for k := range d {
				a += g[i*d+k] * g[j*d+k]
				b += w[i*d+k] * w[j*d+k]
			}
			worst = math.Max(worst, math.Abs(a-b))
		}
	}
	t.Logf("%d sentences; largest cosine-similarity difference %.3g", n, worst)
	if worst > 1e-5 {
		t.Errorf("cosine similarities differ by %.3g", worst)
	}
}
