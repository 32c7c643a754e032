package nn_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// decoderCase is a random tiny decoder with its full-sequence forward.
type decoderCase[M nn.Decoder] struct {
	name   string
	model  M
	vocab  int
	logits func(M, *trace.Array) *trace.Array // the whole sequence's logits
}

func randomGPT2(r *rand.Rand) decoderCase[nn.GPT2] {
	c := nn.GPT2Config{Vocab: 8 + r.IntN(24), MaxPositions: 24, Layers: 1 + r.IntN(3), D: 8, Heads: 1 << r.IntN(3)}
	m := randomize(r, nn.NewGPT2(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
	return decoderCase[nn.GPT2]{
		name: fmt.Sprintf("gpt2 %+v", c), model: m, vocab: c.Vocab,
		logits: func(m nn.GPT2, ids *trace.Array) *trace.Array { return m.Logits(ids, nn.Context{}) },
	}
}

func randomLlama(r *rand.Rand) decoderCase[nn.Llama] {
	kv := 1 + r.IntN(2)
	c := nn.LlamaConfig{Vocab: 8 + r.IntN(24), Layers: 1 + r.IntN(3), D: 16, Heads: 2 * kv, KVHeads: kv, HeadDim: 4 + 2*r.IntN(3),
		Hidden: 24, RopeTheta: []float64{10000, 500000}[r.IntN(2)], TieEmbeddings: r.IntN(2) == 0}
	m := randomize(r, nn.NewLlama(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
	return decoderCase[nn.Llama]{
		name: fmt.Sprintf("llama %+v", c), model: m, vocab: c.Vocab,
		logits: func(m nn.Llama, ids *trace.Array) *trace.Array { return m.Logits(ids, nn.Context{}) },
	}
}

// closeTo reports the largest error of got against want, relative above
// magnitude 1.
func closeTo(got, want []float32) float64 {
	worst := 0.0
	for i := range want {
		d := math.Abs(float64(got[i])-float64(want[i])) / math.Max(1, math.Abs(float64(want[i])))
		if !(d <= worst) {
			worst = d
		}
	}
	return worst
}

// row returns logits [B, T, V]'s rows at position t: [B·V].
func row(all []float32, B, T, V, t int) []float32 {
	out := make([]float32, 0, B*V)
	for b := range B {
		out = append(out, all[(b*T+t)*V:(b*T+t+1)*V]...)
	}
	return out
}

// checkDecode runs a prefill of a random prompt and one decode step per
// further token, and compares the logits at every position with the full
// forward's over the whole sequence.
func checkDecode[M nn.Decoder](t *testing.T, r *rand.Rand, c decoderCase[M]) {
	t.Run(c.name, func(t *testing.T) {
		B, n, steps := 1+r.IntN(2), 1+r.IntN(5), 3+r.IntN(6)
		T := n + steps
		maxLen := T + r.IntN(4)
		ids := randIDs32(r, B*T, c.vocab)
		full := rt.Jit(c.logits)(c.model, rt.FromSlice(ids, B, T)).Float32s()
		g := nn.NewGenerator(c.model, maxLen, 1+r.IntN(8))
		P := g.Bucket(n)
		prompt := make([]int32, B*P)
		for b := range B {
			copy(prompt[b*P:], ids[b*T:b*T+n])
			for i := n; i < P; i++ {
				prompt[b*P+i] = int32(r.IntN(c.vocab)) // padding: any token
			}
		}
		logits, cache, err := g.Prefill(rt.FromSlice(prompt, B, P), rt.FromScalar(int32(n)))
		if err != nil {
			t.Fatal(err)
		}
		const tol = 1e-4
		if e := closeTo(logits.Float32s(), row(full, B, T, c.vocab, n-1)); e > tol {
			t.Errorf("prefill of %d tokens (padded to %d): logits differ from the full forward's by %.3g", n, P, e)
		}
		for p := n; p < T; p++ {
			tok := make([]int32, B)
			for b := range B {
				tok[b] = ids[b*T+p]
			}
			logits, cache, err = g.Step(rt.FromSlice(tok, B), rt.FromScalar(int32(p)), cache)
			if err != nil {
				t.Fatal(err)
			}
			if e := closeTo(logits.Float32s(), row(full, B, T, c.vocab, p)); e > tol {
				t.Errorf("decode step at position %d: logits differ from the full forward's by %.3g", p, e)
			}
		}
		if got := g.StepCompiles(); got != 1 {
			t.Errorf("the decode step compiled %d times over %d steps, want 1", got, steps)
		}
	})
}

// The logits of the prefill and of each decode step equal those of the
// full-sequence forward (Logits) at the same positions, for random GPT-2s
// and Llamas (grouped-query heads, RoPE thetas, tied heads), batch sizes,
// prompt lengths, paddings and cache lengths.
func TestDecodeMatchesFullForward(t *testing.T) {
	r := testseed.Rand(t, 40)
	for range 3 {
		checkDecode(t, r, randomGPT2(r))
		checkDecode(t, r, randomLlama(r))
	}
}

// TransformerLM.GPT2 is the same model: equal logits.
func TestTransformerLMAsGPT2(t *testing.T) {
	r := testseed.Rand(t, 41)
	V, T := 5+r.IntN(20), 2+r.IntN(6)
	m := randomize(r, nn.NewTransformerLM(random.NewKey(r.Uint64()), ir.Float32, V, 8, 2, 16, 2, 32), 0.5)
	ids := rt.FromSlice(randIDs32(r, 2*T, V), 2, T)
	want := rt.Jit(func(m nn.TransformerLM, ids *trace.Array) *trace.Array { return m.Logits(ids) })(m, ids)
	got := rt.Jit(func(m nn.TransformerLM, ids *trace.Array) *trace.Array { return m.GPT2().Logits(ids, nn.Context{}) })(m, ids)
	if e := closeTo(got.Float32s(), want.Float32s()); e > 1e-5 {
		t.Errorf("GPT2() logits differ from TransformerLM's by %.3g", e)
	}
}

// greedyLoop is greedy decoding without a cache: each token is the arg max
// of the full forward's last logits over the whole sequence so far.
func greedyLoop[M nn.Decoder](c decoderCase[M], prompts [][]int32, n int) [][]int32 {
	fwd := rt.Jit(c.logits)
	seqs := make([][]int32, len(prompts))
	for i, p := range prompts {
		seqs[i] = slices.Clone(p)
	}
	out := make([][]int32, len(prompts))
	for range n {
		B, T := len(seqs), len(seqs[0])
		var flat []int32
		for _, s := range seqs {
			flat = append(flat, s...)
		}
		lg := fwd(c.model, rt.FromSlice(flat, B, T)).Float32s()
		for b := range B {
			last := lg[(b*T+T-1)*c.vocab : (b*T+T)*c.vocab]
			best := 0
			for v := range last {
				if last[v] > last[best] {
					best = v
				}
			}
			seqs[b] = append(seqs[b], int32(best))
			out[b] = append(out[b], int32(best))
		}
	}
	return out
}

// Generate's greedy tokens equal a greedy loop over the full forward; a
// stop token ends a row there; sampling with one key is reproducible, and
// top-k sampling only picks among the k largest logits.
func TestGenerate(t *testing.T) {
	r := testseed.Rand(t, 42)
	c := randomLlama(r)
	B, n, N := 2, 1+r.IntN(6), 12
	prompts := make([][]int32, B)
	for b := range prompts {
		prompts[b] = randIDs32(r, n, c.vocab)
	}
	want := greedyLoop(c, prompts, N)
	g := nn.NewGenerator(c.model, n+N, 0)
	res, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N})
	if err != nil {
		t.Fatal(err)
	}
	for b := range B {
		if !slices.Equal(res.Tokens[b], want[b]) {
			t.Errorf("row %d: greedy tokens %v, the loop over the full forward gives %v", b, res.Tokens[b], want[b])
		}
	}
	if res.DecodeSteps != N-1 || res.TokensPerSecond <= 0 {
		t.Errorf("%d decode steps (want %d), %v tokens/s", res.DecodeSteps, N-1, res.TokensPerSecond)
	}

	// Row 0 stops at its third token, row 1 where that token first appears in it.
	stop := want[0][2]
	res, err = g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N, StopTokens: []int32{stop}})
	if err != nil {
		t.Fatal(err)
	}
	for b := range B {
		w := want[b]
		if i := slices.Index(w, stop); i >= 0 {
			w = w[:i+1]
		}
		if !slices.Equal(res.Tokens[b], w) {
			t.Errorf("row %d with stop token %d: %v, want %v", b, stop, res.Tokens[b], w)
		}
	}

	// Sampling: the same key, the same tokens; top-1 is greedy; top-2 picks
	// one of the two largest logits of the full forward of its prefix.
	key := random.NewKey(r.Uint64())
	s := nn.Sampling{Temperature: 0.5 + r.Float64(), TopK: 2}
	a, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N, Sampling: s, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	again, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N, Sampling: s, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(a.Tokens, again.Tokens, slices.Equal) {
		t.Errorf("the same key gave %v, then %v", a.Tokens, again.Tokens)
	}
	for b := range B {
		seq := append(slices.Clone(prompts[b]), a.Tokens[b]...)
		fwd := rt.Jit(c.logits)
		lg := fwd(c.model, rt.FromSlice(seq, 1, len(seq))).Float32s()
		for i, tok := range a.Tokens[b] {
			p := n - 1 + i // the position whose logits chose tok
			l := lg[p*c.vocab : (p+1)*c.vocab]
			above := 0
			for _, v := range l {
				if v > l[tok] {
					above++
				}
			}
			if above >= 2 {
				t.Errorf("row %d, token %d: sampled %d, which %d logits exceed (top-2)", b, i, tok, above)
			}
		}
	}
	top1, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N, Sampling: nn.Sampling{Temperature: 2, TopK: 1}, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(top1.Tokens, want, slices.Equal) {
		t.Errorf("top-1 sampling gave %v, greedy %v", top1.Tokens, want)
	}
	// Greedy, temperature 0.5+ top-2 and top-1: one compile of the step each.
	if got := g.StepCompiles(); got != 3 {
		t.Errorf("the decode step compiled %d times for 3 samplings over 5 generations, want 3", got)
	}

	if _, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N + 2}); err == nil {
		t.Error("no error for more tokens than the cache holds")
	}
	if _, err := g.Generate([][]int32{{1, 2}, {}}, nn.GenerateConfig{MaxNewTokens: 1}); err == nil {
		t.Error("no error for an empty prompt")
	}
	if _, err := g.Generate(prompts, nn.GenerateConfig{Rows: []nn.RowLimit{{MaxNewTokens: 1}}}); err == nil {
		t.Error("no error for one row of limits for two prompts")
	}
}

