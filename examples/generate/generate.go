package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/tokenizer"
	"github.com/ferryml/ferry/trace"
)

// Config is one run.
type Config struct {
	Model, Checkpoint, Data string
	TrainSteps              int
	Prompt                  string
	MaxNew                  int
	Temperature             float64
	TopK                    int
	Seed                    uint64
	// The character LM's shape (examples/transformer's model, smaller).
	Seq, Layers, D, Heads, Batch int
	// Rows, above 1, also decodes a batch of that many prompts of
	// different lengths (prefixes of the prompt) greedily in one batch.
	Rows int
}

var defaultConfig = Config{
	TrainSteps: 300, Prompt: "The ", MaxNew: 48, Temperature: 0.8, TopK: 10, Seed: 1,
	Seq: 64, Layers: 2, D: 64, Heads: 4, Batch: 16,
}

// builtinText is what the character LM learns without -data and without
// the fortunes.
var builtinText = strings.Repeat("The quick brown fox jumps over the lazy dog. The cat sat on the mat. ", 30)

const fortuneDir = "/usr/share/games/fortunes"

func run(w io.Writer, cfg Config) error {
	o := &out{w: w}
	var err error
	if cfg.Model != "" {
		err = runHF(o, cfg)
	} else {
		err = runCharLM(o, cfg)
	}
	if err != nil {
		return err
	}
	return o.err
}

// decode generates greedily and sampled from prompt with m and prints both.
func decode[M nn.Decoder](o *out, m M, maxLen int, prompt []int32, cfg Config, text func([]int32) string) error {
	if len(prompt) == 0 {
		return errors.New("the prompt has no tokens")
	}
	n := min(cfg.MaxNew, maxLen-len(prompt)+1)
	if n < 1 {
		return fmt.Errorf("a prompt of %d tokens leaves no room in %d positions", len(prompt), maxLen)
	}
	g := nn.NewGenerator(m, maxLen, 0)
	for _, s := range []nn.Sampling{{}, {Temperature: cfg.Temperature, TopK: cfg.TopK}} {
		res, err := g.Generate([][]int32{prompt}, nn.GenerateConfig{MaxNewTokens: n, Sampling: s, Key: random.NewKey(cfg.Seed)})
		if err != nil {
			return err
		}
		what := "greedy"
		if s.Temperature > 0 {
			what = fmt.Sprintf("sampled (temperature %g, top-k %d)", s.Temperature, s.TopK)
		}
		o.printf("%s: %q\n", what, text(prompt)+text(res.Tokens[0]))
		o.printf("  %d tokens: prefill %.1f ms, %d decode steps at %.0f tokens/s\n",
			len(res.Tokens[0]), 1000*res.PrefillSeconds, res.DecodeSteps, res.TokensPerSecond)
	}
	o.printf("the decode step compiled %d times (once per sampling)\n", g.StepCompiles())
	if cfg.Rows > 1 {
		return decodeRows(o, g, prompt, n, cfg.Rows)
	}
	return nil
}

// decodeRows decodes rows prompts of different lengths, the prefixes of
// prompt of 1, 2, … tokens (cycling), in one batch, greedily, and checks
// each row against the prompt decoded alone.
func decodeRows[M nn.Decoder](o *out, g *nn.Generator[M], prompt []int32, n, rows int) error {
	prompts := make([][]int32, rows)
	lengths := make([]int, rows)
	for i := range prompts {
		prompts[i] = prompt[:1+i%len(prompt)]
		lengths[i] = len(prompts[i])
	}
	res, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: n})
	if err != nil {
		return err
	}
	same := 0
	for i, p := range prompts {
		alone, err := g.Generate([][]int32{p}, nn.GenerateConfig{MaxNewTokens: n})
		if err != nil {
			return err
		}
		if slices.Equal(alone.Tokens[0], res.Tokens[i]) {
			same++
		}
	}
	o.printf("a batch of %d prompts of lengths %v: prefill %.1f ms, %d decode steps at %.0f tokens/s; %d of %d rows as decoded alone\n",
		rows, lengths, 1000*res.PrefillSeconds, res.DecodeSteps, res.TokensPerSecond, same, rows)
	if same != rows {
		return errors.New("a batched row differs from its prompt decoded alone")
	}
	return nil
}

