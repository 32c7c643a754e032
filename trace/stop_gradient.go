package trace

import "github.com/ferryml/ferry/ir"

// StopGradient returns x unchanged, except that differentiation treats the
// result as a constant: no cotangent flows through it to x (jax.lax.stop_gradient).
//
// Outside a trace, and for concrete or non-float x, it returns x itself (there is
// nothing to differentiate). Inside a trace it records an identity copy
// (device_put to x's own memory space) whose result is marked for Grad and VJP;
// the compiler removes the copy.
func StopGradient(x *Array) *Array {
	checkLive("StopGradient", x)
	if !x.IsTraced() || !x.DType().IsFloat() {
		return x
	}
	out := Apply1(ir.DevicePut, ir.Attrs{"space": x.Space()}, x)
	adMarkStop(out)
	return out
}