// Prompts of different lengths in one batch generate what each generates
// alone (and what a greedy loop over the full forward gives), with each
// row's own limit and stop tokens; batches of other lengths reuse the
// compiled decode step.
func TestGenerateRaggedBatch(t *testing.T) {
	r := testseed.Rand(t, 44)
	for _, c := range []func() (string, func(*testing.T)){
		func() (string, func(*testing.T)) {
			c := randomGPT2(r)
			return c.name, func(t *testing.T) { checkRagged(t, r, c) }
		},
		func() (string, func(*testing.T)) {
			c := randomLlama(r)
			return c.name, func(t *testing.T) { checkRagged(t, r, c) }
		},
	} {
		t.Run(c())
	}
}

func checkRagged[M nn.Decoder](t *testing.T, r *rand.Rand, c decoderCase[M]) {
	const B, N, maxLen = 3, 8, 20
	g := nn.NewGenerator(c.model, maxLen, 4)
	for round := range 2 {
		prompts := make([][]int32, B)
		for b := range prompts {
			prompts[b] = randIDs32(r, 1+r.IntN(9), c.vocab)
		}
		res, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: N})
		if err != nil {
			t.Fatal(err)
		}
		rows := make([]nn.RowLimit, B)
		for b, p := range prompts {
			alone, err := g.Generate([][]int32{p}, nn.GenerateConfig{MaxNewTokens: N})
			if err != nil {
				t.Fatal(err)
			}
			loop := greedyLoop(c, [][]int32{p}, N)[0]
			if !slices.Equal(res.Tokens[b], alone.Tokens[0]) || !slices.Equal(res.Tokens[b], loop) {
				t.Errorf("round %d, row %d (%d of lengths %d, %d, %d): %v in the batch, %v alone, %v by the full forward",
					round, b, len(p), len(prompts[0]), len(prompts[1]), len(prompts[2]), res.Tokens[b], alone.Tokens[0], loop)
			}
			// Each row its own limit, and a stop token from its own tokens.
			rows[b] = nn.RowLimit{MaxNewTokens: 1 + r.IntN(N), StopTokens: []int32{loop[r.IntN(N)]}}
		}
		lim, err := g.Generate(prompts, nn.GenerateConfig{Rows: rows})
		if err != nil {
			t.Fatal(err)
		}
		for b, full := range res.Tokens {
			w := full[:rows[b].MaxNewTokens]
			if i := slices.Index(w, rows[b].StopTokens[0]); i >= 0 {
				w = w[:i+1]
			}
			if !slices.Equal(lim.Tokens[b], w) {
				t.Errorf("round %d, row %d with limit %d and stop token %d: %v, want %v", round, b, rows[b].MaxNewTokens, rows[b].StopTokens[0], lim.Tokens[b], w)
			}
		}
	}
	// One decode step for batches of 3 rows, one for single rows: never per
	// token, length or round.
	if got := g.StepCompiles(); got != 2 {
		t.Errorf("the decode step compiled %d times for two batch sizes, want 2", got)
	}
}

