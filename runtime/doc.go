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
package runtime
