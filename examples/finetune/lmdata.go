package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// The decoder's task: reverse a string of digits. A sequence is
// "<s>3141>1413</s>": a beginning-of-sequence token, two to MaxDigits
// digits, ">", the same digits reversed, and an end-of-sequence token,
// right-padded to a fixed length. The digits before ">" are random, so no
// model predicts them; everything after ">" follows from them. The held-out
// strings never occur in training, so the held-out accuracy (of the tokens
// after ">") measures the rule, not memorised strings.

// The task's vocabulary: ids 0 to 13 of the model's, whatever its
// tokenizer calls them (the task does not use one).
const (
	tokPad   = 0 // padding, masked out of attention and the loss
	tokBOS   = 1
	tokEOS   = 2
	tokDigit = 3  // '0' is 3, …, '9' is 12
	tokSep   = 13 // ">"
	lmVocab  = 14
)

// lmTokens names the task's token ids, written beside the saved model.
var lmTokens = []string{"<pad>", "<s>", "</s>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ">"}

// LMExample is one sequence of the task: its digits and its token ids
// (unpadded).
type LMExample struct {
	Digits string
	IDs    []int32
}

// Text is the sequence as a string.
func (e LMExample) Text() string {
	var b strings.Builder
	for _, id := range e.IDs {
		b.WriteString(lmTokens[id])
	}
	return b.String()
}

// Answer is the index in IDs of the first token after ">": the tokens
// from Answer on (the reversed digits and "</s>") are what the model can
// predict.
func (e LMExample) Answer() int { return len(e.Digits) + 2 }

// reversal returns the example of digits.
func reversal(digits string) LMExample {
	ids := []int32{tokBOS}
	for _, c := range digits {
		ids = append(ids, tokDigit+int32(c-'0'))
	}
	ids = append(ids, tokSep)
	for i := len(digits) - 1; i >= 0; i-- {
		ids = append(ids, tokDigit+int32(digits[i]-'0'))
	}
	return LMExample{Digits: digits, IDs: append(ids, tokEOS)}
}

// Reversals returns nTrain training and nTest held-out examples of two to
// maxDigits digits, drawn with seed; no string is in both splits or twice
// in one.
func Reversals(nTrain, nTest, maxDigits int, seed uint64) (train, test []LMExample) {
	r := rand.New(rand.NewPCG(seed, 0x7e7))
	seen := map[string]bool{}
	draw := func() LMExample {
		for {
			n := 2 + r.IntN(maxDigits-1)
			d := make([]byte, n)
			for i := range d {
				d[i] = byte('0' + r.IntN(10))
			}
			if !seen[string(d)] {
				seen[string(d)] = true
				return reversal(string(d))
			}
		}
	}
	for range nTest {
		test = append(test, draw())
	}
	for range nTrain {
		train = append(train, draw())
	}
	return train, test
}

// LMBatches are sequences padded to one length T: ids and attention masks
// [N, T], and Answer, 1 where the token is one the model can predict (after
// ">"), row-major.
type LMBatches struct {
	N, T              int
	IDs, Mask, Answer []int32
}

// encodeLM pads examples to t tokens.
func encodeLM(examples []LMExample, t int) (*LMBatches, error) {
	b := &LMBatches{N: len(examples), T: t}
	for _, e := range examples {
		if len(e.IDs) > t {
			return nil, fmt.Errorf("%s is %d tokens, longer than %d", e.Text(), len(e.IDs), t)
		}
		for j := range t {
			id, m, a := int32(tokPad), int32(0), int32(0)
			if j < len(e.IDs) {
				id, m = e.IDs[j], 1
				if j >= e.Answer() {
					a = 1
				}
			}
			b.IDs, b.Mask, b.Answer = append(b.IDs, id), append(b.Mask, m), append(b.Answer, a)
		}
	}
	return b, nil
}
