// Package hf loads Hugging Face checkpoints into Ferry's models and saves
// them back: the name mappings between the tensors of Hugging Face's
// BertModel, GPT2LMHeadModel and LlamaForCausalLM and the parameter paths
// of nn.Bert, nn.GPT2 and nn.Llama (checkpoint.Mapping tables), readers of
// their config.json, and loaders that build the model from a model
// directory (config.json beside model.safetensors or a sharded set with
// model.safetensors.index.json).
//
// Loading reads each tensor straight into its place in the model's stacked
// parameters (checkpoint.LoadMapped), so the parameters exist once:
//
//	m, cfg, err := hf.LoadBert("all-MiniLM-L6-v2", ir.Float32)
//	h := m.Encode(ids, types, nn.Context{Padding: mask})
//
// Save writes a model back under Hugging Face's names (the inverse
// mapping), so that transformers' from_pretrained and the safetensors
// package read what Ferry fine-tuned.
package hf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// BertMapping is the mapping of a Hugging Face BertModel checkpoint (also
// sentence-transformers' BERT models such as all-MiniLM-L6-v2, and the
// "bert." prefixed tensors of BertFor* models) onto nn.Bert. It ignores
// "*position_ids" (a buffer) and the heads of BertFor* models ("cls.*").
func BertMapping() checkpoint.Mapping {
	r := func(file, tree string) checkpoint.Rule { return checkpoint.Rule{File: file, Tree: tree} }
	rules := []checkpoint.Rule{
		r("embeddings.word_embeddings.weight", "Word.Table"),
		r("embeddings.position_embeddings.weight", "Position.Table"),
		r("embeddings.token_type_embeddings.weight", "TokenType.Table"),
		r("embeddings.LayerNorm.weight", "EmbedNorm.Scale"),
		r("embeddings.LayerNorm.bias", "EmbedNorm.Bias"),
		r("pooler.dense.weight", "Pooler.W"),
		r("pooler.dense.bias", "Pooler.B"),
	}
	layer := []struct{ file, tree string }{
		{"attention.self.query", "Attn.Q"},
		{"attention.self.key", "Attn.K"},
		{"attention.self.value", "Attn.V"},
		{"attention.output.dense", "Attn.O"},
		{"intermediate.dense", "MLP.Layers[0]"},
		{"output.dense", "MLP.Layers[1]"},
	}
	for _, l := range layer {
		rules = append(rules,
			r("encoder.layer.{i}."+l.file+".weight", "Encoder.Blocks."+l.tree+".W[{i}]"),
			r("encoder.layer.{i}."+l.file+".bias", "Encoder.Blocks."+l.tree+".B[{i}]"))
	}
	for _, n := range []struct{ file, tree string }{{"attention.output.LayerNorm", "AttnNorm"}, {"output.LayerNorm", "MLPNorm"}} {
		rules = append(rules,
			r("encoder.layer.{i}."+n.file+".weight", "Encoder.Blocks."+n.tree+".Scale[{i}]"),
			r("encoder.layer.{i}."+n.file+".bias", "Encoder.Blocks."+n.tree+".Bias[{i}]"))
	}
	return checkpoint.Mapping{Rules: rules, Ignore: []string{"*position_ids", "cls.*"}, Prefixes: []string{"bert."}}
}

