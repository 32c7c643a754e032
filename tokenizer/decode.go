package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// decoder turns tokens back into pieces of text, joined with "" at the end
// (Hugging Face's Decoder and its decode_chain).
type decoder interface {
	decode(toks []string) []string
}

// wordPieceDecoder glues "##" subwords to the token before and puts a space
// before the others; cleanup removes the spaces tokenization put before
// punctuation and contractions.
type wordPieceDecoder struct {
	prefix  string
	cleanup bool
}

func (d wordPieceDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		if i != 0 {
			if strings.HasPrefix(t, d.prefix) {
				t = strings.Replace(t, d.prefix, "", 1)
			} else {
				t = " " + t
			}
		}
		if d.cleanup {
			t = cleanupTokenization(t)
		}
		out[i] = t
	}
	return out
}

var cleanupReplacer = []struct{ old, new string }{
	{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
	{" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"},
	{" 've", "'ve"}, {" 're", "'re"},
}

// cleanupTokenization is Hugging Face's clean_up_tokenization.
func cleanupTokenization(s string) string {
	for _, r := range cleanupReplacer {
		s = strings.ReplaceAll(s, r.old, r.new)
	}
	return s
}

// byteLevelDecoder maps the characters of byte-level tokens back to bytes
// and reads them as UTF-8 (invalid sequences become U+FFFD).
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(toks []string) []string {
	var b []byte
	for _, t := range toks {
		n := len(b)
		ok := true
		for _, r := range t {
			c, in := runeToByte[r]
			if !in {
				ok = false
				break
			}
			b = append(b, c)
		}
		if !ok {
			b = append(b[:n], t...)
		}
	}
	return []string{lossyUTF8(b)}
}

// lossyUTF8 is Rust's String::from_utf8_lossy: each maximal invalid
// subsequence becomes one U+FFFD.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for i := 0; i < len(b); {
		r, w := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || w > 1 {
			sb.Write(b[i : i+w])
			i += w
			continue
		}
		// Skip the longest prefix of a valid sequence that b[i:] starts.
		sb.WriteRune(utf8.RuneError)
		i += invalidPrefixLen(b[i:])
	}
	return sb.String()
}

// invalidPrefixLen is the length of the maximal subpart of an ill-formed
// UTF-8 sequence at the start of b (at least 1).
func invalidPrefixLen(b []byte) int {
	c := b[0]
	var n int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		n = 2
	case c == 0xE0:
		n, lo = 3, 0xA0
	case c >= 0xE1 && c <= 0xEC || c == 0xEE || c == 0xEF:
		n = 3
	case c == 0xED:
		n, hi = 3, 0x9F
	case c == 0xF0:
		n, lo = 4, 0x90
	case c >= 0xF1 && c <= 0xF3:
		n = 4
	case c == 0xF4:
		n, hi = 4, 0x8F
	default:
		return 1
	}
	i := 1
	for ; i < n && i < len(b); i++ {
		if i == 1 {
			if b[i] < lo || b[i] > hi {
				break
			}
		} else if b[i] < 0x80 || b[i] > 0xBF {
			break
		}
	}
	return i
}

func runeLen(r rune) int {
	if n := utf8.RuneLen(r); n > 0 {
		return n
	}
	return 3
}

func encodeRune(p []byte, r rune) int { return utf8.EncodeRune(p, r) }
