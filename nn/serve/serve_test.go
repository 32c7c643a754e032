package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
)

// numbers tokenizes a text of space-separated token ids ("3 17 5").
func numbers(text string) (Row, error) {
	var r Row
	for _, f := range strings.Fields(text) {
		id, err := strconv.Atoi(f)
		if err != nil {
			return Row{}, fmt.Errorf("%q is not a token id", f)
		}
		r.IDs = append(r.IDs, int32(id))
	}
	return r, nil
}

// text is the numbers text of ids.
func text(ids []int32) string {
	var s []string
	for _, id := range ids {
		s = append(s, strconv.Itoa(int(id)))
	}
	return strings.Join(s, " ")
}

// tinyBert is a random 2-layer BERT of width 16 with 32 positions.
func tinyBert(r *rand.Rand) nn.Bert {
	c := nn.BertConfig{Vocab: 64, MaxPositions: 32, TypeVocab: 2, Layers: 2, D: 16, Heads: 2, Hidden: 32}
	return nn.NewBert(random.NewKey(r.Uint64()), ir.Float32, c)
}

// randomIDs returns n token ids in 1..63.
func randomIDs(r *rand.Rand, n int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(1 + r.IntN(63))
	}
	return ids
}

// post sends texts to url and decodes the answer.
func post(t *testing.T, url string, body string) (int, EmbedResponse, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Errorf("POST: %v", err)
		return 0, EmbedResponse{}, ""
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	var out EmbedResponse
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(buf.Bytes(), &out); err != nil {
			t.Errorf("answer is not an EmbedResponse: %v: %s", err, buf.String())
		}
		return resp.StatusCode, out, ""
	}
	var e ErrorResponse
	if err := json.Unmarshal(buf.Bytes(), &e); err != nil || e.Error == "" {
		t.Errorf("status %d: body is not an ErrorResponse: %s", resp.StatusCode, buf.String())
	}
	return resp.StatusCode, out, e.Error
}

// body is the JSON request of texts.
func body(texts ...string) string {
	b, _ := json.Marshal(EmbedRequest{Texts: texts})
	return string(b)
}

// Concurrent requests through HTTP get, row for row, what the model gives
// each text alone (batch 1, no padding).
func TestConcurrentMatchesOneAtATime(t *testing.T) {
	r := testseed.Rand(t, 1)
	m := tinyBert(r)
	emb := NewBertEmbedder(m)
	b, err := NewBatcher(emb.Run, Config{BatchSizes: []int{1, 2, 4, 8}, SeqLens: []int{8, 16, 32}, MaxWait: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ts := httptest.NewServer(NewHandler(b, numbers, HandlerConfig{}))
	defer ts.Close()

	const requests = 24
	texts := make([][][]int32, requests)
	for i := range texts {
		for range 1 + r.IntN(6) {
			texts[i] = append(texts[i], randomIDs(r, 1+r.IntN(32)))
		}
	}
	got := make([]EmbedResponse, requests)
	var wg sync.WaitGroup
	for i := range texts {
		wg.Go(func() {
			var s []string
			for _, ids := range texts[i] {
				s = append(s, text(ids))
			}
			status, resp, msg := post(t, ts.URL, body(s...))
			if status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, status, msg)
			}
			got[i] = resp
		})
	}
	wg.Wait()

	one := rt.Jit(MeanPooled)
	worst := 0.0
	for i, req := range texts {
		if len(got[i].Embeddings) != len(req) || got[i].Dim != 16 {
			t.Fatalf("request %d: %d embeddings of %d for %d texts", i, len(got[i].Embeddings), got[i].Dim, len(req))
		}
		for j, ids := range req {
			n := len(ids)
			ones := make([]int32, n)
			for k := range ones {
				ones[k] = 1
			}
			want := one(m, rt.FromSlice(ids, 1, n), rt.FromSlice(make([]int32, n), 1, n), rt.FromSlice(ones, 1, n)).Float32s()
			if got[i].Tokens[j] != n {
				t.Errorf("request %d text %d: %d tokens, want %d", i, j, got[i].Tokens[j], n)
			}
			for k := range want {
				worst = max(worst, math.Abs(float64(got[i].Embeddings[j][k]-want[k])))
			}
		}
	}
	if worst > 1e-5 {
		t.Errorf("batched embeddings differ from one-at-a-time ones by %g, more than 1e-5", worst)
	}
	s := b.Stats()
	t.Logf("%d requests, %d texts in %d batches; largest difference %g", s.Requests, s.Texts, s.Batches, worst)
}

