package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Decoder is what fine-tuning needs of a family of causal language models
// whose Ferry model is M: how to load a Hugging Face directory, the
// next-token logits, and the mapping between its parameters and the
// checkpoint's names.
type Decoder[M any] struct {
	// Family names the family ("GPT-2"); Flax is transformers' Flax class
	// that reloads the saved directory.
	Family, Flax string
	// Load reads a model directory, returning the model and a description
	// of its shape.
	Load func(dir string) (M, string, error)
	// Logits returns the logits [B, T, V] of ids [B, T] (int32) with the
	// attention mask [B, T] (1 for real tokens).
	Logits  func(m M, ids, mask *trace.Array) *trace.Array
	Mapping checkpoint.Mapping
}

// gpt2Decoder is GPT-2 (nn.GPT2, its token embedding tied to the output).
var gpt2Decoder = Decoder[nn.GPT2]{
	Family: "GPT-2", Flax: "FlaxGPT2LMHeadModel",
	Load: func(dir string) (nn.GPT2, string, error) {
		m, c, err := hf.LoadGPT2(dir, ir.Float32)
		return m, fmt.Sprintf("GPT-2, %d layers of width %d, %d heads, vocabulary %d, %d positions", c.Layers, c.D, c.Heads, c.Vocab, c.MaxPositions), err
	},
	Logits: func(m nn.GPT2, ids, mask *trace.Array) *trace.Array {
		return m.Logits(ids, nn.Context{Padding: mask})
	},
	Mapping: hf.GPT2Mapping(),
}

// llamaDecoder is Llama (nn.Llama).
var llamaDecoder = Decoder[nn.Llama]{
	Family: "Llama", Flax: "FlaxLlamaForCausalLM",
	Load: func(dir string) (nn.Llama, string, error) {
		m, c, err := hf.LoadLlama(dir, ir.Float32)
		kv := c.KVHeads
		if kv == 0 {
			kv = c.Heads
		}
		return m, fmt.Sprintf("Llama, %d layers of width %d, %d heads (%d of keys and values), vocabulary %d", c.Layers, c.D, c.Heads, kv, c.Vocab), err
	},
	Logits: func(m nn.Llama, ids, mask *trace.Array) *trace.Array {
		return m.Logits(ids, nn.Context{Padding: mask})
	},
	Mapping: hf.LlamaMapping(),
}

// modelType returns the model_type of dir's config.json ("bert", "gpt2",
// "llama", …), or "" when dir has no config.json.
func modelType(dir string) (string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var c struct {
		ModelType string `json:"model_type"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	return c.ModelType, nil
}

// causalLoss is the mean next-token cross-entropy of logits [B, T, V]
// against ids [B, T] over the targets that are real tokens (mask [B, T]
// is 1 there): position t predicts token t+1, padding neither predicts nor
// is predicted.
func causalLoss(logits, ids, mask *trace.Array) *trace.Array {
	nll, _ := nextToken(logits, ids)
	t := ids.Shape()[1]
	w := trace.Convert(trace.SliceAxis(mask, 1, 1, t), nll.DType())
	return trace.Div(trace.Sum(trace.Mul(nll, w)), trace.Sum(w))
}

// nextToken returns, for every position t < T−1 of logits [B, T, V], the
// negative log-likelihood [B, T−1] of the token t+1 of ids [B, T] and the
// arg-max prediction [B, T−1] (int32), in f32.
func nextToken(logits, ids *trace.Array) (nll, pred *trace.Array) {
	t, v := ids.Shape()[1], logits.Shape()[2]
	lg := trace.Convert(trace.SliceAxis(logits, 1, 0, t-1), ir.Float32)
	lp := trace.LogSoftmax(lg, 2)
	oh := trace.OneHot(trace.SliceAxis(ids, 1, 1, t), v, ir.Float32)
	return trace.Neg(trace.Sum(trace.Mul(lp, oh), 2)), trace.ArgMax(lg, 2)
}

// LMState is AdamW's state over a model M.
type LMState[M any] = optim.AdamState[M]

// lmStepFunc returns the training step of a causal LM: the padding-masked
// next-token cross-entropy, its gradient, and the AdamW update. The caller
// donates the model and the state (arguments 0 and 1).
func lmStepFunc[M any](dec Decoder[M], opt optim.Optimizer[M, LMState[M]]) func(M, LMState[M], *trace.Array, *trace.Array) (M, LMState[M], *trace.Array) {
	return func(m M, s LMState[M], ids, mask *trace.Array) (M, LMState[M], *trace.Array) {
		loss, g := trace.ValueAndGrad(func(m M) *trace.Array {
			return causalLoss(dec.Logits(m, ids, mask), ids, mask)
		})(m)
		m, s, err := optim.Step(opt, g, s, m)
		if err != nil {
			panic(err)
		}
		return m, s, loss
	}
}

// batch returns rows (indices into b) as arrays: ids and mask [len(rows), T].
func (b *LMBatches) batch(rows []int) (ids, mask *trace.Array) {
	n := len(rows)
	id, m := make([]int32, 0, n*b.T), make([]int32, 0, n*b.T)
	for _, r := range rows {
		id = append(id, b.IDs[r*b.T:(r+1)*b.T]...)
		m = append(m, b.Mask[r*b.T:(r+1)*b.T]...)
	}
	return rt.FromSlice(id, n, b.T), rt.FromSlice(m, n, b.T)
}

// lmBatches returns the next function of trainLoop over train: batch
// sequences a step, in an order shuffled with seed each epoch.
func lmBatches(train *LMBatches, batch int, seed uint64) func() []*trace.Array {
	order := shuffler(train.N, seed)
	return func() []*trace.Array {
		ids, mask := train.batch(order.next(batch))
		return []*trace.Array{ids, mask}
	}
}

// HeldOut is how a model does on the held-out sequences' answers (the
// tokens after ">"): the mean cross-entropy per answer token, the share
// of answer tokens that are the arg max, and the share of sequences whose
// answer is all arg maxes.
type HeldOut struct {
	Loss, TokenAcc, Exact float64
}

func (h HeldOut) String() string {
	return fmt.Sprintf("loss %.4f a token, %.1f%% of tokens and %.1f%% of whole answers right", h.Loss, 100*h.TokenAcc, 100*h.Exact)
}

// evaluate runs eval (nextToken of the model's logits, jitted) on b, batch
// rows at a time (the last batch padded with row 0).
func evaluate[M any](eval func(M, *trace.Array, *trace.Array) (*trace.Array, *trace.Array), m M, b *LMBatches, batch int) HeldOut {
	var loss, right, tokens, exact float64
	for start := 0; start < b.N; start += batch {
		rows := make([]int, batch)
		for i := range rows {
			if start+i < b.N {
				rows[i] = start + i
			}
		}
		ids, mask := b.batch(rows)
		nllA, predA := eval(m, ids, mask)
		nll, pred := nllA.Float64s(), predA.Int64s()
		deleteTree(ids, mask, nllA, predA)
		for i := range min(batch, b.N-start) {
			r, all := start+i, true
			for j := range b.T - 1 {
				next := r*b.T + j + 1
				if b.Answer[next] == 0 {
					continue
				}
				k := i*(b.T-1) + j
				loss += nll[k]
				tokens++
				if int32(pred[k]) == b.IDs[next] {
					right++
				} else {
					all = false
				}
			}
			if all {
				exact++
			}
		}
	}
	return HeldOut{Loss: loss / tokens, TokenAcc: right / tokens, Exact: exact / float64(b.N)}
}
