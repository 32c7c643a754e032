// Package optim provides gradient-based optimizers over trees of arrays, in the
// style of optax: an Optimizer turns gradients into updates that are added to
// the parameters, and keeps its own state as an ordinary tree.
//
// Parameters may be any tree that trace.Flatten walks (typically a struct of
// *trace.Array fields). Optimizer states are trees too: structs with exported
// *trace.Array fields and nested trees (the moments of Adam hold values of the
// parameters' own type). Because states are trees, they can be passed to and
// returned from rt.Jit functions, donated with rt.Donate, written to host memory
// with rt.OutSpace, and saved with package checkpoint.
//
// A training step:
//
//	opt := optim.Chain(optim.ClipByGlobalNorm(1), optim.Adam(optim.Constant(1e-3), 0.9, 0.999, 1e-8))
//	state, _ := opt.Init(params)
//	step := rt.Jit(func(p Params, s optim.State, x *trace.Array) (Params, optim.State, error) {
//		g := trace.Grad(func(p Params) *trace.Array { return loss(p, x) })(p)
//		u, s, err := opt.Update(g, s, p)
//		if err != nil {
//			return p, s, err
//		}
//		p, err = optim.ApplyUpdates(p, u)
//		return p, s, err
//	}, rt.Donate(0, 1))
//
// Everything works eagerly on concrete arrays as well as while tracing.
//
// # Optimizer-state offload
//
// To keep the optimizer state in pinned host memory between steps, move it
// there once (ToSpace(state, ir.PinnedHost)) and jit the step with
// rt.OutSpace(1, ir.PinnedHost) so that the new state is written back to the
// host. Update moves every state leaf that is not in device memory to the
// device itself (trace.DevicePut), so the step needs no other change; the
// compiled program then counts the state as host argument and host output bytes
// (Compiled.MemoryAnalysis).
//
// The update equations are optax's; Schedule functions give the learning rate
// as a function of the step count kept in the state (the number of updates done
// so far, 0 for the first update).
package optim
