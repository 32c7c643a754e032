// Command serve serves sentence embeddings over HTTP with package nn/serve:
// POST /embed with {"texts": [...]} answers {"embeddings": [[...]], ...},
// the texts of concurrent requests batched into one jitted call of
// all-MiniLM-L6-v2 (bucketed batch sizes and lengths, so each bucket
// compiles once), a bounded queue (503 when full), 400s that name the bad
// input, and a graceful shutdown on SIGINT or SIGTERM.
//
//	go run ./examples/serve -model DIR [-addr :8080]
//	curl -d '{"texts": ["A man is eating food."]}' localhost:8080/embed
//
// With -load it load-tests itself on loopback instead: -clients concurrent
// clients post requests of 1 to -texts sentences for -duration, then it
// prints the throughput (texts/s, requests/s) and the p50 and p99 latency.
//
//	go run ./examples/serve -load -clients 16 -duration 10s
//
// DIR (default $FERRY_HF_MODELS/all-MiniLM-L6-v2, FERRY_HF_MODELS
// defaulting to ~/.cache/ferry-hf-models) holds config.json,
// model.safetensors and tokenizer.json (see examples/embed for how to get
// them); without them it serves a small
// random BERT with a letter tokenizer, and says so.
//
// When DIR holds a Hugging Face GPT-2 or Llama (config.json's model_type
// gpt2 or llama), it serves generation instead: POST /generate with
// {"prompt": "...", "max_tokens": n, "temperature": t} (a prompt as text
// needs DIR's tokenizer.json; {"ids": [...]} gives token ids) answers
// {"tokens": [...], "text": "...", "finish_reason": ...}, concurrent
// requests batched into one batched prefill and decode (nn/serve's
// GenBatcher). With -load, clients post greedy requests of random prompts
// and lengths, and it prints tokens/s and the p50 and p99 latency.
//
//	go run ./examples/serve -model nn/hf/testdata/llama -load -clients 8
//	go run ./examples/serve -model nn/hf/testdata/gpt2
//	curl -d '{"ids": [5, 11, 2], "max_tokens": 8}' localhost:8080/generate
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/nn/serve"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/tokenizer"
)

// options are the command's flags.
type options struct {
	model, addr    string
	load           bool
	clients, texts int
	duration       time.Duration
	wait           time.Duration
	queue          int
	maxTokens      int // generation: the most new tokens of a request
	maxLen         int // generation: the KV cache's positions
}

// server is a model behind a batcher and its handler.
type server struct {
	name    string
	emb     *serve.BertEmbedder
	batcher *serve.Batcher
	handler http.Handler
}

// defaultModel is $FERRY_HF_MODELS/all-MiniLM-L6-v2, by default in
// ~/.cache/ferry-hf-models (hf.ModelDir).
func defaultModel() string { return hf.ModelDir("all-MiniLM-L6-v2") }

// hasModel reports whether dir holds the model's files.
func hasModel(dir string) bool {
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}

// newServer loads the model in o.model, or makes the small random one.
func newServer(o options) (*server, error) {
	var (
		s        = &server{}
		tokenize func(string) (serve.Row, error)
		cfg      = serve.Config{MaxWait: o.wait, QueueSize: o.queue}
	)
	if hasModel(o.model) {
		t, err := tokenizer.Load(o.model)
		if err != nil {
			return nil, err
		}
		if tokenize, err = serve.Tokenize(t); err != nil {
			return nil, err
		}
		m, _, err := hf.LoadBert(o.model, ir.Float32)
		if err != nil {
			return nil, err
		}
		s.name, s.emb = "all-MiniLM-L6-v2 ("+o.model+")", serve.NewBertEmbedder(m)
	} else {
		c := nn.BertConfig{Vocab: 32, MaxPositions: 128, TypeVocab: 2, Layers: 2, D: 32, Heads: 4, Hidden: 64}
		s.name = fmt.Sprintf("a small random BERT (%d layers, width %d): %s does not hold all-MiniLM-L6-v2", c.Layers, c.D, o.model)
		s.emb, tokenize = serve.NewBertEmbedder(nn.NewBert(random.NewKey(0), ir.Float32, c)), letters
	}
	var err error
	if s.batcher, err = serve.NewBatcher(s.emb.Run, cfg); err != nil {
		return nil, err
	}
	s.handler = serve.NewHandler(s.batcher, tokenize, serve.HandlerConfig{})
	return s, nil
}

