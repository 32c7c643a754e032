package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// refEmbed gathers rows of table [V, D] for ids (float64).
func refEmbed(table *trace.Array, ids []int32, shape ...int) tensor {
	tab := tensorOf(table)
	d := tab.shape[1]
	out := tensor{shape: append(append([]int{}, shape...), d)}
	for _, id := range ids {
		out.data = append(out.data, tab.data[int(id)*d:int(id)*d+d]...)
	}
	return out
}

// refAttend is x [..., D] times tableᵀ [D, V] (float64).
func refAttend(x tensor, table *trace.Array) tensor {
	return refLinear(x, nn.Linear{W: table, Layout: nn.LayoutOutIn})
}

func refStack(x tensor, s nn.TransformerStack, keep [][]bool) tensor {
	for i := range s.Layers() {
		x = refBlockT(x, s.Layer(i), keep, seqPos)
	}
	return x
}

func randIDs32(r *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	return ids
}

// paddingOf returns a random right-padding mask: row b keeps its first
// lens[b] ≥ 1 tokens.
func paddingOf(r *rand.Rand, B, T int) ([][]bool, *trace.Array) {
	keep := make([][]bool, B)
	flat := make([]bool, B*T)
	for b := range B {
		keep[b] = make([]bool, T)
		n := 1 + r.IntN(T)
		for s := range n {
			keep[b][s], flat[b*T+s] = true, true
		}
	}
	return keep, rt.FromSlice(flat, B, T)
}

// BERT, GPT-2 and Llama at tiny random configurations against float64
// references of the same architectures (embeddings, blocks from their
// definitions, final norm, logits or pooler), with random padding; and the
// real tokens' outputs of a right-padded sequence equal the unpadded ones.
func TestModelFamilies(t *testing.T) {
	r := testseed.Rand(t, 20)
	B, T, V := 2, 2+r.IntN(4), 5+r.IntN(20)
	ids := randIDs32(r, B*T, V)
	idsA := rt.FromSlice(ids, B, T)
	keep, pad := paddingOf(r, B, T)
	ctx := nn.Context{Padding: pad}
	const tol = 2e-4

	t.Run("bert", func(t *testing.T) {
		c := nn.BertConfig{Vocab: V, MaxPositions: 8, TypeVocab: 2, Layers: 2, D: 8, Heads: 2, Hidden: 12}
		m := randomize(r, nn.NewBert(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
		types := randIDs32(r, B*T, 2)
		h := m.Encode(idsA, rt.FromSlice(types, B, T), ctx)
		pos := make([]int32, B*T)
		for i := range pos {
			pos[i] = int32(i % T)
		}
		x := addT(addT(refEmbed(m.Word.Table, ids, B, T), refEmbed(m.TokenType.Table, types, B, T)), refEmbed(m.Position.Table, pos, B, T))
		x = refStack(refNorm(x, m.EmbedNorm), m.Encoder, keep)
		checkClose(t, "Bert.Encode", h, ir.Float32, x, tol)
		first := tensor{shape: []int{B, 8}}
		for b := range B {
			first.data = append(first.data, x.data[b*T*8:b*T*8+8]...)
		}
		checkClose(t, "Bert.Pool", m.Pool(h), ir.Float32, mapT(refLinear(first, m.Pooler), math.Tanh), tol)
		checkPaddedPrefix(t, "bert", func(ids *trace.Array, ctx nn.Context, _ ...nn.StackOption) *trace.Array {
			return m.Encode(ids, nil, ctx)
		}, r, V, T)
	})
	t.Run("gpt2", func(t *testing.T) {
		c := nn.GPT2Config{Vocab: V, MaxPositions: 8, Layers: 2, D: 8, Heads: 2}
		m := randomize(r, nn.NewGPT2(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
		pos := make([]int32, B*T)
		for i := range pos {
			pos[i] = int32(i % T)
		}
		x := addT(refEmbed(m.Tok.Table, ids, B, T), refEmbed(m.Pos.Table, pos, B, T))
		x = refAttend(refNorm(refStack(x, m.Blocks, keep), m.Norm), m.Tok.Table)
		checkClose(t, "GPT2.Logits", m.Logits(idsA, ctx), ir.Float32, x, tol)
		checkPaddedPrefix(t, "gpt2", m.Logits, r, V, T)
	})
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprintf("llama tied=%v", tied), func(t *testing.T) {
			c := nn.LlamaConfig{Vocab: V, Layers: 2, D: 16, Heads: 4, KVHeads: 2, Hidden: 24, RopeTheta: 500000, TieEmbeddings: tied}
			m := randomize(r, nn.NewLlama(random.NewKey(r.Uint64()), ir.Float32, c), 0.5)
			x := refNorm(refStack(refEmbed(m.Embed.Table, ids, B, T), m.Blocks, keep), m.Norm)
			if tied {
				x = refAttend(x, m.Embed.Table)
			} else {
				x = refLinear(x, m.LMHead)
			}
			checkClose(t, "Llama.Logits", m.Logits(idsA, ctx), ir.Float32, x, tol)
			checkPaddedPrefix(t, "llama", m.Logits, r, V, T)
			// Jitted, with the layers rematerialised, the same logits.
			j := rt.Jit(func(m nn.Llama, ids, pad *trace.Array) *trace.Array {
				return m.Logits(ids, nn.Context{Padding: pad}, nn.WithRemat(trace.NothingSaveable))
			})(m, idsA, pad)
			close(t, "Llama jitted", j.Float64s(), m.Logits(idsA, ctx).Float64s(), 1e-5)
		})
	}
}

// checkPaddedPrefix checks that f on one sequence of n tokens gives, for its
// tokens, what f gives on the same sequence right-padded to n+pad tokens
// with random ids and a padding mask.
func checkPaddedPrefix(t *testing.T, name string, f func(ids *trace.Array, ctx nn.Context, _ ...nn.StackOption) *trace.Array, r *rand.Rand, V, n int) {
	t.Helper()
	pad := 1 + r.IntN(2)
	ids := randIDs32(r, n+pad, V)
	m := make([]int32, n+pad)
	for i := range n {
		m[i] = 1
	}
	want := f(rt.FromSlice(ids[:n], 1, n), nn.Context{})
	got := f(rt.FromSlice(ids, 1, n+pad), nn.Context{Padding: rt.FromSlice(m, 1, n+pad)})
	close(t, name+" padded", trace.SliceAxis(got, 1, 0, n).Float64s(), want.Float64s(), 1e-5)
}
