package tokenizer

import (
	"path/filepath"
	"testing"
)

// BenchmarkEncode encodes the golden corpus (2976 lines of prose, code,
// numbers, accents, CJK and emoji) line by line; the throughput is in bytes
// of text.
func BenchmarkEncode(b *testing.B) {
	corpus := readCorpus(b)
	n := 0
	for _, l := range corpus {
		n += len(l)
	}
	for _, gt := range goldenTokenizers {
		b.Run(gt.name, func(b *testing.B) {
			tok, err := Load(filepath.Join("testdata", gt.file))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(n))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, l := range corpus {
					if _, err := tok.Encode(l); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkDecode decodes the ids of the golden corpus.
func BenchmarkDecode(b *testing.B) {
	corpus := readCorpus(b)
	for _, name := range []string{"minilm", "gpt2"} {
		b.Run(name, func(b *testing.B) {
			file := map[string]string{"minilm": "minilm.json", "gpt2": "gpt2.json.gz"}[name]
			tok, err := Load(filepath.Join("testdata", file))
			if err != nil {
				b.Fatal(err)
			}
			var ids [][]int
			n := 0
			for _, l := range corpus {
				e, err := tok.Encode(l)
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, e.IDs)
				n += len(l)
			}
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, x := range ids {
					if _, err := tok.Decode(x, true); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkLoad reads GPT-2's tokenizer.json (50257 tokens, 50000 merges).
func BenchmarkLoad(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Load(filepath.Join("testdata", "gpt2.json.gz")); err != nil {
			b.Fatal(err)
		}
	}
}
