package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// Load reads a tokenizer.json file (gzip'd or not); a directory means the
// tokenizer.json inside it.
func Load(path string) (*Tokenizer, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "tokenizer.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse reads the contents of a tokenizer.json (gzip'd or not). A component
// this package does not implement is an error that names it; it never
// encodes with a part of the pipeline left out.
func Parse(data []byte) (*Tokenizer, error) {
	if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("tokenizer: reading gzip'd tokenizer.json: %w", err)
		}
		if data, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("tokenizer: reading gzip'd tokenizer.json: %w", err)
		}
	}
	var f struct {
		Truncation    json.RawMessage `json:"truncation"`
		Padding       json.RawMessage `json:"padding"`
		AddedTokens   []jsonAdded     `json:"added_tokens"`
		Normalizer    json.RawMessage `json:"normalizer"`
		PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
		Model         json.RawMessage `json:"model"`
		PostProcessor json.RawMessage `json:"post_processor"`
		Decoder       json.RawMessage `json:"decoder"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: not a tokenizer.json: %w", err)
	}
	t := &Tokenizer{addedID: map[int]*AddedToken{}, addedTk: map[string]*AddedToken{}}
	var err error
	if t.model, err = parseModel(f.Model); err != nil {
		return nil, err
	}
	if t.norm, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.post, err = parsePost(f.PostProcessor); err != nil {
		return nil, err
	}
	if t.dec, err = parseDecoder(f.Decoder); err != nil {
		return nil, err
	}
	if t.trunc, err = parseTruncation(f.Truncation); err != nil {
		return nil, err
	}
	if t.pad, err = parsePadding(f.Padding); err != nil {
		return nil, err
	}
	var rawToks, normToks []*AddedToken
	var rawPats, normPats []string
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			continue
		}
		if a.ID < 0 {
			return nil, fmt.Errorf("tokenizer: added token %q has the negative id %d", a.Content, a.ID)
		}
		tok := &AddedToken{ID: a.ID, Content: a.Content, Special: a.Special, SingleWord: a.SingleWord,
			LStrip: a.LStrip, RStrip: a.RStrip, Normalized: a.Normalized}
		t.added = append(t.added, tok)
		t.addedID[tok.ID] = tok
		t.addedTk[tok.Content] = tok
	}
	// Hugging Face matches the special tokens first, then the others, each
	// group in the order it was added.
	for _, special := range []bool{true, false} {
		for _, tok := range t.added {
			if tok.Special != special {
				continue
			}
			if tok.Normalized {
				pat := tok.Content
				if t.norm != nil {
					pat = str(t.norm.normalize(fromText(pat)))
				}
				normToks, normPats = append(normToks, tok), append(normPats, pat)
			} else {
				rawToks, rawPats = append(rawToks, tok), append(rawPats, tok.Content)
			}
		}
	}
	if len(rawToks) > 0 {
		t.raw = newMatcher(rawToks, rawPats)
	}
	if len(normToks) > 0 {
		t.normed = newMatcher(normToks, normPats)
	}
	return t, nil
}

type jsonAdded struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// isNull reports whether a JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// typeOf reads the "type" of a component.
func typeOf(raw json.RawMessage) string {
	var t struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(raw, &t)
	return t.Type
}

func unsupported(what, typ, supported string) error {
	return fmt.Errorf("tokenizer: tokenizer.json %s %s is not supported (supported: %s)", what, typ, supported)
}

func decodeComponent(what, typ string, raw json.RawMessage, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("tokenizer: tokenizer.json %s %s: %w", what, typ, err)
	}
	return nil
}

const supportedModels = "WordPiece, BPE"

func parseModel(raw json.RawMessage) (model, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("tokenizer: tokenizer.json has no model")
	}
	typ := typeOf(raw)
	if typ == "" {
		// Old files leave the type out.
		var probe map[string]json.RawMessage
		_ = json.Unmarshal(raw, &probe)
		if _, ok := probe["merges"]; ok {
			typ = "BPE"
		} else if _, ok := probe["max_input_chars_per_word"]; ok {
			typ = "WordPiece"
		}
	}
	switch typ {
	case "WordPiece":
		var m struct {
			Vocab                   map[string]int `json:"vocab"`
			UnkToken                string         `json:"unk_token"`
			ContinuingSubwordPrefix *string        `json:"continuing_subword_prefix"`
			MaxInputCharsPerWord    *int           `json:"max_input_chars_per_word"`
		}
		if err := decodeComponent("model", typ, raw, &m); err != nil {
			return nil, err
		}
		v, err := newVocabulary(m.Vocab)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: tokenizer.json model WordPiece: %w", err)
		}
		wp := &wordPiece{vocabulary: v, unk: m.UnkToken, prefix: "##", maxInputChar: 100}
		if m.ContinuingSubwordPrefix != nil {
			wp.prefix = *m.ContinuingSubwordPrefix
		}
		if m.MaxInputCharsPerWord != nil {
			wp.maxInputChar = *m.MaxInputCharsPerWord
		}
		wp.unkID, wp.hasUnk = v.ids[wp.unk]
		return wp, nil
	case "BPE":
		var m struct {
			Vocab                   map[string]int    `json:"vocab"`
			Merges                  []json.RawMessage `json:"merges"`
			Dropout                 *float64          `json:"dropout"`
			UnkToken                *string           `json:"unk_token"`
			ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
			EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
			FuseUnk                 bool              `json:"fuse_unk"`
			ByteFallback            bool              `json:"byte_fallback"`
			IgnoreMerges            bool              `json:"ignore_merges"`
		}
		if err := decodeComponent("model", typ, raw, &m); err != nil {
			return nil, err
		}
		if m.Dropout != nil && *m.Dropout > 0 {
			return nil, fmt.Errorf("tokenizer: tokenizer.json model BPE with dropout %v is not supported (it makes encoding random)", *m.Dropout)
		}
		v, err := newVocabulary(m.Vocab)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: tokenizer.json model BPE: %w", err)
		}
		b := &bpe{vocabulary: v, fuseUnk: m.FuseUnk, byteFallback: m.ByteFallback, ignoreMerges: m.IgnoreMerges,
			merges: make(map[[2]int]merge, len(m.Merges)), cache: map[string][]piece{}}
		if m.UnkToken != nil {
			b.unk = *m.UnkToken
			b.unkID, b.hasUnk = v.ids[b.unk]
		}
		if m.ContinuingSubwordPrefix != nil {
			b.prefix = *m.ContinuingSubwordPrefix
		}
		if m.EndOfWordSuffix != nil {
			b.suffix = *m.EndOfWordSuffix
		}
		for rank, raw := range m.Merges {
			var a, c string
			var pair []string
			var s string
			if err := json.Unmarshal(raw, &pair); err == nil && len(pair) == 2 {
				a, c = pair[0], pair[1]
			} else if err := json.Unmarshal(raw, &s); err == nil {
				parts := strings.SplitN(s, " ", 2)
				if len(parts) != 2 {
					return nil, fmt.Errorf("tokenizer: tokenizer.json model BPE: merge %d %q is not two tokens", rank, s)
				}
				a, c = parts[0], parts[1]
			} else {
				return nil, fmt.Errorf("tokenizer: tokenizer.json model BPE: merge %d is %s, not a pair of tokens", rank, raw)
			}
			ida, ok1 := v.ids[a]
			idc, ok2 := v.ids[c]
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("tokenizer: tokenizer.json model BPE: merge %d (%q, %q) uses a token not in the vocabulary", rank, a, c)
			}
			cc := c
			if len(b.prefix) > 0 && len(cc) >= len(b.prefix) {
				cc = cc[len(b.prefix):]
			}
			id, ok := v.ids[a+cc]
			if !ok {
				return nil, fmt.Errorf("tokenizer: tokenizer.json model BPE: merge %d gives %q, which is not in the vocabulary", rank, a+cc)
			}
			b.merges[[2]int{ida, idc}] = merge{rank, id}
		}
		return b, nil
	}
	return nil, unsupported("model", typ, supportedModels)
}

const supportedNormalizers = "BertNormalizer, Lowercase, NFD, NFKD, NFC, NFKC, StripAccents, Prepend, Replace with a string pattern, Strip, Sequence"

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ := typeOf(raw)
	switch typ {
	case "BertNormalizer":
		var n struct {
			CleanText          *bool `json:"clean_text"`
			HandleChineseChars *bool `json:"handle_chinese_chars"`
			StripAccents       *bool `json:"strip_accents"`
			Lowercase          *bool `json:"lowercase"`
		}
		if err := decodeComponent("normalizer", typ, raw, &n); err != nil {
			return nil, err
		}
		def := func(p *bool) bool { return p == nil || *p }
		b := bertNormalizer{cleanText: def(n.CleanText), handleChinese: def(n.HandleChineseChars), lowercase: def(n.Lowercase)}
		b.stripAccents = b.lowercase
		if n.StripAccents != nil {
			b.stripAccents = *n.StripAccents
		}
		return b, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "NFD":
		return formNormalizer{norm.NFD}, nil
	case "NFKD":
		return formNormalizer{norm.NFKD}, nil
	case "NFC":
		return formNormalizer{norm.NFC}, nil
	case "NFKC":
		return formNormalizer{norm.NFKC}, nil
	case "StripAccents":
		return stripAccentsNormalizer{}, nil
	case "Prepend":
		var n struct {
			Prepend string `json:"prepend"`
		}
		if err := decodeComponent("normalizer", typ, raw, &n); err != nil {
			return nil, err
		}
		return prependNormalizer{n.Prepend}, nil
	case "Replace":
		var n struct {
			Pattern map[string]string `json:"pattern"`
			Content string            `json:"content"`
		}
		if err := decodeComponent("normalizer", typ, raw, &n); err != nil {
			return nil, err
		}
		p, ok := n.Pattern["String"]
		if !ok {
			return nil, unsupported("normalizer", "Replace with a regex pattern", supportedNormalizers)
		}
		return replaceNormalizer{[]rune(p), []rune(n.Content)}, nil
	case "Strip":
		var n struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := decodeComponent("normalizer", typ, raw, &n); err != nil {
			return nil, err
		}
		return stripNormalizer{n.Left, n.Right}, nil
	case "Sequence":
		var n struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := decodeComponent("normalizer", typ, raw, &n); err != nil {
			return nil, err
		}
		seq, err := parseSequence(n.Normalizers, parseNormalizer)
		if err != nil {
			return nil, err
		}
		return sequenceNormalizer(seq), nil
	}
	return nil, unsupported("normalizer", typ, supportedNormalizers)
}

const supportedPreTokenizers = "BertPreTokenizer, ByteLevel, Metaspace, Split with the regex of GPT-2 or Llama 3, Whitespace, WhitespaceSplit, Sequence"

// prependScheme reads Metaspace's prepend_scheme, or the older
// add_prefix_space.
func prependScheme(scheme *string, addPrefixSpace *bool) (string, error) {
	if scheme != nil {
		switch s := strings.ToLower(*scheme); s {
		case "always", "first", "never":
			return s, nil
		}
		return "", fmt.Errorf("tokenizer: tokenizer.json Metaspace prepend_scheme %q is not always, first or never", *scheme)
	}
	if addPrefixSpace != nil && !*addPrefixSpace {
		return "never", nil
	}
	return "always", nil
}

type jsonMetaspace struct {
	Replacement    string  `json:"replacement"`
	PrependScheme  *string `json:"prepend_scheme"`
	AddPrefixSpace *bool   `json:"add_prefix_space"`
	Split          *bool   `json:"split"`
}

func (m jsonMetaspace) replacement() (rune, error) {
	rs := []rune(m.Replacement)
	if len(rs) != 1 {
		return 0, fmt.Errorf("tokenizer: tokenizer.json Metaspace replacement %q is not one character", m.Replacement)
	}
	return rs[0], nil
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ := typeOf(raw)
	switch typ {
	case "BertPreTokenizer":
		return bertPreTokenizer{}, nil
	case "Whitespace":
		return whitespacePre{}, nil
	case "WhitespaceSplit":
		return whitespaceSplit{}, nil
	case "ByteLevel":
		var p struct {
			AddPrefixSpace *bool `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := decodeComponent("pre-tokenizer", typ, raw, &p); err != nil {
			return nil, err
		}
		return byteLevelPre{addPrefixSpace: p.AddPrefixSpace == nil || *p.AddPrefixSpace, useRegex: p.UseRegex == nil || *p.UseRegex}, nil
	case "Metaspace":
		var m jsonMetaspace
		if err := decodeComponent("pre-tokenizer", typ, raw, &m); err != nil {
			return nil, err
		}
		r, err := m.replacement()
		if err != nil {
			return nil, err
		}
		scheme, err := prependScheme(m.PrependScheme, m.AddPrefixSpace)
		if err != nil {
			return nil, err
		}
		return metaspacePre{replacement: r, prepend: scheme, split: m.Split == nil || *m.Split}, nil
	case "Split":
		var p struct {
			Pattern  map[string]string `json:"pattern"`
			Behavior string            `json:"behavior"`
			Invert   bool              `json:"invert"`
		}
		if err := decodeComponent("pre-tokenizer", typ, raw, &p); err != nil {
			return nil, err
		}
		re, isRe := p.Pattern["Regex"]
		switch {
		case !isRe:
			return nil, unsupported("pre-tokenizer", fmt.Sprintf("Split with the pattern %v", p.Pattern), supportedPreTokenizers)
		case p.Behavior != "Isolated" || p.Invert:
			return nil, unsupported("pre-tokenizer", fmt.Sprintf("Split with behavior %s and invert %v", p.Behavior, p.Invert), supportedPreTokenizers)
		case re == gpt2Pattern:
			return regexSplit{gpt2Match}, nil
		case re == llama3Pattern:
			return regexSplit{llama3Match}, nil
		}
		return nil, unsupported("pre-tokenizer", fmt.Sprintf("Split with the regex %q", re), supportedPreTokenizers)
	case "Sequence":
		var p struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := decodeComponent("pre-tokenizer", typ, raw, &p); err != nil {
			return nil, err
		}
		seq, err := parseSequence(p.PreTokenizers, parsePreTokenizer)
		if err != nil {
			return nil, err
		}
		return sequencePre(seq), nil
	}
	return nil, unsupported("pre-tokenizer", typ, supportedPreTokenizers)
}

