package runtime_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// A small data-parallel training step: a params struct of four arrays and a
// batch of two, six leaves in all.
type dpParams struct{ W1, B1, W2, B2 *trace.Array }

type dpBatch struct{ X, Y *trace.Array }

func dpLoss(p dpParams, b dpBatch) *trace.Array {
	h := trace.Tanh(trace.Add(trace.MatMul(b.X, p.W1), p.B1))
	d := trace.Sub(trace.Add(trace.MatMul(h, p.W2), p.B2), b.Y)
	return trace.Mean(trace.Mul(d, d))
}

func dpStep(p dpParams, b dpBatch) (dpParams, *trace.Array) {
	loss, g := trace.ValueAndGradFirst(dpLoss)(p, b)
	upd, err := trace.Map2As(p, g, func(w, gw *trace.Array) *trace.Array { return trace.Sub(w, trace.Mul(trace.Scalar(0.1), gw)) })
	if err != nil {
		panic(err)
	}
	return upd, loss
}

func dpRandom(r *rand.Rand, shape ...int) *trace.Array {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return rt.FromSlice(v, shape...)
}

// InShardings read as a tree prefix of the arguments (one sharding per
// argument for all its arrays), InShardingsTree with containers mirroring
// the arguments, and the flat form with one sharding per leaf lay the
// arguments out alike: the same per-device argument bytes (params
// replicated, the batch split four ways) and the same results as the
// unsharded step.
func TestInShardingsTreePrefix(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	r := testseed.Rand(t, 0)
	mesh, err := ir.NewMesh([]int{4}, []string{"data"})
	require.NoError(t, err)
	repl, err := ir.NewNamedSharding(mesh, ir.P())
	require.NoError(t, err)
	rows, err := ir.NewNamedSharding(mesh, ir.P("data", ""))
	require.NoError(t, err)

	p := dpParams{W1: dpRandom(r, 8, 16), B1: dpRandom(r, 16), W2: dpRandom(r, 16, 4), B2: dpRandom(r, 4)}
	b := dpBatch{X: dpRandom(r, 32, 8), Y: dpRandom(r, 32, 4)}
	wantP, wantLoss := rt.Jit(dpStep)(p, b)
	paramBytes := int64(4 * (8*16 + 16 + 16*4 + 4))
	batchBytes := int64(4 * (32*8 + 32*4))

	forms := map[string][]rt.Option{
		"flat, one per leaf":     {rt.InShardings(repl, repl, repl, repl, rows, rows), rt.OutShardings(repl, repl, repl, repl, repl)},
		"one per argument":       {rt.InShardings(repl, rows), rt.OutShardings(repl, repl)},
		"one for all outputs":    {rt.InShardings(repl, rows), rt.OutShardings(repl)},
		"tree, map of fields":    {rt.InShardingsTree(repl, map[string]any{"X": rows, "Y": rows}), rt.OutShardingsTree(repl, repl)},
		"tree, struct of fields": {rt.InShardingsTree(struct{ W1, B1, W2, B2 *ir.NamedSharding }{repl, repl, repl, repl}, struct{ X, Y *ir.NamedSharding }{rows, rows})},
	}
	for name, opts := range forms {
		j := rt.NewJitted(dpStep, opts...)
		l, err := j.Lower(p, b)
		require.NoError(t, err, name)
		c, err := l.Compile()
		require.NoError(t, err, name)
		require.Equal(t, paramBytes+batchBytes/4, c.MemoryAnalysis().ArgumentBytes, "%s: argument bytes per device", name)
		gotP, gotLoss := j.Fn()(p, b)
		require.InDelta(t, wantLoss.Item(), gotLoss.Item(), 1e-5, name)
		for q, w := range trace.Leaves(wantP) {
			require.InDeltaSlice(t, w.Float32s(), trace.Leaves(gotP)[q].Float32s(), 1e-5, "%s: leaf %d", name, q)
		}
		if strings.HasPrefix(name, "one") || strings.HasPrefix(name, "flat") {
			require.True(t, gotLoss.Type().Sharding.EquivalentTo(repl, 0), "%s: loss %v", name, gotLoss.Type())
		}
	}
	// nil leaves the params as they come (whole on every device); rows
	// splits every array of the batch.
	c, err := rt.NewJitted(dpStep, rt.InShardingsTree(nil, rows)).Lower(p, b)
	require.NoError(t, err)
	cc, err := c.Compile()
	require.NoError(t, err)
	require.Equal(t, paramBytes+batchBytes/4, cc.MemoryAnalysis().ArgumentBytes)

	// The flat form may stop short: the leaves after the last entry (here
	// the batch's Y) get no sharding of their own (the compiler chooses).
	constraints := func(opts ...rt.Option) int {
		l, err := rt.NewJitted(dpStep, opts...).Lower(p, b)
		require.NoError(t, err)
		return strings.Count(l.IR(), "sharding_constraint(")
	}
	require.Equal(t, 6, constraints(rt.InShardings(repl, rows)))
	require.Equal(t, 5, constraints(rt.InShardings(repl, repl, repl, repl, rows)))
	require.Equal(t, 2, constraints(rt.InShardingsTree(nil, rows)))
	require.Equal(t, 1, constraints(rt.InShardingsTree(nil, map[string]any{"X": rows, "Y": nil})))
}