// letters tokenizes a text for the random model: one token per letter.
func letters(text string) (serve.Row, error) {
	var r serve.Row
	for _, c := range strings.ToLower(text) {
		if c >= 'a' && c <= 'z' {
			r.IDs = append(r.IDs, int32(c-'a'+1))
		}
	}
	return r, nil
}

// warm compiles every bucket of s's batcher, returning how long it took.
func (s *server) warm() time.Duration {
	start := time.Now()
	for _, sh := range s.batcher.Buckets() {
		b := serve.Batch{Size: sh.Size, Len: sh.Len, Rows: sh.Size}
		b.IDs, b.Types, b.Mask = make([]int32, sh.Size*sh.Len), make([]int32, sh.Size*sh.Len), make([]int32, sh.Size*sh.Len)
		for i := range sh.Size {
			b.Mask[i*sh.Len] = 1
		}
		if _, err := s.emb.Run(b); err != nil {
			log.Fatal(err)
		}
	}
	return time.Since(start)
}

// listenAndServe serves s on o.addr until SIGINT or SIGTERM, then shuts
// down: in-flight requests finish, queued batches run.
func listenAndServe(w io.Writer, s *server, o options) error {
	return listenAndServeOn(w, s.name, "/embed", `{"texts": [...]}`, s.handler, s.batcher.Close, o)
}

// listenAndServeOn serves handler at path on o.addr until SIGINT or
// SIGTERM, then shuts down: in-flight requests finish, then closeBatcher
// runs what is queued.
func listenAndServeOn(w io.Writer, name, path, form string, handler http.Handler, closeBatcher func(context.Context) error, o options) error {
	mux := http.NewServeMux()
	mux.Handle(path, handler)
	srv := &http.Server{Addr: o.addr, Handler: mux}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(w, "serving %s on %s: POST %s %s\n", name, o.addr, path, form)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	fmt.Fprintln(w, "shutting down: finishing the requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	return closeBatcher(sctx)
}

// run is the command: serve, or load-test on loopback.
func run(w io.Writer, o options) error {
	if decoderType(o.model) != "" {
		return runGenerate(w, o)
	}
	s, err := newServer(o)
	if err != nil {
		return err
	}
	if !o.load {
		return listenAndServe(w, s, o)
	}
	fmt.Fprintf(w, "model: %s\n", s.name)
	d := s.warm()
	fmt.Fprintf(w, "compiled %d buckets (batch sizes × lengths) in %.1f s\n", s.emb.Compiles(), d.Seconds())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/embed", s.handler)
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	compiles := s.emb.Compiles()
	rep := loadTest("http://"+ln.Addr().String()+"/embed", o)
	ctx := context.Background()
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	if err := s.batcher.Close(ctx); err != nil {
		return err
	}
	rep.print(w, o, s.batcher.Stats(), s.emb.Compiles()-compiles)
	if rep.failed > 0 {
		return errors.New("some requests failed")
	}
	return nil
}

func main() {
	var o options
	flag.StringVar(&o.model, "model", defaultModel(), "all-MiniLM-L6-v2's directory (config.json, model.safetensors, tokenizer.json), or a GPT-2 or Llama directory to serve generation")
	flag.StringVar(&o.addr, "addr", ":8080", "address to serve on")
	flag.BoolVar(&o.load, "load", false, "load-test on loopback instead of serving")
	flag.IntVar(&o.clients, "clients", 16, "concurrent clients of -load")
	flag.IntVar(&o.texts, "texts", 4, "most texts per request of -load (1 to this many)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long -load runs")
	flag.DurationVar(&o.wait, "wait", 2*time.Millisecond, "longest wait of a partial batch")
	flag.IntVar(&o.queue, "queue", 256, "most requests waiting for the model (more get 503)")
	flag.IntVar(&o.maxTokens, "max-tokens", 16, "generation: the most new tokens a request may ask for")
	flag.IntVar(&o.maxLen, "max-len", 64, "generation: the KV cache's positions (prompt plus new tokens; GPT-2: at most its positions)")
	flag.Parse()
	if err := run(os.Stdout, o); err != nil {
		log.Fatal(err)
	}
}
