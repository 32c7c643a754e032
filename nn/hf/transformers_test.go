package hf_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// transformersGolden is a file of testdata/transformers: what Hugging
// Face transformers' Flax model (run in float64 by gen_transformers.py)
// gives for the checkpoint of testdata/<model>.
type transformersGolden struct {
	Model        string `json:"model"`
	Transformers string `json:"transformers"`
	Inputs       struct {
		IDs   [][]int32 `json:"ids"`
		Types [][]int32 `json:"types"`
		Mask  [][]int32 `json:"mask"`
	} `json:"inputs"`
	Outputs map[string]tensor `json:"outputs"`
	Loss    struct {
		Value float64           `json:"value"`
		Grads map[string]tensor `json:"grads"`
	} `json:"loss"`
	Greedy struct {
		Prompt [][]int32 `json:"prompt"`
		Tokens [][]int32 `json:"tokens"`
		MinGap float64   `json:"min_gap"`
	} `json:"greedy"`
	// GreedyPadded is transformers' generate of prompts of different
	// lengths, left-padded with an attention mask.
	GreedyPadded struct {
		Prompts [][]int32 `json:"prompts"`
		Tokens  [][]int32 `json:"tokens"`
		MinGap  float64   `json:"min_gap"`
	} `json:"greedy_padded"`
}

func readTransformers(t *testing.T, model string) transformersGolden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "transformers", model+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g transformersGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Outputs) == 0 || len(g.Loss.Grads) == 0 {
		t.Fatalf("testdata/transformers/%s.json has no outputs or gradients (regenerate with gen_transformers.py)", model)
	}
	return g
}

// gradTol is the tolerance of an f32 gradient element against
// transformers' float64 one, relative to the largest magnitude of that
// gradient tensor.
const gradTol = 1e-5

// checkGrads compares the gradient tree grads, saved under Hugging Face's
// names with mapping m (so GPT-2's Q, K and V join into c_attn again), with
// transformers' gradients of the same names.
func checkGrads(t *testing.T, grads any, m checkpoint.Mapping, want map[string]tensor) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "grads.safetensors")
	if err := hf.Save(path, grads, m); err != nil {
		t.Fatal(err)
	}
	r, err := checkpoint.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		w := want[n]
		lit, err := r.Read(n, ir.Float64)
		if err != nil {
			t.Errorf("gradient %s: %v", n, err)
			continue
		}
		if !slices.Equal([]int(lit.Type.Shape), w.Shape) {
			t.Errorf("gradient %s: shape %v, transformers' %v", n, lit.Type.Shape, w.Shape)
			continue
		}
		g := ir.View[float64](lit)
		scale := 1e-12
		for _, v := range w.Data {
			scale = math.Max(scale, math.Abs(v))
		}
		worst, at := 0.0, 0
		for i, v := range w.Data {
			if d := math.Abs(g[i]-v) / scale; d > worst || math.IsNaN(d) {
				worst, at = d, i
			}
		}
		if worst > gradTol || math.IsNaN(worst) {
			t.Errorf("gradient %s: element %d is %v, transformers' %v (error %.3g of the largest magnitude %.3g > %g)",
				n, at, g[at], w.Data[at], worst, scale, gradTol)
		} else {
			t.Logf("gradient %s: %d values, largest error %.3g (of the largest magnitude %.3g)", n, len(g), worst, scale)
		}
	}
}

// checkLoss compares a scalar loss with transformers' (1e-5, relative above 1).
func checkLoss(t *testing.T, got *trace.Array, want float64) {
	t.Helper()
	g := got.Float64s()[0]
	if d := math.Abs(g-want) / math.Max(1, math.Abs(want)); d > tol || math.IsNaN(d) {
		t.Errorf("loss %v, transformers' %v (error %.3g > %g)", g, want, d, tol)
	}
}

