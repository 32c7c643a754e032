// Package optim provides gradient-based optimizers over trees of arrays, in the
// style of optax: an Optimizer turns gradients into updates that are added to
// the parameters, and keeps its own state as an ordinary tree.
//
// Optimizers are typed by the parameters' type P and their state's type S:
// Optimizer[P, S]. Parameters may be any tree that trace.Flatten walks
// (typically a struct of *trace.Array fields); a state is a struct of the
// package (AdamState[P] holds the moments Mu and Nu as P values), so reading
// it needs no type assertion: state.Mu.Layers[0].W. Because states are trees,
// they can be passed to and returned from rt.Jit functions, donated with
// rt.Donate, written to host memory with rt.OutSpace, and saved with package
// checkpoint, which names their tensors by path (Mu.Layers[0].W).
//
// Chain composes two optimizers with a typed ChainState; nest it for more.
// Naming the state type once keeps step signatures short:
//
//	opt := optim.Chain(optim.ClipByGlobalNorm[Params](1), optim.Adam[Params](optim.Constant(1e-3), 0.9, 0.999, 1e-8))
//	type OptState = optim.ChainState[optim.EmptyState, optim.AdamState[Params]]
//	state, err := opt.Init(params)
//	step := rt.Jit(func(p Params, s OptState, x *trace.Array) (Params, OptState, error) {
//		g := trace.Grad(func(p Params) *trace.Array { return loss(p, x) })(p)
//		u, s, err := opt.Update(g, s, p)
//		if err != nil {
//			return p, s, err
//		}
//		p, err = optim.ApplyUpdates(p, u)
//		return p, s, err
//	}, rt.Donate(0, 1))
//
// Chain takes two parts rather than a list because Go has no variadic
// heterogeneous generics: a list would have to erase the states to []any and
// bring back the type assertions. To pick an optimizer at run time (from a
// flag, say), write the training loop as a generic function of the state type,
// func train[S any](opt optim.Optimizer[Params, S]), and call it from a
// switch.
//
// Everything works eagerly on concrete arrays as well as while tracing. Init
// returns an error (wrapping *rt.OutOfMemoryError) when the state does not fit
// in device memory.
//
// # Optimizer-state offload
//
// To keep the optimizer state in pinned host memory, create it there with
// InitIn(opt, params, ir.PinnedHost), which never allocates it in device
// memory, and jit the step with rt.OutSpace(1, ir.PinnedHost) so that the
// new state is written back to the host. Update moves every state leaf that is
// not in device memory to the device itself (trace.DevicePut), so the step
// needs no other change; the compiled program then counts the state as host
// argument and host output bytes (Compiled.MemoryAnalysis). InitIn of
// abstract params (trace.Abstract) gives an abstract state, to lower and
// analyse a step too large to run.
//
// The update equations are optax's; Schedule functions give the learning rate
// as a function of the step count kept in the state (the number of updates done
// so far, 0 for the first update).
package optim
