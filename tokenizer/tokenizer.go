package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Tokenizer encodes text to token ids and decodes ids to text, as the
// tokenizer.json it was loaded from says. It is safe for concurrent use.
type Tokenizer struct {
	norm    normalizer
	pre     preTokenizer
	model   model
	post    postProcessor
	dec     decoder
	added   []*AddedToken
	addedID map[int]*AddedToken
	addedTk map[string]*AddedToken
	raw     *matcher // added tokens matched in the raw text
	normed  *matcher // added tokens matched in the normalized text
	trunc   *Truncation
	pad     *Padding
}

// Offset is the byte range [Start, End) of a token in the text it came from.
// Special tokens and padding have {0, 0}.
type Offset struct{ Start, End int }

// Encoding is the result of encoding one text (or a pair of texts): every
// slice has one element per token.
type Encoding struct {
	// IDs are the token ids, the model's input.
	IDs []int
	// Tokens are the tokens' strings as the vocabulary spells them.
	Tokens []string
	// TypeIDs are the segment ids: 0 for the first text, 1 for the second
	// of a pair, as the post-processor's template says.
	TypeIDs []int
	// AttentionMask is 1 for a real token and 0 for padding.
	AttentionMask []int
	// SpecialTokensMask is 1 for the tokens the post-processor added
	// ([CLS], [SEP]) and for padding.
	SpecialTokensMask []int
	// Offsets are each token's byte range in its text.
	Offsets []Offset
	// SequenceIDs says which text a token comes from: 0 or 1, or -1 for a
	// special token or padding.
	SequenceIDs []int
}

// newEncoding makes an encoding of n zero tokens with room for capacity.
// The int slices share one allocation, each capped at its own part.
func newEncoding(n, capacity int) *Encoding {
	if capacity < n {
		capacity = n
	}
	ints := make([]int, 5*capacity)
	part := func(k int) []int { return ints[k*capacity : k*capacity+n : (k+1)*capacity] }
	return &Encoding{
		IDs:               part(0),
		TypeIDs:           part(1),
		AttentionMask:     part(2),
		SpecialTokensMask: part(3),
		SequenceIDs:       part(4),
		Tokens:            make([]string, n, capacity),
		Offsets:           make([]Offset, n, capacity),
	}
}

// Len is the number of tokens.
func (e *Encoding) Len() int { return len(e.IDs) }

func (e *Encoding) push(id int, tok string, typeID, attn, special int, off Offset, seq int) {
	e.IDs = append(e.IDs, id)
	e.Tokens = append(e.Tokens, tok)
	e.TypeIDs = append(e.TypeIDs, typeID)
	e.AttentionMask = append(e.AttentionMask, attn)
	e.SpecialTokensMask = append(e.SpecialTokensMask, special)
	e.Offsets = append(e.Offsets, off)
	e.SequenceIDs = append(e.SequenceIDs, seq)
}

// appendRange appends tokens [i, j) of o.
func (e *Encoding) appendRange(o *Encoding, i, j int) {
	e.IDs = append(e.IDs, o.IDs[i:j]...)
	e.Tokens = append(e.Tokens, o.Tokens[i:j]...)
	e.TypeIDs = append(e.TypeIDs, o.TypeIDs[i:j]...)
	e.AttentionMask = append(e.AttentionMask, o.AttentionMask[i:j]...)
	e.SpecialTokensMask = append(e.SpecialTokensMask, o.SpecialTokensMask[i:j]...)
	e.Offsets = append(e.Offsets, o.Offsets[i:j]...)
	e.SequenceIDs = append(e.SequenceIDs, o.SequenceIDs[i:j]...)
}

// VocabSize is the number of ids: the model's vocabulary and the added
// tokens.
func (t *Tokenizer) VocabSize() int {
	n := len(t.model.vocab().tokens)
	for id := range t.addedID {
		if id >= n {
			n = id + 1
		}
	}
	return n
}

// TokenToID returns the id of a token (an added token or one of the
// model's vocabulary).
func (t *Tokenizer) TokenToID(token string) (int, bool) {
	if a, ok := t.addedTk[token]; ok {
		return a.ID, true
	}
	id, ok := t.model.vocab().ids[token]
	return id, ok
}

