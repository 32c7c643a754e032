package optim

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// State is an optimizer state: a tree of arrays (a struct of exported
// *trace.Array fields and nested trees), so that it can be passed through
// rt.Jit, donated, offloaded to host memory and checkpointed like the
// parameters. Each optimizer documents its concrete state type.
type State = any

// Optimizer is a gradient transformation, like optax.GradientTransformation.
type Optimizer interface {
	// Init returns the initial state for params (a tree of arrays).
	Init(params any) (State, error)
	// Update turns grads (a tree with the structure of the parameters) into
	// updates of the same structure and Go type, which are to be ADDED to the
	// parameters (see ApplyUpdates), and returns the new state. params are the
	// current parameters; optimizers that do not need them (all but AdamW)
	// accept nil. State leaves that are not in device memory (an offloaded
	// state) are moved to the device first.
	Update(grads, state, params any) (updates any, newState State, err error)
}

// CountState is the state of SGD: the number of updates done so far (an i32
// scalar), from which the learning-rate schedule is evaluated.
type CountState struct {
	Count *trace.Array
}

// MomentumState is the state of Momentum: the step count and the momentum
// trace (a tree of the parameters' structure and Go type).
type MomentumState struct {
	Count *trace.Array
	Trace any
}

// AdamState is the state of Adam and AdamW: the step count and the first (Mu)
// and second (Nu) moment estimates, trees of the parameters' structure and Go
// type.
type AdamState struct {
	Count *trace.Array
	Mu    any
	Nu    any
}

// EmptyState is the state of stateless transformations (ClipByGlobalNorm).
type EmptyState struct{}

// ChainState is the state of Chain: one state per chained optimizer.
type ChainState struct {
	States []State
}

// ---- helpers ----

// flat is a flattened tree with its structure.
type flat struct {
	leaves []*trace.Array
	def    *trace.TreeDef
}

func flatten(what string, tree any) (flat, error) {
	l, d, err := trace.Flatten(tree)
	if err != nil {
		return flat{}, fmt.Errorf("%s: %w", what, err)
	}
	return flat{l, d}, nil
}

// flattenAs flattens tree and checks that it has ref's structure.
func flattenAs(what string, tree any, ref flat) ([]*trace.Array, error) {
	f, err := flatten(what, tree)
	if err != nil {
		return nil, err
	}
	if diff := ref.def.Diff(f.def); diff != "" {
		return nil, fmt.Errorf("%s does not have the structure of the gradients: %s", what, diff)
	}
	return f.leaves, nil
}

// onDevice moves an offloaded array to device memory (a no-op for device arrays).
func onDevice(x *trace.Array) *trace.Array {
	if x == nil || x.Space() == ir.Device {
		return x
	}
	return trace.DevicePut(x, ir.Device)
}

func onDeviceAll(xs []*trace.Array) []*trace.Array {
	out := make([]*trace.Array, len(xs))
	for i, x := range xs {
		out[i] = onDevice(x)
	}
	return out
}

// zeroCount is the initial step count: an i32 scalar 0.
func zeroCount() *trace.Array { return trace.ScalarOf(0, ir.Int32) }

func incr(count *trace.Array) *trace.Array { return trace.Add(count, trace.ScalarInt(1)) }

// like converts x to the dtype of ref (updates keep the gradients' dtypes).
func like(x, ref *trace.Array) *trace.Array { return trace.Convert(x, ref.DType()) }

func zerosLike(params any) (any, error) {
	return trace.Map(params, func(x *trace.Array) *trace.Array {
		return trace.Zeros(x.Shape(), x.DType())
	})
}

// stateOf checks the dynamic type of an optimizer state.
func stateOf[S any](name string, state any) (S, error) {
	s, ok := state.(S)
	if !ok {
		var z S
		return z, fmt.Errorf("optim.%s: state is a %T, not a %T (use the state from this optimizer's Init)", name, state, z)
	}
	return s, nil
}

func countOf(name string, c *trace.Array) (*trace.Array, error) {
	if c == nil {
		return nil, fmt.Errorf("optim.%s: state has no Count", name)
	}
	if c.Rank() != 0 || c.DType() != ir.Int32 {
		return nil, fmt.Errorf("optim.%s: state Count is %v, want an i32 scalar", name, c.Type())
	}
	return onDevice(c), nil
}

