package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

const genVocab = 32

// tinyLlama is a random 2-layer Llama whose weights are uniform in ±0.5
// (large enough that greedy decoding is far from ties).
func tinyLlama(r *rand.Rand) nn.Llama {
	c := nn.LlamaConfig{Vocab: genVocab, Layers: 2, D: 16, Heads: 4, KVHeads: 2, Hidden: 32}
	m := nn.NewLlama(random.NewKey(r.Uint64()), ir.Float32, c)
	out, err := trace.MapAs(m, func(x *trace.Array) *trace.Array {
		v := make([]float32, x.Shape().Size())
		for i := range v {
			v[i] = float32(r.Float64() - 0.5)
		}
		return rt.FromSlice(v, x.Shape()...)
	})
	if err != nil {
		panic(err)
	}
	return out
}

// postGen posts body to url: the status, the response and the error body.
func postGen(t *testing.T, url, body string) (int, GenerateResponse, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Errorf("POST: %v", err)
		return 0, GenerateResponse{}, ""
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	var out GenerateResponse
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
			t.Errorf("answer is not a GenerateResponse: %v: %s", err, buf.String())
		}
		return resp.StatusCode, out, ""
	}
	var e ErrorResponse
	if err := json.Unmarshal(buf.Bytes(), &e); err != nil || e.Error == "" {
		t.Errorf("status %d with a body that is not an ErrorResponse: %s", resp.StatusCode, buf.String())
	}
	return resp.StatusCode, out, e.Error
}

// genCase is one client's request and what generating it alone gives.
type genCase struct {
	body  GenerateRequest
	alone []int32
}

// Concurrent clients post prompts of different lengths, limits and stop
// tokens; the greedy ones that fill a batch run as one batched generation,
// and each answer equals the prompt generated alone. Sampled requests run
// in a batch of their own and give tokens of the vocabulary.
func TestGenerateServerBatches(t *testing.T) {
	r := testseed.Rand(t, 60)
	g := nn.NewGenerator(tinyLlama(r), 20, 4)
	const greedy, sampled = 4, 2
	cases := make([]genCase, greedy)
	for i := range cases {
		p := make([]int32, 1+r.IntN(9))
		for j := range p {
			p[j] = int32(r.IntN(genVocab))
		}
		n := 1 + r.IntN(8)
		full, err := g.Generate([][]int32{p}, nn.GenerateConfig{MaxNewTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		want := full.Tokens[0]
		var stop []int32
		if r.IntN(2) == 0 { // stop at a token of its own continuation
			stop = []int32{want[r.IntN(len(want))]}
			want = want[:slices.Index(want, stop[0])+1]
		}
		cases[i] = genCase{GenerateRequest{IDs: p, MaxTokens: n, Stop: stop}, want}
	}
	compiles := g.StepCompiles()
	// Greedy requests wait for a full batch of 4; the sampled ones for the
	// rest of a second (a wait long enough for every client to be queued).
	b, err := NewGeneratorBatcher(g, GenConfig{BatchSizes: []int{1, 2, 4}, MaxWait: time.Second, MaxTokens: 8, Vocab: genVocab})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewGenerateHandler(b, Codec{}, GenHandlerConfig{}))
	defer srv.Close()
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() {
			body, _ := json.Marshal(c.body)
			status, resp, msg := postGen(t, srv.URL, string(body))
			if status != http.StatusOK {
				t.Errorf("request %d: %d %s", i, status, msg)
				return
			}
			if !slices.Equal(resp.Tokens, c.alone) {
				t.Errorf("request %d (prompt of %d tokens, max %d, stop %v): %v batched, %v alone", i, len(c.body.IDs), c.body.MaxTokens, c.body.Stop, resp.Tokens, c.alone)
			}
			reason := "length"
			if len(c.body.Stop) > 0 && resp.Tokens[len(resp.Tokens)-1] == c.body.Stop[0] {
				reason = "stop"
			}
			if resp.FinishReason != reason || resp.PromptTokens != len(c.body.IDs) {
				t.Errorf("request %d: finish reason %q and %d prompt tokens, want %q and %d", i, resp.FinishReason, resp.PromptTokens, reason, len(c.body.IDs))
			}
		})
	}
	for i := range sampled {
		wg.Go(func() {
			status, resp, msg := postGen(t, srv.URL, `{"ids": [3, 1, 4], "max_tokens": 5, "temperature": 0.8, "top_k": 5}`)
			if status != http.StatusOK || len(resp.Tokens) != 5 {
				t.Errorf("sampled request %d: %d %s, %d tokens", i, status, msg, len(resp.Tokens))
			}
			for _, tok := range resp.Tokens {
				if tok < 0 || tok >= genVocab {
					t.Errorf("sampled request %d: token %d outside the vocabulary", i, tok)
				}
			}
		})
	}
	wg.Wait()
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := b.Stats()
	if s.Requests != greedy+sampled || s.Batches != 2 || s.Errors != 0 {
		t.Errorf("stats %+v: want %d requests in 2 batches (one greedy of %d, one sampled)", s, greedy+sampled, greedy)
	}
	// A step for batches of 4 (greedy) and 2 (sampled) rows.
	if got := g.StepCompiles() - compiles; got != 2 {
		t.Errorf("serving compiled the decode step %d times, want 2", got)
	}
}