// runHF generates with a Hugging Face GPT-2 or Llama directory.
func runHF(o *out, cfg Config) error {
	data, err := os.ReadFile(filepath.Join(cfg.Model, "config.json"))
	if err != nil {
		return err
	}
	var c struct {
		ModelType string `json:"model_type"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("%s/config.json: %v", cfg.Model, err)
	}
	prompt, text, err := hfTokens(cfg.Model, cfg.Prompt)
	if err != nil {
		return err
	}
	switch c.ModelType {
	case "gpt2":
		m, mc, err := hf.LoadGPT2(cfg.Model, ir.Float32)
		if err != nil {
			return err
		}
		o.printf("GPT-2 from %s: %d layers, width %d, %d positions\n", cfg.Model, mc.Layers, mc.D, mc.MaxPositions)
		return decode(o, m, mc.MaxPositions, prompt, cfg, text)
	case "llama":
		m, mc, err := hf.LoadLlama(cfg.Model, ir.Float32)
		if err != nil {
			return err
		}
		o.printf("Llama from %s: %d layers, width %d, %d heads (%d key/value)\n", cfg.Model, mc.Layers, mc.D, mc.Heads, mc.KVHeads)
		return decode(o, m, len(prompt)+cfg.MaxNew-1, prompt, cfg, text)
	}
	return fmt.Errorf("%s: model_type %q; this example runs gpt2 and llama", cfg.Model, c.ModelType)
}

// hfTokens tokenizes the prompt with dir's tokenizer.json, or reads it as
// token ids when there is none; text turns ids back into text.
func hfTokens(dir, prompt string) (ids []int32, text func([]int32) string, err error) {
	path := filepath.Join(dir, "tokenizer.json")
	if _, err := os.Stat(path); err != nil {
		for _, f := range strings.Fields(prompt) {
			id, err := strconv.Atoi(f)
			if err != nil {
				return nil, nil, fmt.Errorf("%s has no tokenizer.json: give the prompt as token ids (-prompt \"5 11 2\"), not %q", dir, prompt)
			}
			ids = append(ids, int32(id))
		}
		return ids, func(ids []int32) string { // "5 11 2 "
			var sb strings.Builder
			for _, id := range ids {
				fmt.Fprintf(&sb, "%d ", id)
			}
			return sb.String()
		}, nil
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, nil, err
	}
	enc, err := tok.Encode(prompt)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range enc.IDs {
		ids = append(ids, int32(id))
	}
	return ids, func(ids []int32) string {
		in := make([]int, len(ids))
		for i, id := range ids {
			in[i] = int(id)
		}
		s, err := tok.Decode(in, true)
		if err != nil {
			return fmt.Sprint(ids)
		}
		return s
	}, nil
}

// vocab maps the bytes of a text to ids 0..n−1, as examples/transformer.
type vocab []byte

func newVocab(text string) vocab {
	var seen [256]bool
	for i := 0; i < len(text); i++ {
		seen[text[i]] = true
	}
	var v vocab
	for b := range 256 {
		if seen[b] {
			v = append(v, byte(b))
		}
	}
	return v
}

func (v vocab) encode(s string) []int32 {
	ids := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		ids[i] = int32(max(0, strings.IndexByte(string(v), s[i])))
	}
	return ids
}

func (v vocab) text(ids []int32) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = v[id]
	}
	return string(b)
}

// runCharLM generates with the character LM, loaded or trained.
func runCharLM(o *out, cfg Config) error {
	var m nn.TransformerLM
	var v vocab
	var err error
	if _, statErr := os.Stat(cfg.Checkpoint); cfg.Checkpoint != "" && statErr == nil {
		if m, v, cfg, err = loadCharLM(cfg); err != nil {
			return err
		}
		o.printf("loaded the character LM from %s: vocab %d, %d layers, width %d, %d positions\n", cfg.Checkpoint, len(v), cfg.Layers, cfg.D, cfg.Seq)
	} else {
		text, from := loadText(cfg.Data)
		v = newVocab(text)
		loss := 0.0
		if m, loss, err = train(cfg, v, v.encode(text)); err != nil {
			return err
		}
		o.printf("trained the character LM on %s for %d steps: loss %.3f nats/char, vocab %d\n", from, cfg.TrainSteps, loss, len(v))
		if cfg.Checkpoint != "" {
			meta := map[string]string{"vocab": string(v), "seq": strconv.Itoa(cfg.Seq), "layers": strconv.Itoa(cfg.Layers),
				"d": strconv.Itoa(cfg.D), "heads": strconv.Itoa(cfg.Heads)}
			if err := checkpoint.SaveFile(cfg.Checkpoint, m, meta); err != nil {
				return err
			}
			o.printf("saved it to %s\n", cfg.Checkpoint)
		}
	}
	return decode(o, m.GPT2(), cfg.Seq, v.encode(cfg.Prompt), cfg, v.text)
}

func newCharLM(cfg Config, V int) func(k *trace.Array) nn.TransformerLM {
	return func(k *trace.Array) nn.TransformerLM {
		return nn.NewTransformerLM(k, ir.Float32, V, cfg.Seq, cfg.Layers, cfg.D, cfg.Heads, 4*cfg.D)
	}
}

// loadCharLM reads the character LM and its vocabulary and shape from a
// checkpoint written by runCharLM.
func loadCharLM(cfg Config) (nn.TransformerLM, vocab, Config, error) {
	r, err := checkpoint.Open(cfg.Checkpoint)
	if err != nil {
		return nn.TransformerLM{}, nil, cfg, err
	}
	meta := r.Metadata()
	r.Close()
	v := vocab(meta["vocab"])
	for k, p := range map[string]*int{"seq": &cfg.Seq, "layers": &cfg.Layers, "d": &cfg.D, "heads": &cfg.Heads} {
		if *p, err = strconv.Atoi(meta[k]); err != nil {
			return nn.TransformerLM{}, nil, cfg, fmt.Errorf("%s: metadata %q: %v (not written by this example?)", cfg.Checkpoint, k, err)
		}
	}
	like, err := hf.Abstract(newCharLM(cfg, len(v)))
	if err != nil {
		return nn.TransformerLM{}, nil, cfg, err
	}
	m, err := checkpoint.LoadFile(cfg.Checkpoint, like)
	return m, v, cfg, err
}

// loadText reads the training text: path, else the fortunes, else the
// built-in text. It returns the text and where it came from.
func loadText(path string) (string, string) {
	if path != "" {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b), path
		}
	}
	var sb strings.Builder
	ents, _ := os.ReadDir(fortuneDir)
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || strings.HasSuffix(n, ".dat") || strings.HasSuffix(n, ".u8") {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(fortuneDir, n)); err == nil {
			sb.Write(b)
		}
	}
	if sb.Len() > 0 {
		return sb.String(), "the fortunes under " + fortuneDir
	}
	return builtinText, "a built-in text"
}

// train fits the character LM to ids with Adam for cfg.TrainSteps steps on
// random windows, the step jitted with the parameters and the optimizer
// state donated. It returns the model and the last step's loss.
func train(cfg Config, v vocab, ids []int32) (nn.TransformerLM, float64, error) {
	if len(ids) < cfg.Seq+2 {
		return nn.TransformerLM{}, 0, fmt.Errorf("%d characters of text, need more than %d", len(ids), cfg.Seq+1)
	}
	m := rt.Jit(newCharLM(cfg, len(v)))(random.NewKey(cfg.Seed))
	opt := optim.Adam[nn.TransformerLM](optim.Constant(3e-3), 0.9, 0.99, 1e-8)
	state, err := opt.Init(m)
	if err != nil {
		return m, 0, err
	}
	step := rt.Jit(func(m nn.TransformerLM, s optim.AdamState[nn.TransformerLM], x, y *trace.Array) (nn.TransformerLM, optim.AdamState[nn.TransformerLM], *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(m nn.TransformerLM) *trace.Array { return m.Loss(x, y) })(m)
		m, s, err := optim.Step(opt, g, s, m)
		return m, s, loss, err
	}, rt.Donate(0, 1))
	r := rand.New(rand.NewPCG(cfg.Seed, 2))
	x, y := make([]int32, cfg.Batch*cfg.Seq), make([]int32, cfg.Batch*cfg.Seq)
	loss := 0.0
	for i := range cfg.TrainSteps {
		for b := range cfg.Batch {
			at := r.IntN(len(ids) - cfg.Seq - 1)
			copy(x[b*cfg.Seq:], ids[at:at+cfg.Seq])
			copy(y[b*cfg.Seq:], ids[at+1:at+1+cfg.Seq])
		}
		var l *trace.Array
		if m, state, l, err = step(m, state, rt.FromSlice(x, cfg.Batch, cfg.Seq), rt.FromSlice(y, cfg.Batch, cfg.Seq)); err != nil {
			return m, 0, err
		}
		if i == cfg.TrainSteps-1 {
			loss = l.Item()
		}
		l.Delete()
	}
	return m, loss, nil
}
