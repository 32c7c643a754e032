package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/trace"
)

// The model is GPT-2 exactly: a token embedding tied to the output, learned
// positions, pre-norm blocks of causal multi-head attention and a GELU
// (tanh) MLP with biases, a final LayerNorm. Its attention projections have
// no biases (GPT-2's are zero) and its LayerNorms an epsilon of 1e-6.
// nn.TransformerLM.GPT2 is the same model as an nn.GPT2; SaveHF writes it
// under Hugging Face GPT-2's names.

// GPT2Config returns the Hugging Face GPT-2 configuration of m: a model of
// vocab tokens and seq positions.
func GPT2Config(m Model) nn.GPT2Config {
	b := m.Blocks.Blocks
	return nn.GPT2Config{
		Vocab: m.Tok.Table.Shape()[0], MaxPositions: m.Pos.Shape()[0], Layers: m.Blocks.Layers(),
		D: m.Tok.Table.Shape()[1], Heads: b.Attn.Heads, Hidden: b.MLP.Layers[0].W.Shape()[2], Eps: m.Norm.Eps,
	}
}

// AsGPT2 returns m as an nn.GPT2 with every parameter GPT-2 has: m.GPT2()
// with the zero biases of the attention projections added.
func AsGPT2(m Model) nn.GPT2 {
	g := m.GPT2()
	a := &g.Blocks.Blocks.Attn
	for _, l := range []*nn.Linear{&a.Q, &a.K, &a.V, &a.O} {
		s := l.W.Shape() // [L, in, out]
		l.B = trace.Zeros([]int{s[0], s[2]}, l.W.DType())
	}
	return g
}

// SaveHF writes m into dir as a Hugging Face GPT-2 directory that
// transformers' GPT2LMHeadModel.from_pretrained loads: config.json,
// model.safetensors (hf.Save under hf.GPT2Mapping's names) and vocab.json,
// the character of each token id.
func SaveHF(dir string, m Model, v *Vocab) error {
	c := GPT2Config(m)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	config := map[string]any{
		"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2",
		"vocab_size": c.Vocab, "n_positions": c.MaxPositions, "n_ctx": c.MaxPositions, "n_embd": c.D,
		"n_layer": c.Layers, "n_head": c.Heads, "n_inner": c.Hidden, "activation_function": "gelu_new",
		"layer_norm_epsilon": c.Eps, "tie_word_embeddings": true, "scale_attn_weights": true,
		"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "torch_dtype": "float32",
		"bos_token_id": 0, "eos_token_id": 0,
	}
	data, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	chars := make([]string, len(v.bytes))
	for i, b := range v.bytes {
		chars[i] = string(rune(b))
	}
	if data, err = json.Marshal(chars); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "vocab.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if err := hf.Save(filepath.Join(dir, "model.safetensors"), AsGPT2(m), hf.GPT2Mapping()); err != nil {
		return fmt.Errorf("saving %s: %w", dir, err)
	}
	return nil
}