// maskedMean is Σ x·mask / Σ mask for x [B, T] (float) and mask [B, T] (int32).
func maskedMean(x, mask *trace.Array) *trace.Array {
	m := trace.Convert(mask, x.DType())
	return trace.Div(trace.Sum(trace.Mul(x, m)), trace.Sum(m))
}

// bertLoss is gen_transformers.py's BERT loss: Σ pooled² / B plus the mean
// over unmasked tokens of Σ_d h².
func bertLoss(m nn.Bert, ids, types, mask *trace.Array) *trace.Array {
	h := m.Encode(ids, types, nn.Context{Padding: mask})
	pooled := trace.Sum(trace.Square(m.Pool(h)))
	B := float64(ids.Shape()[0])
	return trace.Add(trace.Div(pooled, trace.ScalarAs(B, h.DType())), maskedMean(trace.Sum(trace.Square(h), 2), mask))
}

// lmLoss is gen_transformers.py's causal LM loss: the next-token cross
// entropy of logits [B, T, V] for ids [B, T], averaged over the positions
// whose target is not padding.
func lmLoss(logits, ids, mask *trace.Array) *trace.Array {
	V := logits.Shape()[2]
	lp := trace.LogSoftmax(trace.SliceAxis(logits, 1, 0, -1), 2)
	next := trace.SliceAxis(ids, 1, 1, ids.Shape()[1])
	nll := trace.Neg(trace.Sum(trace.Mul(lp, trace.OneHot(next, V, lp.DType())), 2))
	return maskedMean(nll, trace.SliceAxis(mask, 1, 1, ids.Shape()[1]))
}

// checkGenerate decodes the golden's prompts greedily with nn.Generator
// (KV cache) and compares the tokens with transformers' Flax generate.
func checkGenerate[M nn.Decoder](t *testing.T, m M, g transformersGolden) {
	t.Helper()
	if len(g.Greedy.Tokens) == 0 {
		t.Fatal("the golden has no greedy continuation")
	}
	n, N := len(g.Greedy.Prompt[0]), len(g.Greedy.Tokens[0])
	res, err := nn.NewGenerator(m, n+N-1, 0).Generate(g.Greedy.Prompt, nn.GenerateConfig{MaxNewTokens: N})
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range g.Greedy.Tokens {
		if !slices.Equal(res.Tokens[b], want) {
			t.Errorf("row %d: greedy tokens %v, transformers' generate %v", b, res.Tokens[b], want)
		}
	}
	t.Logf("%d×%d tokens as transformers' generate (smallest top-2 logit gap %.3g)", len(res.Tokens), N, g.Greedy.MinGap)

	// Prompts of different lengths in one batch (Ferry pads them on the
	// right, transformers on the left with an attention mask): the same
	// tokens.
	pp := g.GreedyPadded
	if len(pp.Tokens) == 0 || len(pp.Tokens) != len(pp.Prompts) {
		t.Fatal("the golden has no greedy continuation of padded prompts (regenerate with gen_transformers.py)")
	}
	n, N = 0, len(pp.Tokens[0])
	for _, p := range pp.Prompts {
		n = max(n, len(p))
	}
	res, err = nn.NewGenerator(m, n+N-1, 4).Generate(pp.Prompts, nn.GenerateConfig{MaxNewTokens: N})
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range pp.Tokens {
		if !slices.Equal(res.Tokens[b], want) {
			t.Errorf("prompt %v in a batch of lengths %d…%d: greedy tokens %v, transformers' generate with an attention mask %v", pp.Prompts[b], len(pp.Prompts[0]), n, res.Tokens[b], want)
		}
	}
	t.Logf("%d prompts of different lengths: %d tokens each as transformers' padded generate (smallest top-2 logit gap %.3g)", len(pp.Prompts), N, pp.MinGap)
}