// Every bucket compiles once: a sweep of batch sizes and lengths compiles
// as many programs as buckets it used, and a second sweep none.
func TestBucketsCompileOnce(t *testing.T) {
	r := testseed.Rand(t, 2)
	emb := NewBertEmbedder(tinyBert(r))
	b, err := NewBatcher(emb.Run, Config{BatchSizes: []int{1, 2, 4}, SeqLens: []int{8, 16, 32}, MaxWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	sweep := func() {
		for n := 1; n <= 4; n++ {
			for _, l := range []int{1, 7, 8, 9, 16, 17, 32} {
				rows := make([]Row, n)
				for i := range rows {
					rows[i] = Row{IDs: randomIDs(r, 1+r.IntN(l))}
				}
				rows[r.IntN(n)] = Row{IDs: randomIDs(r, l)}
				if _, err := b.Embed(context.Background(), rows); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	sweep()
	first, used := emb.Compiles(), b.Stats().Buckets
	if want := int64(len(used)); first != want || want != 9 {
		t.Errorf("%d compiles for %d buckets used %v, want 9 of each", first, want, used)
	}
	for s := range used {
		if !contains(b.Buckets(), s) {
			t.Errorf("a batch ran as %v, not one of the buckets %v", s, b.Buckets())
		}
	}
	sweep()
	if again := emb.Compiles(); again != first {
		t.Errorf("the second sweep compiled %d more programs, want 0", again-first)
	}
}

func contains(s []Shape, x Shape) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// gate is a Model that answers each row with (sum of its real ids, its
// real length, Size, Len), blocking each call until released; started
// receives a value as each call begins.
type gate struct {
	started chan Batch
	release chan struct{}
	fail    error
}

func newGate() *gate { return &gate{started: make(chan Batch, 100), release: make(chan struct{})} }

func (g *gate) run(b Batch) ([][]float32, error) {
	g.started <- b
	<-g.release
	if g.fail != nil {
		return nil, g.fail
	}
	out := make([][]float32, b.Rows)
	for i := range out {
		var sum, n float32
		for j := range b.Len {
			if b.Mask[i*b.Len+j] != 0 {
				sum += float32(b.IDs[i*b.Len+j])
				n++
			}
		}
		out[i] = []float32{sum, n, float32(b.Size), float32(b.Len)}
	}
	return out, nil
}

// checkSums checks a gate's answers for texts.
func checkSums(t *testing.T, texts [][]int32, got [][]float32) {
	t.Helper()
	if len(got) != len(texts) {
		t.Fatalf("%d embeddings for %d texts", len(got), len(texts))
	}
	for i, ids := range texts {
		var sum float32
		for _, id := range ids {
			sum += float32(id)
		}
		if got[i][0] != sum || got[i][1] != float32(len(ids)) {
			t.Errorf("text %d: got sum %v of %v tokens, want %v of %d", i, got[i][0], got[i][1], sum, len(ids))
		}
	}
}

// waitQueued waits until n requests are queued.
func waitQueued(b *Batcher, n int) {
	for len(b.queue.ch) < n {
		time.Sleep(time.Millisecond)
	}
}

// Requests queued while the model runs go together into the next batch,
// padded to its bucket; a request larger than a batch is split over two.
func TestQueuedRequestsShareABatch(t *testing.T) {
	r := testseed.Rand(t, 3)
	g := newGate()
	b, err := NewBatcher(g.run, Config{BatchSizes: []int{1, 2, 4, 8}, SeqLens: []int{4, 8, 16}, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	embed := func(texts [][]int32, wg *sync.WaitGroup) {
		rows := make([]Row, len(texts))
		for i, ids := range texts {
			rows[i] = Row{IDs: ids}
		}
		wg.Go(func() {
			got, err := b.Embed(context.Background(), rows)
			if err != nil {
				t.Error(err)
				return
			}
			checkSums(t, texts, got)
		})
	}
	var wg sync.WaitGroup
	first := make([][]int32, 8) // a full batch: it runs without waiting
	for i := range first {
		first[i] = randomIDs(r, 1+r.IntN(16))
	}
	embed(first, &wg)
	<-g.started
	sizes := []int{2, 1, 4, 3} // 10 texts: a batch of 8 and one of 2
	var lens []int             // in queue order
	for i, n := range sizes {
		texts := make([][]int32, n)
		for j := range texts {
			texts[j] = randomIDs(r, 1+r.IntN(5))
			lens = append(lens, len(texts[j]))
		}
		embed(texts, &wg)
		waitQueued(b, i+1)
	}
	close(g.release)
	second, third := <-g.started, <-g.started
	wg.Wait()
	if second.Size != 8 || second.Rows != 8 || third.Size != 2 || third.Rows != 2 {
		t.Errorf("batches of %d/%d and %d/%d rows, want 8/8 and 2/2", second.Rows, second.Size, third.Rows, third.Size)
	}
	want2, want3 := bucket([]int{4, 8, 16}, slices.Max(lens[:8])), bucket([]int{4, 8, 16}, slices.Max(lens[8:]))
	if second.Len != want2 || third.Len != want3 {
		t.Errorf("batch lengths %d and %d, want %d and %d", second.Len, third.Len, want2, want3)
	}
	if s := b.Stats(); s.Batches != 3 || s.Requests != 5 || s.Texts != 18 {
		t.Errorf("stats %+v, want 3 batches, 5 requests, 18 texts", s)
	}
}

// A full queue answers 503 at once; the queued requests still run.
func TestQueueFull(t *testing.T) {
	g := newGate()
	b, err := NewBatcher(g.run, Config{BatchSizes: []int{1}, SeqLens: []int{4}, QueueSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ts := httptest.NewServer(NewHandler(b, numbers, HandlerConfig{}))
	defer ts.Close()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			status, resp, msg := post(t, ts.URL, body(text([]int32{int32(i), 5})))
			if status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, status, msg)
				return
			}
			checkSums(t, [][]int32{{int32(i), 5}}, resp.Embeddings)
		})
		if i == 0 {
			<-g.started
		} else {
			waitQueued(b, i)
		}
	}
	status, _, msg := post(t, ts.URL, body("1 2"))
	if status != http.StatusServiceUnavailable || !strings.Contains(msg, "queue is full") {
		t.Errorf("with a full queue: status %d %q, want 503 saying the queue is full", status, msg)
	}
	if _, err := b.Embed(context.Background(), []Row{{IDs: []int32{1}}}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("Embed with a full queue: %v, want ErrQueueFull", err)
	}
	close(g.release)
	wg.Wait()
}

// Bad input is a 400 (or 405, 413) naming the problem.
func TestBadInput(t *testing.T) {
	g := newGate()
	close(g.release)
	b, err := NewBatcher(g.run, Config{SeqLens: []int{8, 32}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ts := httptest.NewServer(NewHandler(b, numbers, HandlerConfig{MaxTexts: 3, MaxBodyBytes: 4096}))
	defer ts.Close()
	long := text(randomIDs(testseed.Rand(t, 4), 40))
	for _, c := range []struct {
		name, body string
		status     int
		says       string
	}{
		{"not JSON", "texts: hello", 400, "not JSON"},
		{"a list", `["a"]`, 400, "not JSON"},
		{"unknown field", `{"text": ["1"]}`, 400, `unknown field "text"`},
		{"missing", `{}`, 400, `"texts" is empty`},
		{"empty", `{"texts": []}`, 400, `"texts" is empty`},
		{"too many", body("1", "2", "3", "4"), 400, `"texts" has 4 texts, more than the 3`},
		{"too long", body("1 2", long), 400, "texts[1] has 40 tokens, more than the 32"},
		{"no tokens", body("1", ""), 400, "texts[1] has no tokens"},
		{"bad token", body("1", "2", "x"), 400, `texts[2] does not tokenize: "x"`},
		{"trailing", `{"texts": ["1"]} {}`, 400, "more after"},
		{"too big", body(strings.Repeat("1 ", 3000)), 413, "over 4096 bytes"},
	} {
		status, _, msg := post(t, ts.URL, c.body)
		if status != c.status || !strings.Contains(msg, c.says) {
			t.Errorf("%s: status %d %q, want %d saying %q", c.name, status, msg, c.status, c.says)
		}
	}
	resp, err := http.Get(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want 405", resp.StatusCode)
	}
	if status, resp, msg := post(t, ts.URL, body("1 2 3")); status != 200 || resp.Embeddings[0][0] != 6 {
		t.Errorf("a good request after bad ones: status %d %q, embeddings %v", status, msg, resp.Embeddings)
	}
}

// A model that fails or panics is a 500 naming the failure, and the
// Batcher goes on.
func TestModelFailure(t *testing.T) {
	calls := 0
	model := func(b Batch) ([][]float32, error) {
		calls++
		switch calls {
		case 1:
			return nil, errors.New("out of luck")
		case 2:
			panic("boom")
		case 3:
			return nil, nil
		}
		return make([][]float32, b.Rows), nil
	}
	b, err := NewBatcher(model, Config{MaxWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ts := httptest.NewServer(NewHandler(b, numbers, HandlerConfig{}))
	defer ts.Close()
	for _, says := range []string{"out of luck", "panicked", "returned 0 rows", ""} {
		status, _, msg := post(t, ts.URL, body("1"))
		if says == "" && status != 200 || says != "" && (status != 500 || !strings.Contains(msg, says)) {
			t.Errorf("status %d %q, want 500 saying %q (200 when empty)", status, msg, says)
		}
	}
	if s := b.Stats(); s.Errors != 3 || s.Batches != 4 {
		t.Errorf("stats %+v, want 3 errors in 4 batches", s)
	}
}

// Shutting down lets the request in the model and the queued ones finish;
// later requests get ErrClosed.
func TestShutdownDrains(t *testing.T) {
	g := newGate()
	b, err := NewBatcher(g.run, Config{BatchSizes: []int{1}, SeqLens: []int{4}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(NewHandler(b, numbers, HandlerConfig{}))
	defer ts.Close()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			status, resp, msg := post(t, ts.URL, body(text([]int32{int32(i), 1, 2})))
			if status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, status, msg)
				return
			}
			checkSums(t, [][]int32{{int32(i), 1, 2}}, resp.Embeddings)
		})
		if i == 0 {
			<-g.started
		} else {
			waitQueued(b, i)
		}
	}
	done := make(chan error, 1)
	go func() {
		ctx := context.Background()
		if err := ts.Config.Shutdown(ctx); err != nil {
			done <- err
			return
		}
		done <- b.Close(ctx)
	}()
	for { // until the listener is closed: shutdown has begun
		resp, err := http.Get(ts.URL) // a 405, answered without the model
		if err != nil {
			break
		}
		resp.Body.Close()
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	wg.Wait()
	if _, err := b.Embed(context.Background(), []Row{{IDs: []int32{1}}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Embed after Close: %v, want ErrClosed", err)
	}
	if s := b.Stats(); s.Requests != 4 {
		t.Errorf("%d requests answered, want 4", s.Requests)
	}
}