// GPT2Mapping is the mapping of a Hugging Face GPT2LMHeadModel (or
// GPT2Model) checkpoint onto nn.GPT2. The fused c_attn weight [D, 3D] and
// bias [3D] split into Attn.Q, Attn.K and Attn.V; Conv1D weights are [in,
// out], nn.GPT2's layout, so nothing is transposed. Names with and without
// the "transformer." prefix load (the original gpt2 repository's file has
// none); Save writes it. It ignores the attention's mask buffers
// ("*.attn.bias", "*.attn.masked_bias") and lm_head.weight, which is the
// token embedding (tied).
func GPT2Mapping() checkpoint.Mapping {
	const p = "transformer."
	r := func(file, tree string) checkpoint.Rule { return checkpoint.Rule{File: p + file, Tree: tree} }
	rules := []checkpoint.Rule{
		r("wte.weight", "Tok.Table"),
		r("wpe.weight", "Pos.Table"),
		r("ln_f.weight", "Norm.Scale"),
		r("ln_f.bias", "Norm.Bias"),
	}
	for part, qkv := range []string{"Q", "K", "V"} {
		rules = append(rules,
			checkpoint.Rule{File: p + "h.{i}.attn.c_attn.weight", Tree: "Blocks.Blocks.Attn." + qkv + ".W[{i}]", Split: checkpoint.Split{Axis: 1, Part: part, Parts: 3}},
			checkpoint.Rule{File: p + "h.{i}.attn.c_attn.bias", Tree: "Blocks.Blocks.Attn." + qkv + ".B[{i}]", Split: checkpoint.Split{Axis: 0, Part: part, Parts: 3}})
	}
	for _, l := range []struct{ file, tree string }{
		{"attn.c_proj", "Attn.O"}, {"mlp.c_fc", "MLP.Layers[0]"}, {"mlp.c_proj", "MLP.Layers[1]"},
	} {
		rules = append(rules,
			r("h.{i}."+l.file+".weight", "Blocks.Blocks."+l.tree+".W[{i}]"),
			r("h.{i}."+l.file+".bias", "Blocks.Blocks."+l.tree+".B[{i}]"))
	}
	for _, n := range []struct{ file, tree string }{{"ln_1", "AttnNorm"}, {"ln_2", "MLPNorm"}} {
		rules = append(rules,
			r("h.{i}."+n.file+".weight", "Blocks.Blocks."+n.tree+".Scale[{i}]"),
			r("h.{i}."+n.file+".bias", "Blocks.Blocks."+n.tree+".Bias[{i}]"))
	}
	return checkpoint.Mapping{Rules: rules, Ignore: []string{"*.attn.bias", "*.attn.masked_bias", "lm_head.weight"}, Prefixes: []string{p}}
}

// LlamaMapping is the mapping of a Hugging Face LlamaForCausalLM checkpoint
// onto nn.Llama (weights [out, in], as stored). lm_head.weight goes to
// LMHead.W; a model with tied embeddings has neither. It ignores
// "*.rotary_emb.inv_freq" (a buffer of older checkpoints).
func LlamaMapping() checkpoint.Mapping {
	r := func(file, tree string) checkpoint.Rule { return checkpoint.Rule{File: file, Tree: tree} }
	rules := []checkpoint.Rule{
		r("model.embed_tokens.weight", "Embed.Table"),
		r("model.norm.weight", "Norm.Scale"),
		r("lm_head.weight", "LMHead.W"),
		r("model.layers.{i}.input_layernorm.weight", "Blocks.Blocks.AttnNorm.Scale[{i}]"),
		r("model.layers.{i}.post_attention_layernorm.weight", "Blocks.Blocks.MLPNorm.Scale[{i}]"),
	}
	for _, l := range []struct{ file, tree string }{
		{"self_attn.q_proj", "Attn.Q"}, {"self_attn.k_proj", "Attn.K"}, {"self_attn.v_proj", "Attn.V"}, {"self_attn.o_proj", "Attn.O"},
		{"mlp.gate_proj", "MLP.Gate"}, {"mlp.up_proj", "MLP.Up"}, {"mlp.down_proj", "MLP.Down"},
	} {
		rules = append(rules, r("model.layers.{i}."+l.file+".weight", "Blocks.Blocks."+l.tree+".W[{i}]"))
	}
	return checkpoint.Mapping{Rules: rules, Ignore: []string{"*.rotary_emb.inv_freq"}}
}

