package nn_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

func randIDs(r *rand.Rand, vocab int, shape ...int) *trace.Array {
	ids := make([]int32, shape[0]*shape[1])
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	return rt.FromSlice(ids, shape...)
}

// TestTransformerLM checks the logits' shape and dtype, that the model is
// causal (the logits of a prefix are those of the whole sequence's first
// positions), its matmul FLOPs against the formula written out here, and
// that bad ids are errors.
func TestTransformerLM(t *testing.T) {
	r := testseed.Rand(t, 2)
	vocab, seq, layers, d, heads, batch := 5+r.IntN(20), 4+r.IntN(5), 1+r.IntN(3), 8, 2, 1+r.IntN(3)
	m := rt.Jit(func(k *trace.Array) nn.TransformerLM {
		return nn.NewTransformerLM(k, ir.Float32, vocab, seq, layers, d, heads, 4*d)
	})(random.NewKey(r.Uint64()))
	leaves, _, ferr := trace.Flatten(m)
	require.NoError(t, ferr)
	require.Equal(t, ir.Shape{vocab, d}, leaves[0].Shape(), "Tok first")
	require.Equal(t, ir.Shape{seq, d}, leaves[1].Shape(), "Pos second")

	ids := randIDs(r, vocab, batch, seq)
	logits := rt.Jit(func(m nn.TransformerLM, ids *trace.Array) *trace.Array { return m.Logits(ids) })
	full := logits(m, ids)
	require.Equal(t, ir.Shape{batch, seq, vocab}, full.Shape())
	require.Equal(t, ir.Float32, full.DType())

	tp := 1 + r.IntN(seq-1)
	prefix := logits(m, trace.SliceAxis(ids, 1, 0, tp))
	require.Equal(t, ir.Shape{batch, tp, vocab}, prefix.Shape())
	want := trace.SliceAxis(full, 1, 0, tp).Float32s()
	got := prefix.Float32s()
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-4, "logit %d of the prefix of %d positions", i, tp)
	}

	low, err := rt.Lower(func(m nn.TransformerLM, ids, y *trace.Array) *trace.Array { return m.Loss(ids, y) }, m, ids, ids)
	require.NoError(t, err)
	tokens := float64(batch * seq)
	perLayer := 4*2*tokens*float64(d*d) + // q, k, v, output projections
		2*2*tokens*float64(d*4*d) + // the MLP
		2*2*float64(batch*seq*seq*d) // scores and their weighted sum
	wantDots := float64(layers)*perLayer + 2*tokens*float64(d*vocab)
	require.Equal(t, wantDots, low.CostAnalysis().DotFlops)

	var bad error
	func() {
		defer trace.Recover(&bad)
		m.Logits(randIDs(r, vocab, batch, seq+1))
	}()
	require.ErrorContains(t, bad, "positions")
	func() {
		defer trace.Recover(&bad)
		m.Logits(rt.FromSlice([]int32{1, 2}, 2))
	}()
	require.ErrorContains(t, bad, "want [batch, t]")
}
