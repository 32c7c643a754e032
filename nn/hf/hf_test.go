package hf_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// saveDir, when set, is where TestSaveRoundTrip leaves the files it saves,
// for gen.py --roundtrip to read with Python's safetensors.
var saveDir = flag.String("hf.save", "", "directory to leave TestSaveRoundTrip's files in")

type golden struct {
	Inputs struct {
		IDs   [][]int32 `json:"ids"`
		Types [][]int32 `json:"types"`
		Mask  [][]int32 `json:"mask"`
	} `json:"inputs"`
	Hidden    tensor `json:"last_hidden_state"`
	Pooled    tensor `json:"pooler_output"`
	Embedding tensor `json:"sentence_embedding"`
	Logits    tensor `json:"logits"`
}

type tensor struct {
	Shape []int     `json:"shape"`
	Data  []float64 `json:"data"`
}

func readGolden(t *testing.T, model string) golden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", model, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func matrix(rows [][]int32) *trace.Array {
	var flat []int32
	for _, r := range rows {
		flat = append(flat, r...)
	}
	return rt.FromSlice(flat, len(rows), len(rows[0]))
}

// tol is the tolerance of an f32 result against the float64 golden:
// 1e-5, relative above magnitude 1.
const tol = 1e-5

// compare checks got (f32) against want elementwise.
func compare(t *testing.T, what string, got *trace.Array, want tensor) {
	t.Helper()
	if !slices.Equal([]int(got.Shape()), want.Shape) {
		t.Fatalf("%s: shape %v, want %v", what, got.Shape(), want.Shape)
	}
	g := got.Float64s()
	worst, at := 0.0, 0
	for i, w := range want.Data {
		if d := math.Abs(g[i]-w) / math.Max(1, math.Abs(w)); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	if worst > tol || math.IsNaN(worst) {
		t.Errorf("%s: element %d is %v, want %v (error %.3g > %g)", what, at, g[at], want.Data[at], worst, tol)
	} else {
		t.Logf("%s: %d values, largest error %.3g", what, len(g), worst)
	}
}

// meanPool is sentence-transformers' mean pooling over the mask and L2
// normalisation: h [B, T, D], mask [B, T] int32 → [B, D].
func meanPool(h, mask *trace.Array) *trace.Array {
	m := trace.ExpandDims(trace.Convert(mask, h.DType()), 2)
	sum := trace.Sum(trace.Mul(h, m), 1)
	n := trace.Maximum(trace.Sum(m, 1), trace.Scalar(1e-9))
	e := trace.Div(sum, n)
	norm := trace.Sqrt(trace.Sum(trace.Mul(e, e), 1))
	return trace.Div(e, trace.ExpandDims(trace.Maximum(norm, trace.Scalar(1e-12)), 1))
}

func TestBertGolden(t *testing.T) {
	g := readGolden(t, "bert")
	m, cfg, err := hf.LoadBert("testdata/bert", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Layers != 2 || cfg.D != 16 || cfg.Eps != 1e-12 {
		t.Errorf("config %+v", cfg)
	}
	run := rt.Jit(func(m nn.Bert, ids, types, mask *trace.Array) (*trace.Array, *trace.Array, *trace.Array) {
		h := m.Encode(ids, types, nn.Context{Padding: mask})
		return h, m.Pool(h), meanPool(h, mask)
	})
	mask := matrix(g.Inputs.Mask)
	h, pooled, emb := run(m, matrix(g.Inputs.IDs), matrix(g.Inputs.Types), mask)
	compare(t, "last_hidden_state", h, g.Hidden)
	compare(t, "pooler_output", pooled, g.Pooled)
	compare(t, "sentence_embedding", emb, g.Embedding)
}

func gpt2Hidden(m nn.GPT2, ids, mask *trace.Array) *trace.Array {
	T := ids.Shape()[1]
	x := trace.Add(m.Tok.Apply(ids), m.Pos.Apply(trace.Iota(ir.Int32, ir.Shape{T}, 0)))
	return m.Norm.Apply(m.Blocks.Apply(x, nn.Context{Padding: mask}))
}

func TestGPT2Golden(t *testing.T) {
	g := readGolden(t, "gpt2")
	// The transformer.-prefixed file of save_pretrained, and the original
	// gpt2 repository's layout (no prefix, mask buffers).
	for _, dir := range []string{"gpt2", "gpt2-legacy"} {
		t.Run(dir, func(t *testing.T) {
			m, _, err := hf.LoadGPT2(filepath.Join("testdata", dir), ir.Float32)
			if err != nil {
				t.Fatal(err)
			}
			run := rt.Jit(func(m nn.GPT2, ids, mask *trace.Array) (*trace.Array, *trace.Array) {
				return gpt2Hidden(m, ids, mask), m.Logits(ids, nn.Context{Padding: mask})
			})
			h, logits := run(m, matrix(g.Inputs.IDs), matrix(g.Inputs.Mask))
			compare(t, "last_hidden_state", h, g.Hidden)
			compare(t, "logits", logits, g.Logits)
		})
	}
}

func TestLlamaGolden(t *testing.T) {
	g := readGolden(t, "llama")
	// Sharded (model.safetensors.index.json), stored in f16, loaded as f32.
	m, cfg, err := hf.LoadLlama("testdata/llama", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KVHeads != 2 || cfg.HeadDim != 8 || cfg.Eps != 1e-6 || cfg.RopeTheta != 10000 {
		t.Errorf("config %+v", cfg)
	}
	run := rt.Jit(func(m nn.Llama, ids, mask *trace.Array) (*trace.Array, *trace.Array) {
		ctx := nn.Context{Padding: mask}
		h := m.Norm.Apply(m.Blocks.Apply(m.Embed.Apply(ids), ctx))
		return h, m.Logits(ids, ctx)
	})
	h, logits := run(m, matrix(g.Inputs.IDs), matrix(g.Inputs.Mask))
	compare(t, "last_hidden_state", h, g.Hidden)
	compare(t, "logits", logits, g.Logits)
}

// TestSaveRoundTrip saves each loaded model back under Hugging Face's
// names and checks that the file holds the original tensors (less the
// buffers the mapping ignores), with the same values.
func TestSaveRoundTrip(t *testing.T) {
	dir := *saveDir
	if dir == "" {
		dir = t.TempDir()
	}
	bert, _, err := hf.LoadBert("testdata/bert", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	gpt2, _, err := hf.LoadGPT2("testdata/gpt2", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	llama, _, err := hf.LoadLlama("testdata/llama", ir.Float32)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		model any
		m     checkpoint.Mapping
	}{{"bert", bert, hf.BertMapping()}, {"gpt2", gpt2, hf.GPT2Mapping()}, {"llama", llama, hf.LlamaMapping()}} {
		path := filepath.Join(dir, c.name+".safetensors")
		if err := hf.Save(path, c.model, c.m); err != nil {
			t.Fatal(err)
		}
		saved, err := checkpoint.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		orig, err := checkpoint.Open(filepath.Join("testdata", c.name))
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, n := range orig.Names() {
			if !strings.HasSuffix(n, "position_ids") {
				want = append(want, n)
			}
		}
		if got := saved.Names(); !slices.Equal(got, want) {
			t.Errorf("%s: saved tensors %v, want %v", c.name, got, want)
		}
		if md := saved.Metadata(); md["format"] != "pt" {
			t.Errorf("%s: metadata %v, want format pt", c.name, md)
		}
		for _, n := range want {
			a, err := saved.Read(n, ir.Float64)
			if err != nil {
				t.Fatal(err)
			}
			b, err := orig.Read(n, ir.Float64)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a.Type.Shape, b.Type.Shape) || !slices.Equal(ir.View[float64](a), ir.View[float64](b)) {
				t.Errorf("%s: tensor %s: saved %v differs from the original %v", c.name, n, a.Type, b.Type)
			}
		}
		saved.Close()
		orig.Close()
	}
}

// TestErrorsListEverything loads GPT-2's checkpoint as a Bert: one error
// lists every unmapped file tensor and every leaf the file does not fill.
func TestErrorsListEverything(t *testing.T) {
	cfg, err := hf.ReadBertConfig("testdata/bert")
	if err != nil {
		t.Fatal(err)
	}
	like, err := hf.Abstract(func(k *trace.Array) nn.Bert { return nn.NewBert(k, ir.Float32, cfg) })
	if err != nil {
		t.Fatal(err)
	}
	_, err = checkpoint.LoadMappedFile("testdata/gpt2", like, hf.BertMapping())
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		`file tensor "transformer.h.1.attn.c_attn.weight" (F32[16 48]) is not mapped`,
		`file tensor "transformer.wte.weight" (F32[48 16]) is not mapped`,
		"leaf Encoder.Blocks.Attn.Q.W (f32[2,16,16]) is not in the file (expected encoder.layer.0.attention.self.query.weight, encoder.layer.1.attention.self.query.weight)",
		"leaf Pooler.B (f32[16]) is not in the file (expected pooler.dense.bias)",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "is not mapped"); n != 28 {
		t.Errorf("%d unmapped tensors listed, want 28 (all of the file's):\n%s", n, msg)
	}
	if n := strings.Count(msg, "is not in the file"); n != 23 {
		t.Errorf("%d missing leaves listed, want 23 (all of nn.Bert's):\n%s", n, msg)
	}

	// A missing layer of a stacked leaf is named, with the file name expected.
	b, _, err := hf.LoadBert("testdata/bert", ir.Float32, checkpoint.IgnoreTensors("encoder.layer.1.attention.self.key.*"))
	if err == nil {
		t.Fatalf("loaded without layer 1's key: %v", b.Encoder.Blocks.Attn.K.W)
	}
	for _, want := range []string{
		"leaf part Encoder.Blocks.Attn.K.W[1] is not in the file (expected encoder.layer.1.attention.self.key.weight)",
		"leaf part Encoder.Blocks.Attn.K.B[1] is not in the file (expected encoder.layer.1.attention.self.key.bias)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%s", want, err)
		}
	}
}

