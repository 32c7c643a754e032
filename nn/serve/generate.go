package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
)

// GenerateFunc generates one batch: nn.Generator.Generate, or any function
// like it. The batcher gives it the prompts of a batch (of different
// lengths), each row's limit and stop tokens in cfg.Rows, one Sampling and
// a key. It is called by one goroutine at a time.
type GenerateFunc func(prompts [][]int32, cfg nn.GenerateConfig) (nn.GenerateResult, error)

// GenConfig sets a GenBatcher's batch sizes, wait, queue and limits. Zero
// fields take the defaults.
type GenConfig struct {
	// BatchSizes are the batch sizes a batch is padded to (with one-token
	// filler rows that stop after one token), the smallest that holds it;
	// the largest is the most requests in a batch. Default 1, 2, 4, 8.
	BatchSizes []int
	// MaxWait is how long the oldest request of a batch that is not full
	// waits for more before the batch runs. Default 5 ms; negative means
	// no wait.
	MaxWait time.Duration
	// QueueSize is how many requests may wait; one more gets ErrQueueFull.
	// Default 256.
	QueueSize int
	// MaxTokens is the most new tokens a request may ask for. It bounds a
	// batch: every row, and the batch with it, ends within MaxTokens
	// decode steps. Default 64.
	MaxTokens int
	// MaxLen is the generator's cache: a prompt's tokens plus its
	// max_tokens − 1 must fit in it. Required.
	MaxLen int
	// Vocab, when set, is the vocabulary size: prompt ids must lie in
	// [0, Vocab) and top_k be at most Vocab.
	Vocab int
	// PadID is the token of the filler rows. Default 0.
	PadID int32
	// Seed seeds the keys of sampled batches (batch i draws with
	// random.NewKey(Seed+i)).
	Seed uint64
}

// GenRequest is one prompt to continue.
type GenRequest struct {
	Prompt    []int32 // token ids, at least one
	MaxTokens int     // the most new tokens, 1 to GenConfig.MaxTokens
	nn.Sampling
	Stop []int32 // tokens that end the generation (kept as its last token)
}

// GenResult is what a request generated.
type GenResult struct {
	Tokens []int32 // the new tokens
	// FinishReason is "stop" when the last token is a stop token, "length"
	// when MaxTokens were generated.
	FinishReason string
}

// GenStats counts what a GenBatcher ran.
type GenStats struct {
	Batches  int64 // calls of the GenerateFunc
	Requests int64 // requests answered
	Tokens   int64 // tokens generated for requests
	// RowSteps is the tokens the model computed: each batch's padded size
	// times its prefill and decode steps (filler rows and rows that have
	// finished included).
	RowSteps int64
	Errors   int64 // batches that failed
}

// GenBatcher runs the prompts of concurrent requests in batches through a
// GenerateFunc. Requests that arrive within MaxWait of a batch's oldest one
// and sample alike (the same nn.Sampling: greedy requests together) join
// one batched prefill and decode; each row stops at its own stop tokens and
// max tokens, and the batch ends when its last row does (at most
// GenConfig.MaxTokens decode steps). A greedy request gets the tokens it
// would get alone; a sampled one draws with the batch's key. It is safe
// for concurrent use.
type GenBatcher struct {
	gen   GenerateFunc
	cfg   GenConfig
	queue *queue[*genRequest]

	statsMu sync.Mutex
	stats   GenStats
}

// genRequest is one Generate call's request, result and completion.
type genRequest struct {
	GenRequest
	out  GenResult
	err  error
	enq  time.Time
	done chan struct{}
}

// NewGenBatcher starts a GenBatcher of gen; Close stops it.
func NewGenBatcher(gen GenerateFunc, cfg GenConfig) (*GenBatcher, error) {
	if gen == nil {
		return nil, errors.New("serve.NewGenBatcher: nil GenerateFunc")
	}
	if cfg.MaxLen <= 0 {
		return nil, fmt.Errorf("serve.NewGenBatcher: MaxLen %d must be the generator's cache length", cfg.MaxLen)
	}
	var err error
	if cfg.BatchSizes, err = buckets("BatchSizes", cfg.BatchSizes, []int{1, 2, 4, 8}); err != nil {
		return nil, err
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 5 * time.Millisecond
	}
	if cfg.QueueSize < 0 || cfg.MaxTokens < 0 || cfg.Vocab < 0 {
		return nil, fmt.Errorf("serve.NewGenBatcher: QueueSize %d, MaxTokens %d and Vocab %d must not be negative", cfg.QueueSize, cfg.MaxTokens, cfg.Vocab)
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = 256
	}
	if cfg.MaxTokens == 0 {
		cfg.MaxTokens = 64
	}
	cfg.MaxTokens = min(cfg.MaxTokens, cfg.MaxLen)
	b := &GenBatcher{gen: gen, cfg: cfg, queue: newQueue[*genRequest](cfg.QueueSize)}
	go b.loop()
	return b, nil
}

