package serve_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/serve"
	"github.com/ferryml/ferry/random"
)

// Serving generation over HTTP: concurrent requests (prompts of different
// lengths, each with its own max_tokens) run as one batched prefill and
// decode, and each gets the tokens its prompt gives alone. A model with a
// tokenizer takes text prompts through a serve.Codec; this small random
// Llama takes token ids.
func ExampleNewGenerateHandler() {
	m := nn.NewLlama(random.NewKey(0), ir.Float32, nn.LlamaConfig{Vocab: 32, Layers: 2, D: 16, Heads: 4, KVHeads: 2, Hidden: 32})
	g := nn.NewGenerator(m, 32, 8)
	b, err := serve.NewGeneratorBatcher(g, serve.GenConfig{BatchSizes: []int{1, 2, 4}, MaxTokens: 16, Vocab: 32})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(serve.NewGenerateHandler(b, serve.Codec{}, serve.GenHandlerConfig{}))
	defer srv.Close()

	bodies := []string{
		`{"ids": [1, 5, 7], "max_tokens": 6}`,
		`{"ids": [1, 9, 4, 4, 2, 8, 3], "max_tokens": 4}`,
		`{"ids": [3, 1, 4, 1], "max_tokens": 8}`,
		`{"ids": [2, 7], "max_tokens": 5}`,
	}
	answers := make([]serve.GenerateResponse, len(bodies))
	var wg sync.WaitGroup
	for i, body := range bodies {
		wg.Go(func() {
			resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
			if err != nil {
				panic(err)
			}
			json.NewDecoder(resp.Body).Decode(&answers[i])
			resp.Body.Close()
		})
	}
	wg.Wait()
	b.Close(context.Background()) // after http.Server.Shutdown: runs what is queued

	for i, a := range answers {
		var req serve.GenerateRequest
		json.Unmarshal([]byte(bodies[i]), &req)
		alone, _ := g.Generate([][]int32{req.IDs}, nn.GenerateConfig{MaxNewTokens: req.MaxTokens})
		fmt.Printf("request %d: %d prompt tokens, %d new (%s), as alone: %v\n",
			i, a.PromptTokens, len(a.Tokens), a.FinishReason, slices.Equal(a.Tokens, alone.Tokens[0]))
	}
	s := b.Stats()
	fmt.Println("requests:", s.Requests, "tokens:", s.Tokens)
	// Output:
	// request 0: 3 prompt tokens, 6 new (length), as alone: true
	// request 1: 7 prompt tokens, 4 new (length), as alone: true
	// request 2: 4 prompt tokens, 8 new (length), as alone: true
	// request 3: 2 prompt tokens, 5 new (length), as alone: true
	// requests: 4 tokens: 23
}