// TestConfigRefused: settings the models do not implement are errors.
func TestConfigRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := hf.ReadBertConfig(write(`{"hidden_act": "relu"}`)); err == nil || !strings.Contains(err.Error(), "relu") {
		t.Errorf("BERT relu: %v", err)
	}
	if _, err := hf.ReadLlamaConfig(write(`{"rope_scaling": {"rope_type": "llama3", "factor": 8}}`)); err == nil || !strings.Contains(err.Error(), "rope_scaling") {
		t.Errorf("Llama rope_scaling: %v", err)
	}
	if _, err := hf.ReadGPT2Config(write(`{"scale_attn_by_inverse_layer_idx": true}`)); err == nil {
		t.Error("GPT-2 scale_attn_by_inverse_layer_idx: no error")
	}
	if c, err := hf.ReadLlamaConfig(write(`{"rope_scaling": null, "num_hidden_layers": 3}`)); err != nil || c.Layers != 3 {
		t.Errorf("Llama rope_scaling null: %+v, %v", c, err)
	}
}

func ExampleLoadBert() {
	// A tiny BERT in Hugging Face's layout (config.json, model.safetensors).
	m, cfg, err := hf.LoadBert("testdata/bert", ir.Float32)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Layers, "layers; Q weights", m.Encoder.Blocks.Attn.Q.W.Type())

	ids := rt.FromSlice([]int32{2, 17, 5, 3, 2, 9, 3, 0}, 2, 4)
	mask := rt.FromSlice([]int32{1, 1, 1, 1, 1, 1, 1, 0}, 2, 4)
	h := rt.Jit(func(m nn.Bert, ids, mask *trace.Array) *trace.Array {
		return m.Encode(ids, nil, nn.Context{Padding: mask})
	})(m, ids, mask)
	fmt.Println(h.Type())
	// Output:
	// 2 layers; Q weights f32[2,16,16]
	// f32[2,4,16]
}