const supportedPost = "TemplateProcessing, BertProcessing, ByteLevel, Sequence"

func parsePost(raw json.RawMessage) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ := typeOf(raw)
	switch typ {
	case "BertProcessing":
		var p struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := decodeComponent("post-processor", typ, raw, &p); err != nil {
			return nil, err
		}
		var sep, cls string
		var sepID, clsID int
		for _, x := range []struct {
			raw json.RawMessage
			v   any
		}{{p.Sep[0], &sep}, {p.Sep[1], &sepID}, {p.Cls[0], &cls}, {p.Cls[1], &clsID}} {
			if err := decodeComponent("post-processor", typ, x.raw, x.v); err != nil {
				return nil, err
			}
		}
		c := templatePiece{seq: -1, ids: []int{clsID}, tokens: []string{cls}}
		s := templatePiece{seq: -1, ids: []int{sepID}, tokens: []string{sep}}
		s1 := s
		s1.typeID = 1
		return &templateProcessing{
			single: []templatePiece{c, {seq: 0}, s},
			pair:   []templatePiece{c, {seq: 0}, s, {seq: 1, typeID: 1}, s1},
		}, nil
	case "TemplateProcessing":
		var p struct {
			Single []map[string]struct {
				ID     string `json:"id"`
				TypeID int    `json:"type_id"`
			} `json:"single"`
			Pair []map[string]struct {
				ID     string `json:"id"`
				TypeID int    `json:"type_id"`
			} `json:"pair"`
			SpecialTokens map[string]struct {
				IDs    []int    `json:"ids"`
				Tokens []string `json:"tokens"`
			} `json:"special_tokens"`
		}
		if err := decodeComponent("post-processor", typ, raw, &p); err != nil {
			return nil, err
		}
		tp := &templateProcessing{}
		for k, src := range [][]map[string]struct {
			ID     string `json:"id"`
			TypeID int    `json:"type_id"`
		}{p.Single, p.Pair} {
			var out []templatePiece
			for _, m := range src {
				for kind, v := range m {
					switch kind {
					case "Sequence":
						seq := 0
						switch v.ID {
						case "A":
						case "B":
							seq = 1
						default:
							return nil, fmt.Errorf("tokenizer: tokenizer.json post-processor TemplateProcessing: sequence %q is not A or B", v.ID)
						}
						out = append(out, templatePiece{seq: seq, typeID: v.TypeID})
					case "SpecialToken":
						st, ok := p.SpecialTokens[v.ID]
						if !ok || len(st.IDs) != len(st.Tokens) {
							return nil, fmt.Errorf("tokenizer: tokenizer.json post-processor TemplateProcessing: special token %q is missing or malformed", v.ID)
						}
						out = append(out, templatePiece{seq: -1, typeID: v.TypeID, ids: st.IDs, tokens: st.Tokens})
					default:
						return nil, fmt.Errorf("tokenizer: tokenizer.json post-processor TemplateProcessing: piece %q is not Sequence or SpecialToken", kind)
					}
				}
			}
			if k == 0 {
				tp.single = out
			} else {
				tp.pair = out
			}
		}
		return tp, nil
	case "ByteLevel":
		var p struct {
			TrimOffsets    *bool `json:"trim_offsets"`
			AddPrefixSpace *bool `json:"add_prefix_space"`
		}
		if err := decodeComponent("post-processor", typ, raw, &p); err != nil {
			return nil, err
		}
		return byteLevelPost{trimOffsets: p.TrimOffsets == nil || *p.TrimOffsets, addPrefixSpace: p.AddPrefixSpace == nil || *p.AddPrefixSpace}, nil
	case "Sequence":
		var p struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := decodeComponent("post-processor", typ, raw, &p); err != nil {
			return nil, err
		}
		seq, err := parseSequence(p.Processors, parsePost)
		if err != nil {
			return nil, err
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return sequencePost(seq), nil
	}
	return nil, unsupported("post-processor", typ, supportedPost)
}

