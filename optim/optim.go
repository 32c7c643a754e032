package optim

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Optimizer is a gradient transformation over parameters of type P (a tree of
// arrays, typically a struct of *trace.Array fields) with a state of type S,
// like optax.GradientTransformation. Both P and S are trees, so they pass
// through rt.Jit, rt.Donate, rt.OutSpace and package checkpoint unchanged.
type Optimizer[P, S any] interface {
	// Init returns the initial state for params, in device memory. Running out
	// of device memory is an error (an *rt.OutOfMemoryError inside), never a
	// panic. Abstract params (trace.Abstract) give an abstract state, for
	// lowering a step that is too large to run.
	Init(params P) (S, error)
	// Update turns grads (of the parameters' type) into updates of the same
	// type, which are to be ADDED to the parameters (see ApplyUpdates), and
	// returns the new state. params are the current parameters; optimizers
	// that do not need them (all of this package's but AdamW with a nonzero
	// weight decay) accept the zero P. State leaves that are not in device
	// memory (an offloaded state) are moved to the device first.
	Update(grads P, state S, params P) (updates P, newState S, err error)
}

// SpaceIniter is implemented by optimizers that build their state directly in
// a memory space (see InitIn). Every optimizer of this package does; Chain
// does when both of its parts do.
type SpaceIniter[P, S any] interface {
	// InitIn is Init with every state leaf created in space.
	InitIn(params P, space ir.MemorySpace) (S, error)
}

// InitIn returns opt's initial state for params with every leaf created
// directly in memory space space: InitIn(opt, params, ir.PinnedHost) builds an
// offloaded optimizer state without ever allocating it in device memory, which
// Init followed by ToSpace would do. Concrete params give a concrete state,
// abstract params (trace.Abstract) an abstract one; while tracing, the state
// is made by ops recorded into the trace and put in space with
// trace.DevicePut. Running out of memory is an error, never a panic. opt must
// implement SpaceIniter.
func InitIn[P, S any](opt Optimizer[P, S], params P, space ir.MemorySpace) (S, error) {
	var zero S
	if space != ir.Device && space != ir.PinnedHost {
		return zero, fmt.Errorf("optim.InitIn: invalid memory space %v (want device or pinned_host)", space)
	}
	si, ok := opt.(SpaceIniter[P, S])
	if !ok {
		return zero, fmt.Errorf("optim.InitIn: %T cannot build its state in a memory space (it has no InitIn method): use Init and ToSpace", opt)
	}
	return si.InitIn(params, space)
}

// CountState is the state of SGD: the number of updates done so far (an i32
// scalar), from which the learning-rate schedule is evaluated.
type CountState struct {
	Count *trace.Array
}

// MomentumState is the state of Momentum: the step count and the momentum
// trace, of the parameters' type P.
type MomentumState[P any] struct {
	Count *trace.Array
	Trace P
}

// AdamState is the state of Adam and AdamW: the step count and the first (Mu)
// and second (Nu) moment estimates, of the parameters' type P and dtypes. A
// checkpoint names its tensors by their path, such as Mu.Layers[0].W.
type AdamState[P any] struct {
	Count *trace.Array
	Mu    P
	Nu    P
}

// EmptyState is the state of stateless transformations (ClipByGlobalNorm).
type EmptyState struct{}

// ChainState is the state of Chain(first, second): the state of each part.
type ChainState[S1, S2 any] struct {
	First  S1
	Second S2
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

// unflatten rebuilds a P from the leaves of a tree of structure def.
func unflatten[P any](def *trace.TreeDef, leaves []*trace.Array) P {
	p, err := trace.UnflattenAs[P](def, leaves)
	if err != nil {
		panic(trace.WrapError("optim", err))
	}
	return p
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

func incr(count *trace.Array) *trace.Array { return trace.Add(count, trace.ScalarInt(1)) }

// like converts x to the dtype of ref (updates keep the gradients' dtypes).
func like(x, ref *trace.Array) *trace.Array { return trace.Convert(x, ref.DType()) }

func countOf(name string, c *trace.Array) (*trace.Array, error) {
	if c == nil {
		return nil, fmt.Errorf("optim.%s: state has no Count (use the state from this optimizer's Init)", name)
	}
	if c.Rank() != 0 || c.DType() != ir.Int32 {
		return nil, fmt.Errorf("optim.%s: state Count is %v, want an i32 scalar", name, c.Type())
	}
	return onDevice(c), nil
}

// ---- SGD ----

type sgd[P any] struct{ lr Schedule }

// SGD is stochastic gradient descent: updates = -lr(count)·grads (optax.sgd
// without momentum). Its state is a CountState.
func SGD[P any](lr Schedule) Optimizer[P, CountState] { return sgd[P]{lr} }

func (o sgd[P]) Init(params P) (CountState, error) { return o.InitIn(params, ir.Device) }

// InitIn is Init with the state in space (see the package function InitIn).
func (o sgd[P]) InitIn(params P, space ir.MemorySpace) (CountState, error) {
	var s CountState
	err := build("SGD", params, space, func(b *builder) { s = CountState{Count: b.count()} })
	return s, err
}

func (o sgd[P]) Update(grads P, state CountState, params P) (updates P, newState CountState, err error) {
	defer trace.Recover(&err)
	count, err := countOf("SGD", state.Count)
	if err != nil {
		return updates, state, err
	}
	lr := o.lr(count)
	u, err := trace.MapAs(grads, func(g *trace.Array) *trace.Array { return like(trace.Mul(trace.Neg(lr), g), g) })
	if err != nil {
		return updates, state, fmt.Errorf("optim.SGD: grads: %w", err)
	}
	return u, CountState{Count: incr(count)}, nil
}

// ---- Momentum ----

type momentum[P any] struct {
	lr       Schedule
	beta     float64
	nesterov bool
}

// Momentum is SGD with (heavy-ball or Nesterov) momentum, as optax.sgd with
// momentum: trace = grads + beta·trace; updates = -lr(count)·trace, or with
// nesterov -lr(count)·(grads + beta·trace). Its state is a MomentumState[P].
func Momentum[P any](lr Schedule, beta float64, nesterov bool) Optimizer[P, MomentumState[P]] {
	return momentum[P]{lr, beta, nesterov}
}

func (o momentum[P]) Init(params P) (MomentumState[P], error) { return o.InitIn(params, ir.Device) }

// InitIn is Init with the state in space (see the package function InitIn).
func (o momentum[P]) InitIn(params P, space ir.MemorySpace) (MomentumState[P], error) {
	var s MomentumState[P]
	err := build("Momentum", params, space, func(b *builder) {
		s = MomentumState[P]{Count: b.count(), Trace: zerosLike(b, params)}
	})
	return s, err
}

func (o momentum[P]) Update(grads P, state MomentumState[P], params P) (updates P, newState MomentumState[P], err error) {
	defer trace.Recover(&err)
	count, err := countOf("Momentum", state.Count)
	if err != nil {
		return updates, state, err
	}
	g, err := flatten("optim.Momentum: grads", grads)
	if err != nil {
		return updates, state, err
	}
	tr, err := flattenAs("optim.Momentum: state Trace", state.Trace, g)
	if err != nil {
		return updates, state, err
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
	return unflatten[P](g.def, us), MomentumState[P]{Count: incr(count), Trace: unflatten[P](g.def, ts)}, nil
}

// ---- Adam / AdamW ----

type adam[P any] struct {
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
// Its state is an AdamState[P] whose moments have the parameters' dtypes.
func Adam[P any](lr Schedule, b1, b2, eps float64) Optimizer[P, AdamState[P]] {
	return adam[P]{name: "Adam", lr: lr, b1: b1, b2: b2, eps: eps}
}

// AdamW is Adam with decoupled weight decay (optax.adamw): the Adam direction
// plus weightDecay·params, scaled by -lr(count). Update needs the params.
func AdamW[P any](lr Schedule, b1, b2, eps, weightDecay float64) Optimizer[P, AdamState[P]] {
	return adam[P]{name: "AdamW", lr: lr, b1: b1, b2: b2, eps: eps, weightDecay: weightDecay, decoupled: true}
}

func (o adam[P]) Init(params P) (AdamState[P], error) { return o.InitIn(params, ir.Device) }

// InitIn is Init with the state in space (see the package function InitIn).
func (o adam[P]) InitIn(params P, space ir.MemorySpace) (AdamState[P], error) {
	var s AdamState[P]
	err := build(o.name, params, space, func(b *builder) {
		s = AdamState[P]{Count: b.count(), Mu: zerosLike(b, params), Nu: zerosLike(b, params)}
	})
	return s, err
}

func (o adam[P]) Update(grads P, state AdamState[P], params P) (updates P, newState AdamState[P], err error) {
	defer trace.Recover(&err)
	count, err := countOf(o.name, state.Count)
	if err != nil {
		return updates, state, err
	}
	g, err := flatten("optim."+o.name+": grads", grads)
	if err != nil {
		return updates, state, err
	}
	mu, err := flattenAs("optim."+o.name+": state Mu", state.Mu, g)
	if err != nil {
		return updates, state, err
	}
	nu, err := flattenAs("optim."+o.name+": state Nu", state.Nu, g)
	if err != nil {
		return updates, state, err
	}
	mu, nu = onDeviceAll(mu), onDeviceAll(nu)
	var ps []*trace.Array
	if o.decoupled && o.weightDecay != 0 {
		if len(trace.Leaves(params)) == 0 && len(g.leaves) > 0 {
			return updates, state, fmt.Errorf("optim.%s: Update needs the params for weight decay", o.name)
		}
		if ps, err = flattenAs("optim."+o.name+": params", params, g); err != nil {
			return updates, state, err
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
	return unflatten[P](g.def, us), AdamState[P]{Count: t, Mu: unflatten[P](g.def, ms), Nu: unflatten[P](g.def, vs)}, nil
}

// ---- ClipByGlobalNorm ----

type clip[P any] struct{ maxNorm float64 }

// ClipByGlobalNorm scales the updates so that their global norm (GlobalNorm)
// is at most maxNorm (optax.clip_by_global_norm): updates are kept when the
// norm is below maxNorm, and multiplied by maxNorm/norm otherwise. Its state is
// an EmptyState. Chain it before an optimizer.
func ClipByGlobalNorm[P any](maxNorm float64) Optimizer[P, EmptyState] { return clip[P]{maxNorm} }

func (o clip[P]) Init(params P) (EmptyState, error) { return o.InitIn(params, ir.Device) }

// InitIn is Init with the state in space (see the package function InitIn).
func (o clip[P]) InitIn(params P, space ir.MemorySpace) (EmptyState, error) {
	return EmptyState{}, build("ClipByGlobalNorm", params, space, func(*builder) {})
}

func (o clip[P]) Update(grads P, state EmptyState, params P) (updates P, newState EmptyState, err error) {
	defer trace.Recover(&err)
	g, err := flatten("optim.ClipByGlobalNorm: grads", grads)
	if err != nil {
		return updates, state, err
	}
	norm := globalNorm(g.leaves)
	keep := trace.Less(norm, trace.Scalar(o.maxNorm))
	us := make([]*trace.Array, len(g.leaves))
	for i, x := range g.leaves {
		scaled := trace.Mul(trace.Div(x, like(norm, x)), trace.Scalar(o.maxNorm))
		us[i] = like(trace.Where(keep, x, scaled), x)
	}
	return unflatten[P](g.def, us), EmptyState{}, nil
}

// ---- Chain ----

type chain[P, S1, S2 any] struct {
	first  Optimizer[P, S1]
	second Optimizer[P, S2]
}

// Chain applies first, then second to first's updates (optax.chain of two).
// Its state is a ChainState[S1, S2] holding both states by name, so that it
// stays typed: a checkpoint names a leaf Second.Mu.W. Chain more by nesting:
// Chain(a, Chain(b, c)).
func Chain[P, S1, S2 any](first Optimizer[P, S1], second Optimizer[P, S2]) Optimizer[P, ChainState[S1, S2]] {
	return chain[P, S1, S2]{first, second}
}

func (c chain[P, S1, S2]) Init(params P) (ChainState[S1, S2], error) {
	var s ChainState[S1, S2]
	var err error
	if s.First, err = c.first.Init(params); err != nil {
		return s, fmt.Errorf("optim.Chain: first: %w", err)
	}
	if s.Second, err = c.second.Init(params); err != nil {
		discard(s.First)
		return s, fmt.Errorf("optim.Chain: second: %w", err)
	}
	return s, nil
}

// InitIn is Init with the state in space (see the package function InitIn).
// Both parts must implement SpaceIniter.
func (c chain[P, S1, S2]) InitIn(params P, space ir.MemorySpace) (ChainState[S1, S2], error) {
	var s ChainState[S1, S2]
	var err error
	if s.First, err = InitIn(c.first, params, space); err != nil {
		return s, fmt.Errorf("optim.Chain: first: %w", err)
	}
	if s.Second, err = InitIn(c.second, params, space); err != nil {
		discard(s.First)
		return s, fmt.Errorf("optim.Chain: second: %w", err)
	}
	return s, nil
}

func (c chain[P, S1, S2]) Update(grads P, state ChainState[S1, S2], params P) (updates P, newState ChainState[S1, S2], err error) {
	u, s1, err := c.first.Update(grads, state.First, params)
	if err != nil {
		return updates, state, fmt.Errorf("optim.Chain: first: %w", err)
	}
	u, s2, err := c.second.Update(u, state.Second, params)
	if err != nil {
		return updates, state, fmt.Errorf("optim.Chain: second: %w", err)
	}
	return u, ChainState[S1, S2]{First: s1, Second: s2}, nil
}

// Step runs one optimizer step: the updates opt computes from grads, state and
// params, applied to params (opt.Update followed by ApplyUpdates, the usual body
// of a training step). On an error it returns params and state unchanged.
func Step[P, S any](opt Optimizer[P, S], grads P, state S, params P) (P, S, error) {
	u, newState, err := opt.Update(grads, state, params)
	if err != nil {
		return params, state, err
	}
	newParams, err := ApplyUpdates(params, u)
	if err != nil {
		return params, state, err
	}
	return newParams, newState, nil
}

// ---- tree utilities ----

// ApplyUpdates returns params + updates, leaf by leaf, each result in its
// parameter's dtype (optax.apply_updates). updates must have the structure of
// params.
func ApplyUpdates[P any](params, updates P) (_ P, err error) {
	defer trace.Recover(&err)
	var z P
	p, err := flatten("optim.ApplyUpdates: params", params)
	if err != nil {
		return z, err
	}
	u, err := flatten("optim.ApplyUpdates: updates", updates)
	if err != nil {
		return z, err
	}
	if diff := p.def.Diff(u.def); diff != "" {
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
	sum := trace.ScalarAs(0, ir.Float32)
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
// ir.Device) brings an offloaded optimizer state back), while tracing it
// records the copies. Leaves already there are kept. To create an offloaded
// state, use InitIn, which never puts it in device memory.
func ToSpace[T any](tree T, space ir.MemorySpace) (_ T, err error) {
	defer trace.Recover(&err)
	return trace.MapAs(tree, func(x *trace.Array) *trace.Array { return trace.DevicePut(x, space) })
}
