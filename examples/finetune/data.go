package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// The task: is a short review positive or negative? The reviews are
// generated here from templates ("the coffee was not very good.") with a
// fixed seed, so nothing is downloaded but the model: a subject, a verb,
// an optional "not", an optional intensifier and an adjective whose
// polarity "not" flips. The held-out split reviews subjects the training
// split never mentions, so its accuracy measures more than memorised
// sentences; "not" makes the words' polarity alone a wrong answer a third
// of the time.

var (
	trainSubjects = []string{"movie", "food", "service", "book", "staff", "coffee", "room", "music", "show"}
	testSubjects  = []string{"hotel", "concert", "pizza"}
	verbs         = []string{"was", "is"}
	intensifiers  = []string{"", "very", "really"}
	positive      = []string{"good", "great", "wonderful", "excellent", "lovely", "fine", "superb", "amazing"}
	negative      = []string{"bad", "awful", "terrible", "boring", "poor", "horrible", "dull", "bland"}
)

// Example is one labelled review: Label 1 is positive, 0 negative.
type Example struct {
	Text  string
	Label int32
}

// review returns the review of subject with the other choices drawn from r.
func review(r *rand.Rand, subject string) Example {
	pos := r.IntN(2) == 1
	adj := negative[r.IntN(len(negative))]
	if pos {
		adj = positive[r.IntN(len(positive))]
	}
	words := []string{"the", subject, verbs[r.IntN(len(verbs))]}
	not := r.IntN(3) == 0
	if not {
		words = append(words, "not")
	}
	if in := intensifiers[r.IntN(len(intensifiers))]; in != "" {
		words = append(words, in)
	}
	words = append(words, adj)
	text := strings.Join(words, " ") + "."
	text = strings.ToUpper(text[:1]) + text[1:]
	label := int32(0)
	if pos != not {
		label = 1
	}
	return Example{Text: text, Label: label}
}

// Reviews returns nTrain training reviews of the training subjects and
// nTest held-out reviews of the others, drawn with seed.
func Reviews(nTrain, nTest int, seed uint64) (train, test []Example) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	for range nTrain {
		train = append(train, review(r, trainSubjects[r.IntN(len(trainSubjects))]))
	}
	for range nTest {
		test = append(test, review(r, testSubjects[r.IntN(len(testSubjects))]))
	}
	return train, test
}

// taskWords are every word and punctuation mark the reviews use.
func taskWords() []string {
	words := []string{"the", "not", "."}
	for _, l := range [][]string{trainSubjects, testSubjects, verbs, intensifiers[1:], positive, negative} {
		words = append(words, l...)
	}
	return words
}

// tinyTokenizer returns a tokenizer.json for the small random BERT of
// nn/hf/testdata (a vocabulary of vocab ids): BERT's pipeline (lowercase,
// split on whitespace and punctuation, WordPiece, [CLS] … [SEP]) over the
// special tokens and the task's words.
func tinyTokenizer(vocab int) ([]byte, error) {
	specials := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}
	words := append(append([]string(nil), specials...), taskWords()...)
	if len(words) > vocab {
		return nil, fmt.Errorf("the task needs %d tokens, the model has %d", len(words), vocab)
	}
	ids := map[string]int{}
	for i, w := range words {
		ids[w] = i
	}
	var added []map[string]any
	for i, s := range specials {
		added = append(added, map[string]any{"id": i, "special": true, "content": s, "single_word": false,
			"lstrip": false, "rstrip": false, "normalized": false})
	}
	return json.MarshalIndent(map[string]any{
		"version":       "1.0",
		"truncation":    nil,
		"padding":       nil,
		"added_tokens":  added,
		"normalizer":    map[string]any{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": nil, "lowercase": true},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{"type": "BertProcessing",
			"sep": []any{"[SEP]", ids["[SEP]"]}, "cls": []any{"[CLS]", ids["[CLS]"]}},
		"decoder": map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": 100, "vocab": ids},
	}, "", " ")
}
