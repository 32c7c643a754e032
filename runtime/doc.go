// Package runtime (imported as rt) compiles and runs Ferry programs: rt.Jit
// traces a Go function over arrays into IR once per input signature, compiles it
// with the default backend and caches it; rt.Lower traces without running and
// gives the IR (l, err := rt.Lower(f, x, y); l.IR()); rt.FromSlice and
// friends make concrete arrays; the CPU backend is always registered.
//
//	f := rt.Jit(func(x, y *trace.Array) *trace.Array {
//		return trace.Add(trace.Mul(x, y), y)
//	})
//	z := f(rt.FromSlice([]float32{1, 2}), rt.FromSlice([]float32{3, 4}))
//
// rt.Scalar(0.5) is weakly typed like trace.Scalar (a Python float in JAX):
// it takes the dtype of the array it meets. rt.ScalarOf(float32(0.5)) and
// rt.ScalarOf(int32(0)) are strongly typed scalars of their Go type's dtype.
//
// A jitted function is safe for concurrent use: concurrent first calls with one
// signature compile it once and share the executable.
//
// # Debugging NaNs
//
// FERRY_DEBUG_NANS=1 (or rt.SetDebugNans(true)), like jax_debug_nans, makes an
// op that produces a NaN from operands without NaN an error naming the op and
// the Go line that made it:
//
//	model.go:42: log: produced NaN (element 3) from operands without NaN in jitted function loss called at train.go:88 (FERRY_DEBUG_NANS)
//
// FERRY_DEBUG_INFS=1 (rt.SetDebugInfs), like jax_debug_infs, does the same for
// an op that produces +Inf or -Inf from operands without NaN or Inf (log(0),
// 1/0, an overflowing exp).
//
// Eager ops are checked one by one. A jitted call checks its results; when one
// holds a NaN (or Inf) it runs the traced function again op by op with the
// reference executor, unfused (inside scan, while and cond bodies too), to find
// the first op that made it. The error is a *trace.Error wrapping a *NaNError.
// NaN or Inf already in the arguments, constants such as a -inf mask, and what
// an op makes from empty operands are no error; only floating-point values are
// checked. When the checks are off they cost one atomic load per call.
package runtime
