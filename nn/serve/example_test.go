package serve_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/nn/serve"
	"github.com/ferryml/ferry/random"
)

// Serving a BERT encoder (here a small random one) over HTTP: the texts of
// concurrent requests run in batches padded to a few bucketed shapes. A
// real model comes with its tokenizer (serve.Tokenize); this one takes
// texts of letters, one token each.
func Example() {
	bert := nn.NewBert(random.NewKey(0), ir.Float32, nn.BertConfig{
		Vocab: 32, MaxPositions: 16, TypeVocab: 2, Layers: 2, D: 8, Heads: 2, Hidden: 16,
	})
	emb := serve.NewBertEmbedder(bert)
	b, err := serve.NewBatcher(emb.Run, serve.Config{BatchSizes: []int{1, 4}, SeqLens: []int{8, 16}})
	if err != nil {
		panic(err)
	}
	letters := func(text string) (serve.Row, error) {
		var r serve.Row
		for _, c := range strings.ToLower(text) {
			if c >= 'a' && c <= 'z' {
				r.IDs = append(r.IDs, int32(c-'a'+1))
			}
		}
		return r, nil
	}
	srv := httptest.NewServer(serve.NewHandler(b, letters, serve.HandlerConfig{}))
	defer b.Close(context.Background())
	defer srv.Close()

	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"texts": ["A man is eating food.", "A dog"]}`))
	if err != nil {
		panic(err)
	}
	var out serve.EmbedResponse
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	for i, e := range out.Embeddings {
		var norm float64
		for _, v := range e {
			norm += float64(v * v)
		}
		fmt.Printf("text %d: %d tokens, %d values, norm %.3f\n", i, out.Tokens[i], out.Dim, math.Sqrt(norm))
	}

	resp, _ = http.Post(srv.URL, "application/json", strings.NewReader(`{"texts": []}`))
	var bad serve.ErrorResponse
	json.NewDecoder(resp.Body).Decode(&bad)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, bad.Error)
	fmt.Println("compiles:", emb.Compiles())
	// Output:
	// text 0: 16 tokens, 8 values, norm 1.000
	// text 1: 4 tokens, 8 values, norm 1.000
	// 400 "texts" is empty or missing: give at least one text
	// compiles: 1
}