// IDToToken returns the token of an id.
func (t *Tokenizer) IDToToken(id int) (string, bool) {
	if a, ok := t.addedID[id]; ok {
		return a.Content, true
	}
	v := t.model.vocab()
	if id < 0 || id >= len(v.tokens) {
		return "", false
	}
	if v.tokens[id] == "" {
		if got, ok := v.ids[""]; !ok || got != id {
			return "", false
		}
	}
	return v.tokens[id], true
}

// AddedTokens returns the added tokens ([CLS], <|endoftext|>, ...), in the
// order of the tokenizer.json.
func (t *Tokenizer) AddedTokens() []AddedToken {
	out := make([]AddedToken, len(t.added))
	for i, a := range t.added {
		out[i] = *a
	}
	return out
}

// Encode encodes one text: added tokens, normalizer, pre-tokenizer, model,
// then truncation, the post-processor's special tokens and padding, as the
// tokenizer.json (or WithTruncation and WithPadding) says.
func (t *Tokenizer) Encode(text string) (*Encoding, error) {
	return t.encode(text, nil)
}

// EncodePair encodes a pair of texts (a question and a passage, two
// sentences), with the post-processor's pair template ([CLS] A [SEP] B [SEP]
// for BERT: B's type ids are 1).
func (t *Tokenizer) EncodePair(a, b string) (*Encoding, error) {
	return t.encode(a, &b)
}

// EncodeBatch encodes several texts. Padding without a fixed length pads
// every encoding to the longest of the batch.
func (t *Tokenizer) EncodeBatch(texts []string) ([]*Encoding, error) {
	encs := make([]*Encoding, len(texts))
	for i, s := range texts {
		e, err := t.encodeUnpadded(s, nil)
		if err != nil {
			return nil, fmt.Errorf("text %d: %w", i, err)
		}
		encs[i] = e
	}
	if t.pad != nil {
		t.pad.apply(encs)
	}
	return encs, nil
}

func (t *Tokenizer) encode(a string, b *string) (*Encoding, error) {
	e, err := t.encodeUnpadded(a, b)
	if err != nil {
		return nil, err
	}
	if t.pad != nil {
		t.pad.apply([]*Encoding{e})
	}
	return e, nil
}

func (t *Tokenizer) encodeUnpadded(a string, b *string) (*Encoding, error) {
	ea, err := t.encodeSequence(a, 0)
	if err != nil {
		return nil, err
	}
	var eb *Encoding
	if b != nil {
		if eb, err = t.encodeSequence(*b, 1); err != nil {
			return nil, err
		}
	}
	if t.trunc != nil {
		tr := *t.trunc
		if n := t.addedByPost(eb != nil); n > 0 {
			tr.MaxLength -= n
			if tr.MaxLength < 0 {
				tr.MaxLength = 0
			}
		}
		if err := tr.apply(ea, eb); err != nil {
			return nil, err
		}
	}
	capacity := 0
	if t.pad != nil {
		capacity = t.pad.Length + t.pad.MultipleOf
	}
	if t.post == nil {
		return mergePair(ea, eb, capacity), nil
	}
	return t.post.process(ea, eb, capacity), nil
}

// addedByPost is the number of tokens the post-processor adds.
func (t *Tokenizer) addedByPost(pair bool) int {
	if t.post == nil {
		return 0
	}
	var b *Encoding
	if pair {
		b = &Encoding{}
	}
	return t.post.process(&Encoding{}, b, 0).Len()
}