func ExampleSave() {
	m, _, err := hf.LoadGPT2("testdata/gpt2", ir.Float32)
	if err != nil {
		fmt.Println(err)
		return
	}
	dir, _ := os.MkdirTemp("", "gpt2")
	defer os.RemoveAll(dir)
	// Fine-tune m, then write it back under Hugging Face's names: Q, K and V
	// join into c_attn again.
	path := filepath.Join(dir, "model.safetensors")
	if err := hf.Save(path, m, hf.GPT2Mapping()); err != nil {
		fmt.Println(err)
		return
	}
	r, _ := checkpoint.Open(path)
	defer r.Close()
	info, _ := r.Info("transformer.h.0.attn.c_attn.weight")
	fmt.Println(len(r.Names()), "tensors; c_attn", info.DType, info.Shape)
	// Output:
	// 28 tensors; c_attn F32 [16 48]
}

// TestLoadPeakMemory loads a BERT of a few MB and measures the device
// pool's peak (rt.MemoryStats): loading holds the parameters once, each
// tensor read into its place in the stacked arrays.
func TestLoadPeakMemory(t *testing.T) {
	cfg := nn.BertConfig{Vocab: 3000, MaxPositions: 128, TypeVocab: 2, Layers: 4, D: 128, Heads: 4, Hidden: 512}
	seed := testseed.Seed(t)
	dir := t.TempDir()
	m := rt.Jit(func(k *trace.Array) nn.Bert { return nn.NewBert(k, ir.Float32, cfg) })(random.NewKey(seed))
	if err := hf.Save(filepath.Join(dir, "model.safetensors"), m, hf.BertMapping()); err != nil {
		t.Fatal(err)
	}
	want, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	leaves, _, _ := trace.Flatten(m)
	var params int64
	for _, a := range leaves {
		params += a.Type().Bytes()
		if err := a.Delete(); err != nil {
			t.Fatal(err)
		}
	}
	like, err := hf.Abstract(func(k *trace.Array) nn.Bert { return nn.NewBert(k, ir.Float32, cfg) })
	if err != nil {
		t.Fatal(err)
	}
	goruntime.GC()
	before := rt.MemoryStats(ir.Device).BytesInUse
	var heap0, heap1 goruntime.MemStats
	goruntime.ReadMemStats(&heap0)
	rt.ResetPeakMemory()
	got, err := checkpoint.LoadMappedFile(dir, like, hf.BertMapping())
	if err != nil {
		t.Fatal(err)
	}
	peak := rt.MemoryStats(ir.Device).PeakBytesInUse - before
	goruntime.ReadMemStats(&heap1)
	heap := int64(heap1.TotalAlloc - heap0.TotalAlloc)
	t.Logf("parameters %d bytes; device pool peak during the load %d bytes (%.4f×); Go heap allocated %d bytes (%.3f×)",
		params, peak, float64(peak)/float64(params), heap, float64(heap)/float64(params))
	if float64(peak) > 1.05*float64(params) {
		t.Errorf("the load's peak is %d bytes, more than 1.05× the parameters' %d", peak, params)
	}
	if float64(heap) > 0.5*float64(params) && !raceEnabled { // -race allocates for its own bookkeeping
		t.Errorf("the load allocated %d bytes of Go heap, more than half the parameters' %d: a host copy?", heap, params)
	}
	// And it loaded the right values.
	q := got.Encoder.Blocks.Attn.Q.W.Float32s()
	for i := range cfg.Layers {
		l, err := want.Read(fmt.Sprintf("encoder.layer.%d.attention.self.query.weight", i), ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		n := cfg.D * cfg.D
		if !slices.Equal(q[i*n:(i+1)*n], ir.View[float32](l)) {
			t.Errorf("seed %d: layer %d's query weight differs from the file's", seed, i)
		}
	}
}

// greedyGolden is a golden's greedy continuation: the tokens gen.py's
// greedy loop over its float64 forward appends to the prompts.
type greedyGolden struct {
	Greedy struct {
		Prompt [][]int32 `json:"prompt"`
		Tokens [][]int32 `json:"tokens"`
		MinGap float64   `json:"min_gap"`
	} `json:"greedy"`
}

func readGreedy(t *testing.T, model string) greedyGolden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", model, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g greedyGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Greedy.Tokens) == 0 {
		t.Fatalf("%s/golden.json has no greedy continuation (regenerate with gen.py)", model)
	}
	return g
}

