package runtime_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/nn"
	"github.com/ferryml/ferry/optim"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// donatedBytes sums the device bytes of the leaves of trees.
func donatedBytes(trees ...any) int64 {
	var n int64
	for _, t := range trees {
		for _, x := range trace.Leaves(t) {
			if x.Space() == ir.Device {
				n += x.Type().Bytes()
			}
		}
	}
	return n
}

// mlpStep is a jitted training step of a one-hidden-layer MLP with params and
// optimizer state donated.
func mlpStep[S any](opt optim.Optimizer[nn.MLP, S]) func(p nn.MLP, s S, x, y *trace.Array) (nn.MLP, S, *trace.Array, error) {
	return func(p nn.MLP, s S, x, y *trace.Array) (nn.MLP, S, *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array {
			return nn.SoftmaxCrossEntropy(p.Apply(x), y)
		})(p)
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, loss, err
	}
}

// A training step of an MLP with SGD or Adam, params and optimizer state
// donated, writes (nearly) all of them in place: the scheduler runs the last
// readers of each donated parameter (the backward pass's dot_generals) before
// the update that overwrites it.
func TestDonatedTrainingStepAliases(t *testing.T) {
	adam := optim.Adam[nn.MLP](optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	t.Run("sgd", func(t *testing.T) {
		checkStepAliases(t, optim.SGD[nn.MLP](optim.Constant(0.01)), []int{512, 256, 10}, 32)
	})
	t.Run("adam", func(t *testing.T) { checkStepAliases(t, adam, []int{512, 256, 10}, 32) })
	// Tiny: the step count is not fused with the values broadcast from
	// it, and orders needing the same memory prefer reusing more.
	t.Run("adam-tiny", func(t *testing.T) { checkStepAliases(t, adam, []int{16, 32, 4}, 8) })
}

// checkStepAliases compiles a donated MLP training step with opt and requires
// every donated byte to be aliased to a result, with no warning.
func checkStepAliases[S any](t *testing.T, opt optim.Optimizer[nn.MLP, S], sizes []int, batch int) {
	warnings := captureWarnings(t)
	p := rt.Jit(func(key *trace.Array) nn.MLP {
		return nn.NewMLP(key, ir.Float32, sizes, nn.Relu)
	})(random.NewKey(1))
	s, err := opt.Init(p)
	require.NoError(t, err)
	x := rt.FromSlice(make([]float32, batch*sizes[0]), batch, sizes[0])
	y := rt.FromSlice(make([]int32, batch), batch)
	step := rt.NewJitted(mlpStep(opt), rt.Donate(0, 1))
	low, err := step.Lower(p, s, x, y)
	require.NoError(t, err)
	c, err := low.Compile()
	require.NoError(t, err)
	m := c.MemoryAnalysis()
	donated := donatedBytes(p, s)
	t.Logf("%s: donated %d B, aliased %d B, temp %d B, total %d B", t.Name(), donated, m.AliasBytes, m.TempBytes, m.TotalBytes())
	require.Equal(t, donated, m.AliasBytes, "donated bytes not aliased:\n%s", c.Program().PlanString())
	require.Empty(t, *warnings)
}

// captureWarnings collects the runtime's warnings until the test ends.
func captureWarnings(t *testing.T) *[]string {
	var got []string
	var mu sync.Mutex
	prev := rt.SetWarnings(func(msg string) {
		mu.Lock()
		got = append(got, msg)
		mu.Unlock()
	})
	t.Cleanup(func() { rt.SetWarnings(prev) })
	return &got
}

// A donated buffer no result can reuse is reported once per compiled
// signature, named by its argument's position and tree path; a fully usable
// donation says nothing.
func TestUnusableDonationWarnsOnce(t *testing.T) {
	got := captureWarnings(t)
	type pair struct{ A, B *trace.Array }
	step := rt.Jit(func(p pair) *trace.Array {
		return trace.Add(trace.Mul(p.A, trace.Scalar(2)), trace.Sum(p.B))
	}, rt.Donate(0), rt.WithName("unusable"))
	r := newRand(t)
	for range 3 {
		a := rt.FromSlice(randSlice(r, 5), 5)
		b := rt.FromSlice(randSlice(r, 3), 3)
		bs := b.Float32s()
		as := a.Float32s()
		out := step(pair{a, b})
		var sum float64
		for _, v := range bs {
			sum += float64(v)
		}
		for i, v := range out.Float32s() {
			require.InDelta(t, 2*float64(as[i])+sum, float64(v), 1e-5)
		}
	}
	require.Len(t, *got, 1, "%q", *got)
	require.Contains(t, (*got)[0], "unusable: some donated buffers were not usable: args[0].B f32[3] (no result has its size and memory space)")
	require.NotContains(t, (*got)[0], "args[0].A")
	// Another signature is another compile: one more warning.
	step(pair{rt.FromSlice(randSlice(r, 4), 4), rt.FromSlice(randSlice(r, 2), 2)})
	step(pair{rt.FromSlice(randSlice(r, 4), 4), rt.FromSlice(randSlice(r, 2), 2)})
	require.Len(t, *got, 2, "%q", *got)
	require.Contains(t, (*got)[1], "args[0].B f32[2]")

	// Fully usable: nothing.
	*got = nil
	usable := rt.Jit(func(x *trace.Array) *trace.Array { return trace.Exp(x) }, rt.Donate(0))
	for range 2 {
		usable(rt.FromSlice(randSlice(r, 8), 8))
	}
	require.Empty(t, *got)

	// Silenced: nothing either.
	rt.SetWarnings(nil)
	step(pair{rt.FromSlice(randSlice(r, 6), 6), rt.FromSlice(randSlice(r, 1), 1)})
	require.Empty(t, *got)
}