// encodeSequence runs one text through added tokens, normalizer,
// pre-tokenizer and model; typeID is 0 for the first text of a pair, 1 for
// the second.
func (t *Tokenizer) encodeSequence(text string, seq int) (*Encoding, error) {
	cs := fromText(text)
	var splits []split
	if t.raw != nil {
		splits = t.raw.find(cs, nil)
	} else if len(cs) > 0 {
		splits = []split{{cs: cs}}
	}
	var normed []split
	for _, s := range splits {
		if s.added != nil {
			normed = append(normed, s)
			continue
		}
		n := s.cs
		if t.norm != nil {
			n = t.norm.normalize(append([]nchar(nil), n...))
		}
		if t.normed != nil {
			normed = t.normed.find(n, normed)
		} else if len(n) > 0 {
			normed = append(normed, split{cs: n})
		}
	}
	e := newEncoding(0, len(text)/3+4)
	var pieces []piece
	var err error
	var wb []byte
	v := t.model.vocab()
	word := func(w []nchar) {
		if err != nil || len(w) == 0 {
			return
		}
		wb = wb[:0]
		for _, c := range w {
			wb = utf8.AppendRune(wb, c.r)
		}
		pieces, err = t.model.tokenize(wb, pieces[:0])
		if err != nil {
			return
		}
		// Walk w and the pieces together: ci is the character at byte
		// offset cb of the word.
		ci, cb := 0, 0
		charAt := func(b int) int {
			for ci+1 < len(w) && cb+runeLen(w[ci].r) <= b {
				cb += runeLen(w[ci].r)
				ci++
			}
			return ci
		}
		for _, p := range pieces {
			tok := ""
			if p.id < len(v.tokens) {
				tok = v.tokens[p.id]
			}
			off := Offset{}
			if p.end > p.start {
				// The pieces come in order: charAt's queries never go back.
				first := w[charAt(p.start)].start
				off = Offset{first, w[charAt(p.end-1)].end}
			}
			e.push(p.id, tok, seq, 1, 0, off, seq)
		}
	}
	for _, s := range normed {
		if s.added != nil {
			off := Offset{s.cs[0].start, s.cs[len(s.cs)-1].end}
			// The token's string is the matched text, with the whitespace
			// that lstrip or rstrip took.
			e.push(s.added.ID, str(s.cs), seq, 1, 0, off, seq)
			continue
		}
		if t.pre == nil {
			word(s.cs)
		} else {
			t.pre.preTokenize(s.cs, word)
		}
		if err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Decode turns ids back into text with the tokenizer's decoder, leaving out
// the special tokens when skipSpecial is set (as Hugging Face's
// decode(ids, skip_special_tokens=True), its default). An id outside the
// vocabulary is an error.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) (string, error) {
	toks := make([]string, 0, len(ids))
	for i, id := range ids {
		tok, ok := t.IDToToken(id)
		if !ok {
			return "", fmt.Errorf("tokenizer: Decode: ids[%d] = %d is not in the vocabulary (%d ids)", i, id, t.VocabSize())
		}
		if skipSpecial {
			if a, ok := t.addedTk[tok]; ok && a.Special {
				continue
			}
		}
		toks = append(toks, tok)
	}
	if t.dec == nil {
		return strings.Join(toks, " "), nil
	}
	return strings.Join(t.dec.decode(toks), ""), nil
}

// Truncation returns the truncation the tokenizer applies (a copy), or nil.
func (t *Tokenizer) Truncation() *Truncation {
	if t.trunc == nil {
		return nil
	}
	c := *t.trunc
	return &c
}

// Padding returns the padding the tokenizer applies (a copy), or nil.
func (t *Tokenizer) Padding() *Padding {
	if t.pad == nil {
		return nil
	}
	c := *t.pad
	return &c
}

// WithTruncation returns a tokenizer that truncates as tr says (nil: never),
// sharing everything else with t. The tokenizer.json's truncation is
// replaced.
func (t *Tokenizer) WithTruncation(tr *Truncation) (*Tokenizer, error) {
	c := *t
	c.trunc = nil
	if tr != nil {
		if err := tr.validate(); err != nil {
			return nil, err
		}
		x := *tr
		c.trunc = &x
	}
	return &c, nil
}

// WithPadding returns a tokenizer that pads as p says (nil: never), sharing
// everything else with t. The tokenizer.json's padding is replaced.
func (t *Tokenizer) WithPadding(p *Padding) (*Tokenizer, error) {
	c := *t
	c.pad = nil
	if p != nil {
		if err := p.validate(); err != nil {
			return nil, err
		}
		x := *p
		c.pad = &x
	}
	return &c, nil
}
