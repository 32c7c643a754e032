package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Row is one tokenized text: its token ids and token type ids (nil means
// all 0), of the same length.
type Row struct {
	IDs, Types []int32
}

// Batch is the padded input of one call of a Model: Size rows of Len
// tokens, row-major. The first Rows rows are texts; the others are filler
// (one masked-in padding token each, so no row is wholly masked) whose
// results are dropped. Mask is 1 on real tokens and 0 on padding.
type Batch struct {
	Size, Len, Rows  int
	IDs, Types, Mask []int32
}

// Model computes one embedding per row of a batch: it returns at least
// b.Rows rows (filler rows may be left out). It is called by one goroutine
// at a time.
type Model func(b Batch) ([][]float32, error)

// Config sets a Batcher's buckets, wait and queue. Zero fields take the
// defaults.
type Config struct {
	// BatchSizes are the batch sizes a batch is padded to, the smallest
	// that holds it; the largest is the most rows a batch has. Default
	// 1, 2, 4, 8, 16, 32.
	BatchSizes []int
	// SeqLens are the sequence lengths a batch is padded to, the smallest
	// that holds its longest text; the largest is the longest text taken.
	// Default 16, 32, 64, 128.
	SeqLens []int
	// MaxWait is how long the oldest text of a batch that is not full
	// waits for more before the batch runs. Default 2 ms; negative means
	// no wait (a batch takes only what is already queued).
	MaxWait time.Duration
	// QueueSize is how many requests may wait for the model; one more gets
	// ErrQueueFull. Default 256.
	QueueSize int
	// PadID is the token id of padding. Default 0 (BERT's [PAD]).
	PadID int32
}

// ErrQueueFull is Embed's error when QueueSize requests already wait.
var ErrQueueFull = errors.New("serve: the queue is full")

// ErrClosed is Embed's error after Close.
var ErrClosed = errors.New("serve: the server is shutting down")

// TooLongError is Embed's error for a text longer than the longest
// sequence length bucket.
type TooLongError struct {
	Index, Tokens, Max int
}

func (e *TooLongError) Error() string {
	return fmt.Sprintf("texts[%d] has %d tokens, more than the %d the model takes", e.Index, e.Tokens, e.Max)
}

// Shape is a bucket: a batch size and a sequence length.
type Shape struct{ Size, Len int }

// Stats counts what a Batcher ran.
type Stats struct {
	Batches  int64           // model calls
	Requests int64           // requests answered
	Texts    int64           // texts embedded
	Tokens   int64           // real tokens in them
	Slots    int64           // tokens the model ran, padding included
	Buckets  map[Shape]int64 // batches run per bucket
	Errors   int64           // model calls that failed
}

// Batcher runs the texts of concurrent requests in batches through a
// Model. It is safe for concurrent use.
type Batcher struct {
	model Model
	cfg   Config
	queue *queue[*request]

	statsMu sync.Mutex
	stats   Stats
}

// request is one Embed call's texts, results and completion.
type request struct {
	rows []Row
	out  [][]float32
	err  error
	left int // rows not yet run; the loop goroutine's
	enq  time.Time
	done chan struct{}
}

// slot is one row of a request in a batch.
type slot struct {
	req *request
	i   int
}

// NewBatcher starts a Batcher of model; Close stops it.
func NewBatcher(model Model, cfg Config) (*Batcher, error) {
	if model == nil {
		return nil, errors.New("serve.NewBatcher: nil model")
	}
	var err error
	if cfg.BatchSizes, err = buckets("BatchSizes", cfg.BatchSizes, []int{1, 2, 4, 8, 16, 32}); err != nil {
		return nil, err
	}
	if cfg.SeqLens, err = buckets("SeqLens", cfg.SeqLens, []int{16, 32, 64, 128}); err != nil {
		return nil, err
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = 2 * time.Millisecond
	}
	if cfg.QueueSize < 0 {
		return nil, fmt.Errorf("serve.NewBatcher: QueueSize %d is negative", cfg.QueueSize)
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = 256
	}
	b := &Batcher{model: model, cfg: cfg, queue: newQueue[*request](cfg.QueueSize)}
	b.stats.Buckets = map[Shape]int64{}
	go b.loop()
	return b, nil
}

// buckets returns the sorted, deduplicated bucket sizes, or def when none
// are given.
func buckets(name string, given, def []int) ([]int, error) {
	if len(given) == 0 {
		return def, nil
	}
	s := slices.Clone(given)
	slices.Sort(s)
	if s[0] <= 0 {
		return nil, fmt.Errorf("serve.NewBatcher: %s %v must be positive", name, given)
	}
	return slices.Compact(s), nil
}

// bucket returns the smallest of sizes (sorted) that is at least n.
func bucket(sizes []int, n int) int {
	i, _ := slices.BinarySearch(sizes, n)
	return sizes[i]
}

// MaxLen returns the most tokens a text may have: the largest SeqLens.
func (b *Batcher) MaxLen() int { return b.cfg.SeqLens[len(b.cfg.SeqLens)-1] }

// MaxBatch returns the most rows of a batch: the largest BatchSizes.
func (b *Batcher) MaxBatch() int { return b.cfg.BatchSizes[len(b.cfg.BatchSizes)-1] }

// QueueSize returns how many requests may wait.
func (b *Batcher) QueueSize() int { return b.cfg.QueueSize }

// Buckets returns every shape a batch may take, batch sizes outermost.
func (b *Batcher) Buckets() []Shape {
	var s []Shape
	for _, n := range b.cfg.BatchSizes {
		for _, l := range b.cfg.SeqLens {
			s = append(s, Shape{n, l})
		}
	}
	return s
}

// Embed returns the embeddings of rows, one per row in order. The rows are
// queued as one request and may run in several batches, among other
// requests' rows. It returns ErrQueueFull at once when the queue is full,
// ErrClosed after Close, a *TooLongError for a row longer than MaxLen, and
// ctx's error when ctx ends first (the rows still run; their results are
// dropped).
func (b *Batcher) Embed(ctx context.Context, rows []Row) ([][]float32, error) {
	if len(rows) == 0 {
		return nil, errors.New("serve: no texts")
	}
	for i, r := range rows {
		if len(r.IDs) == 0 {
			return nil, fmt.Errorf("serve: texts[%d] has no tokens", i)
		}
		if len(r.IDs) > b.MaxLen() {
			return nil, &TooLongError{Index: i, Tokens: len(r.IDs), Max: b.MaxLen()}
		}
		if r.Types != nil && len(r.Types) != len(r.IDs) {
			return nil, fmt.Errorf("serve: texts[%d] has %d ids and %d type ids", i, len(r.IDs), len(r.Types))
		}
	}
	req := &request{rows: rows, out: make([][]float32, len(rows)), left: len(rows), enq: time.Now(), done: make(chan struct{})}
	if err := b.queue.enqueue(req); err != nil {
		return nil, err
	}
	select {
	case <-req.done:
		return req.out, req.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops taking requests (Embed returns ErrClosed) and waits until
// every queued request has run, or until ctx ends.
func (b *Batcher) Close(ctx context.Context) error { return b.queue.close(ctx) }

// Stats returns what the Batcher has run so far.
func (b *Batcher) Stats() Stats {
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	s := b.stats
	s.Buckets = make(map[Shape]int64, len(b.stats.Buckets))
	for k, v := range b.stats.Buckets {
		s.Buckets[k] = v
	}
	return s
}

// loop gathers batches and runs them until the queue is closed and empty.
func (b *Batcher) loop() {
	defer b.queue.loopEnded()
	var carry []slot // rows of a request that did not fit in the last batch
	for {
		batch := carry
		carry = nil
		if len(batch) == 0 {
			req, ok := b.queue.next()
			if !ok {
				return
			}
			batch = appendRows(batch, req)
		}
		batch = b.gather(batch)
		if max := b.MaxBatch(); len(batch) > max {
			carry = slices.Clone(batch[max:])
			batch = batch[:max]
		}
		b.run(batch)
	}
}

// appendRows appends req's rows to batch.
func appendRows(batch []slot, req *request) []slot {
	for i := range req.rows {
		batch = append(batch, slot{req, i})
	}
	return batch
}

// gather adds queued requests to batch until it is full or its oldest row
// has waited MaxWait.
func (b *Batcher) gather(batch []slot) []slot {
	b.queue.gather(batch[0].req.enq.Add(b.cfg.MaxWait),
		func() bool { return len(batch) >= b.MaxBatch() },
		func(req *request) { batch = appendRows(batch, req) })
	return batch
}

// run pads batch to its bucket, calls the model and hands each row's
// result to its request.
func (b *Batcher) run(batch []slot) {
	n, longest, tokens := len(batch), 0, 0
	for _, s := range batch {
		longest = max(longest, len(s.req.rows[s.i].IDs))
		tokens += len(s.req.rows[s.i].IDs)
	}
	in := Batch{Size: bucket(b.cfg.BatchSizes, n), Len: bucket(b.cfg.SeqLens, longest), Rows: n}
	in.IDs = make([]int32, in.Size*in.Len)
	in.Types = make([]int32, in.Size*in.Len)
	in.Mask = make([]int32, in.Size*in.Len)
	if b.cfg.PadID != 0 {
		for i := range in.IDs {
			in.IDs[i] = b.cfg.PadID
		}
	}
	for i, s := range batch {
		row := s.req.rows[s.i]
		copy(in.IDs[i*in.Len:], row.IDs)
		copy(in.Types[i*in.Len:], row.Types)
		for j := range row.IDs {
			in.Mask[i*in.Len+j] = 1
		}
	}
	for i := n; i < in.Size; i++ {
		in.Mask[i*in.Len] = 1
	}
	out, err := b.call(in)
	b.record(in, tokens, err)
	for i, s := range batch {
		r := s.req
		if err != nil {
			r.err = err
		} else {
			r.out[s.i] = out[i]
		}
		if r.left--; r.left == 0 {
			b.statsMu.Lock()
			b.stats.Requests++
			b.statsMu.Unlock()
			close(r.done)
		}
	}
}

// call runs the model, turning a panic or too few rows into an error.
func (b *Batcher) call(in Batch) (out [][]float32, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("serve: the model panicked on a batch of %d×%d: %v", in.Size, in.Len, p)
		}
	}()
	out, err = b.model(in)
	if err == nil && len(out) < in.Rows {
		err = fmt.Errorf("serve: the model returned %d rows for a batch of %d texts", len(out), in.Rows)
	}
	return out, err
}

// record counts a batch in the stats.
func (b *Batcher) record(in Batch, tokens int, err error) {
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	b.stats.Batches++
	b.stats.Texts += int64(in.Rows)
	b.stats.Tokens += int64(tokens)
	b.stats.Slots += int64(in.Size * in.Len)
	b.stats.Buckets[Shape{in.Size, in.Len}]++
	if err != nil {
		b.stats.Errors++
	}
}