// NewGeneratorBatcher starts a GenBatcher of g's Generate, with MaxLen set
// to g's cache.
func NewGeneratorBatcher[M nn.Decoder](g *nn.Generator[M], cfg GenConfig) (*GenBatcher, error) {
	cfg.MaxLen = g.MaxLen()
	return NewGenBatcher(g.Generate, cfg)
}

// Config returns the batcher's configuration, defaults filled in.
func (b *GenBatcher) Config() GenConfig { return b.cfg }

// MaxBatch returns the most requests of a batch: the largest BatchSizes.
func (b *GenBatcher) MaxBatch() int { return b.cfg.BatchSizes[len(b.cfg.BatchSizes)-1] }

// Check returns the error of a request the batcher would refuse, a
// *GenRequestError naming the field, or nil.
func (b *GenBatcher) Check(r GenRequest) error {
	c := b.cfg
	bad := func(field, format string, args ...any) error {
		return &GenRequestError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(r.Prompt) == 0:
		return bad("prompt", "the prompt has no tokens")
	case r.MaxTokens < 1 || r.MaxTokens > c.MaxTokens:
		return bad("max_tokens", "max_tokens %d must be in [1, %d]", r.MaxTokens, c.MaxTokens)
	case len(r.Prompt)+r.MaxTokens-1 > c.MaxLen:
		return bad("prompt", "the prompt has %d tokens: with max_tokens %d it needs %d positions, the model holds %d",
			len(r.Prompt), r.MaxTokens, len(r.Prompt)+r.MaxTokens-1, c.MaxLen)
	case !(r.Temperature >= 0) || r.Temperature > 1e6:
		return bad("temperature", "temperature %v must be in [0, 1e6]", r.Temperature)
	case r.TopK < 0 || c.Vocab > 0 && r.TopK > c.Vocab:
		return bad("top_k", "top_k %d must be in [0, %d]", r.TopK, c.Vocab)
	}
	if c.Vocab > 0 {
		for i, id := range r.Prompt {
			if id < 0 || int(id) >= c.Vocab {
				return bad("prompt", "prompt token %d is %d, outside the vocabulary [0, %d)", i, id, c.Vocab)
			}
		}
		for i, id := range r.Stop {
			if id < 0 || int(id) >= c.Vocab {
				return bad("stop", "stop token %d is %d, outside the vocabulary [0, %d)", i, id, c.Vocab)
			}
		}
	}
	return nil
}

// GenRequestError is Generate's error for a request it refuses: Field is
// the request's JSON field at fault.
type GenRequestError struct {
	Field, Msg string
}

func (e *GenRequestError) Error() string { return e.Msg }

// Generate continues r.Prompt, batched with concurrent requests. It
// returns a *GenRequestError for a bad request, ErrQueueFull at once when
// the queue is full, ErrClosed after Close, and ctx's error when ctx ends
// first (the request still runs; its result is dropped).
func (b *GenBatcher) Generate(ctx context.Context, r GenRequest) (GenResult, error) {
	if err := b.Check(r); err != nil {
		return GenResult{}, err
	}
	req := &genRequest{GenRequest: r, enq: time.Now(), done: make(chan struct{})}
	if err := b.queue.enqueue(req); err != nil {
		return GenResult{}, err
	}
	select {
	case <-req.done:
		return req.out, req.err
	case <-ctx.Done():
		return GenResult{}, ctx.Err()
	}
}

// Close stops taking requests (Generate returns ErrClosed) and waits until
// every queued request has run, or until ctx ends.
func (b *GenBatcher) Close(ctx context.Context) error { return b.queue.close(ctx) }

