package tokenizer

import (
	"unicode"
)

// preTokenizer splits a normalized string into words (Hugging Face's
// PreTokenizer); it may also transform them (ByteLevel maps bytes to
// characters). Empty words are dropped.
type preTokenizer interface {
	preTokenize(cs []nchar, emit func([]nchar))
}

// bertPreTokenizer splits on whitespace (dropped) and isolates every
// punctuation character.
type bertPreTokenizer struct{}

func (bertPreTokenizer) preTokenize(cs []nchar, emit func([]nchar)) {
	start := 0
	for i, c := range cs {
		switch {
		case unicode.IsSpace(c.r):
			if i > start {
				emit(cs[start:i])
			}
			start = i + 1
		case isBertPunctuation(c.r):
			if i > start {
				emit(cs[start:i])
			}
			emit(cs[i : i+1])
			start = i + 1
		}
	}
	if len(cs) > start {
		emit(cs[start:])
	}
}

// isBertPunctuation is ASCII punctuation or Unicode's P categories.
func isBertPunctuation(r rune) bool {
	if r < 0x80 {
		return r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~'
	}
	return unicode.IsPunct(r)
}

// whitespaceSplit splits on whitespace, dropping it.
type whitespaceSplit struct{}

func (whitespaceSplit) preTokenize(cs []nchar, emit func([]nchar)) {
	start := 0
	for i, c := range cs {
		if unicode.IsSpace(c.r) {
			if i > start {
				emit(cs[start:i])
			}
			start = i + 1
		}
	}
	if len(cs) > start {
		emit(cs[start:])
	}
}

// whitespacePre is Hugging Face's Whitespace pre-tokenizer: the regex
// `\w+|[^\w\s]+`, whitespace dropped.
type whitespacePre struct{}

func (whitespacePre) preTokenize(cs []nchar, emit func([]nchar)) {
	for i := 0; i < len(cs); {
		r := cs[i].r
		j := i + 1
		switch {
		case isWordChar(r):
			for j < len(cs) && isWordChar(cs[j].r) {
				j++
			}
			emit(cs[i:j])
		case !unicode.IsSpace(r):
			for j < len(cs) && !isWordChar(cs[j].r) && !unicode.IsSpace(cs[j].r) {
				j++
			}
			emit(cs[i:j])
		}
		i = j
	}
}

// isWordChar is the regex class \w with Unicode: letters and other
// alphabetic characters, marks, decimal digits, connector punctuation and
// the join controls.
func isWordChar(r rune) bool {
	if r < 0x80 {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_'
	}
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		unicode.Is(unicode.Other_Alphabetic, r) || unicode.Is(unicode.Nl, r) || r == 0x200c || r == 0x200d
}

type sequencePre []preTokenizer

func (s sequencePre) preTokenize(cs []nchar, emit func([]nchar)) {
	words := [][]nchar{cs}
	for _, p := range s {
		var next [][]nchar
		for _, w := range words {
			p.preTokenize(w, func(x []nchar) {
				if len(x) > 0 {
					next = append(next, x)
				}
			})
		}
		words = next
	}
	for _, w := range words {
		emit(w)
	}
}

// byteLevelPre is the ByteLevel pre-tokenizer: an optional leading space,
// GPT-2's split, then every byte of UTF-8 mapped to one printable character.
type byteLevelPre struct {
	addPrefixSpace, useRegex bool
}

func (p byteLevelPre) preTokenize(cs []nchar, emit func([]nchar)) {
	if len(cs) == 0 {
		return
	}
	if p.addPrefixSpace && cs[0].r != ' ' {
		cs = append([]nchar{{' ', cs[0].start, cs[0].end}}, cs...)
	}
	if !p.useRegex {
		emit(toByteLevel(cs))
		return
	}
	for i := 0; i < len(cs); {
		j := gpt2Match(cs, i)
		emit(toByteLevel(cs[i:j]))
		i = j
	}
}

// gpt2Match returns the end of GPT-2's pattern
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// matched at cs[i] (the pattern matches everywhere, so splitting with it
// leaves no gaps). The alternatives are tried in order, as a backtracking
// regex engine does.
func gpt2Match(cs []nchar, i int) int {
	n := len(cs)
	c := cs[i].r
	if c == '\'' && i+1 < n {
		switch c1 := cs[i+1].r; c1 {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < n && cs[i+2].r == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < n && cs[i+2].r == 'l' {
				return i + 3
			}
		}
	}
	k := i
	if c == ' ' && i+1 < n {
		k = i + 1
	}
	switch ck := cs[k].r; {
	case unicode.IsLetter(ck):
		j := k + 1
		for j < n && unicode.IsLetter(cs[j].r) {
			j++
		}
		return j
	case unicode.IsNumber(ck):
		j := k + 1
		for j < n && unicode.IsNumber(cs[j].r) {
			j++
		}
		return j
	case !unicode.IsSpace(ck):
		j := k + 1
		for j < n && isGPT2Other(cs[j].r) {
			j++
		}
		return j
	}
	// Whitespace: \s+(?!\S) leaves the last space of a run to the word that
	// follows; a single space before a word is matched by \s+.
	j := i + 1
	for j < n && unicode.IsSpace(cs[j].r) {
		j++
	}
	if j < n && j-i >= 2 {
		return j - 1
	}
	return j
}

func isGPT2Other(r rune) bool {
	return !unicode.IsSpace(r) && !unicode.IsLetter(r) && !unicode.IsNumber(r)
}

// byteToRune is GPT-2's bytes_to_unicode: printable bytes map to themselves,
// the others to U+0100 onwards in order.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// toByteLevel maps every UTF-8 byte of the characters to its character;
// all bytes of one character keep that character's alignment.
func toByteLevel(cs []nchar) []nchar {
	out := make([]nchar, 0, len(cs)+len(cs)/2)
	var buf [4]byte
	for _, c := range cs {
		if c.r < 0x80 {
			out = append(out, nchar{byteToRune[c.r], c.start, c.end})
			continue
		}
		n := encodeRune(buf[:], c.r)
		for _, b := range buf[:n] {
			out = append(out, nchar{byteToRune[b], c.start, c.end})
		}
	}
	return out
}