// Bad requests are 400s that name the field and the problem; another
// method is a 405.
func TestGenerateServerBadRequests(t *testing.T) {
	r := testseed.Rand(t, 61)
	g := nn.NewGenerator(tinyLlama(r), 12, 4)
	b, err := NewGeneratorBatcher(g, GenConfig{MaxTokens: 8, Vocab: genVocab})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	codec := Codec{Encode: func(s string) ([]int32, error) {
		if strings.ContainsAny(s, "!") {
			return nil, errors.New("'!' is not in the vocabulary")
		}
		return make([]int32, len(s)), nil
	}}
	srv := httptest.NewServer(NewGenerateHandler(b, codec, GenHandlerConfig{}))
	defer srv.Close()
	for _, c := range []struct{ body, want string }{
		{`{"ids": [1, 2]`, "not JSON"},
		{`{"ids": [1], "n": 3}`, `unknown field "n"`},
		{`{"max_tokens": 3}`, `"prompt" and "ids" are missing`},
		{`{"prompt": "ab", "ids": [1]}`, "not both"},
		{`{"prompt": "a!"}`, "does not tokenize: '!'"},
		{`{"ids": []}`, `"prompt": the prompt has no tokens`},
		{`{"ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "max_tokens": 4}`, "10 tokens: with max_tokens 4 it needs 13 positions, the model holds 12"},
		{`{"ids": [1, 40]}`, "prompt token 1 is 40, outside the vocabulary [0, 32)"},
		{`{"ids": [1], "max_tokens": 9}`, `"max_tokens": max_tokens 9 must be in [1, 8]`},
		{`{"ids": [1], "temperature": -1}`, `"temperature"`},
		{`{"ids": [1], "top_k": 33}`, `"top_k": top_k 33 must be in [0, 32]`},
		{`{"ids": [1], "stop": [-2]}`, `"stop": stop token 0 is -2`},
		{`{"ids": [1]} {}`, "more after its JSON object"},
	} {
		status, _, msg := postGen(t, srv.URL, c.body)
		if status != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %d %q, want 400 naming %q", c.body, status, msg, c.want)
		}
	}
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
	// A text prompt with the default max_tokens runs.
	if status, resp, msg := postGen(t, srv.URL, `{"prompt": "abc"}`); status != http.StatusOK || len(resp.Tokens) != 8 || resp.PromptTokens != 3 {
		t.Errorf(`{"prompt": "abc"}: %d %s, %d tokens for 3 prompt tokens, want 8 (the default, capped at MaxTokens)`, status, msg, len(resp.Tokens))
	}
}

// A full queue answers 503 at once; Close runs what is queued, and later
// requests are 503s.
func TestGenerateServerQueueAndShutdown(t *testing.T) {
	entered, release := make(chan struct{}, 4), make(chan struct{})
	gen := func(prompts [][]int32, cfg nn.GenerateConfig) (nn.GenerateResult, error) {
		entered <- struct{}{}
		<-release
		res := nn.GenerateResult{Tokens: make([][]int32, len(prompts))}
		for i, p := range prompts {
			res.Tokens[i] = []int32{p[0] + 1}
		}
		return res, nil
	}
	b, err := NewGenBatcher(gen, GenConfig{BatchSizes: []int{1}, MaxWait: -1, QueueSize: 1, MaxLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewGenerateHandler(b, Codec{}, GenHandlerConfig{}))
	defer srv.Close()
	var wg sync.WaitGroup
	results := make([]int32, 2)
	for i := range 2 {
		wg.Go(func() {
			status, resp, msg := postGen(t, srv.URL, `{"ids": [`+string(rune('1'+i))+`], "max_tokens": 1}`)
			if status != http.StatusOK || len(resp.Tokens) != 1 {
				t.Errorf("request %d: %d %s", i, status, msg)
				return
			}
			results[i] = resp.Tokens[0]
		})
		if i == 0 {
			<-entered // the first runs, the second waits in the queue
		}
	}
	// Once the second request is queued, the third finds the queue full.
	for len(b.queue.ch) == 0 {
		time.Sleep(time.Millisecond)
	}
	if status, _, msg := postGen(t, srv.URL, `{"ids": [7]}`); status != http.StatusServiceUnavailable || !strings.Contains(msg, "queue is full") {
		t.Errorf("with the queue full: %d %q, want 503 saying so", status, msg)
	}
	closed := make(chan error)
	go func() { closed <- b.Close(context.Background()) }()
	close(release)
	wg.Wait()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if results[0] != 2 || results[1] != 3 {
		t.Errorf("the queued requests answered %v, want [2 3]", results)
	}
	if status, _, msg := postGen(t, srv.URL, `{"ids": [1]}`); status != http.StatusServiceUnavailable || !strings.Contains(msg, "shutting down") {
		t.Errorf("after Close: %d %q, want 503", status, msg)
	}
}
