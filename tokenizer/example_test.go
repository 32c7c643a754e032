package tokenizer_test

import (
	"fmt"
	"log"

	"github.com/ferryml/ferry/tokenizer"
)

// Encode a sentence with the all-MiniLM-L6-v2 sentence embedding model's
// tokenizer (BERT's uncased WordPiece) and decode it back. The
// tokenizer.json pads every encoding to 128 tokens; WithPadding(nil)
// turns that off.
func Example() {
	tok, err := tokenizer.Load("testdata/minilm.json")
	if err != nil {
		log.Fatal(err)
	}
	tok, err = tok.WithPadding(nil)
	if err != nil {
		log.Fatal(err)
	}
	enc, err := tok.Encode("Hello, Ferry! Tokenizers aren't hard.")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(enc.Tokens)
	fmt.Println(enc.IDs)
	fmt.Println(enc.AttentionMask)
	text, err := tok.Decode(enc.IDs, true)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(text)
	// Output:
	// [[CLS] hello , ferry ! token ##izer ##s aren ' t hard . [SEP]]
	// [101 7592 1010 7115 999 19204 17629 2015 4995 1005 1056 2524 1012 102]
	// [1 1 1 1 1 1 1 1 1 1 1 1 1 1]
	// hello, ferry! tokenizers aren ' t hard.
}

// GPT-2's byte-level BPE: a space belongs to the word that follows it (Ġ);
// the four bytes of the emoji make two tokens, each of whose offsets (in
// bytes of the text) covers the whole emoji; <|endoftext|> is an added
// token, matched before the split.
func ExampleTokenizer_Encode() {
	tok, err := tokenizer.Load("testdata/gpt2.json.gz")
	if err != nil {
		log.Fatal(err)
	}
	enc, err := tok.Encode("Hello world 👋<|endoftext|>")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(enc.Tokens)
	fmt.Println(enc.IDs)
	fmt.Println(enc.Offsets)
	// Output:
	// [Hello Ġworld ĠðŁĳ ĭ <|endoftext|>]
	// [15496 995 50169 233 50256]
	// [{0 5} {5 11} {11 16} {12 16} {16 29}]
}

// Pad a batch to its longest text, BERT style, for a model that takes
// (batch, length) ids and attention masks.
func ExampleTokenizer_EncodeBatch() {
	tok, err := tokenizer.Load("testdata/minilm.json")
	if err != nil {
		log.Fatal(err)
	}
	tok, err = tok.WithPadding(&tokenizer.Padding{ID: 0, Token: "[PAD]"})
	if err != nil {
		log.Fatal(err)
	}
	encs, err := tok.EncodeBatch([]string{"A short one.", "A somewhat longer sentence."})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range encs {
		fmt.Println(e.IDs, e.AttentionMask)
	}
	// Output:
	// [101 1037 2460 2028 1012 102 0] [1 1 1 1 1 1 0]
	// [101 1037 5399 2936 6251 1012 102] [1 1 1 1 1 1 1]
}