// checkGreedy decodes the golden's prompts greedily with the KV cache and
// compares the tokens with NumPy's loop over the full forward.
func checkGreedy[M nn.Decoder](t *testing.T, m M, g greedyGolden) {
	t.Helper()
	n, N := len(g.Greedy.Prompt[0]), len(g.Greedy.Tokens[0])
	gen := nn.NewGenerator(m, n+N-1, 0)
	res, err := gen.Generate(g.Greedy.Prompt, nn.GenerateConfig{MaxNewTokens: N})
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range g.Greedy.Tokens {
		if !slices.Equal(res.Tokens[b], want) {
			t.Errorf("row %d: greedy tokens %v, NumPy's greedy loop %v", b, res.Tokens[b], want)
		}
	}
	t.Logf("%d×%d tokens as NumPy's (smallest top-2 logit gap %.3g); %.0f tokens/s", len(res.Tokens), N, g.Greedy.MinGap, res.TokensPerSecond)
}

// The tiny random GPT-2 and Llama checkpoints decode greedily, with the KV
// cache, the tokens of gen.py's greedy loop over its float64 forward.
func TestGreedyGolden(t *testing.T) {
	t.Run("gpt2", func(t *testing.T) {
		m, _, err := hf.LoadGPT2("testdata/gpt2", ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		checkGreedy(t, m, readGreedy(t, "gpt2"))
	})
	t.Run("llama", func(t *testing.T) {
		m, _, err := hf.LoadLlama("testdata/llama", ir.Float32)
		if err != nil {
			t.Fatal(err)
		}
		checkGreedy(t, m, readGreedy(t, "llama"))
	})
}
