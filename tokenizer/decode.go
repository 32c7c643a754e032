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

// replaceDecoder replaces a string in every token.
type replaceDecoder struct{ old, new string }

func (d replaceDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = strings.ReplaceAll(t, d.old, d.new)
	}
	return out
}

// byteFallbackDecoder turns runs of <0xNN> tokens into the text their
// bytes spell, or one U+FFFD per byte when they are not valid UTF-8.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decode(toks []string) []string {
	var out []string
	var bytes []byte
	flush := func() {
		if len(bytes) == 0 {
			return
		}
		if utf8.Valid(bytes) {
			out = append(out, string(bytes))
		} else {
			for range bytes {
				out = append(out, "\ufffd")
			}
		}
		bytes = bytes[:0]
	}
	for _, t := range toks {
		if b, ok := byteToken(t); ok {
			bytes = append(bytes, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// byteToken parses a byte-fallback token "<0xNN>".
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | (c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

// fuseDecoder joins all tokens into one.
type fuseDecoder struct{}

func (fuseDecoder) decode(toks []string) []string { return []string{strings.Join(toks, "")} }

// stripDecoder removes up to start leading and stop trailing occurrences of
// a character from every token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		rs := []rune(t)
		a, b := 0, len(rs)
		for a < len(rs) && a < d.start && rs[a] == d.content {
			a++
		}
		for k := 0; k < d.stop && b > a && rs[b-1] == d.content; k++ {
			b--
		}
		out[i] = string(rs[a:b])
	}
	return out
}

// metaspaceDecoder turns the replacement character back into spaces; in the
// first token it is dropped unless the prepend scheme is "never".
type metaspaceDecoder struct {
	replacement rune
	prepend     string
}

func (d metaspaceDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		var sb strings.Builder
		for _, r := range t {
			if r == d.replacement {
				if i == 0 && d.prepend != "never" {
					continue
				}
				r = ' '
			}
			sb.WriteRune(r)
		}
		out[i] = sb.String()
	}
	return out
}

type sequenceDecoder []decoder

func (s sequenceDecoder) decode(toks []string) []string {
	for _, d := range s {
		toks = d.decode(toks)
	}
	return toks
}

// bpeDecoder replaces the end-of-word suffix with a space (with nothing in
// the last token).
type bpeDecoder struct{ suffix string }

func (d bpeDecoder) decode(toks []string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		rep := " "
		if i == len(toks)-1 {
			rep = ""
		}
		out[i] = strings.ReplaceAll(t, d.suffix, rep)
	}
	return out
}
