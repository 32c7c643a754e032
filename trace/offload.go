package trace

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// DevicePut returns x in memory space space (jax.device_put with a memory
// kind). While tracing it records a device_put op: a copy between memory
// spaces that the compiler schedules like any other op (and removes when x is
// already there). On a concrete array it moves it: the result is a new
// concrete array whose buffer the runtime allocates from the pool of space
// (pinned_host arrays come from the host pool and do not count against device
// memory); x itself is left as it is (Delete it to free its memory). When x
// is already in space, x itself is returned.
//
// Differentiating through DevicePut is the identity, and the cotangent lives
// on device (see Grad).
func DevicePut(x *Array, space ir.MemorySpace) *Array {
	checkLive("DevicePut", x)
	if space != ir.Device && space != ir.PinnedHost {
		panic(Errorf("DevicePut", "invalid memory space %v", space))
	}
	if x.Space() == space {
		return x
	}
	return Apply1(ir.DevicePut, ir.Attrs{"space": space}, x)
}

// moveInHostParams returns a copy of args with each HostParam replaced by
// a device copy, unless op code (device_put, optimization_barrier, control
// flow) reads pinned_host arrays itself. The copies are not HostParams, so
// apply called again with the result does not come back here.
func moveInHostParams(code ir.Code, args []*Array) []*Array {
	out := make([]*Array, len(args))
	for i, a := range args {
		out[i] = a
		if a != nil && a.moveIn {
			if code == ir.DevicePut || code == ir.OptimizationBarrier || code.Info().Class == ir.ClassRegion {
				out[i] = &Array{typ: a.typ, val: a.val, tr: a.tr, weak: a.weak}
			} else {
				out[i] = Apply1(ir.DevicePut, ir.Attrs{"space": ir.Device}, a)
			}
		}
	}
	return out
}

// checkHostOperands panics with *Error when an op other than device_put,
// optimization_barrier (an identity that keeps each operand's space) and the
// control-flow ops (scan, while, cond) reads a pinned_host array, as JAX
// refuses device computations on host memory: the op would otherwise read all
// of the array and give a device result, a silent copy of the whole array to
// device. Scan streams pinned_host xs over axis 0; for another axis the
// message says how to lay the array out instead.
func checkHostOperands(code ir.Code, attrs ir.Attrs, args []*Array) {
	if code == ir.DevicePut || code == ir.OptimizationBarrier || code.Info().Class == ir.ClassRegion {
		return
	}
	for i, a := range args {
		if a == nil || a.typ.Space != ir.PinnedHost {
			continue
		}
		msg := fmt.Sprintf("operand %d (%v) is in pinned_host memory, and ops compute on device arrays only: "+
			"reading it here would copy all of it to device. Move it first with trace.DevicePut(x, ir.Device), "+
			"or pass it to Scan as an xs, which streams it to the body one axis-0 slice per iteration", i, a.typ)
		if axis := hostAxis(code, attrs, a); axis > 0 {
			msg += fmt.Sprintf(". Pinned_host arrays are scanned over axis 0 only: to scan over axis %d, store the array "+
				"with axis %d first (transpose it on device, or when building it, then DevicePut(..., ir.PinnedHost)), "+
				"so that each step copies one contiguous slice", axis, axis)
		}
		panic(Errorf(code.String(), "%s", msg))
	}
}

// hostAxis returns the axis an indexing or layout op on a would bring to the
// front or select along (the axis a user scanning a over it means), or -1.
func hostAxis(code ir.Code, attrs ir.Attrs, a *Array) int {
	shape := a.typ.Shape
	switch code {
	case ir.Transpose:
		if perm := attrs.Ints("perm"); len(perm) > 0 {
			return perm[0]
		}
	case ir.Slice:
		start, limit := attrs.Ints("start"), attrs.Ints("limit")
		for d := range shape {
			if d < len(start) && d < len(limit) && limit[d]-start[d] < shape[d] {
				return d
			}
		}
	case ir.Gather:
		return attrs.Int("axis")
	case ir.DynamicSlice:
		sizes := attrs.Ints("sizes")
		for d := range shape {
			if d < len(sizes) && sizes[d] < shape[d] {
				return d
			}
		}
	}
	return -1
}
