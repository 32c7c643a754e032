package nn

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Decoder is a language model that decodes with a KV cache: GPT2 and Llama,
// and TransformerLM through its GPT2 method.
type Decoder interface {
	// NewKVCache returns a zero cache for batch rows and maxLen positions.
	NewKVCache(batch, maxLen int) KVCache
	// LogitsCached returns the logits [B, T, Vocab] of ids [B, T] at
	// positions pos … pos+T−1 over the cache, and the updated cache.
	LogitsCached(ids, pos *trace.Array, cache KVCache) (*trace.Array, KVCache)
}

// SampleLogits picks one token (int32) per row of logits [B, V]: the arg max
// when temperature is 0 (greedy decoding), otherwise a draw from
// softmax(logits/temperature) (random.Categorical with key) among the topK
// largest logits of the row (topK 0: all of them; ties with the k-th largest
// stay in). The result is [B].
func SampleLogits(key, logits *trace.Array, temperature float64, topK int) *trace.Array {
	const op = "nn.SampleLogits"
	if logits == nil || logits.Rank() != 2 || !logits.DType().IsFloat() {
		panic(trace.Errorf(op, "logits must be a float array [batch, vocab], got %v", logits))
	}
	if temperature < 0 || math.IsNaN(temperature) || math.IsInf(temperature, 0) {
		panic(trace.Errorf(op, "temperature %v must be finite and at least 0", temperature))
	}
	V := logits.Shape()[1]
	if topK < 0 || topK > V {
		panic(trace.Errorf(op, "topK %d must be in [0, %d]", topK, V))
	}
	if temperature == 0 {
		return trace.ArgMax(logits, 1)
	}
	w := trace.Convert(logits, workDType(logits.DType()))
	if topK > 0 && topK < V {
		kth := trace.SliceAxis(trace.Sort(w, 1), 1, V-topK, V-topK+1) // [B, 1]
		w = trace.Where(trace.GreaterEqual(w, kth), w, trace.ScalarAs(math.Inf(-1), w.DType()))
	}
	return random.Categorical(key, trace.Mul(w, trace.ScalarAs(1/temperature, w.DType())), 1)
}

// Sampling is how Generate picks each token: greedy when Temperature is 0.
// Its fields are static in the jitted step (a new value compiles it anew);
// the key is an argument.
type Sampling struct {
	Temperature float64 // 0: greedy (arg max)
	TopK        int     // sample among the TopK most likely tokens; 0: all
}

// GenerateConfig says how much Generate decodes and how it picks tokens.
type GenerateConfig struct {
	// MaxNewTokens is the most tokens generated per prompt (at least 1).
	MaxNewTokens int
	Sampling
	// Key is the PRNG key of sampled decoding (random.NewKey): the same key
	// gives the same tokens. It is not used by greedy decoding; nil means
	// random.NewKey(0).
	Key *trace.Array
	// StopTokens end a row's generation; the stop token is kept as its last
	// token, as transformers' generate keeps the eos token.
	StopTokens []int32
}

// GenerateResult is what Generate produced.
type GenerateResult struct {
	// Tokens are the new tokens of each prompt (without the prompt).
	Tokens [][]int32
	// PrefillSeconds is the time of the prefill (prompt to first token),
	// DecodeSeconds that of the decode steps after it.
	PrefillSeconds, DecodeSeconds float64
	// DecodeSteps is the number of one-token decode steps run.
	DecodeSteps int
	// TokensPerSecond is the decoding rate: the tokens of the decode steps
	// after the first (batch rows times steps) per second they took. The
	// first step is left out because on a generator's first use it traces
	// and compiles the step. It is 0 with fewer than two decode steps.
	TokensPerSecond float64
}

// Generator holds a Decoder's jitted prefill and decode step for a cache of
// MaxLen positions. The prefill runs a prompt padded on the right to a
// bucket length (a multiple of PromptBucket), so prompts of lengths in one
// bucket share one compiled program; the prompt's length is an array
// argument. The decode step takes one token per row at a position given as
// an int32 scalar array and donates the cache: its shapes never change, so
// it compiles once and decoding runs in the cache's memory, flat across
// tokens.
type Generator[M Decoder] struct {
	model        M
	maxLen       int
	promptBucket int

	prefill     *rt.Jitted[func(M, *trace.Array, *trace.Array) (*trace.Array, KVCache)]
	step        *rt.Jitted[func(M, *trace.Array, *trace.Array, KVCache) (*trace.Array, KVCache)]
	prefillNext *rt.Jitted[func(M, *trace.Array, *trace.Array, *trace.Array, Sampling) (*trace.Array, KVCache, *trace.Array)]
	next        *rt.Jitted[func(M, *trace.Array, *trace.Array, KVCache, *trace.Array, Sampling) (*trace.Array, KVCache, *trace.Array)]
}

