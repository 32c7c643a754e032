package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// nchar is one character of a normalized string with the byte range of the
// input it came from: every step of the pipeline keeps this alignment, so
// that a token's offsets point into the caller's text.
type nchar struct {
	r          rune
	start, end int
}

// fromText is the identity-aligned string of text. Invalid UTF-8 bytes are
// read as U+FFFD, one per byte.
func fromText(text string) []nchar {
	out := make([]nchar, 0, len(text))
	for i, r := range text {
		out = append(out, nchar{r, i, i + utf8.RuneLen(r)})
		if r == utf8.RuneError {
			if _, w := utf8.DecodeRuneInString(text[i:]); w == 1 {
				out[len(out)-1].end = i + 1
			}
		}
	}
	return out
}

// str is the text of a normalized string.
func str(cs []nchar) string {
	var b strings.Builder
	b.Grow(len(cs))
	for _, c := range cs {
		b.WriteRune(c.r)
	}
	return b.String()
}

// normalizer transforms a normalized string (Hugging Face's Normalizer).
type normalizer interface {
	normalize(cs []nchar) []nchar
}

// bertNormalizer is Hugging Face's BertNormalizer.
type bertNormalizer struct {
	cleanText, handleChinese, stripAccents, lowercase bool
}

func (n bertNormalizer) normalize(cs []nchar) []nchar {
	if n.cleanText || n.handleChinese {
		out := make([]nchar, 0, len(cs)+len(cs)/8+2)
		for _, c := range cs {
			if n.cleanText {
				if c.r == 0 || c.r == 0xfffd || isBertControl(c.r) {
					continue
				}
				if isBertWhitespace(c.r) {
					c.r = ' '
				}
			}
			if n.handleChinese && isChineseChar(c.r) {
				sp := c
				sp.r = ' '
				out = append(out, sp, c, sp)
				continue
			}
			out = append(out, c)
		}
		cs = out
	}
	if n.stripAccents {
		cs = stripAccents(unicodeNormalize(cs, norm.NFD))
	}
	if n.lowercase {
		cs = lowercase(cs)
	}
	return cs
}

// isBertWhitespace is BERT's whitespace: tab, newline, carriage return and
// Unicode's White_Space.
func isBertWhitespace(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' || unicode.IsSpace(r)
}

// isBertControl is BERT's control character: Unicode's Other categories
// Cc, Cf, Co and Cs (not the unassigned Cn) except tab, newline and carriage
// return.
func isBertControl(r rune) bool {
	if r < 0x80 {
		return (r < 0x20 || r == 0x7f) && r != '\t' && r != '\n' && r != '\r'
	}
	return unicode.Is(unicode.C, r)
}

func isChineseChar(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FFF ||
		r >= 0x3400 && r <= 0x4DBF ||
		r >= 0x20000 && r <= 0x2A6DF ||
		r >= 0x2A700 && r <= 0x2B73F ||
		r >= 0x2B740 && r <= 0x2B81F ||
		r >= 0x2B920 && r <= 0x2CEAF ||
		r >= 0xF900 && r <= 0xFAFF ||
		r >= 0x2F800 && r <= 0x2FA1F
}

// stripAccents drops the nonspacing marks (Mn).
func stripAccents(cs []nchar) []nchar {
	out := cs[:0]
	for _, c := range cs {
		if !unicode.Is(unicode.Mn, c.r) {
			out = append(out, c)
		}
	}
	return out
}

// lowercase maps every character to its full lowercase mapping, as Rust's
// char::to_lowercase does (U+0130 becomes two characters).
func lowercase(cs []nchar) []nchar {
	var out []nchar
	for i, c := range cs {
		if c.r == 0x130 {
			if out == nil {
				out = append(make([]nchar, 0, len(cs)+1), cs[:i]...)
			}
			out = append(out, nchar{'i', c.start, c.end}, nchar{0x307, c.start, c.end})
			continue
		}
		c.r = unicode.ToLower(c.r)
		if out != nil {
			out = append(out, c)
		} else {
			cs[i] = c
		}
	}
	if out != nil {
		return out
	}
	return cs
}

// unicodeNormalize applies a Unicode normalization form. The decomposing
// forms (NFD, NFKD) decompose character by character, each output character
// aligned with the input character it came from, then put the combining
// marks in canonical order. The composing forms (NFC, NFKC) work segment by
// segment (a starter and the marks that follow it), the k-th output
// character of a segment aligned with its k-th input character.
func unicodeNormalize(cs []nchar, form norm.Form) []nchar {
	ascii := true
	for _, c := range cs {
		if c.r >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return cs
	}
	if form == norm.NFD || form == norm.NFKD {
		return decompose(cs, form)
	}
	s := str(cs)
	// idx maps a byte offset of s to the index of its character in cs.
	idx := make([]int, len(s)+1)
	k := 0
	for i := 0; i < len(s); {
		_, w := utf8.DecodeRuneInString(s[i:])
		for j := 0; j < w; j++ {
			idx[i+j] = k
		}
		i += w
		k++
	}
	idx[len(s)] = len(cs)
	out := make([]nchar, 0, len(cs)+len(cs)/4)
	var it norm.Iter
	it.InitString(form, s)
	var seg []rune // the output of the segment so far
	for !it.Done() {
		from := idx[it.Pos()]
		piece := it.Next()
		to := idx[it.Pos()]
		if to == from {
			// The iterator inserts U+034F between runs of more than 30
			// combining marks (the stream-safe format); Hugging Face
			// does not.
			if string(piece) == "\u034f" && (from >= len(cs) || cs[from].r != 0x34f) {
				continue
			}
			// A character's expansion may come in several pieces before
			// the iterator moves past it.
			for len(piece) > 0 {
				r, w := utf8.DecodeRune(piece)
				piece = piece[w:]
				seg = append(seg, r)
			}
			continue
		}
		for len(piece) > 0 {
			r, w := utf8.DecodeRune(piece)
			piece = piece[w:]
			seg = append(seg, r)
		}
		// Align as Hugging Face does: output characters one to one with
		// the input ones, the extra characters of an expansion with the
		// first input character.
		in := cs[from:to]
		extra := max(len(seg)-len(in), 0)
		for k, r := range seg {
			c := in[min(max(k-extra, 0), len(in)-1)]
			out = append(out, nchar{r, c.start, c.end})
		}
		seg = seg[:0]
	}
	return out
}

