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
	// positions pos … pos+T−1 over the cache, and the updated cache. pos is
	// an int32 scalar (every row at one position) or a vector [B] (each row
	// at its own).
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
	// MaxNewTokens is the most tokens generated per prompt (at least 1),
	// unless Rows is set.
	MaxNewTokens int
	Sampling
	// Key is the PRNG key of sampled decoding (random.NewKey): the same key
	// gives the same tokens. It is not used by greedy decoding; nil means
	// random.NewKey(0).
	Key *trace.Array
	// StopTokens end a row's generation; the stop token is kept as its last
	// token, as transformers' generate keeps the eos token.
	StopTokens []int32
	// Rows, when set, has one RowLimit per prompt, used instead of
	// MaxNewTokens and StopTokens: each row its own limit and stop tokens
	// (as requests batched by a server have).
	Rows []RowLimit
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
// MaxLen positions. The prefill runs prompts padded on the right to a
// bucket length (a multiple of PromptBucket), so prompts of lengths in one
// bucket share one compiled program; the prompts' lengths are an array
// argument, one per row, so the prompts of a batch may differ in length.
// The decode step takes one token per row at a position given as an int32
// array, one per row, and donates the cache: its shapes never change, so
// it compiles once and decoding runs in the cache's memory, flat across
// tokens.
//
// Prompts of different lengths are padded on the right, not on the left as
// transformers' generate pads them: each row keeps its own positions 0 …
// length−1 (learned and rotary positions need no offset), and its decode
// steps write its tokens into the cache from its own length on, over its
// padding. A query of a row attends to the cache positions below its own
// position and nothing else, so the padding is never seen and every row
// generates what it would alone.
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
	// [B, V] at position length−1 (of each row when length is a vector) and
	// the cache.
	prompt := func(m M, ids, length *trace.Array) (*trace.Array, KVCache) {
		B, P := ids.Shape()[0], ids.Shape()[1]
		logits, c := m.LogitsCached(ids, trace.ScalarAs(0, ir.Int32), m.NewKVCache(B, maxLen))
		V := logits.Shape()[2]
		last := trace.Sub(trace.Convert(length, ir.Int32), trace.ScalarAs(1, ir.Int32))
		if last.Rank() == 1 {
			at := trace.Equal(trace.Iota(ir.Int32, ir.Shape{B, P, 1}, 1), trace.Reshape(last, B, 1, 1))
			return trace.Sum(trace.Where(at, logits, trace.ScalarAs(0, logits.DType())), 1), c
		}
		zero := trace.ScalarAs(0, ir.Int32)
		logits = trace.DynamicSlice(logits, []*trace.Array{zero, last, zero}, []int{B, 1, V})
		return trace.Reshape(logits, B, V), c
	}
	// one runs tok [B] at position pos (a scalar, or one per row): the
	// logits [B, V] and the cache.
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
// the first length tokens of each row are real and the rest padding, from
// position 0 into a new cache. length is an int32 scalar array (every row
// has that many tokens) or a vector [B] (row b has length[b]); each length
// is at least 1. It returns the logits [B, Vocab] of each row's position
// length−1, which predict the first new token, and the cache, whose
// positions from a row's length on are to be overwritten by its decode
// steps.
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

// Step runs one token per row, tok [B] (int32), at position pos over cache:
// pos is an int32 scalar array (every row at that position) or a vector [B]
// (row b at pos[b], as after a Prefill of prompts of different lengths),
// below MaxLen. It donates the cache: it returns the
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

// Generate continues each prompt (at least one token each; the prompts of a
// batch may differ in length) by up to cfg.MaxNewTokens tokens: one prefill
// of the prompts padded on the right to the bucket of the longest, then one
// decode step per token, each row at its own position, each picking the
// next token as cfg.Sampling says. A row stops at one of cfg.StopTokens;
// generation ends when every row has stopped or has its most tokens.
// cfg.Rows may set each row's own limit and stop tokens instead. Each
// prompt's length plus its most new tokens − 1 must be at most MaxLen. A
// greedy row generates the tokens it would generate alone; a sampled row's
// draws depend on the batch (one key per step for all rows).
func (g *Generator[M]) Generate(prompts [][]int32, cfg GenerateConfig) (res GenerateResult, err error) {
	defer trace.Recover(&err)
	st, err := g.newGenState(prompts, cfg)
	if err != nil {
		return res, err
	}
	return st.run()
}

// RowLimit is one row's own limit and stop tokens (GenerateConfig.Rows).
type RowLimit struct {
	MaxNewTokens int     // the most tokens generated for the row (at least 1)
	StopTokens   []int32 // tokens that end the row (kept as its last token)
}

