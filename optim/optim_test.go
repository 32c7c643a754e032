package optim_test

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/optim"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// Params is a small parameters tree: a matrix and a vector.
type Params struct {
	W *trace.Array // [3,4]
	B *trace.Array // [4]
}

func newRand(t *testing.T) *rand.Rand {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

func randVec(r *rand.Rand, n int, scale float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = scale * r.NormFloat64()
	}
	return v
}

func f32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// toParams builds a Params from a flat vector (W's 12 elements, then B's 4),
// rounded to f32; fromParams is its inverse.
func toParams(v []float64) Params {
	f := f32s(v)
	return Params{W: rt.FromSlice(f[:12], 3, 4), B: rt.FromSlice(f[12:], 4)}
}

func fromParams(p Params) []float64 { return append(p.W.Float64s(), p.B.Float64s()...) }

// round32 rounds like toParams does, so the reference starts from the same values.
func round32(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(float32(x))
	}
	return out
}

// refOpt is a float64 reference optimizer over a flat vector: it returns the
// updates for grads g at params p; step counts from 0.
type refOpt func(g, p []float64, step int) []float64

func refSGD(lr func(int) float64) refOpt {
	return func(g, _ []float64, step int) []float64 {
		u := make([]float64, len(g))
		for i := range g {
			u[i] = -lr(step) * g[i]
		}
		return u
	}
}

func refMomentum(lr func(int) float64, beta float64, nesterov bool) refOpt {
	var tr []float64
	return func(g, _ []float64, step int) []float64 {
		if tr == nil {
			tr = make([]float64, len(g))
		}
		u := make([]float64, len(g))
		for i := range g {
			tr[i] = g[i] + beta*tr[i]
			d := tr[i]
			if nesterov {
				d = g[i] + beta*tr[i]
			}
			u[i] = -lr(step) * d
		}
		return u
	}
}

func refAdam(lr func(int) float64, b1, b2, eps, wd float64) refOpt {
	var mu, nu []float64
	return func(g, p []float64, step int) []float64 {
		if mu == nil {
			mu, nu = make([]float64, len(g)), make([]float64, len(g))
		}
		t := float64(step + 1)
		u := make([]float64, len(g))
		for i := range g {
			mu[i] = b1*mu[i] + (1-b1)*g[i]
			nu[i] = b2*nu[i] + (1-b2)*g[i]*g[i]
			mhat := mu[i] / (1 - math.Pow(b1, t))
			vhat := nu[i] / (1 - math.Pow(b2, t))
			d := mhat/(math.Sqrt(vhat)+eps) + wd*p[i]
			u[i] = -lr(step) * d
		}
		return u
	}
}

func refClip(maxNorm float64, next refOpt) refOpt {
	return func(g, p []float64, step int) []float64 {
		var s float64
		for _, x := range g {
			s += x * x
		}
		n := math.Sqrt(s)
		c := append([]float64{}, g...)
		if n >= maxNorm {
			for i := range c {
				c[i] = c[i] / n * maxNorm
			}
		}
		return next(c, p, step)
	}
}

func constLR(v float64) func(int) float64 { return func(int) float64 { return v } }

func refWarmupCosine(peak float64, warmup, total int, end float64) func(int) float64 {
	return func(s int) float64 {
		if s < warmup {
			return peak * float64(s) / float64(warmup)
		}
		frac := math.Min(float64(s-warmup)/float64(total-warmup), 1)
		return end + (peak-end)*0.5*(1+math.Cos(math.Pi*frac))
	}
}

// anyOpt is an optimizer over Params with its state type erased, so that the
// cases of different state types fit in one table.
type anyOpt struct {
	init   func(p Params) (any, error)
	initIn func(p Params, space ir.MemorySpace) (any, error)
	update func(g Params, s any, p Params) (Params, any, error)
}

