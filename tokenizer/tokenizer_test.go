package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// edited returns testdata/name with one top-level field replaced.
func edited(t *testing.T, name, field, value string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m[field] = json.RawMessage(value)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUnsupported: a component the package does not implement is refused
// with an error naming it, never left out of the pipeline.
func TestUnsupported(t *testing.T) {
	for _, c := range []struct{ field, value, want string }{
		{"model", `{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0]]}`, "model Unigram is not supported"},
		{"model", `{"type":"WordLevel","vocab":{"a":0},"unk_token":"a"}`, "model WordLevel is not supported"},
		{"model", `{"type":"BPE","dropout":0.1,"vocab":{"a":0},"merges":[]}`, "dropout"},
		{"normalizer", `{"type":"Precompiled","precompiled_charsmap":""}`, "normalizer Precompiled is not supported"},
		{"normalizer", `{"type":"Replace","pattern":{"Regex":" +"},"content":" "}`, "Replace with a regex pattern"},
		{"normalizer", `{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Nmt"}]}`, "normalizer Nmt is not supported"},
		{"pre_tokenizer", `{"type":"Split","pattern":{"Regex":"\\d+"},"behavior":"Isolated","invert":false}`, `Split with the regex "\\d+"`},
		{"pre_tokenizer", `{"type":"Split","pattern":{"String":" "},"behavior":"Removed","invert":false}`, "Split with the pattern"},
		{"pre_tokenizer", `{"type":"Digits","individual_digits":true}`, "pre-tokenizer Digits is not supported"},
		{"pre_tokenizer", `{"type":"UnicodeScripts"}`, "pre-tokenizer UnicodeScripts is not supported"},
		{"post_processor", `{"type":"RobertaProcessing","sep":["</s>",2],"cls":["<s>",0],"trim_offsets":true,"add_prefix_space":true}`, "post-processor RobertaProcessing is not supported"},
		{"decoder", `{"type":"CTC","pad_token":"<pad>","word_delimiter_token":"|","cleanup":true}`, "decoder CTC is not supported"},
		{"padding", `{"strategy":"Longest","direction":"Right","pad_id":0,"pad_type_id":0,"pad_token":"[PAD]"}`, "padding strategy"},
		{"truncation", `{"max_length":8,"strategy":"Middle","direction":"Right","stride":0}`, `strategy "Middle"`},
	} {
		_, err := Parse(edited(t, "wp-cased.json", c.field, c.value))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: error %v, want one saying %q", c.field, c.value, err, c.want)
		}
	}
}

// TestBadFiles: malformed files are errors, not panics.
func TestBadFiles(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"model": 3}`))
	zw.Close()
	for name, data := range map[string][]byte{
		"empty":              nil,
		"not json":           []byte("vocab.txt"),
		"no model":           []byte(`{"version":"1.0"}`),
		"model not object":   gz.Bytes(),
		"truncated gzip":     gz.Bytes()[:10],
		"merge not in vocab": []byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}`),
		"merge malformed":    []byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[3]}}`),
		"negative id":        []byte(`{"model":{"type":"WordPiece","vocab":{"a":-4}}}`),
		"bad template":       []byte(`{"model":{"type":"WordPiece","vocab":{"a":0}},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"[X]","type_id":0}}],"pair":[],"special_tokens":{}}}`),
	} {
		if _, err := Parse(data); err == nil {
			t.Errorf("%s: Parse accepted it", name)
		}
	}
	if _, err := Load(filepath.Join("testdata", "no-such-tokenizer.json")); err == nil {
		t.Error("Load of a missing file: no error")
	}
	// A directory means its tokenizer.json.
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("testdata", "wp-cased.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err != nil {
		t.Errorf("Load(directory): %v", err)
	}
}

// TestMissingUnk: a WordPiece whose unknown token is not in the vocabulary
// fails on a word it cannot split, as Hugging Face's does.
func TestMissingUnk(t *testing.T) {
	tok, err := Parse([]byte(`{"model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"a":0,"##b":1}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if e, err := tok.Encode("ab"); err != nil || !sameInts(e.IDs, []int{0, 1}) {
		t.Errorf("Encode(ab) = %v, %v; want [0 1]", e, err)
	}
	if _, err := tok.Encode("c"); err == nil || !strings.Contains(err.Error(), "[UNK]") {
		t.Errorf("Encode(c): error %v, want one naming [UNK]", err)
	}
}