// ---- SGD ----

type sgd struct{ lr Schedule }

// SGD is stochastic gradient descent: updates = -lr(count)·grads (optax.sgd
// without momentum). Its state is a CountState.
func SGD(lr Schedule) Optimizer { return sgd{lr} }

func (o sgd) Init(params any) (State, error) {
	if _, err := flatten("optim.SGD.Init: params", params); err != nil {
		return nil, err
	}
	return CountState{Count: zeroCount()}, nil
}

func (o sgd) Update(grads, state, params any) (updates any, newState State, err error) {
	defer trace.Recover(&err)
	s, err := stateOf[CountState]("SGD", state)
	if err != nil {
		return nil, nil, err
	}
	count, err := countOf("SGD", s.Count)
	if err != nil {
		return nil, nil, err
	}
	lr := o.lr(count)
	u, err := trace.Map(grads, func(g *trace.Array) *trace.Array { return like(trace.Mul(trace.Neg(lr), g), g) })
	if err != nil {
		return nil, nil, fmt.Errorf("optim.SGD: grads: %w", err)
	}
	return u, CountState{Count: incr(count)}, nil
}

// ---- Momentum ----

type momentum struct {
	lr       Schedule
	beta     float64
	nesterov bool
}

// Momentum is SGD with (heavy-ball or Nesterov) momentum, as optax.sgd with
// momentum: trace = grads + beta·trace; updates = -lr(count)·trace, or with
// nesterov -lr(count)·(grads + beta·trace). Its state is a MomentumState.
func Momentum(lr Schedule, beta float64, nesterov bool) Optimizer {
	return momentum{lr, beta, nesterov}
}

func (o momentum) Init(params any) (State, error) {
	tr, err := zerosLike(params)
	if err != nil {
		return nil, fmt.Errorf("optim.Momentum.Init: %w", err)
	}
	return MomentumState{Count: zeroCount(), Trace: tr}, nil
}

func (o momentum) Update(grads, state, params any) (updates any, newState State, err error) {
	defer trace.Recover(&err)
	s, err := stateOf[MomentumState]("Momentum", state)
	if err != nil {
		return nil, nil, err
	}
	count, err := countOf("Momentum", s.Count)
	if err != nil {
		return nil, nil, err
	}
	g, err := flatten("optim.Momentum: grads", grads)
	if err != nil {
		return nil, nil, err
	}
	tr, err := flattenAs("optim.Momentum: state Trace", s.Trace, g)
	if err != nil {
		return nil, nil, err
	}
	tr = onDeviceAll(tr)
	lr := o.lr(count)
	beta := trace.Scalar(o.beta)
	us := make([]*trace.Array, len(g.leaves))
	ts := make([]*trace.Array, len(g.leaves))
	for i, gi := range g.leaves {
		t := like(trace.Add(gi, trace.Mul(beta, tr[i])), tr[i])
		ts[i] = t
		d := t
		if o.nesterov {
			d = trace.Add(gi, trace.Mul(beta, t))
		}
		us[i] = like(trace.Mul(trace.Neg(lr), d), gi)
	}
	u, err := g.def.Unflatten(us)
	if err != nil {
		return nil, nil, err
	}
	t, err := g.def.Unflatten(ts)
	if err != nil {
		return nil, nil, err
	}
	return u, MomentumState{Count: incr(count), Trace: t}, nil
}

// ---- Adam / AdamW ----

type adam struct {
	name        string
	lr          Schedule
	b1, b2, eps float64
	weightDecay float64
	decoupled   bool
}

// Adam is the Adam optimizer (optax.adam): with t = count+1,
//
//	mu = b1·mu + (1-b1)·g;  nu = b2·nu + (1-b2)·g²
//	updates = -lr(count) · (mu/(1-b1^t)) / (sqrt(nu/(1-b2^t)) + eps)
//
// Its state is an AdamState whose moments have the parameters' dtypes.
func Adam(lr Schedule, b1, b2, eps float64) Optimizer {
	return adam{name: "Adam", lr: lr, b1: b1, b2: b2, eps: eps}
}

