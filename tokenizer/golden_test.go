package tokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// golden is one line of a golden file written by testdata/gen.py: what
// Hugging Face's tokenizers gives for corpus line I (and J, for a pair).
type golden struct {
	I                 int      `json:"i"`
	J                 *int     `json:"j"`
	IDs               []int    `json:"ids"`
	TypeIDs           []int    `json:"type_ids"`
	AttentionMask     []int    `json:"attention_mask"`
	SpecialTokensMask []int    `json:"special_tokens_mask"`
	Offsets           [][2]int `json:"offsets"`
	Decoded           string   `json:"decoded"`
}

func readJSONLines[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []T
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s:%d: %v", path, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

func readCorpus(t testing.TB) []string {
	return readJSONLines[string](t, filepath.Join("testdata", "corpus.jsonl.gz"))
}

// goldenTokenizers names each tokenizer and its file under testdata.
var goldenTokenizers = []struct{ name, file string }{
	{"minilm", "minilm.json"},
	{"gpt2", "gpt2.json.gz"},
	{"wp-cased", "wp-cased.json"},
	{"wp-uncased", "wp-uncased.json"},
	{"bbpe", "bbpe.json"},
	{"llama2", "llama2.json"},
	{"metaspace", "metaspace.json"},
	{"llama3", "llama3.json"},
	{"ws-nfkc", "ws-nfkc.json"},
	{"ws-nfd", "ws-nfd.json"},
}

// charIndex maps every byte offset of text, and len(text), to the index of
// the character it is in: Python's offsets count characters.
func charIndex(text string) []int {
	m := make([]int, len(text)+1)
	ci := 0
	for b, r := range text {
		for k := 0; k < runeLen(r) && b+k < len(text); k++ {
			m[b+k] = ci
		}
		ci++
	}
	m[len(text)] = ci
	return m
}

// sameInts compares int slices, nil and empty being the same.
func sameInts(a, b []int) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

// TestGoldens encodes every corpus line with every tokenizer and requires
// Hugging Face's ids, type ids, masks, offsets and decoded text.
func TestGoldens(t *testing.T) {
	corpus := readCorpus(t)
	if len(corpus) < 1000 {
		t.Fatalf("the corpus has %d lines, want a few thousand", len(corpus))
	}
	for _, gt := range goldenTokenizers {
		t.Run(gt.name, func(t *testing.T) {
			tok, err := Load(filepath.Join("testdata", gt.file))
			if err != nil {
				t.Fatal(err)
			}
			gs := readJSONLines[golden](t, filepath.Join("testdata", "golden-"+gt.name+".jsonl.gz"))
			bad := map[string]int{}
			n := 0
			for k, g := range gs {
				if testing.Short() && k%4 != 0 {
					continue // -short: every fourth line
				}
				n++
				var enc *Encoding
				var err error
				what := fmt.Sprintf("line %d %q", g.I, corpus[g.I])
				if g.J != nil {
					enc, err = tok.EncodePair(corpus[g.I], corpus[*g.J])
					what = fmt.Sprintf("pair (%d, %d) %q, %q", g.I, *g.J, corpus[g.I], corpus[*g.J])
				} else {
					enc, err = tok.Encode(corpus[g.I])
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				report := func(field string, got, want any) {
					bad[field]++
					if bad[field] <= 3 {
						t.Errorf("%s: %s\n got %v\nwant %v\ntokens %q", what, field, got, want, enc.Tokens)
					}
				}
				if !sameInts(enc.IDs, g.IDs) {
					report("ids", enc.IDs, g.IDs)
					continue
				}
				if !sameInts(enc.TypeIDs, g.TypeIDs) {
					report("type ids", enc.TypeIDs, g.TypeIDs)
				}
				if !sameInts(enc.AttentionMask, g.AttentionMask) {
					report("attention mask", enc.AttentionMask, g.AttentionMask)
				}
				if !sameInts(enc.SpecialTokensMask, g.SpecialTokensMask) {
					report("special tokens mask", enc.SpecialTokensMask, g.SpecialTokensMask)
				}
				offs := make([][2]int, len(enc.Offsets))
				idx := [2][]int{charIndex(corpus[g.I]), nil}
				if g.J != nil {
					idx[1] = charIndex(corpus[*g.J])
				}
				for k, o := range enc.Offsets {
					m := idx[0]
					if enc.SequenceIDs[k] == 1 {
						m = idx[1]
					}
					if o.Start < 0 || o.End > len(m)-1 || o.Start > o.End {
						offs[k] = [2]int{o.Start, o.End}
						continue
					}
					offs[k] = [2]int{m[o.Start], m[o.End]}
				}
				if len(offs) == 0 && len(g.Offsets) == 0 {
					offs = g.Offsets
				}
				if !reflect.DeepEqual(offs, g.Offsets) {
					report("offsets", offs, g.Offsets)
				}
				dec, err := tok.Decode(enc.IDs, true)
				if err != nil {
					t.Fatalf("%s: Decode: %v", what, err)
				}
				if dec != g.Decoded {
					report("decoded text", fmt.Sprintf("%q", dec), fmt.Sprintf("%q", g.Decoded))
				}
			}
			for field, k := range bad {
				t.Errorf("%s: %d of %d encodings differ from Hugging Face's in their %s", gt.name, k, n, field)
			}
			t.Logf("%s: %d encodings compared", gt.name, n)
		})
	}
}
