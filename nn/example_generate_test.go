package nn_test

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A tiny random Llama continues two prompts greedily and sampled, with a
// KV cache: one prefill, then a decode step that compiles once and donates
// the cache; then prompts of different lengths in one batch.
func ExampleGenerator_Generate() {
	cfg := nn.LlamaConfig{Vocab: 32, Layers: 2, D: 16, Heads: 4, KVHeads: 2, Hidden: 32}
	m := rt.Jit(func(k *trace.Array) nn.Llama { return nn.NewLlama(k, ir.Float32, cfg) })(random.NewKey(0))

	g := nn.NewGenerator(m, 32, 0) // a cache of 32 positions
	prompts := [][]int32{{1, 5, 7}, {1, 9, 4}}
	greedy, err := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: 8})
	if err != nil {
		panic(err)
	}
	sampled, err := g.Generate(prompts, nn.GenerateConfig{
		MaxNewTokens: 8,
		Sampling:     nn.Sampling{Temperature: 0.8, TopK: 5},
		Key:          random.NewKey(42), // the same key, the same tokens
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(greedy.Tokens), "rows of", len(greedy.Tokens[0]), "greedy tokens and", len(sampled.Tokens[0]), "sampled ones")
	fmt.Println("decode steps:", greedy.DecodeSteps, "compiles of the decode step:", g.StepCompiles())

	// Top-1 sampling is greedy decoding.
	top1, _ := g.Generate(prompts, nn.GenerateConfig{MaxNewTokens: 8, Sampling: nn.Sampling{Temperature: 1, TopK: 1}, Key: random.NewKey(1)})
	fmt.Println("top-1 = greedy:", slices.EqualFunc(top1.Tokens, greedy.Tokens, slices.Equal))

	// Prompts of different lengths share a batch (padded on the right, each
	// row at its own position), each with its own limit: every row gets
	// what its prompt gives alone.
	ragged := [][]int32{{1, 5, 7}, {1, 9, 4, 4, 2, 8}, {3}}
	rows := []nn.RowLimit{{MaxNewTokens: 8}, {MaxNewTokens: 4}, {MaxNewTokens: 6}}
	batch, _ := g.Generate(ragged, nn.GenerateConfig{Rows: rows})
	for i, p := range ragged {
		alone, _ := g.Generate([][]int32{p}, nn.GenerateConfig{MaxNewTokens: rows[i].MaxNewTokens})
		fmt.Printf("prompt of %d tokens: %d new, as alone: %v\n", len(p), len(batch.Tokens[i]), slices.Equal(batch.Tokens[i], alone.Tokens[0]))
	}
	// Output:
	// 2 rows of 8 greedy tokens and 8 sampled ones
	// decode steps: 7 compiles of the decode step: 2
	// top-1 = greedy: true
	// prompt of 3 tokens: 8 new, as alone: true
	// prompt of 6 tokens: 4 new, as alone: true
	// prompt of 1 tokens: 6 new, as alone: true
}
