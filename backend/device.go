package backend

import (
	"github.com/ferryml/ferry/ir"
)

// DeviceBuffer is implemented by the buffers of a backend with several
// devices (the CPU backend's virtual devices, FERRY_CPU_DEVICES). A buffer
// that does not implement it is on device 0 and not committed.
//
// A buffer is committed to its device when it was put there explicitly
// (runtime.ToDevice, Placer.FromLiteralOn) or computed from committed
// buffers, as in JAX: a computation runs on the device of its committed
// arguments (which must all be on one device), and uncommitted arguments
// (arrays made without naming a device, on device 0) follow them there.
type DeviceBuffer interface {
	ir.Buffer
	// Device is the index (Device.ID) of the device holding the buffer.
	Device() int
	// Committed reports whether the buffer is committed to its device.
	Committed() bool
}

// Placer is implemented by a backend with several devices.
type Placer interface {
	// FromLiteralOn copies a host literal into a new buffer of the literal's
	// memory space on device dev (Device.ID), committed to it.
	FromLiteralOn(l *ir.Literal, dev int) (ir.Buffer, error)
}

// BufferDevice returns the device index of a buffer and whether it is
// committed to it: (0, false) for a buffer that is not a DeviceBuffer.
func BufferDevice(b ir.Buffer) (dev int, committed bool) {
	if d, ok := b.(DeviceBuffer); ok {
		return d.Device(), d.Committed()
	}
	return 0, false
}