func erase[S any](o optim.Optimizer[Params, S]) anyOpt {
	return anyOpt{
		init: func(p Params) (any, error) { return o.Init(p) },
		initIn: func(p Params, space ir.MemorySpace) (any, error) {
			return optim.InitIn(o, p, space)
		},
		update: func(g Params, s any, p Params) (Params, any, error) {
			st, ok := s.(S)
			if !ok {
				return g, s, fmt.Errorf("state %T, want %T", s, st)
			}
			return o.Update(g, st, p)
		},
	}
}

type optCase struct {
	name    string
	opt     anyOpt
	ref     func() refOpt
	gradS   float64 // gradient scale
	moments int64   // the state holds this many arrays of the params' size
}

func optCases() []optCase {
	return []optCase{
		{"SGD", erase(optim.SGD[Params](optim.Constant(0.1))), func() refOpt { return refSGD(constLR(0.1)) }, 1, 0},
		{"SGDWarmupCosine", erase(optim.SGD[Params](optim.WarmupCosine(0.5, 2, 5, 0.05))), func() refOpt { return refSGD(refWarmupCosine(0.5, 2, 5, 0.05)) }, 1, 0},
		{"Momentum", erase(optim.Momentum[Params](optim.Constant(0.05), 0.9, false)), func() refOpt { return refMomentum(constLR(0.05), 0.9, false) }, 1, 1},
		{"Nesterov", erase(optim.Momentum[Params](optim.Constant(0.05), 0.9, true)), func() refOpt { return refMomentum(constLR(0.05), 0.9, true) }, 1, 1},
		{"Adam", erase(optim.Adam[Params](optim.Constant(0.01), 0.9, 0.999, 1e-8)), func() refOpt { return refAdam(constLR(0.01), 0.9, 0.999, 1e-8, 0) }, 1, 2},
		{"AdamW", erase(optim.AdamW[Params](optim.Constant(0.01), 0.8, 0.99, 1e-6, 0.1)), func() refOpt { return refAdam(constLR(0.01), 0.8, 0.99, 1e-6, 0.1) }, 1, 2},
		{"Clip", erase(optim.Chain(optim.ClipByGlobalNorm[Params](1), optim.SGD[Params](optim.Constant(1)))), func() refOpt { return refClip(1, refSGD(constLR(1))) }, 1, 0},
		{"ClipNoop", erase(optim.Chain(optim.ClipByGlobalNorm[Params](100), optim.SGD[Params](optim.Constant(1)))), func() refOpt { return refClip(100, refSGD(constLR(1))) }, 1, 0},
		{"ChainClipAdam", erase(optim.Chain(optim.ClipByGlobalNorm[Params](0.5), optim.Adam[Params](optim.Constant(0.02), 0.9, 0.999, 1e-8))),
			func() refOpt { return refClip(0.5, refAdam(constLR(0.02), 0.9, 0.999, 1e-8, 0)) }, 1, 2},
		{"ChainOfThree", erase(optim.Chain(optim.ClipByGlobalNorm[Params](2), optim.Chain(optim.ClipByGlobalNorm[Params](0.5), optim.Momentum[Params](optim.Constant(0.1), 0.5, true)))),
			func() refOpt { return refClip(2, refClip(0.5, refMomentum(constLR(0.1), 0.5, true))) }, 1, 1},
	}
}

// TestOptimizersMatchReference runs each optimizer for several steps, eagerly
// and under rt.Jit, on random params and gradients, beside a float64
// reference of optax's update equations.
func TestOptimizersMatchReference(t *testing.T) {
	for _, c := range optCases() {
		for _, jit := range []bool{false, true} {
			name := c.name
			if jit {
				name += "/jit"
			}
			t.Run(name, func(t *testing.T) {
				r := newRand(t)
				p0 := round32(randVec(r, 16, 1))
				params := toParams(p0)
				state, err := c.opt.init(params)
				require.NoError(t, err)
				update := func(p Params, s any, g Params) (Params, any, error) {
					u, s, err := c.opt.update(g, s, p)
					if err != nil {
						return p, s, err
					}
					p, err = optim.ApplyUpdates(p, u)
					return p, s, err
				}
				if jit {
					update = rt.Jit(update)
				}
				ref := c.ref()
				want := p0
				for step := range 5 {
					g := round32(randVec(r, 16, c.gradS))
					params, state, err = update(params, state, toParams(g))
					require.NoError(t, err)
					u := ref(g, want, step)
					for i := range want {
						want[i] = float64(float32(want[i] + u[i]))
					}
					got := fromParams(params)
					for i := range want {
						require.InDelta(t, want[i], got[i], 2e-5+2e-5*math.Abs(want[i]), "step %d element %d", step, i)
					}
				}
				require.Equal(t, []int32{5}, countOf(t, state))
			})
		}
	}
}