// Stats returns what the batcher has run so far.
func (b *GenBatcher) Stats() GenStats {
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	return b.stats
}

// loop gathers batches and runs them until the queue is closed and every
// request has run. Requests of another sampling than the batch's wait in
// pending, in order, for a later batch.
func (b *GenBatcher) loop() {
	defer b.queue.loopEnded()
	var pending []*genRequest
	open := true
	for {
		if len(pending) == 0 {
			req, ok := b.queue.next()
			if !ok {
				return
			}
			pending = append(pending, req)
		}
		var batch []*genRequest
		batch, pending = b.take(pending)
		if open && len(batch) < b.MaxBatch() {
			batch, pending, open = b.gather(batch, pending)
		}
		b.run(batch)
	}
}

// take moves from pending to a new batch its first request and the later
// ones that sample alike, up to MaxBatch.
func (b *GenBatcher) take(pending []*genRequest) (batch, rest []*genRequest) {
	s := pending[0].Sampling
	for _, r := range pending {
		if r.Sampling == s && len(batch) < b.MaxBatch() {
			batch = append(batch, r)
		} else {
			rest = append(rest, r)
		}
	}
	return batch, rest
}

// gather adds queued requests that sample as batch does until it is full
// or its oldest request has waited MaxWait; others go to pending. open is
// false once the queue is closed.
func (b *GenBatcher) gather(batch, pending []*genRequest) (_, _ []*genRequest, open bool) {
	open = b.queue.gather(batch[0].enq.Add(b.cfg.MaxWait),
		func() bool { return len(batch) >= b.MaxBatch() },
		func(req *genRequest) {
			if req.Sampling == batch[0].Sampling {
				batch = append(batch, req)
			} else {
				pending = append(pending, req)
			}
		})
	return batch, pending, open
}

// run pads batch to its bucket with filler rows, generates, and hands each
// request its tokens.
func (b *GenBatcher) run(batch []*genRequest) {
	n := len(batch)
	size := bucket(b.cfg.BatchSizes, n)
	prompts := make([][]int32, size)
	rows := make([]nn.RowLimit, size)
	for i := range size {
		if i < n {
			prompts[i], rows[i] = batch[i].Prompt, nn.RowLimit{MaxNewTokens: batch[i].MaxTokens, StopTokens: batch[i].Stop}
		} else {
			prompts[i], rows[i] = []int32{b.cfg.PadID}, nn.RowLimit{MaxNewTokens: 1}
		}
	}
	b.statsMu.Lock()
	seed := b.cfg.Seed + uint64(b.stats.Batches)
	b.statsMu.Unlock()
	cfg := nn.GenerateConfig{Rows: rows, Sampling: batch[0].Sampling}
	if cfg.Temperature > 0 {
		cfg.Key = random.NewKey(seed)
		defer cfg.Key.Delete()
	}
	res, err := b.call(prompts, cfg)
	var tokens int64
	for i, r := range batch {
		if err != nil {
			r.err = err
		} else {
			r.out = GenResult{Tokens: res.Tokens[i], FinishReason: "length"}
			if t := res.Tokens[i]; len(t) > 0 && slices.Contains(r.Stop, t[len(t)-1]) {
				r.out.FinishReason = "stop"
			}
			tokens += int64(len(res.Tokens[i]))
		}
	}
	b.statsMu.Lock()
	b.stats.Batches++
	b.stats.Requests += int64(n)
	b.stats.Tokens += tokens
	b.stats.RowSteps += int64(size * (res.DecodeSteps + 1))
	if err != nil {
		b.stats.Errors++
	}
	b.statsMu.Unlock()
	for _, r := range batch {
		close(r.done)
	}
}

// call generates, turning a panic or a wrong number of rows into an error.
func (b *GenBatcher) call(prompts [][]int32, cfg nn.GenerateConfig) (res nn.GenerateResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nn.GenerateResult{}, fmt.Errorf("serve: generation panicked on a batch of %d: %v", len(prompts), p)
		}
	}()
	res, err = b.gen(prompts, cfg)
	if err == nil && len(res.Tokens) != len(prompts) {
		err = fmt.Errorf("serve: generation returned %d rows for a batch of %d", len(res.Tokens), len(prompts))
	}
	return res, err
}