// readConfig decodes a model directory's config.json (or the JSON file
// path) into v.
func readConfig(path string, v any) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadBertConfig reads a BERT config.json (path: the file, or the model
// directory holding it). Settings nn.Bert does not implement (an
// activation other than "gelu", relative position embeddings) are errors.
func ReadBertConfig(path string) (nn.BertConfig, error) {
	var c struct {
		VocabSize             int     `json:"vocab_size"`
		MaxPositionEmbeddings int     `json:"max_position_embeddings"`
		TypeVocabSize         int     `json:"type_vocab_size"`
		NumHiddenLayers       int     `json:"num_hidden_layers"`
		HiddenSize            int     `json:"hidden_size"`
		NumAttentionHeads     int     `json:"num_attention_heads"`
		IntermediateSize      int     `json:"intermediate_size"`
		LayerNormEps          float64 `json:"layer_norm_eps"`
		HiddenAct             string  `json:"hidden_act"`
		PositionEmbeddingType string  `json:"position_embedding_type"`
	}
	if err := readConfig(path, &c); err != nil {
		return nn.BertConfig{}, fmt.Errorf("hf.ReadBertConfig: %w", err)
	}
	if c.HiddenAct != "" && c.HiddenAct != "gelu" {
		return nn.BertConfig{}, fmt.Errorf("hf.ReadBertConfig %s: hidden_act %q: nn.Bert implements \"gelu\" (exact GELU)", path, c.HiddenAct)
	}
	if c.PositionEmbeddingType != "" && c.PositionEmbeddingType != "absolute" {
		return nn.BertConfig{}, fmt.Errorf("hf.ReadBertConfig %s: position_embedding_type %q: nn.Bert implements \"absolute\"", path, c.PositionEmbeddingType)
	}
	if c.TypeVocabSize == 0 {
		c.TypeVocabSize = 2
	}
	return nn.BertConfig{Vocab: c.VocabSize, MaxPositions: c.MaxPositionEmbeddings, TypeVocab: c.TypeVocabSize,
		Layers: c.NumHiddenLayers, D: c.HiddenSize, Heads: c.NumAttentionHeads, Hidden: c.IntermediateSize, Eps: c.LayerNormEps}, nil
}

// ReadGPT2Config reads a GPT-2 config.json (the file or its directory).
// Settings nn.GPT2 does not implement (an activation other than
// "gelu_new", attention scaled by layer index or upcast and reordered)
// are errors.
func ReadGPT2Config(path string) (nn.GPT2Config, error) {
	var c struct {
		VocabSize          int     `json:"vocab_size"`
		NPositions         int     `json:"n_positions"`
		NLayer             int     `json:"n_layer"`
		NEmbd              int     `json:"n_embd"`
		NHead              int     `json:"n_head"`
		NInner             *int    `json:"n_inner"`
		LayerNormEpsilon   float64 `json:"layer_norm_epsilon"`
		ActivationFunction string  `json:"activation_function"`
		ScaleAttnWeights   *bool   `json:"scale_attn_weights"`
		ScaleByLayer       bool    `json:"scale_attn_by_inverse_layer_idx"`
		Reorder            bool    `json:"reorder_and_upcast_attn"`
	}
	if err := readConfig(path, &c); err != nil {
		return nn.GPT2Config{}, fmt.Errorf("hf.ReadGPT2Config: %w", err)
	}
	switch {
	case c.ActivationFunction != "" && c.ActivationFunction != "gelu_new" && c.ActivationFunction != "gelu_pytorch_tanh":
		return nn.GPT2Config{}, fmt.Errorf("hf.ReadGPT2Config %s: activation_function %q: nn.GPT2 implements \"gelu_new\"", path, c.ActivationFunction)
	case c.ScaleAttnWeights != nil && !*c.ScaleAttnWeights, c.ScaleByLayer, c.Reorder:
		return nn.GPT2Config{}, fmt.Errorf("hf.ReadGPT2Config %s: scale_attn_weights false, scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn are not implemented", path)
	}
	cfg := nn.GPT2Config{Vocab: c.VocabSize, MaxPositions: c.NPositions, Layers: c.NLayer, D: c.NEmbd, Heads: c.NHead, Eps: c.LayerNormEpsilon}
	if c.NInner != nil {
		cfg.Hidden = *c.NInner
	}
	return cfg, nil
}

// ReadLlamaConfig reads a Llama config.json (the file or its directory).
// Settings nn.Llama does not implement (rope_scaling, attention or MLP
// biases, an activation other than "silu") are errors.
func ReadLlamaConfig(path string) (nn.LlamaConfig, error) {
	var c struct {
		VocabSize         int             `json:"vocab_size"`
		NumHiddenLayers   int             `json:"num_hidden_layers"`
		HiddenSize        int             `json:"hidden_size"`
		NumAttentionHeads int             `json:"num_attention_heads"`
		NumKeyValueHeads  int             `json:"num_key_value_heads"`
		HeadDim           int             `json:"head_dim"`
		IntermediateSize  int             `json:"intermediate_size"`
		RMSNormEps        float64         `json:"rms_norm_eps"`
		RopeTheta         float64         `json:"rope_theta"`
		TieWordEmbeddings bool            `json:"tie_word_embeddings"`
		HiddenAct         string          `json:"hidden_act"`
		RopeScaling       json.RawMessage `json:"rope_scaling"`
		AttentionBias     bool            `json:"attention_bias"`
		MLPBias           bool            `json:"mlp_bias"`
	}
	if err := readConfig(path, &c); err != nil {
		return nn.LlamaConfig{}, fmt.Errorf("hf.ReadLlamaConfig: %w", err)
	}
	switch {
	case c.HiddenAct != "" && c.HiddenAct != "silu":
		return nn.LlamaConfig{}, fmt.Errorf("hf.ReadLlamaConfig %s: hidden_act %q: nn.Llama implements \"silu\"", path, c.HiddenAct)
	case len(c.RopeScaling) > 0 && string(c.RopeScaling) != "null":
		return nn.LlamaConfig{}, fmt.Errorf("hf.ReadLlamaConfig %s: rope_scaling %s is not implemented", path, c.RopeScaling)
	case c.AttentionBias, c.MLPBias:
		return nn.LlamaConfig{}, fmt.Errorf("hf.ReadLlamaConfig %s: attention_bias and mlp_bias are not implemented", path)
	}
	return nn.LlamaConfig{Vocab: c.VocabSize, Layers: c.NumHiddenLayers, D: c.HiddenSize, Heads: c.NumAttentionHeads,
		KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Hidden: c.IntermediateSize, Eps: c.RMSNormEps,
		RopeTheta: c.RopeTheta, TieEmbeddings: c.TieWordEmbeddings}, nil
}

// Abstract returns the tree that build returns, with trace.Abstract arrays
// (types only) for leaves: build is traced, not run, so no parameter is
// allocated. It is the like tree of checkpoint.LoadMapped:
//
//	like, err := hf.Abstract(func(k *trace.Array) nn.Bert { return nn.NewBert(k, ir.Float32, cfg) })
func Abstract[T any](build func(key *trace.Array) T) (T, error) {
	var out T
	if _, err := rt.Lower(func(k *trace.Array) T {
		out = build(k)
		return out
	}, random.NewKey(0)); err != nil {
		var z T
		return z, fmt.Errorf("hf.Abstract: %w", err)
	}
	leaves, def, err := trace.Flatten(out)
	if err != nil {
		var z T
		return z, fmt.Errorf("hf.Abstract: %w", err)
	}
	for i, a := range leaves {
		leaves[i] = trace.Abstract(a.Type())
	}
	return trace.UnflattenAs[T](def, leaves)
}

// LoadBert loads a Hugging Face BERT model directory (config.json and
// model.safetensors, or a sharded set) as an nn.Bert of dtype dt,
// converting the stored dtype. opts are checkpoint.LoadMapped's: a
// checkpoint without the pooler loads with
// checkpoint.KeepLeaves("Pooler.*") after giving the model one, or, to
// skip it, checkpoint.IgnoreTensors("pooler.*") and a like tree of your own.
func LoadBert(dir string, dt ir.DType, opts ...checkpoint.LoadOption) (nn.Bert, nn.BertConfig, error) {
	cfg, err := ReadBertConfig(dir)
	if err != nil {
		return nn.Bert{}, cfg, err
	}
	m, err := load(dir, func(k *trace.Array) nn.Bert { return nn.NewBert(k, dt, cfg) }, BertMapping(), opts)
	return m, cfg, err
}

// LoadGPT2 loads a Hugging Face GPT-2 model directory as an nn.GPT2 of
// dtype dt (see LoadBert).
func LoadGPT2(dir string, dt ir.DType, opts ...checkpoint.LoadOption) (nn.GPT2, nn.GPT2Config, error) {
	cfg, err := ReadGPT2Config(dir)
	if err != nil {
		return nn.GPT2{}, cfg, err
	}
	m, err := load(dir, func(k *trace.Array) nn.GPT2 { return nn.NewGPT2(k, dt, cfg) }, GPT2Mapping(), opts)
	return m, cfg, err
}

// LoadLlama loads a Hugging Face Llama model directory as an nn.Llama of
// dtype dt (see LoadBert).
func LoadLlama(dir string, dt ir.DType, opts ...checkpoint.LoadOption) (nn.Llama, nn.LlamaConfig, error) {
	cfg, err := ReadLlamaConfig(dir)
	if err != nil {
		return nn.Llama{}, cfg, err
	}
	m, err := load(dir, func(k *trace.Array) nn.Llama { return nn.NewLlama(k, dt, cfg) }, LlamaMapping(), opts)
	return m, cfg, err
}

func load[T any](dir string, build func(*trace.Array) T, m checkpoint.Mapping, opts []checkpoint.LoadOption) (T, error) {
	like, err := Abstract(build)
	if err != nil {
		return like, err
	}
	return checkpoint.LoadMappedFile(dir, like, m, opts...)
}

// Save writes model (nn.Bert, nn.GPT2, nn.Llama or any tree m maps) to a
// safetensors file at path under Hugging Face's names, with the metadata
// {"format": "pt"} that transformers' from_pretrained asks for. Put it
// beside the model's config.json as model.safetensors.
func Save(path string, model any, m checkpoint.Mapping) error {
	if err := checkpoint.SaveMapped(path, model, m, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("hf.Save: %w", err)
	}
	return nil
}