// TestDecodeBadID: an id outside the vocabulary is an error naming it.
func TestDecodeBadID(t *testing.T) {
	tok, err := Load(filepath.Join("testdata", "gpt2.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int{-1, 50257, 1 << 40} {
		if _, err := tok.Decode([]int{464, id}, true); err == nil || !strings.Contains(err.Error(), "ids[1]") {
			t.Errorf("Decode(%d): error %v, want one naming ids[1]", id, err)
		}
	}
	if n := tok.VocabSize(); n != 50257 {
		t.Errorf("VocabSize = %d, want 50257", n)
	}
	if id, ok := tok.TokenToID("<|endoftext|>"); !ok || id != 50256 {
		t.Errorf("TokenToID(<|endoftext|>) = %d, %v", id, ok)
	}
	if s, ok := tok.IDToToken(464); !ok || s != "The" {
		t.Errorf("IDToToken(464) = %q, %v", s, ok)
	}
}

// TestLossyUTF8 checks the byte-level decoder's reading of invalid UTF-8
// against the Unicode standard's "maximal subpart" practice (which Rust's
// from_utf8_lossy and Python's decode(errors="replace") follow).
func TestLossyUTF8(t *testing.T) {
	for in, want := range map[string]string{
		"abc":                              "abc",
		"\xe2\x82":                         "\ufffd",
		"\xe2\x82a":                        "\ufffda",
		"\xff":                             "\ufffd",
		"a\xf0\x9f\x98":                    "a\ufffd",
		"\xed\xa0\x80":                     "\ufffd\ufffd\ufffd",
		"\xc0\xaf":                         "\ufffd\ufffd",
		"\xf4\x90\x80\x80":                 "\ufffd\ufffd\ufffd\ufffd",
		"\xe0\x80\x80":                     "\ufffd\ufffd\ufffd",
		"\xf0\x9f\x98\x80\x80":             "😀\ufffd",
		"\x61\xf1\x80\x80\xe1\x80\xc2\x62": "a\ufffd\ufffd\ufffdb",
	} {
		if got := lossyUTF8([]byte(in)); got != want {
			t.Errorf("lossyUTF8(%q) = %q, want %q", in, got, want)
		}
	}
}

// randomText draws text from a pool of characters of many scripts and
// categories, with invalid UTF-8 bytes when invalid is set.
func randomText(t *testing.T, r interface{ IntN(int) int }, invalid bool) string {
	pool := []rune("abcXYZ019 \t\n\r.,;:!?'\"-_()[]{}<>/\\@#$%^&*+=~`|éÉàçñüßøİıŞğαβΣςжЖאבابكก ข你好世界あア한글😀🎉👍🏽\u200d\u00a0\u3000\u200b\u00ad\u0301\u0308①²½™٣१\u2028\x00\x07\ufffd")
	var b strings.Builder
	n := r.IntN(80)
	for i := 0; i < n; i++ {
		if invalid && r.IntN(20) == 0 {
			b.WriteByte(byte(0x80 + r.IntN(0x80)))
			continue
		}
		b.WriteRune(pool[r.IntN(len(pool))])
	}
	_ = t
	return b.String()
}

// TestRandomText encodes random text (valid and invalid UTF-8) with every
// tokenizer: no error, offsets inside the text in order, and for the
// byte-level tokenizers decode(encode(x)) == x.
func TestRandomText(t *testing.T) {
	r := testseed.Rand(t, 0)
	for _, gt := range goldenTokenizers {
		tok, err := Load(filepath.Join("testdata", gt.file))
		if err != nil {
			t.Fatal(err)
		}
		tok, _ = tok.WithPadding(nil)
		tok, _ = tok.WithTruncation(nil)
		for k := 0; k < 300; k++ {
			text := randomText(t, r, k%2 == 1)
			e, err := tok.Encode(text)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", gt.name, text, err)
			}
			for i, o := range e.Offsets {
				if o.Start < 0 || o.End > len(text) || o.Start > o.End {
					t.Fatalf("%s: Encode(%q): token %d %q has offsets %v outside the text", gt.name, text, i, e.Tokens[i], o)
				}
			}
			dec, err := tok.Decode(e.IDs, true)
			if err != nil {
				t.Fatalf("%s: Decode(Encode(%q)): %v", gt.name, text, err)
			}
			switch gt.name {
			case "gpt2", "llama3":
				if utf8.ValidString(text) && dec != text {
					t.Fatalf("%s: Decode(Encode(%q)) = %q", gt.name, text, dec)
				}
			}
		}
	}
}

// TestConcurrent encodes from several goroutines at once (the BPE cache is
// shared); run with -race.
func TestConcurrent(t *testing.T) {
	tok, err := Load(filepath.Join("testdata", "gpt2.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	corpus := readCorpus(t)[:400]
	want := make([][]int, len(corpus))
	for i, l := range corpus {
		e, err := tok.Encode(l)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = e.IDs
	}
	tok2, _ := Load(filepath.Join("testdata", "gpt2.json.gz"))
	errs := make(chan string, 4)
	for g := 0; g < 4; g++ {
		go func(g int) {
			for i := range corpus {
				k := (i*7 + g*13) % len(corpus)
				e, err := tok2.Encode(corpus[k])
				if err != nil || !sameInts(e.IDs, want[k]) {
					errs <- corpus[k]
					return
				}
			}
			errs <- ""
		}(g)
	}
	for g := 0; g < 4; g++ {
		if s := <-errs; s != "" {
			t.Errorf("concurrent Encode(%q) differs", s)
		}
	}
}
