package main

import (
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// copyBytes is the size of the array the copy cases move (1 GiB).
const copyBytes = 1 << 30

// copyModel moves one f32 array of copyBytes from pinned_host to device
// (h2d) or back (d2h): device_put inside a jitted function, the copy a
// training step's offload makes.
func copyModel(h2d bool) *ir.Func {
	from, to := ir.Device, ir.PinnedHost
	if h2d {
		from, to = ir.PinnedHost, ir.Device
	}
	return traceFn("copy", []ir.Type{f32(copyBytes / 4).WithSpace(from)}, func(a []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.DevicePut(a[0], to)}
	})
}