const supportedDecoders = "WordPiece, BPEDecoder, ByteLevel, Metaspace, Replace with a string pattern, ByteFallback, Fuse, Strip, Sequence"

func parseDecoder(raw json.RawMessage) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	typ := typeOf(raw)
	switch typ {
	case "WordPiece":
		var d struct {
			Prefix  *string `json:"prefix"`
			Cleanup *bool   `json:"cleanup"`
		}
		if err := decodeComponent("decoder", typ, raw, &d); err != nil {
			return nil, err
		}
		w := wordPieceDecoder{prefix: "##", cleanup: d.Cleanup == nil || *d.Cleanup}
		if d.Prefix != nil {
			w.prefix = *d.Prefix
		}
		return w, nil
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Metaspace":
		var m jsonMetaspace
		if err := decodeComponent("decoder", typ, raw, &m); err != nil {
			return nil, err
		}
		r, err := m.replacement()
		if err != nil {
			return nil, err
		}
		scheme, err := prependScheme(m.PrependScheme, m.AddPrefixSpace)
		if err != nil {
			return nil, err
		}
		return metaspaceDecoder{replacement: r, prepend: scheme}, nil
	case "Replace":
		var d struct {
			Pattern map[string]string `json:"pattern"`
			Content string            `json:"content"`
		}
		if err := decodeComponent("decoder", typ, raw, &d); err != nil {
			return nil, err
		}
		p, ok := d.Pattern["String"]
		if !ok {
			return nil, unsupported("decoder", "Replace with a regex pattern", supportedDecoders)
		}
		return replaceDecoder{p, d.Content}, nil
	case "BPEDecoder":
		var d struct {
			Suffix *string `json:"suffix"`
		}
		if err := decodeComponent("decoder", typ, raw, &d); err != nil {
			return nil, err
		}
		b := bpeDecoder{suffix: "</w>"}
		if d.Suffix != nil {
			b.suffix = *d.Suffix
		}
		return b, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		var d struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := decodeComponent("decoder", typ, raw, &d); err != nil {
			return nil, err
		}
		rs := []rune(d.Content)
		if len(rs) != 1 {
			return nil, fmt.Errorf("tokenizer: tokenizer.json decoder Strip content %q is not one character", d.Content)
		}
		return stripDecoder{content: rs[0], start: d.Start, stop: d.Stop}, nil
	case "Sequence":
		var d struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := decodeComponent("decoder", typ, raw, &d); err != nil {
			return nil, err
		}
		seq, err := parseSequence(d.Decoders, parseDecoder)
		if err != nil {
			return nil, err
		}
		return sequenceDecoder(seq), nil
	}
	return nil, unsupported("decoder", typ, supportedDecoders)
}

