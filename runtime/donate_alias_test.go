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
func mlpStep(opt optim.Optimizer) func(p nn.MLP, s optim.State, x, y *trace.Array) (nn.MLP, optim.State, *trace.Array, error) {
	return func(p nn.MLP, s optim.State, x, y *trace.Array) (nn.MLP, optim.State, *trace.Array, error) {
		loss, g := trace.ValueAndGrad(func(p nn.MLP) *trace.Array {
			return nn.SoftmaxCrossEntropy(p.Apply(x), y)
		})(p)
		u, s, err := opt.Update(g, s, p)
		if err != nil {
			return p, s, loss, err
		}
		p, err = optim.ApplyUpdates(p, u)
		return p, s, loss, err
	}
}

// A training step of an MLP with SGD or Adam, params and optimizer state
// donated, writes (nearly) all of them in place: the scheduler runs the last
// readers of each donated parameter (the backward pass's dot_generals) before
// the update that overwrites it.
func TestDonatedTrainingStepAliases(t *testing.T) {
	adam := optim.Adam(optim.Constant(1e-3), 0.9, 0.999, 1e-8)
	for _, tc := range []struct {
		name  string
		opt   optim.Optimizer
		sizes []int
		batch int
	}{
		{"sgd", optim.SGD(optim.Constant(0.01)), []int{512, 256, 10}, 32},
		{"adam", adam, []int{512, 256, 10}, 32},
		// Tiny: the step count is not fused with the values broadcast from
		// it, and orders needing the same memory prefer reusing more.
		{"adam-tiny", adam, []int{16, 32, 4}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warnings := captureWarnings(t)
			p := rt.Jit(func(key *trace.Array) nn.MLP {
				return nn.NewMLP(key, ir.Float32, tc.sizes, nn.Relu)
			})(random.NewKey(1))
			s, err := tc.opt.Init(p)
			require.NoError(t, err)
			x := rt.FromSlice(make([]float32, tc.batch*tc.sizes[0]), tc.batch, tc.sizes[0])
			y := rt.FromSlice(make([]int32, tc.batch), tc.batch)
			step := rt.NewJitted(mlpStep(tc.opt), rt.Donate(0, 1))
			low, err := step.Lower(p, s, x, y)
			require.NoError(t, err)
			c, err := low.Compile()
			require.NoError(t, err)
			m := c.MemoryAnalysis()
			donated := donatedBytes(p, s)
			t.Logf("%s: donated %d B, aliased %d B, temp %d B, total %d B", tc.name, donated, m.AliasBytes, m.TempBytes, m.TotalBytes())
			require.Equal(t, donated, m.AliasBytes, "donated bytes not aliased:\n%s", c.Program().PlanString())
			require.Empty(t, *warnings)
		})
	}
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
