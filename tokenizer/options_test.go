package tokenizer

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// optionGolden is one line of golden-options.jsonl.gz: the wp-cased
// tokenizer under truncation and padding set by the caller, on a pair
// (I, J) or a batch of single lines.
type optionGolden struct {
	Opts struct {
		Truncation *struct {
			MaxLength int    `json:"max_length"`
			Strategy  string `json:"strategy"`
			Direction string `json:"direction"`
		} `json:"truncation"`
		Padding *struct {
			Direction  string `json:"direction"`
			PadID      int    `json:"pad_id"`
			PadTypeID  int    `json:"pad_type_id"`
			PadToken   string `json:"pad_token"`
			Length     *int   `json:"length"`
			MultipleOf *int   `json:"pad_to_multiple_of"`
		} `json:"padding"`
	} `json:"opts"`
	I, J               int
	Batch              []int   `json:"batch"`
	Error              string  `json:"error"`
	IDs                []int   `json:"ids"`
	TypeIDs            []int   `json:"type_ids"`
	AttentionMask      []int   `json:"attention_mask"`
	SpecialTokensMask  []int   `json:"special_tokens_mask"`
	BatchIDs           [][]int `json:"batch_ids"`
	BatchAttentionMask [][]int `json:"batch_attention_mask"`
	BatchTypeIDs       [][]int `json:"batch_type_ids"`
}

// TestOptionGoldens sets truncation (every strategy and direction) and
// padding (fixed length on the left, the batch's longest rounded to a
// multiple on the right) as Python's enable_truncation and enable_padding
// did, and requires Hugging Face's encodings of pairs and batches, and its
// errors where it refused.
func TestOptionGoldens(t *testing.T) {
	corpus := readCorpus(t)
	base, err := Load(filepath.Join("testdata", "wp-cased.json"))
	if err != nil {
		t.Fatal(err)
	}
	gs := readJSONLines[optionGolden](t, filepath.Join("testdata", "golden-options.jsonl.gz"))
	strategies := map[string]TruncationStrategy{"longest_first": LongestFirst, "only_first": OnlyFirst, "only_second": OnlySecond}
	directions := map[string]Direction{"right": Right, "left": Left}
	failures := 0
	for _, g := range gs {
		var tr *Truncation
		if o := g.Opts.Truncation; o != nil {
			tr = &Truncation{MaxLength: o.MaxLength, Strategy: strategies[o.Strategy], Direction: directions[o.Direction]}
		}
		var pad *Padding
		if o := g.Opts.Padding; o != nil {
			pad = &Padding{ID: o.PadID, TypeID: o.PadTypeID, Token: o.PadToken, Direction: directions[o.Direction]}
			if o.Length != nil {
				pad.Length = *o.Length
			}
			if o.MultipleOf != nil {
				pad.MultipleOf = *o.MultipleOf
			}
		}
		tok, err := base.WithTruncation(tr)
		if err != nil {
			t.Fatal(err)
		}
		if tok, err = tok.WithPadding(pad); err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("truncation %+v, padding %+v", tr, pad)
		fail := func(format string, args ...any) {
			failures++
			if failures <= 5 {
				t.Errorf(what+": "+format, args...)
			}
		}
		if g.Batch != nil {
			texts := make([]string, len(g.Batch))
			for k, i := range g.Batch {
				texts[k] = corpus[i]
			}
			encs, err := tok.EncodeBatch(texts)
			switch {
			case g.Error != "" && err == nil:
				fail("batch %v: no error, Hugging Face says %s", g.Batch, g.Error)
			case g.Error == "" && err != nil:
				fail("batch %v: %v", g.Batch, err)
			case err == nil:
				for k, e := range encs {
					if !sameInts(e.IDs, g.BatchIDs[k]) || !sameInts(e.AttentionMask, g.BatchAttentionMask[k]) || !sameInts(e.TypeIDs, g.BatchTypeIDs[k]) {
						fail("batch %v, text %d: got ids %v mask %v types %v, want %v %v %v", g.Batch, k,
							e.IDs, e.AttentionMask, e.TypeIDs, g.BatchIDs[k], g.BatchAttentionMask[k], g.BatchTypeIDs[k])
					}
				}
			}
			continue
		}
		e, err := tok.EncodePair(corpus[g.I], corpus[g.J])
		switch {
		case g.Error != "" && err == nil:
			fail("pair (%d, %d): no error, Hugging Face says %s", g.I, g.J, g.Error)
		case g.Error == "" && err != nil:
			fail("pair (%d, %d): %v", g.I, g.J, err)
		case err == nil:
			if !sameInts(e.IDs, g.IDs) || !sameInts(e.TypeIDs, g.TypeIDs) || !sameInts(e.AttentionMask, g.AttentionMask) ||
				!sameInts(e.SpecialTokensMask, g.SpecialTokensMask) {
				fail("pair (%d, %d):\n got ids %v types %v mask %v special %v\nwant ids %v types %v mask %v special %v", g.I, g.J,
					e.IDs, e.TypeIDs, e.AttentionMask, e.SpecialTokensMask, g.IDs, g.TypeIDs, g.AttentionMask, g.SpecialTokensMask)
			}
		}
	}
	if failures > 0 {
		t.Errorf("%d of %d option goldens differ", failures, len(gs))
	}
	t.Logf("%d option goldens compared", len(gs))
	if len(gs) < 100 {
		t.Fatalf("only %d option goldens", len(gs))
	}
}

// TestOptionErrors: invalid options are errors naming the option.
func TestOptionErrors(t *testing.T) {
	tok, err := Load(filepath.Join("testdata", "wp-cased.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tr   *Truncation
		pad  *Padding
		want string
	}{
		{tr: &Truncation{MaxLength: -1}, want: "max length -1"},
		{tr: &Truncation{MaxLength: 4, Strategy: "Shortest"}, want: `strategy "Shortest"`},
		{tr: &Truncation{MaxLength: 4, Direction: "Up"}, want: `direction "Up"`},
		{pad: &Padding{Length: -3}, want: "padding length -3"},
		{pad: &Padding{Direction: "Down"}, want: `direction "Down"`},
	} {
		var err error
		if c.tr != nil {
			_, err = tok.WithTruncation(c.tr)
		} else {
			_, err = tok.WithPadding(c.pad)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %+v: error %v, want one naming %s", c.tr, c.pad, err, c.want)
		}
	}
}