// DefaultPromptBucket is the bucket of prompt lengths a Generator pads to
// when NewGenerator is given 0.
const DefaultPromptBucket = 16

// NewGenerator returns a Generator for m with a cache of maxLen positions
// (the prompt plus the new tokens must fit in it) and prompts padded to a
// multiple of promptBucket tokens (0 means DefaultPromptBucket).
func NewGenerator[M Decoder](m M, maxLen, promptBucket int) *Generator[M] {
	if maxLen <= 0 || promptBucket < 0 {
		panic(trace.Errorf("nn.NewGenerator", "maxLen %d must be positive and promptBucket %d at least 0", maxLen, promptBucket))
	}
	if promptBucket == 0 {
		promptBucket = DefaultPromptBucket
	}
	g := &Generator[M]{model: m, maxLen: maxLen, promptBucket: promptBucket}
	// prompt runs ids [B, P] from position 0 into a new cache: the logits
	// [B, V] at position length−1 and the cache.
	prompt := func(m M, ids, length *trace.Array) (*trace.Array, KVCache) {
		B := ids.Shape()[0]
		logits, c := m.LogitsCached(ids, trace.ScalarAs(0, ir.Int32), m.NewKVCache(B, maxLen))
		V := logits.Shape()[2]
		last := trace.Sub(trace.Convert(length, ir.Int32), trace.ScalarAs(1, ir.Int32))
		zero := trace.ScalarAs(0, ir.Int32)
		logits = trace.DynamicSlice(logits, []*trace.Array{zero, last, zero}, []int{B, 1, V})
		return trace.Reshape(logits, B, V), c
	}
	// one runs tok [B] at position pos: the logits [B, V] and the cache.
	one := func(m M, tok, pos *trace.Array, c KVCache) (*trace.Array, KVCache) {
		B := tok.Shape()[0]
		logits, c := m.LogitsCached(trace.Reshape(tok, B, 1), pos, c)
		return trace.Reshape(logits, B, logits.Shape()[2]), c
	}
	pick := func(logits, key *trace.Array, s Sampling) (*trace.Array, *trace.Array) {
		ks := random.Keys(key, 2)
		return SampleLogits(ks[1], logits, s.Temperature, s.TopK), ks[0]
	}
	g.prefill = rt.NewJitted(prompt)
	g.step = rt.NewJitted(one, rt.Donate(3))
	g.prefillNext = rt.NewJitted(func(m M, ids, length, key *trace.Array, s Sampling) (*trace.Array, KVCache, *trace.Array) {
		logits, c := prompt(m, ids, length)
		tok, key := pick(logits, key, s)
		return tok, c, key
	})
	g.next = rt.NewJitted(func(m M, tok, pos *trace.Array, c KVCache, key *trace.Array, s Sampling) (*trace.Array, KVCache, *trace.Array) {
		logits, c := one(m, tok, pos, c)
		tok, key = pick(logits, key, s)
		return tok, c, key
	}, rt.Donate(3))
	return g
}

// Model returns the generator's model.
func (g *Generator[M]) Model() M { return g.model }

// MaxLen returns the number of positions of the generator's cache.
func (g *Generator[M]) MaxLen() int { return g.maxLen }

// Bucket returns the padded length of a prompt of n tokens: n rounded up to
// a multiple of the prompt bucket, at most MaxLen.
func (g *Generator[M]) Bucket(n int) int {
	return min((n+g.promptBucket-1)/g.promptBucket*g.promptBucket, g.maxLen)
}

// Prefill runs the prompts ids [B, P] (int32, P at most MaxLen), of which
// the first length (an int32 scalar array, at least 1) tokens of each row
// are real and the rest padding, from position 0 into a new cache. It
// returns the logits [B, Vocab] of position length−1, which predict the
// first new token, and the cache, whose positions from length on are to be
// overwritten by the decode steps.
func (g *Generator[M]) Prefill(ids, length *trace.Array) (*trace.Array, KVCache, error) {
	if ids == nil || ids.Rank() != 2 || ids.Shape()[1] > g.maxLen {
		return nil, KVCache{}, fmt.Errorf("nn.Generator.Prefill: ids must be [batch, t ≤ %d], got %v", g.maxLen, ids)
	}
	out, err := g.prefill.Call(g.model, ids, length)
	if err != nil {
		return nil, KVCache{}, err
	}
	return out[0].(*trace.Array), out[1].(KVCache), nil
}

