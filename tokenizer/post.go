package tokenizer

import (
	"fmt"
	"unicode"
)

// postProcessor adds the special tokens around one text or a pair
// (Hugging Face's PostProcessor). b is nil for a single text.
type postProcessor interface {
	// process may return a or b themselves; capacity is a hint for the
	// result's (padding may follow).
	process(a, b *Encoding, capacity int) *Encoding
}

// templatePiece is one element of a template: a sequence (A or B) or a
// special token, with its type id.
type templatePiece struct {
	seq    int // 0 for A, 1 for B, -1 for a special token
	typeID int
	ids    []int
	tokens []string
}

// templateProcessing is Hugging Face's TemplateProcessing (BertProcessing is
// its "[CLS] $A [SEP]" / "[CLS] $A [SEP] $B:1 [SEP]:1" case).
type templateProcessing struct {
	single, pair []templatePiece
}

func (p *templateProcessing) process(a, b *Encoding, capacity int) *Encoding {
	tmpl := p.single
	if b != nil {
		tmpl = p.pair
	}
	total := 0
	for _, tp := range tmpl {
		switch {
		case tp.seq < 0:
			total += len(tp.ids)
		case tp.seq == 0:
			total += a.Len()
		case b != nil:
			total += b.Len()
		}
	}
	out := newEncoding(0, max(total, capacity))
	for _, tp := range tmpl {
		if tp.seq < 0 {
			for i, id := range tp.ids {
				out.push(id, tp.tokens[i], tp.typeID, 1, 1, Offset{}, -1)
			}
			continue
		}
		src := a
		if tp.seq == 1 {
			src = b
		}
		if src == nil {
			continue
		}
		n := out.Len()
		out.appendRange(src, 0, src.Len())
		for i := n; i < out.Len(); i++ {
			out.TypeIDs[i] = tp.typeID
		}
	}
	return out
}

// byteLevelPost is the ByteLevel post-processor: with trim_offsets, the
// offsets of a token leave out its leading and trailing spaces.
type byteLevelPost struct {
	trimOffsets, addPrefixSpace bool
}

func (p byteLevelPost) process(a, b *Encoding, capacity int) *Encoding {
	if p.trimOffsets {
		for _, e := range []*Encoding{a, b} {
			if e != nil {
				p.trim(e)
			}
		}
	}
	return mergePair(a, b, capacity)
}

func (p byteLevelPost) trim(e *Encoding) {
	space := byteToRune[' ']
	isSp := func(r rune) bool { return r == space || unicode.IsSpace(r) }
	for i, tok := range e.Tokens {
		rs := []rune(tok)
		lead := 0
		for lead < len(rs) && isSp(rs[lead]) {
			lead++
		}
		trail := 0
		for trail < len(rs) && isSp(rs[len(rs)-1-trail]) {
			trail++
		}
		if lead == 0 && trail == 0 {
			continue
		}
		off := &e.Offsets[i]
		if lead > 0 {
			first := i == 0 || off.Start == 0
			if first && p.addPrefixSpace && lead == 1 {
				lead = 0
			}
			off.Start = min(off.Start+lead, off.End)
		}
		if trail > 0 && off.End >= trail {
			off.End = max(off.End-trail, off.Start)
		}
	}
}

// mergePair concatenates a pair (the default post-processing).
func mergePair(a, b *Encoding, capacity int) *Encoding {
	if b == nil {
		return a
	}
	out := newEncoding(0, max(a.Len()+b.Len(), capacity))
	out.appendRange(a, 0, a.Len())
	out.appendRange(b, 0, b.Len())
	return out
}

// sequencePost applies post-processors in turn: the first ones see the
// pair separately, the last one joins it.
type sequencePost []postProcessor

func (s sequencePost) process(a, b *Encoding, capacity int) *Encoding {
	for i, p := range s {
		if i == len(s)-1 {
			return p.process(a, b, capacity)
		}
		if bl, ok := p.(byteLevelPost); ok {
			// ByteLevel only trims offsets; keep the pair apart.
			if bl.trimOffsets {
				bl.trim(a)
				if b != nil {
					bl.trim(b)
				}
			}
			continue
		}
		a, b = p.process(a, b, capacity), nil
	}
	return mergePair(a, b, capacity)
}

// TruncationStrategy says which text of a pair loses tokens.
type TruncationStrategy string

// The truncation strategies of Hugging Face's tokenizers.
const (
	// LongestFirst removes tokens from the longer text of a pair.
	LongestFirst TruncationStrategy = "LongestFirst"
	// OnlyFirst truncates only the first text.
	OnlyFirst TruncationStrategy = "OnlyFirst"
	// OnlySecond truncates only the second text of a pair.
	OnlySecond TruncationStrategy = "OnlySecond"
)

// Direction is the side truncation cuts from or padding adds to.
type Direction string

// The two directions.
const (
	// Right cuts or pads at the end.
	Right Direction = "Right"
	// Left cuts or pads at the start.
	Left Direction = "Left"
)

