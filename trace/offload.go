package trace

import "github.com/ferryml/ferry/ir"

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