// genState is one Generate call: the rows' limits, positions and tokens.
type genState[M Decoder] struct {
	g       *Generator[M]
	prompts [][]int32
	cfg     GenerateConfig
	rows    []RowLimit
	pos     []int32 // the position of each row's next decode step
	done    []bool
	res     GenerateResult
}

// newGenState checks Generate's arguments.
func (g *Generator[M]) newGenState(prompts [][]int32, cfg GenerateConfig) (*genState[M], error) {
	if len(prompts) == 0 {
		return nil, errors.New("nn.Generate: no prompt")
	}
	rows := cfg.Rows
	if rows == nil {
		if cfg.MaxNewTokens < 1 {
			return nil, fmt.Errorf("nn.Generate: MaxNewTokens %d must be at least 1", cfg.MaxNewTokens)
		}
		rows = make([]RowLimit, len(prompts))
		for i := range rows {
			rows[i] = RowLimit{MaxNewTokens: cfg.MaxNewTokens, StopTokens: cfg.StopTokens}
		}
	} else if len(rows) != len(prompts) {
		return nil, fmt.Errorf("nn.Generate: %d rows of limits for %d prompts", len(rows), len(prompts))
	}
	st := &genState[M]{g: g, prompts: prompts, cfg: cfg, rows: rows, pos: make([]int32, len(prompts)), done: make([]bool, len(prompts))}
	for i, p := range prompts {
		n, max := len(p), rows[i].MaxNewTokens
		if n == 0 {
			return nil, fmt.Errorf("nn.Generate: prompt %d is empty", i)
		}
		if max < 1 {
			return nil, fmt.Errorf("nn.Generate: row %d: MaxNewTokens %d must be at least 1", i, max)
		}
		if n+max-1 > g.maxLen {
			return nil, fmt.Errorf("nn.Generate: prompt %d: %d prompt tokens and %d new ones need %d cache positions, the generator has %d", i, n, max, n+max-1, g.maxLen)
		}
		st.pos[i] = int32(n)
	}
	return st, nil
}

// record appends each row's token, and reports whether every row is done.
func (st *genState[M]) record(tok *trace.Array) bool {
	all := true
	for i, t := range tok.Int32s() {
		if st.done[i] {
			continue
		}
		st.res.Tokens[i] = append(st.res.Tokens[i], t)
		st.done[i] = slices.Contains(st.rows[i].StopTokens, t) || len(st.res.Tokens[i]) == st.rows[i].MaxNewTokens
		all = all && st.done[i]
	}
	return all
}

// run is the prefill and the decode steps.
func (st *genState[M]) run() (GenerateResult, error) {
	g, B := st.g, len(st.prompts)
	key := st.cfg.Key
	if key == nil {
		key = random.NewKey(0)
	}
	n := 0
	for _, p := range st.prompts {
		n = max(n, len(p))
	}
	P := g.Bucket(n)
	ids := make([]int32, B*P)
	for i, p := range st.prompts {
		copy(ids[i*P:], p)
	}
	st.res.Tokens = make([][]int32, B)

	t0 := time.Now()
	length := rt.FromSlice(slices.Clone(st.pos), B)
	out, err := g.prefillNext.Call(g.model, rt.FromSlice(ids, B, P), length, key, st.cfg.Sampling)
	length.Delete()
	if err != nil {
		return st.res, err
	}
	tok, cache, key := out[0].(*trace.Array), out[1].(KVCache), out[2].(*trace.Array)
	finished := st.record(tok)
	t1 := time.Now()
	st.res.PrefillSeconds = t1.Sub(t0).Seconds()
	var t2 time.Time // after the first decode step
	for !finished {
		p := rt.FromSlice(slices.Clone(st.pos), B)
		out, err := g.next.Call(g.model, tok, p, cache, key, st.cfg.Sampling)
		if err != nil {
			return st.res, err
		}
		p.Delete()
		tok.Delete()
		key.Delete()
		tok, cache, key = out[0].(*trace.Array), out[1].(KVCache), out[2].(*trace.Array)
		for i := range st.pos {
			st.pos[i] = min(st.pos[i]+1, int32(g.maxLen-1)) // a finished row's position stays in the cache
		}
		st.res.DecodeSteps++
		finished = st.record(tok)
		if st.res.DecodeSteps == 1 {
			t2 = time.Now()
		}
	}
	st.res.DecodeSeconds = time.Since(t1).Seconds()
	if d := time.Since(t2).Seconds(); st.res.DecodeSteps > 1 && d > 0 {
		st.res.TokensPerSecond = float64(B*(st.res.DecodeSteps-1)) / d
	}
	for _, a := range []*trace.Array{tok, key, cache.K, cache.V} {
		a.Delete()
	}
	return st.res, nil
}
