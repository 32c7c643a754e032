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
	if len(s) == 0 {
		emit(cs)
		return
	}
	words := [][]nchar{cs}
	for _, p := range s[:len(s)-1] {
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
	last := s[len(s)-1]
	for _, w := range words {
		last.preTokenize(w, emit)
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
	mapped := toByteLevel(cs)
	if !p.useRegex {
		emit(mapped)
		return
	}
	// Split cs with the regex; mapped[at:] holds the bytes of cs[i:].
	at := 0
	for i := 0; i < len(cs); {
		j := gpt2Match(cs, i)
		n := 0
		for _, c := range cs[i:j] {
			n += runeLen(c.r)
		}
		emit(mapped[at : at+n])
		at += n
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

// metaspacePre is the Metaspace pre-tokenizer (SentencePiece's "▁" for
// spaces): spaces become the replacement, which is prepended to the text
// (always, or only to the first piece of the text), and with split each
// replacement starts a new word.
type metaspacePre struct {
	replacement rune
	prepend     string // "always", "first" or "never"
	split       bool
}

func (p metaspacePre) preTokenize(cs []nchar, emit func([]nchar)) {
	if len(cs) == 0 {
		return
	}
	out := make([]nchar, 0, len(cs)+1)
	for _, c := range cs {
		if c.r == ' ' {
			c.r = p.replacement
		}
		out = append(out, c)
	}
	if out[0].r != p.replacement && (p.prepend == "always" || p.prepend == "first" && out[0].start == 0) {
		out = append([]nchar{{p.replacement, out[0].start, out[0].end}}, out...)
	}
	if !p.split {
		emit(out)
		return
	}
	start := 0
	for i := 1; i < len(out); i++ {
		if out[i].r == p.replacement {
			emit(out[start:i])
			start = i
		}
	}
	emit(out[start:])
}

// regexSplit is the Split pre-tokenizer with a regex this package knows
// (Go's regexp has no lookahead, so each is matched by hand), isolating
// every match.
type regexSplit struct {
	match func(cs []nchar, i int) int
}

func (p regexSplit) preTokenize(cs []nchar, emit func([]nchar)) {
	for i := 0; i < len(cs); {
		j := p.match(cs, i)
		emit(cs[i:j])
		i = j
	}
}

// gpt2Pattern and llama3Pattern are the split regexes of GPT-2 and Llama 3.
const (
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// llama3Match returns the end of Llama 3's pattern (llama3Pattern) matched
// at cs[i], trying the alternatives in order.
func llama3Match(cs []nchar, i int) int {
	n := len(cs)
	c := cs[i].r
	if c == '\'' && i+1 < n {
		switch unicode.ToLower(cs[i+1].r) {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < n && unicode.ToLower(cs[i+2].r) == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < n && unicode.ToLower(cs[i+2].r) == 'l' {
				return i + 3
			}
		}
	}
	letters := func(j int) int {
		for j < n && unicode.IsLetter(cs[j].r) {
			j++
		}
		return j
	}
	isNL := func(r rune) bool { return r == '\r' || r == '\n' }
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if unicode.IsLetter(c) {
		return letters(i + 1)
	}
	if !isNL(c) && !unicode.IsNumber(c) && i+1 < n && unicode.IsLetter(cs[i+1].r) {
		return letters(i + 2)
	}
	// \p{N}{1,3}
	if unicode.IsNumber(c) {
		j := i + 1
		for j < n && j < i+3 && unicode.IsNumber(cs[j].r) {
			j++
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	k := i
	if c == ' ' && i+1 < n {
		k = i + 1
	}
	if isGPT2Other(cs[k].r) {
		j := k + 1
		for j < n && isGPT2Other(cs[j].r) {
			j++
		}
		for j < n && isNL(cs[j].r) {
			j++
		}
		return j
	}
	// c is whitespace. \s*[\r\n]+ ends after the run's last newline.
	j := i + 1
	for j < n && unicode.IsSpace(cs[j].r) {
		j++
	}
	for p := j - 1; p >= i; p-- {
		if isNL(cs[p].r) {
			return p + 1
		}
	}
	// \s+(?!\S), then \s+.
	if j < n && j-i >= 2 {
		return j - 1
	}
	return j
}