// decompose is NFD or NFKD with per-character alignment.
func decompose(cs []nchar, form norm.Form) []nchar {
	out := make([]nchar, 0, len(cs)+len(cs)/4)
	var in [utf8.UTFMax]byte
	var buf []byte
	marks := false
	for _, c := range cs {
		if c.r < 0x80 {
			out = append(out, c)
			continue
		}
		n := utf8.EncodeRune(in[:], c.r)
		buf = form.Append(buf[:0], in[:n]...)
		for b := buf; len(b) > 0; {
			r, w := utf8.DecodeRune(b)
			if form.Properties(b[:w]).CCC() != 0 {
				marks = true
			}
			b = b[w:]
			out = append(out, nchar{r, c.start, c.end})
		}
	}
	if !marks {
		return out
	}
	// Canonical ordering: sort each run of combining marks by their
	// combining class, stably.
	ccc := func(r rune) uint8 {
		n := utf8.EncodeRune(in[:], r)
		return form.Properties(in[:n]).CCC()
	}
	for i := 0; i < len(out); {
		if out[i].r < 0x300 || ccc(out[i].r) == 0 {
			i++
			continue
		}
		j := i + 1
		for j < len(out) && out[j].r >= 0x300 && ccc(out[j].r) != 0 {
			j++
		}
		run := out[i:j]
		sort.SliceStable(run, func(a, b int) bool { return ccc(run[a].r) < ccc(run[b].r) })
		i = j
	}
	return out
}

// formNormalizer is NFD, NFKD, NFC or NFKC.
type formNormalizer struct{ form norm.Form }

func (n formNormalizer) normalize(cs []nchar) []nchar { return unicodeNormalize(cs, n.form) }

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(cs []nchar) []nchar { return lowercase(cs) }

// stripAccentsNormalizer is the StripAccents normalizer: it drops every
// combining mark (Mn, Mc, Me), where BertNormalizer drops only Mn.
type stripAccentsNormalizer struct{}

func (stripAccentsNormalizer) normalize(cs []nchar) []nchar {
	out := cs[:0]
	for _, c := range cs {
		if c.r < 0x300 || !unicode.Is(unicode.M, c.r) {
			out = append(out, c)
		}
	}
	return out
}

type sequenceNormalizer []normalizer

func (s sequenceNormalizer) normalize(cs []nchar) []nchar {
	for _, n := range s {
		cs = n.normalize(cs)
	}
	return cs
}

// prependNormalizer puts a string before a non-empty text; the new
// characters are aligned with the first one.
type prependNormalizer struct{ prefix string }

func (n prependNormalizer) normalize(cs []nchar) []nchar {
	if len(cs) == 0 {
		return cs
	}
	out := make([]nchar, 0, len(cs)+len(n.prefix))
	for _, r := range n.prefix {
		out = append(out, nchar{r, cs[0].start, cs[0].end})
	}
	return append(out, cs...)
}

// replaceNormalizer replaces every occurrence of a literal string; the new
// characters are aligned with the last character of the match, as Hugging
// Face's.
type replaceNormalizer struct {
	pattern []rune
	content []rune
}

func (n replaceNormalizer) normalize(cs []nchar) []nchar {
	if len(n.pattern) == 0 {
		return cs
	}
	var out []nchar
	for i := 0; i < len(cs); {
		if i+len(n.pattern) <= len(cs) && matchRunes(cs[i:], n.pattern) {
			last := cs[i+len(n.pattern)-1]
			for _, r := range n.content {
				out = append(out, nchar{r, last.start, last.end})
			}
			i += len(n.pattern)
			continue
		}
		out = append(out, cs[i])
		i++
	}
	return out
}

func matchRunes(cs []nchar, p []rune) bool {
	for j, r := range p {
		if cs[j].r != r {
			return false
		}
	}
	return true
}

// stripNormalizer removes leading and/or trailing whitespace.
type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(cs []nchar) []nchar {
	if n.left {
		for len(cs) > 0 && unicode.IsSpace(cs[0].r) {
			cs = cs[1:]
		}
	}
	if n.right {
		for len(cs) > 0 && unicode.IsSpace(cs[len(cs)-1].r) {
			cs = cs[:len(cs)-1]
		}
	}
	return cs
}