// TestTransformersBert: nn.Bert on testdata/bert against transformers'
// FlaxBertModel: the last hidden state, the pooled output, and the
// gradients of a loss of both through trace.Grad.
func TestTransformersBert(t *testing.T) {
	g := readTransformers(t, "bert")
	m, _, err := hf.LoadBert("testdata/bert", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	ids, types, mask := matrix(g.Inputs.IDs), matrix(g.Inputs.Types), matrix(g.Inputs.Mask)
	run := rt.Jit(func(m nn.Bert, ids, types, mask *trace.Array) (*trace.Array, *trace.Array) {
		h := m.Encode(ids, types, nn.Context{Padding: mask})
		return h, m.Pool(h)
	})
	h, pooled := run(m, ids, types, mask)
	compare(t, "last_hidden_state", h, g.Outputs["last_hidden_state"])
	compare(t, "pooler_output", pooled, g.Outputs["pooler_output"])

	grad := rt.Jit(func(m nn.Bert, ids, types, mask *trace.Array) (*trace.Array, nn.Bert) {
		return trace.ValueAndGrad(func(m nn.Bert) *trace.Array { return bertLoss(m, ids, types, mask) })(m)
	})
	loss, grads := grad(m, ids, types, mask)
	checkLoss(t, loss, g.Loss.Value)
	checkGrads(t, grads, hf.BertMapping(), g.Loss.Grads)
}

// TestTransformersGPT2: nn.GPT2 on testdata/gpt2 against transformers'
// FlaxGPT2LMHeadModel: the logits, the gradients of the next-token cross
// entropy (the token embedding's sums its two uses, as the tied LM head),
// and greedy decoding against its generate.
func TestTransformersGPT2(t *testing.T) {
	g := readTransformers(t, "gpt2")
	m, _, err := hf.LoadGPT2("testdata/gpt2", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	ids, mask := matrix(g.Inputs.IDs), matrix(g.Inputs.Mask)
	logits := rt.Jit(func(m nn.GPT2, ids, mask *trace.Array) *trace.Array {
		return m.Logits(ids, nn.Context{Padding: mask})
	})(m, ids, mask)
	compare(t, "logits", logits, g.Outputs["logits"])

	grad := rt.Jit(func(m nn.GPT2, ids, mask *trace.Array) (*trace.Array, nn.GPT2) {
		return trace.ValueAndGrad(func(m nn.GPT2) *trace.Array {
			return lmLoss(m.Logits(ids, nn.Context{Padding: mask}), ids, mask)
		})(m)
	})
	loss, grads := grad(m, ids, mask)
	checkLoss(t, loss, g.Loss.Value)
	checkGrads(t, grads, hf.GPT2Mapping(), g.Loss.Grads)
	checkGenerate(t, m, g)
}

// TestTransformersLlama: nn.Llama on testdata/llama (grouped-query
// attention, rotary embeddings, f16 weights loaded as f32) against
// transformers' FlaxLlamaForCausalLM: logits, gradients of the next-token
// cross entropy, greedy decoding against its generate.
func TestTransformersLlama(t *testing.T) {
	g := readTransformers(t, "llama")
	m, _, err := hf.LoadLlama("testdata/llama", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	ids, mask := matrix(g.Inputs.IDs), matrix(g.Inputs.Mask)
	logits := rt.Jit(func(m nn.Llama, ids, mask *trace.Array) *trace.Array {
		return m.Logits(ids, nn.Context{Padding: mask})
	})(m, ids, mask)
	compare(t, "logits", logits, g.Outputs["logits"])

	grad := rt.Jit(func(m nn.Llama, ids, mask *trace.Array) (*trace.Array, nn.Llama) {
		return trace.ValueAndGrad(func(m nn.Llama) *trace.Array {
			return lmLoss(m.Logits(ids, nn.Context{Padding: mask}), ids, mask)
		})(m)
	})
	loss, grads := grad(m, ids, mask)
	checkLoss(t, loss, g.Loss.Value)
	checkGrads(t, grads, hf.LlamaMapping(), g.Loss.Grads)
	checkGenerate(t, m, g)
}