// Step runs one token per row, tok [B] (int32), at position pos (an int32
// scalar array below MaxLen) over cache, which it donates: it returns the
// logits [B, Vocab] of the next token and the updated cache, and cache must
// not be used again.
func (g *Generator[M]) Step(tok, pos *trace.Array, cache KVCache) (*trace.Array, KVCache, error) {
	out, err := g.step.Call(g.model, tok, pos, cache)
	if err != nil {
		return nil, KVCache{}, err
	}
	return out[0].(*trace.Array), out[1].(KVCache), nil
}

// LowerStep traces and lowers Step for these arguments without running it
// (rt.Jitted.Lower): its Compile gives the step's memory analysis, whose
// AliasBytes count the donated cache reused for the result.
func (g *Generator[M]) LowerStep(tok, pos *trace.Array, cache KVCache) (*rt.Lowered, error) {
	return g.step.Lower(g.model, tok, pos, cache)
}

// StepCompiles returns how many times the decode steps (Step's, and
// Generate's with each Sampling) were traced and compiled: once per
// signature, never per token.
func (g *Generator[M]) StepCompiles() int64 {
	return g.step.Stats().Misses + g.next.Stats().Misses
}

// Generate continues each prompt (all of the same length, at least one
// token) by up to cfg.MaxNewTokens tokens: one prefill of the padded
// prompts, then one decode step per token, each picking the next token as
// cfg.Sampling says. A row stops at one of cfg.StopTokens; generation ends
// when every row has stopped or has MaxNewTokens tokens. The prompt length
// plus MaxNewTokens − 1 must be at most MaxLen.
func (g *Generator[M]) Generate(prompts [][]int32, cfg GenerateConfig) (res GenerateResult, err error) {
	defer trace.Recover(&err)
	if len(prompts) == 0 || len(prompts[0]) == 0 {
		return res, errors.New("nn.Generate: no prompt, or an empty one")
	}
	B, n := len(prompts), len(prompts[0])
	for i, p := range prompts {
		if len(p) != n {
			return res, fmt.Errorf("nn.Generate: prompt %d has %d tokens, prompt 0 has %d: the prompts of a batch must have one length", i, len(p), n)
		}
	}
	if cfg.MaxNewTokens < 1 {
		return res, fmt.Errorf("nn.Generate: MaxNewTokens %d must be at least 1", cfg.MaxNewTokens)
	}
	if n+cfg.MaxNewTokens-1 > g.maxLen {
		return res, fmt.Errorf("nn.Generate: %d prompt tokens and %d new ones need %d cache positions, the generator has %d", n, cfg.MaxNewTokens, n+cfg.MaxNewTokens-1, g.maxLen)
	}
	key := cfg.Key
	if key == nil {
		key = random.NewKey(0)
	}
	P := g.Bucket(n)
	ids := make([]int32, B*P)
	for i, p := range prompts {
		copy(ids[i*P:], p)
	}
	res.Tokens = make([][]int32, B)
	done := make([]bool, B)
	// record appends each row's token, and reports whether every row is done.
	record := func(tok *trace.Array) bool {
		all := true
		for i, t := range tok.Int32s() {
			if done[i] {
				continue
			}
			res.Tokens[i] = append(res.Tokens[i], t)
			done[i] = slices.Contains(cfg.StopTokens, t) || len(res.Tokens[i]) == cfg.MaxNewTokens
			all = all && done[i]
		}
		return all
	}

	t0 := time.Now()
	out, err := g.prefillNext.Call(g.model, rt.FromSlice(ids, B, P), rt.FromScalar(int32(n)), key, cfg.Sampling)
	if err != nil {
		return res, err
	}
	tok, cache, key := out[0].(*trace.Array), out[1].(KVCache), out[2].(*trace.Array)
	finished := record(tok)
	t1 := time.Now()
	res.PrefillSeconds = t1.Sub(t0).Seconds()
	var t2 time.Time // after the first decode step
	for pos := n; !finished; pos++ {
		p := rt.FromScalar(int32(pos))
		out, err := g.next.Call(g.model, tok, p, cache, key, cfg.Sampling)
		if err != nil {
			return res, err
		}
		p.Delete()
		tok.Delete()
		key.Delete()
		tok, cache, key = out[0].(*trace.Array), out[1].(KVCache), out[2].(*trace.Array)
		res.DecodeSteps++
		finished = record(tok)
		if res.DecodeSteps == 1 {
			t2 = time.Now()
		}
	}
	res.DecodeSeconds = time.Since(t1).Seconds()
	if d := time.Since(t2).Seconds(); res.DecodeSteps > 1 && d > 0 {
		res.TokensPerSecond = float64(B*(res.DecodeSteps-1)) / d
	}
	for _, a := range []*trace.Array{tok, key, cache.K, cache.V} {
		a.Delete()
	}
	return res, nil
}