// AdamW is Adam with decoupled weight decay (optax.adamw): the Adam direction
// plus weightDecay·params, scaled by -lr(count). Update needs the params.
func AdamW(lr Schedule, b1, b2, eps, weightDecay float64) Optimizer {
	return adam{name: "AdamW", lr: lr, b1: b1, b2: b2, eps: eps, weightDecay: weightDecay, decoupled: true}
}

func (o adam) Init(params any) (State, error) {
	mu, err := zerosLike(params)
	if err != nil {
		return nil, fmt.Errorf("optim.%s.Init: %w", o.name, err)
	}
	nu, err := zerosLike(params)
	if err != nil {
		return nil, fmt.Errorf("optim.%s.Init: %w", o.name, err)
	}
	return AdamState{Count: zeroCount(), Mu: mu, Nu: nu}, nil
}

func (o adam) Update(grads, state, params any) (updates any, newState State, err error) {
	defer trace.Recover(&err)
	s, err := stateOf[AdamState](o.name, state)
	if err != nil {
		return nil, nil, err
	}
	count, err := countOf(o.name, s.Count)
	if err != nil {
		return nil, nil, err
	}
	g, err := flatten("optim."+o.name+": grads", grads)
	if err != nil {
		return nil, nil, err
	}
	mu, err := flattenAs("optim."+o.name+": state Mu", s.Mu, g)
	if err != nil {
		return nil, nil, err
	}
	nu, err := flattenAs("optim."+o.name+": state Nu", s.Nu, g)
	if err != nil {
		return nil, nil, err
	}
	mu, nu = onDeviceAll(mu), onDeviceAll(nu)
	var ps []*trace.Array
	if o.decoupled && o.weightDecay != 0 {
		if params == nil {
			return nil, nil, fmt.Errorf("optim.%s: Update needs the params for weight decay", o.name)
		}
		if ps, err = flattenAs("optim."+o.name+": params", params, g); err != nil {
			return nil, nil, err
		}
	}
	lr := o.lr(count)
	t := incr(count)
	tf := trace.Convert(t, ir.Float32)
	bc1 := trace.Sub(trace.Scalar(1), trace.Pow(trace.Scalar(o.b1), tf))
	bc2 := trace.Sub(trace.Scalar(1), trace.Pow(trace.Scalar(o.b2), tf))
	n := len(g.leaves)
	us, ms, vs := make([]*trace.Array, n), make([]*trace.Array, n), make([]*trace.Array, n)
	for i, gi := range g.leaves {
		m := like(trace.Add(trace.Mul(trace.Scalar(o.b1), mu[i]), trace.Mul(trace.Scalar(1-o.b1), gi)), mu[i])
		v := like(trace.Add(trace.Mul(trace.Scalar(o.b2), nu[i]), trace.Mul(trace.Scalar(1-o.b2), trace.Square(gi))), nu[i])
		ms[i], vs[i] = m, v
		d := trace.Div(trace.Div(m, bc1), trace.Add(trace.Sqrt(trace.Div(v, bc2)), trace.Scalar(o.eps)))
		if ps != nil {
			d = trace.Add(d, trace.Mul(trace.Scalar(o.weightDecay), ps[i]))
		}
		us[i] = like(trace.Mul(trace.Neg(lr), d), gi)
	}
	u, err := g.def.Unflatten(us)
	if err != nil {
		return nil, nil, err
	}
	m, err := g.def.Unflatten(ms)
	if err != nil {
		return nil, nil, err
	}
	v, err := g.def.Unflatten(vs)
	if err != nil {
		return nil, nil, err
	}
	return u, AdamState{Count: t, Mu: m, Nu: v}, nil
}

// ---- ClipByGlobalNorm ----

type clip struct{ maxNorm float64 }

// ClipByGlobalNorm scales the updates so that their global norm (GlobalNorm)
// is at most maxNorm (optax.clip_by_global_norm): updates are kept when the
// norm is below maxNorm, and multiplied by maxNorm/norm otherwise. Its state is
// an EmptyState. Chain it before an optimizer.
func ClipByGlobalNorm(maxNorm float64) Optimizer { return clip{maxNorm} }

func (o clip) Init(params any) (State, error) { return EmptyState{}, nil }

