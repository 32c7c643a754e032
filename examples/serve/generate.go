package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/hf"
	"github.com/ferryml/ferry/nn/serve"
	"github.com/ferryml/ferry/tokenizer"
)

// decoderType returns dir's config.json model_type when it is a decoder
// this command generates with (gpt2, llama), or "".
func decoderType(dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return ""
	}
	var c struct {
		ModelType string `json:"model_type"`
	}
	if json.Unmarshal(data, &c) != nil || c.ModelType != "gpt2" && c.ModelType != "llama" {
		return ""
	}
	return c.ModelType
}

// genServer is a decoder behind a generation batcher and its handler.
type genServer struct {
	name     string
	vocab    int
	batcher  *serve.GenBatcher
	handler  http.Handler
	compiles func() int64 // the decode step's compiles so far
	warm     func() error // compiles the prefill and decode step of every batch size
}

// newGenServer loads the GPT-2 or Llama in o.model.
func newGenServer(o options) (*genServer, error) {
	s := &genServer{}
	cfg := serve.GenConfig{MaxWait: o.wait, QueueSize: o.queue, MaxTokens: o.maxTokens}
	switch decoderType(o.model) {
	case "gpt2":
		m, mc, err := hf.LoadGPT2(o.model, ir.Float32)
		if err != nil {
			return nil, err
		}
		s.name, s.vocab = fmt.Sprintf("GPT-2 from %s (%d layers, width %d)", o.model, mc.Layers, mc.D), mc.Vocab
		return s, startGen(s, nn.NewGenerator(m, min(o.maxLen, mc.MaxPositions), 0), cfg, o.model)
	case "llama":
		m, mc, err := hf.LoadLlama(o.model, ir.Float32)
		if err != nil {
			return nil, err
		}
		s.name, s.vocab = fmt.Sprintf("Llama from %s (%d layers, width %d)", o.model, mc.Layers, mc.D), mc.Vocab
		return s, startGen(s, nn.NewGenerator(m, o.maxLen, 0), cfg, o.model)
	}
	return nil, fmt.Errorf("%s: not a gpt2 or llama directory", o.model)
}

// startGen makes s's batcher and handler for g, with dir's tokenizer.json
// when there is one.
func startGen[M nn.Decoder](s *genServer, g *nn.Generator[M], cfg serve.GenConfig, dir string) error {
	cfg.Vocab = s.vocab
	var err error
	if s.batcher, err = serve.NewGeneratorBatcher(g, cfg); err != nil {
		return err
	}
	codec, err := codecOf(dir)
	if err != nil {
		return err
	}
	s.handler = serve.NewGenerateHandler(s.batcher, codec, serve.GenHandlerConfig{})
	s.compiles = g.StepCompiles
	s.warm = func() error {
		for _, n := range s.batcher.Config().BatchSizes {
			prompts := make([][]int32, n)
			for i := range prompts {
				prompts[i] = []int32{0}
			}
			if _, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: 2}); err != nil {
				return err
			}
		}
		return nil
	}
	return nil
}

// codecOf returns the Codec of dir's tokenizer.json, or none (prompts as
// token ids) when it has none.
func codecOf(dir string) (serve.Codec, error) {
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		return serve.Codec{}, nil
	}
	t, err := tokenizer.Load(dir)
	if err != nil {
		return serve.Codec{}, err
	}
	enc := func(text string) ([]int32, error) {
		e, err := t.Encode(text)
		if err != nil {
			return nil, err
		}
		ids := make([]int32, len(e.IDs))
		for i, id := range e.IDs {
			ids[i] = int32(id)
		}
		return ids, nil
	}
	dec := func(ids []int32) (string, error) {
		in := make([]int, len(ids))
		for i, id := range ids {
			in[i] = int(id)
		}
		return t.Decode(in, true)
	}
	return serve.Codec{Encode: enc, Decode: dec}, nil
}

// runGenerate serves s, or load-tests it on loopback.
func runGenerate(w io.Writer, o options) error {
	s, err := newGenServer(o)
	if err != nil {
		return err
	}
	if !o.load {
		return listenAndServeOn(w, s.name, "/generate", `{"ids": [...], "max_tokens": n}`, s.handler, s.batcher.Close, o)
	}
	fmt.Fprintf(w, "model: %s\n", s.name)
	start := time.Now()
	if err := s.warm(); err != nil {
		return err
	}
	fmt.Fprintf(w, "compiled the decode step for %d batch sizes in %.1f s\n", s.compiles(), time.Since(start).Seconds())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.handler}
	go srv.Serve(ln)
	compiles := s.compiles()
	rep := genLoad("http://"+ln.Addr().String(), s.vocab, s.batcher.Config(), o)
	ctx := context.Background()
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	if err := s.batcher.Close(ctx); err != nil {
		return err
	}
	rep.printGen(w, o, s.batcher.Stats(), s.compiles()-compiles)
	if rep.failed > 0 {
		return errors.New("some requests failed")
	}
	return nil
}

// genLoad runs o.clients clients against url for o.duration, each posting
// greedy requests of a random prompt of 1 to 16 tokens and 1 to
// o.maxTokens new tokens.
func genLoad(url string, vocab int, cfg serve.GenConfig, o options) *report {
	return runLoad(o, 2, func(client *http.Client, r *rand.Rand) (int, int) {
		n := 1 + r.IntN(cfg.MaxTokens)
		ids := make([]int32, 1+r.IntN(min(16, cfg.MaxLen-n+1)))
		for i := range ids {
			ids[i] = int32(r.IntN(vocab))
		}
		return postGenerate(client, url, serve.GenerateRequest{IDs: ids, MaxTokens: n})
	})
}

// postGenerate sends one request: its status (0 when it did not get one)
// and the number of tokens generated.
func postGenerate(client *http.Client, url string, req serve.GenerateRequest) (int, int) {
	body, _ := json.Marshal(req)
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		var out serve.GenerateResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Tokens) == 0 || len(out.Tokens) > req.MaxTokens {
			return 0, 0
		}
		return http.StatusOK, len(out.Tokens)
	}
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, 0
}

// printGen writes the report of a generation load test.
func (rep *report) printGen(w io.Writer, o options, s serve.GenStats, compiles int64) {
	sec := rep.elapsed.Seconds()
	fmt.Fprintf(w, "%d clients for %.1f s, greedy, 1 to %d new tokens per request, max wait %v\n", o.clients, sec, o.maxTokens, o.wait)
	rep.printRates(w, "tokens")
	if s.Batches > 0 {
		fmt.Fprintf(w, "batches: %d, %.1f requests each, %.0f%% of the row steps run made requested tokens\n",
			s.Batches, float64(s.Requests)/float64(s.Batches), 100*float64(s.Tokens)/float64(s.RowSteps))
	}
	fmt.Fprintf(w, "rejected (503): %d, failed: %d, decode step compiles during the load: %d\n", rep.rejected, rep.failed, compiles)
}