// A prefix that does not fit its argument is an error naming the option,
// the argument and the path in it; a count that fits neither one per
// argument nor one per leaf says what to give.
func TestInShardingsTreeErrors(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{Devices: 4})
	r := testseed.Rand(t, 0)
	mesh, err := ir.NewMesh([]int{4}, []string{"data"})
	require.NoError(t, err)
	repl, err := ir.NewNamedSharding(mesh, ir.P())
	require.NoError(t, err)
	rows, err := ir.NewNamedSharding(mesh, ir.P("data", ""))
	require.NoError(t, err)
	p := dpParams{W1: dpRandom(r, 8, 16), B1: dpRandom(r, 16), W2: dpRandom(r, 16, 4), B2: dpRandom(r, 4)}
	b := dpBatch{X: dpRandom(r, 32, 8), Y: dpRandom(r, 32, 4)}
	lower := func(opts ...rt.Option) error {
		_, err := rt.NewJitted(dpStep, opts...).Lower(p, b)
		return err
	}
	for _, c := range []struct {
		opt  rt.Option
		want []string
	}{
		{rt.InShardingsTree(map[string]any{"W1": repl, "B1": repl}, rows), []string{"InShardingsTree: argument 0: at the top", "has no field W2"}},
		{rt.InShardingsTree(repl, map[string]any{"X": rows, "Y": rows, "Z": rows}), []string{"argument 1", "has a field Z"}},
		{rt.InShardingsTree(repl, []any{rows, rows}), []string{"argument 1: at the top", "the prefix has a []interface {} where the tree has a struct"}},
		{rt.InShardingsTree(repl, map[string]any{"X": []any{rows}, "Y": rows}), []string{"argument 1: at X", "where the tree has an array"}},
		{rt.InShardingsTree(repl, rows, rows), []string{"InShardingsTree has 3 entries for 2 arguments"}},
		{rt.InShardings(repl, repl, repl, repl, rows, rows, rows), []string{"InShardings has 7 entries for 2 arguments (with 4, 2 array leaves)", "InShardingsTree"}},
		{rt.OutShardingsTree(map[string]any{"W1": repl}, repl), []string{"OutShardingsTree: result 0", "has no field B1"}},
	} {
		err := lower(c.opt)
		require.Error(t, err)
		for _, w := range c.want {
			require.Contains(t, err.Error(), w)
		}
		require.Contains(t, err.Error(), "shardingspec_test.go", "the error names the caller's line")
	}
	// As many entries as arguments and as leaves, read differently: an
	// error, not a silent choice.
	two := func(p struct{ A, B *trace.Array }, none struct{}) *trace.Array { return trace.Add(p.A, p.B) }
	x := dpRandom(r, 4, 2)
	_, err = rt.NewJitted(two, rt.InShardings(rows, repl)).Lower(struct{ A, B *trace.Array }{x, x}, struct{}{})
	require.ErrorContains(t, err, "InShardings has 2 entries, one per argument and one per array leaf, and the two readings differ")
}

// A data-parallel step over a params struct and a batch struct: one
// sharding per argument, each applying to every array of it, as jax.jit's
// in_shardings takes a tree prefix.
func ExampleInShardingsTree() {
	if err := rt.SetCPUDeviceCount(4); err != nil {
		panic(err)
	}
	defer rt.ConfigureMemory(rt.MemoryConfig{})
	mesh, err := ir.NewMesh([]int{4}, []string{"data"})
	if err != nil {
		panic(err)
	}
	replicated, _ := ir.NewNamedSharding(mesh, ir.P())
	rows, _ := ir.NewNamedSharding(mesh, ir.P("data", ""))

	type Params struct{ W, B *trace.Array }
	type Batch struct{ X, Y *trace.Array }
	step := func(p Params, b Batch) *trace.Array {
		d := trace.Sub(trace.Add(trace.MatMul(b.X, p.W), p.B), b.Y)
		return trace.Mean(trace.Mul(d, d))
	}
	p := Params{W: rt.FromSlice([]float32{1, 1}, 2, 1), B: rt.FromSlice([]float32{0})}
	b := Batch{X: rt.FromSlice([]float32{1, 2, 3, 4, 5, 6, 7, 8}, 4, 2), Y: rt.FromSlice([]float32{3, 7, 11, 15}, 4, 1)}

	// One sharding per argument: params replicated, every array of the batch
	// split by rows. The same as rt.InShardings(replicated, rows).
	j := rt.NewJitted(step, rt.InShardingsTree(replicated, rows))
	fmt.Println(j.Fn()(p, b))
	// Finer: a container mirroring an argument, here the batch's fields.
	j = rt.NewJitted(step, rt.InShardingsTree(replicated, map[string]any{"X": rows, "Y": rows}))
	fmt.Println(j.Fn()(p, b).Item())
	// Output:
	// f32[]{sharding<mesh[data=4], []>} 0
	// 0
}