// countOf finds the step count in a state: the last Count leaf of the tree
// (the innermost optimizer of a chain).
func countOf(t *testing.T, s any) []int32 {
	d, err := trace.Structure(s)
	require.NoError(t, err)
	paths, leaves := d.Paths(), trace.Leaves(s)
	for i := len(paths) - 1; i >= 0; i-- {
		if strings.HasSuffix(paths[i], "Count") {
			return leaves[i].Int32s()
		}
	}
	t.Fatalf("state %T has no Count", s)
	return nil
}

func TestSchedules(t *testing.T) {
	at := func(s optim.Schedule, step int) float64 { return s(trace.ScalarAs(float64(step), ir.Int32)).Item() }
	for _, step := range []int{0, 1, 3, 7, 10, 15, 100} {
		require.InDelta(t, 0.3, at(optim.Constant(0.3), step), 1e-7)
		require.InDelta(t, 2*math.Min(float64(step)/10, 1), at(optim.LinearWarmup(2, 10), step), 1e-6, "warmup step %d", step)
		cos := 1.5 * ((1-0.1)*0.5*(1+math.Cos(math.Pi*math.Min(float64(step), 10)/10)) + 0.1)
		require.InDelta(t, cos, at(optim.CosineDecay(1.5, 10, 0.1), step), 1e-6, "cosine step %d", step)
		require.InDelta(t, refWarmupCosine(1, 3, 13, 0.01)(step), at(optim.WarmupCosine(1, 3, 13, 0.01), step), 1e-6, "warmup-cosine step %d", step)
	}
	// Known values.
	require.InDelta(t, 1.0, at(optim.WarmupCosine(1, 3, 13, 0), 3), 1e-6)
	require.InDelta(t, 0.5, at(optim.WarmupCosine(1, 3, 13, 0), 8), 1e-6)
	require.InDelta(t, 0.0, at(optim.WarmupCosine(1, 3, 13, 0), 0), 1e-7)
	require.InDelta(t, 1.0, at(optim.LinearWarmup(1, 0), 0), 1e-7)
	// Inside Jit.
	f := rt.Jit(func(s *trace.Array) *trace.Array { return optim.WarmupCosine(1, 3, 13, 0)(s) })
	require.InDelta(t, 0.5, f(rt.FromScalar(int32(8))).Item(), 1e-6)
}

func TestGlobalNormAndApplyUpdates(t *testing.T) {
	p := Params{W: rt.FromSlice([]float32{3, 0, 0, 0}, 2, 2), B: rt.FromSlice([]float32{4}, 1)}
	require.InDelta(t, 5, optim.GlobalNorm(p).Item(), 1e-6)
	require.InDelta(t, 0, optim.GlobalNorm(struct{}{}).Item(), 0)

	q, err := optim.ApplyUpdates(p, p)
	require.NoError(t, err)
	require.Equal(t, []float32{6, 0, 0, 0}, q.W.Float32s())

	_, err = optim.ApplyUpdates(p, Params{W: p.W})
	require.ErrorContains(t, err, "structure")

	// Updates keep the parameters' dtype (bf16 params, f32 updates).
	pb := Params{W: trace.Convert(p.W, ir.BFloat16), B: trace.Convert(p.B, ir.BFloat16)}
	qb, err := optim.ApplyUpdates(pb, p)
	require.NoError(t, err)
	require.Equal(t, ir.BFloat16, qb.W.DType())
}