// Truncation limits the number of tokens of an encoding, special tokens
// included. The tokens cut off are dropped (Hugging Face's overflowing
// tokens and stride are not kept).
type Truncation struct {
	MaxLength int
	Strategy  TruncationStrategy // LongestFirst when empty
	Direction Direction          // Right when empty
}

func (tr *Truncation) validate() error {
	if tr.MaxLength < 0 {
		return fmt.Errorf("tokenizer: truncation max length %d is negative", tr.MaxLength)
	}
	switch tr.Strategy {
	case "", LongestFirst, OnlyFirst, OnlySecond:
	default:
		return fmt.Errorf("tokenizer: truncation strategy %q is not LongestFirst, OnlyFirst or OnlySecond", tr.Strategy)
	}
	switch tr.Direction {
	case "", Right, Left:
	default:
		return fmt.Errorf("tokenizer: truncation direction %q is not Right or Left", tr.Direction)
	}
	return nil
}

// keep truncates e to n tokens.
func (tr *Truncation) keep(e *Encoding, n int) {
	if e.Len() <= n {
		return
	}
	i, j := 0, n
	if tr.Direction == Left {
		i, j = e.Len()-n, e.Len()
	}
	out := &Encoding{}
	out.appendRange(e, i, j)
	*e = *out
}

func (tr *Truncation) apply(a, b *Encoding) error {
	if tr.MaxLength == 0 {
		tr.keep(a, 0)
		if b != nil {
			tr.keep(b, 0)
		}
		return nil
	}
	total := a.Len()
	if b != nil {
		total += b.Len()
	}
	if total <= tr.MaxLength {
		return nil
	}
	remove := total - tr.MaxLength
	switch tr.Strategy {
	case "", LongestFirst:
		if b == nil {
			tr.keep(a, total-remove)
			return nil
		}
		n1, n2 := a.Len(), b.Len()
		swap := n1 > n2
		if swap {
			n1, n2 = n2, n1
		}
		if n1 > tr.MaxLength {
			n2 = n1
		} else {
			n2 = max(n1, tr.MaxLength-n1)
		}
		if n1+n2 > tr.MaxLength {
			n1 = tr.MaxLength / 2
			n2 = n1 + tr.MaxLength%2
		}
		if swap {
			n1, n2 = n2, n1
		}
		tr.keep(a, n1)
		tr.keep(b, n2)
	case OnlyFirst, OnlySecond:
		target := a
		if tr.Strategy == OnlySecond {
			if b == nil {
				return fmt.Errorf("tokenizer: truncation OnlySecond needs a pair of texts")
			}
			target = b
		}
		if target.Len() <= remove {
			return fmt.Errorf("tokenizer: truncation %s to %d tokens: the %d tokens of the truncated text are not enough to remove %d",
				tr.Strategy, tr.MaxLength, target.Len(), remove)
		}
		tr.keep(target, target.Len()-remove)
	}
	return nil
}

// Padding pads encodings with a padding token up to a length.
type Padding struct {
	// Length pads to that many tokens; 0 pads to the longest encoding of
	// the batch (Hugging Face's BatchLongest).
	Length int
	// MultipleOf, when positive, rounds the length up to a multiple of it.
	MultipleOf int
	// ID, TypeID and Token are the padding token's id, type id and string.
	ID, TypeID int
	Token      string
	Direction  Direction // Right when empty
}

func (p *Padding) validate() error {
	if p.Length < 0 || p.MultipleOf < 0 {
		return fmt.Errorf("tokenizer: padding length %d or multiple %d is negative", p.Length, p.MultipleOf)
	}
	switch p.Direction {
	case "", Right, Left:
	default:
		return fmt.Errorf("tokenizer: padding direction %q is not Right or Left", p.Direction)
	}
	return nil
}

func (p *Padding) apply(encs []*Encoding) {
	n := p.Length
	if n == 0 {
		for _, e := range encs {
			n = max(n, e.Len())
		}
	}
	if p.MultipleOf > 0 && n%p.MultipleOf != 0 {
		n += p.MultipleOf - n%p.MultipleOf
	}
	for _, e := range encs {
		if e.Len() >= n {
			continue
		}
		k := n - e.Len()
		if p.Direction != Left && cap(e.IDs) >= n && cap(e.TypeIDs) >= n && cap(e.Tokens) >= n {
			for i := 0; i < k; i++ {
				e.push(p.ID, p.Token, p.TypeID, 0, 1, Offset{}, -1)
			}
			continue
		}
		out := newEncoding(0, n)
		if p.Direction != Left {
			out.appendRange(e, 0, e.Len())
		}
		for i := 0; i < k; i++ {
			out.push(p.ID, p.Token, p.TypeID, 0, 1, Offset{}, -1)
		}
		if p.Direction == Left {
			out.appendRange(e, 0, e.Len())
		}
		*e = *out
	}
}
