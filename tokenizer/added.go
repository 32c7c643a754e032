package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// AddedToken is a token matched in the text before the model sees it
// (Hugging Face's added tokens: the special tokens such as [CLS] or
// <|endoftext|>, and any token added to a trained vocabulary).
type AddedToken struct {
	ID      int
	Content string
	// Special tokens are dropped by Decode when asked to skip them.
	Special bool
	// SingleWord: matched only where it is not inside a word.
	SingleWord bool
	// LStrip, RStrip: the whitespace on its left (right) is part of the match.
	LStrip, RStrip bool
	// Normalized: matched in the normalized text (its content normalized
	// too) rather than in the raw text.
	Normalized bool
}

// matcher finds added tokens, leftmost first and the longest at a
// position, as an Aho-Corasick automaton in LeftmostLongest mode does.
type matcher struct {
	byFirst map[byte][]int // first byte -> indices of pats, longest first
	first   [256]bool      // the first bytes of pats
	pats    []string
	toks    []*AddedToken
}

func newMatcher(toks []*AddedToken, pats []string) *matcher {
	m := &matcher{byFirst: map[byte][]int{}, pats: pats, toks: toks}
	for i, p := range pats {
		if p == "" {
			continue
		}
		m.byFirst[p[0]] = append(m.byFirst[p[0]], i)
		m.first[p[0]] = true
	}
	for _, l := range m.byFirst {
		sort.SliceStable(l, func(a, b int) bool { return len(pats[l[a]]) > len(pats[l[b]]) })
	}
	return m
}

// split is a piece of a sequence: either text still to tokenize or an
// added token already found.
type split struct {
	cs    []nchar
	added *AddedToken
}

// find splits cs around the added tokens it holds.
func (m *matcher) find(cs []nchar, out []split) []split {
	if len(m.pats) == 0 || len(cs) == 0 {
		if len(cs) > 0 {
			out = append(out, split{cs: cs})
		}
		return out
	}
	// Most texts hold no character an added token starts with.
	maybe := false
	var lead [utf8.UTFMax]byte
	for _, c := range cs {
		b := byte(c.r)
		if c.r >= utf8.RuneSelf {
			utf8.EncodeRune(lead[:], c.r)
			b = lead[0]
		}
		if m.first[b] {
			maybe = true
			break
		}
	}
	if !maybe {
		return append(out, split{cs: cs})
	}
	s := str(cs)
	// pos[b] is the index in cs of the character at byte b of s.
	pos := make([]int, len(s)+1)
	k := 0
	for i := 0; i < len(s); {
		_, w := utf8.DecodeRuneInString(s[i:])
		for j := 0; j < w; j++ {
			pos[i+j] = k
		}
		i += w
		k++
	}
	pos[len(s)] = len(cs)

	startOffset := 0
	for i := 0; i < len(s); {
		best := -1
		for _, p := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], m.pats[p]) {
				best = p
				break
			}
		}
		if best < 0 {
			i++
			continue
		}
		start, stop := i, i+len(m.pats[best])
		i = stop
		tok := m.toks[best]
		if tok.SingleWord {
			if start > 0 && endsWithWord(s[:start]) || stop < len(s) && startsWithWord(s[stop:]) {
				continue
			}
		}
		if tok.LStrip {
			ns := len(strings.TrimRightFunc(s[:start], unicode.IsSpace))
			if ns < startOffset {
				ns = startOffset
			}
			start = ns
		}
		if tok.RStrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if startOffset < start {
			out = append(out, split{cs: cs[pos[startOffset]:pos[start]]})
		}
		out = append(out, split{cs: cs[pos[start]:pos[stop]], added: tok})
		startOffset = stop
	}
	if startOffset < len(s) {
		out = append(out, split{cs: cs[pos[startOffset]:]})
	}
	return out
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordChar(r)
}