func parseTruncation(raw json.RawMessage) (*Truncation, error) {
	if isNull(raw) {
		return nil, nil
	}
	var t struct {
		MaxLength int    `json:"max_length"`
		Strategy  string `json:"strategy"`
		Direction string `json:"direction"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json truncation: %w", err)
	}
	tr := &Truncation{MaxLength: t.MaxLength, Strategy: TruncationStrategy(t.Strategy), Direction: Direction(t.Direction)}
	if err := tr.validate(); err != nil {
		return nil, err
	}
	return tr, nil
}

func parsePadding(raw json.RawMessage) (*Padding, error) {
	if isNull(raw) {
		return nil, nil
	}
	var p struct {
		Strategy        json.RawMessage `json:"strategy"`
		Direction       string          `json:"direction"`
		PadToMultipleOf *int            `json:"pad_to_multiple_of"`
		PadID           int             `json:"pad_id"`
		PadTypeID       int             `json:"pad_type_id"`
		PadToken        string          `json:"pad_token"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json padding: %w", err)
	}
	pad := &Padding{ID: p.PadID, TypeID: p.PadTypeID, Token: p.PadToken, Direction: Direction(p.Direction)}
	if p.PadToMultipleOf != nil {
		pad.MultipleOf = *p.PadToMultipleOf
	}
	var fixed struct {
		Fixed *int `json:"Fixed"`
	}
	var s string
	switch {
	case json.Unmarshal(p.Strategy, &s) == nil && s == "BatchLongest":
	case json.Unmarshal(p.Strategy, &fixed) == nil && fixed.Fixed != nil:
		pad.Length = *fixed.Fixed
	default:
		return nil, fmt.Errorf("tokenizer: tokenizer.json padding strategy %s is not BatchLongest or {\"Fixed\": n}", p.Strategy)
	}
	if err := pad.validate(); err != nil {
		return nil, err
	}
	return pad, nil
}

// parseSequence parses the components of a Sequence with parse, dropping
// those that parse to nil (components with nothing to do).
func parseSequence[T comparable](raws []json.RawMessage, parse func(json.RawMessage) (T, error)) ([]T, error) {
	var seq []T
	var none T
	for _, r := range raws {
		x, err := parse(r)
		if err != nil {
			return nil, err
		}
		if x != none {
			seq = append(seq, x)
		}
	}
	return seq, nil
}