func TestUpdateErrors(t *testing.T) {
	p := toParams(make([]float64, 16))
	adam := optim.Adam[Params](optim.Constant(0.1), 0.9, 0.999, 1e-8)
	s, err := adam.Init(p)
	require.NoError(t, err)
	_, _, err = adam.Update(p, optim.AdamState[Params]{}, p)
	require.ErrorContains(t, err, "state has no Count")
	_, _, err = adam.Update(Params{W: p.W}, s, p)
	require.ErrorContains(t, err, "structure")
	_, _, err = optim.AdamW[Params](optim.Constant(0.1), 0.9, 0.999, 1e-8, 0.1).Update(p, s, Params{})
	require.ErrorContains(t, err, "needs the params")
	chain := optim.Chain(optim.ClipByGlobalNorm[Params](1), optim.SGD[Params](optim.Constant(1)))
	_, _, err = chain.Update(p, optim.ChainState[optim.EmptyState, optim.CountState]{}, p)
	require.ErrorContains(t, err, "optim.Chain: second: optim.SGD: state has no Count")
	_, err = optim.InitIn(adam, p, ir.MemorySpace(42))
	require.ErrorContains(t, err, "invalid memory space")
}

// plainSGD is an optimizer written outside the package, without InitIn.
type plainSGD struct{}

func (plainSGD) Init(Params) (optim.EmptyState, error) { return optim.EmptyState{}, nil }

func (plainSGD) Update(g Params, s optim.EmptyState, _ Params) (Params, optim.EmptyState, error) {
	u, err := trace.MapAs(g, trace.Neg)
	return u, s, err
}

// User-defined optimizers chain with the package's; InitIn needs every part
// to implement SpaceIniter.
func TestUserOptimizer(t *testing.T) {
	p := toParams(randVec(newRand(t), 16, 1))
	opt := optim.Chain(optim.ClipByGlobalNorm[Params](1e9), optim.Optimizer[Params, optim.EmptyState](plainSGD{}))
	s, err := opt.Init(p)
	require.NoError(t, err)
	u, _, err := opt.Update(p, s, p)
	require.NoError(t, err)
	require.Equal(t, trace.Neg(p.W).Float32s(), u.W.Float32s())
	_, err = optim.InitIn(opt, p, ir.PinnedHost)
	require.ErrorContains(t, err, "optim.Chain: second: optim.InitIn: optim_test.plainSGD cannot build its state in a memory space")
}

// A jitted training step with donated params and state minimizes a quadratic.
func TestJitTrainingStepMinimizesQuadratic(t *testing.T) {
	r := newRand(t)
	target := toParams(randVec(r, 16, 1))
	loss := func(p Params) *trace.Array {
		dw := trace.Sub(p.W, target.W)
		db := trace.Sub(p.B, target.B)
		return trace.Add(trace.Sum(trace.Square(dw)), trace.Sum(trace.Square(db)))
	}
	opt := optim.Chain(optim.ClipByGlobalNorm[Params](10), optim.Adam[Params](optim.WarmupCosine(0.1, 10, 300, 0.001), 0.9, 0.999, 1e-8))
	type State = optim.ChainState[optim.EmptyState, optim.AdamState[Params]]
	step := rt.NewJitted(func(p Params, s State) (Params, State, *trace.Array, error) {
		l, g := trace.ValueAndGrad(loss)(p)
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, l, err
	}, rt.Donate(0, 1))
	params := toParams(make([]float64, 16))
	state, err := opt.Init(params)
	require.NoError(t, err)
	first := loss(params).Item()
	var l *trace.Array
	for range 300 {
		params, state, l, err = step.Fn()(params, state)
		require.NoError(t, err)
	}
	require.Less(t, l.Item(), 1e-3*first)
	require.Equal(t, int64(1), step.Stats().Misses, "compiled once")
	require.InDeltaSlice(t, target.W.Float64s(), params.W.Float64s(), 1e-2)
	require.Equal(t, []int32{300}, state.Second.Count.Int32s())
}

func stateBytes(s any) int64 {
	var n int64
	for _, x := range trace.Leaves(s) {
		n += x.Type().Bytes()
	}
	return n
}