func (o clip) Update(grads, state, params any) (updates any, newState State, err error) {
	defer trace.Recover(&err)
	g, err := flatten("optim.ClipByGlobalNorm: grads", grads)
	if err != nil {
		return nil, nil, err
	}
	norm := globalNorm(g.leaves)
	keep := trace.Less(norm, trace.Scalar(o.maxNorm))
	us := make([]*trace.Array, len(g.leaves))
	for i, x := range g.leaves {
		scaled := trace.Mul(trace.Div(x, like(norm, x)), trace.Scalar(o.maxNorm))
		us[i] = like(trace.Where(keep, x, scaled), x)
	}
	u, err := g.def.Unflatten(us)
	if err != nil {
		return nil, nil, err
	}
	return u, EmptyState{}, nil
}

// ---- Chain ----

type chain []Optimizer

// Chain applies optimizers in sequence, each to the updates of the previous
// one (optax.chain). Its state is a ChainState with one state per optimizer.
func Chain(opts ...Optimizer) Optimizer { return chain(opts) }

func (c chain) Init(params any) (State, error) {
	st := ChainState{States: make([]State, len(c))}
	for i, o := range c {
		s, err := o.Init(params)
		if err != nil {
			return nil, fmt.Errorf("optim.Chain: optimizer %d: %w", i, err)
		}
		st.States[i] = s
	}
	return st, nil
}

func (c chain) Update(grads, state, params any) (updates any, newState State, err error) {
	s, err := stateOf[ChainState]("Chain", state)
	if err != nil {
		return nil, nil, err
	}
	if len(s.States) != len(c) {
		return nil, nil, fmt.Errorf("optim.Chain: state has %d states for %d optimizers", len(s.States), len(c))
	}
	out := ChainState{States: make([]State, len(c))}
	u := grads
	for i, o := range c {
		u, out.States[i], err = o.Update(u, s.States[i], params)
		if err != nil {
			return nil, nil, fmt.Errorf("optim.Chain: optimizer %d: %w", i, err)
		}
	}
	return u, out, nil
}

// ---- tree utilities ----

// ApplyUpdates returns params + updates, leaf by leaf, each result in its
// parameter's dtype (optax.apply_updates). updates must have the structure of
// params.
func ApplyUpdates[P any](params P, updates any) (_ P, err error) {
	defer trace.Recover(&err)
	p, err := flatten("optim.ApplyUpdates: params", params)
	if err != nil {
		var z P
		return z, err
	}
	u, err := flatten("optim.ApplyUpdates: updates", updates)
	if err != nil {
		var z P
		return z, err
	}
	if diff := p.def.Diff(u.def); diff != "" {
		var z P
		return z, fmt.Errorf("optim.ApplyUpdates: updates do not have the structure of params: %s", diff)
	}
	out := make([]*trace.Array, len(p.leaves))
	for i, x := range p.leaves {
		out[i] = like(trace.Add(x, u.leaves[i]), x)
	}
	return trace.UnflattenAs[P](p.def, out)
}

// GlobalNorm returns sqrt(Σ x²) over every element of every leaf of tree, a
// scalar computed in f32 (f64 if any leaf is f64); 0 for a tree without leaves.
// It panics with *trace.Error if tree cannot be flattened.
func GlobalNorm(tree any) *trace.Array {
	return globalNorm(trace.Leaves(tree))
}

func globalNorm(leaves []*trace.Array) *trace.Array {
	sum := trace.ScalarOf(0, ir.Float32)
	for _, x := range leaves {
		if x.DType() != ir.Float64 {
			x = trace.Convert(x, ir.Float32)
		}
		sum = trace.Add(sum, trace.Sum(trace.Square(x)))
	}
	return trace.Sqrt(sum)
}

// ToSpace returns tree with every leaf put in memory space space with
// trace.DevicePut: on concrete arrays it moves them (ToSpace(state,
// ir.PinnedHost) offloads an optimizer state), while tracing it records the
// copies. Leaves already there are kept.
func ToSpace(tree any, space ir.MemorySpace) (_ any, err error) {
	defer trace.Recover(&err)
	return trace.Map(tree, func(x *trace.Array) *trace.Array { return trace.DevicePut(x, space) })
}

// ToSpaceAs is ToSpace for a tree whose type is known at compile time.
func ToSpaceAs[T any](tree T, space ir.MemorySpace) (_ T, err error) {
	defer trace.Recover(&err)
	return trace.MapAs(tree, func(x *trace.Array) *trace.Array { return trace.DevicePut(x, space) })
}