// Decoding runs in the donated cache's memory: the live device bytes and
// arrays after the first decode step and after the 50th are equal, the
// donated cache cannot be used again, and the step compiles once.
func TestDecodeMemoryFlat(t *testing.T) {
	r := testseed.Rand(t, 43)
	c := randomLlama(r)
	const steps = 50
	g := nn.NewGenerator(c.model, 4+steps, 4)
	logits, cache, err := g.Prefill(rt.FromSlice(randIDs32(r, 4, c.vocab), 1, 4), rt.FromScalar(int32(4)))
	if err != nil {
		t.Fatal(err)
	}
	logits.Delete()
	// The compiled step reuses the donated cache for the new one.
	low, err := g.LowerStep(rt.FromSlice([]int32{0}, 1), rt.FromScalar(int32(4)), cache)
	if err != nil {
		t.Fatal(err)
	}
	comp, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	cacheBytes := 2 * int64(cache.K.Shape().Size()) * 4
	if ma := comp.MemoryAnalysis(); ma.AliasBytes < cacheBytes {
		t.Errorf("the decode step aliases %d B of its arguments to its results, want the cache's %d B (%v)", ma.AliasBytes, cacheBytes, ma)
	}
	// So does the step with one position per row (a vector [B]), which
	// writes each row's keys and values at its own position.
	low, err = g.LowerStep(rt.FromSlice([]int32{0}, 1), rt.FromSlice([]int32{4}, 1), cache)
	if err != nil {
		t.Fatal(err)
	}
	if comp, err = low.Compile(); err != nil {
		t.Fatal(err)
	}
	if ma := comp.MemoryAnalysis(); ma.AliasBytes < cacheBytes {
		t.Errorf("the decode step with per-row positions aliases %d B of its arguments to its results, want the cache's %d B (%v)", ma.AliasBytes, cacheBytes, ma)
	}
	var bytes1, arrays1 int64
	for i := range steps {
		tok, pos := rt.FromSlice(randIDs32(r, 1, c.vocab), 1), rt.FromScalar(int32(4+i))
		old := cache
		logits, cache, err = g.Step(tok, pos, cache)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if _, _, err := g.Step(tok, pos, old); !errors.Is(err, rt.ErrDonated) {
				t.Errorf("stepping a donated cache again: %v, want rt.ErrDonated", err)
			}
		}
		logits.Delete()
		tok.Delete()
		pos.Delete()
		if i != 0 && i != steps-1 {
			continue
		}
		s := settledStats()
		if i == 0 {
			bytes1, arrays1 = s.BytesInUse, int64(len(rt.LiveArrays()))
		} else if i == steps-1 {
			if s.BytesInUse != bytes1 || int64(len(rt.LiveArrays())) != arrays1 {
				t.Errorf("after step 1: %d B in %d arrays; after step %d: %d B in %d arrays", bytes1, arrays1, steps, s.BytesInUse, len(rt.LiveArrays()))
			}
			t.Logf("live device memory after steps 1 and %d: %d B in %d arrays", steps, s.BytesInUse, arrays1)
		}
	}
	if got := g.StepCompiles(); got != 1 {
		t.Errorf("the decode step compiled %d times over %d steps, want 1", got, steps)
	}
}

// settledStats collects garbage (the arrays other tests left to the
// collector) until the device pool's live bytes stop changing, and returns
// its statistics.
func settledStats() rt.MemStats {
	prev := int64(-1)
	for range 100 {
		goruntime.GC()
		time.Sleep(time.Millisecond)
		s := rt.MemoryStats(ir.Device)
		if s.BytesInUse == prev {
			return s
		}
		prev = s.BytesInUse
	}
	return rt.MemoryStats(ir.Device)
}