// The offloaded state (made in pinned_host by InitIn, written back with
// OutSpace) gives the same parameters as the device-resident state, and the
// program counts the state as host argument and output bytes.
func TestOffloadedStateMatchesDevice(t *testing.T) {
	r := newRand(t)
	opt := optim.AdamW[Params](optim.Constant(0.01), 0.9, 0.999, 1e-8, 0.01)
	type State = optim.AdamState[Params]
	stepFn := func(p Params, s State, g Params) (Params, State, error) {
		p, s, err := optim.Step(opt, g, s, p)
		return p, s, err
	}
	dev := rt.Jit(stepFn, rt.Donate(0, 1))
	off := rt.NewJitted(stepFn, rt.Donate(0, 1), rt.OutSpace(1, ir.PinnedHost))

	p0 := randVec(r, 16, 1)
	pd, po := toParams(p0), toParams(p0)
	sd, err := opt.Init(pd)
	require.NoError(t, err)
	so, err := optim.InitIn(opt, po, ir.PinnedHost)
	require.NoError(t, err)
	for _, x := range trace.Leaves(so) {
		require.Equal(t, ir.PinnedHost, x.Space())
	}
	nbytes := stateBytes(so)
	require.Equal(t, int64(2*16*4+4), nbytes)

	g0 := toParams(randVec(r, 16, 1))
	low, err := off.Lower(po, so, g0)
	require.NoError(t, err)
	c, err := low.Compile()
	require.NoError(t, err)
	m := c.MemoryAnalysis()
	require.Equal(t, nbytes, m.HostArgumentBytes)
	require.Equal(t, nbytes, m.HostOutputBytes)

	for range 4 {
		g := randVec(r, 16, 1)
		pd, sd, err = dev(pd, sd, toParams(g))
		require.NoError(t, err)
		po, so, err = off.Fn()(po, so, toParams(g))
		require.NoError(t, err)
		require.Equal(t, fromParams(pd), fromParams(po))
		require.Equal(t, ir.Device, po.W.Space())
		for _, x := range trace.Leaves(so) {
			require.Equal(t, ir.PinnedHost, x.Space())
		}
		for _, x := range trace.Leaves(sd) {
			require.Equal(t, ir.Device, x.Space())
		}
	}
	require.Equal(t, sd.Count.Int32s(), so.Count.Int32s())
	require.Equal(t, sd.Mu.W.Float32s(), so.Mu.W.Float32s())

	// ToSpace back to device, typed.
	back, err := optim.ToSpace(so, ir.Device)
	require.NoError(t, err)
	require.Equal(t, ir.Device, back.Mu.W.Space())
}

// Low-precision parameters keep their dtype through every optimizer, and the
// state of each optimizer has the parameters' dtypes.
func TestBF16Params(t *testing.T) {
	p := Params{W: trace.Convert(rt.FromSlice(make([]float32, 12), 3, 4), ir.BFloat16), B: trace.Convert(rt.FromSlice(make([]float32, 4), 4), ir.Float16)}
	g, err := trace.MapAs(p, func(x *trace.Array) *trace.Array { return trace.OnesLike(x) })
	require.NoError(t, err)
	for _, c := range optCases() {
		s, err := c.opt.init(p)
		require.NoError(t, err, c.name)
		u, s, err := c.opt.update(g, s, p)
		require.NoError(t, err, c.name)
		require.Equal(t, ir.BFloat16, u.W.DType(), c.name)
		require.Equal(t, ir.Float16, u.B.DType(), c.name)
		q, err := optim.ApplyUpdates(p, u)
		require.NoError(t, err, c.name)
		require.Equal(t, ir.BFloat16, q.W.DType(), c.name)
		if c.name != "SGDWarmupCosine" { // whose learning rate is 0 at step 0
			require.Less(t, q.W.Float64s()[0], 0.0, c.name)
		}
		if a, ok := s.(optim.AdamState[Params]); ok {
			require.Equal(t, ir.BFloat16, a.Mu.W.DType(), c.name)
		}
	}
}
