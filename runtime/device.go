package runtime

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// EnvCPUDevices names the environment variable that sets the number of
// virtual CPU devices (backend.EnvCPUDevices; default 1).
const EnvCPUDevices = backend.EnvCPUDevices

// SetCPUDeviceCount gives the CPU backend n virtual devices, cpu:0 to
// cpu:n-1, each with its own device and pinned_host pools sized by the
// memory settings (which it keeps), like XLA's
// --xla_force_host_platform_device_count or FERRY_CPU_DEVICES=n. It is
// ConfigureMemory with MemoryConfig.Devices = n (backend.HostMemory): call
// it before making arrays, or when none is live.
//
// In a job of several processes (InitDistributed) the count is fixed: it is
// an error to change it.
func SetCPUDeviceCount(n int) error {
	if _, _, k, on := distInfo(); on && n != k {
		return fmt.Errorf("rt.SetCPUDeviceCount(%d): this process is in a job of several processes with %d devices each (rt.InitDistributed); the count cannot change", n, k)
	}
	return hostMemory().SetDeviceCount(n)
}

// DeviceOf returns the device holding a concrete array (jax.Array.devices()
// for an array on one device). Arrays made without naming a device are on
// device 0, the default device. A sharded array (DevicePut) is on several
// devices: DeviceOf is an error naming them, and Shards lists its blocks.
func DeviceOf(x *trace.Array) (Device, error) {
	b, err := concreteBuffer("DeviceOf", x)
	if err != nil {
		return Device{}, err
	}
	if sb, ok := b.(*shardedBuffer); ok {
		return Device{}, trace.Errorf("DeviceOf", "array %v is sharded over devices %v: rt.Shards lists its blocks, rt.ToDevice gathers it onto one device",
			sb.typ, sb.typ.Sharding.Mesh.Devices())
	}
	id, _ := backend.BufferDevice(b)
	id = globalID(id)
	for _, d := range Devices() {
		if d.ID == id {
			return d, nil
		}
	}
	return Device{Platform: DefaultBackend().Name(), ID: id, Process: ProcessIndex()}, nil
}

// IsCommitted reports whether a concrete array is committed to its device:
// put there by ToDevice, or computed from committed arrays. A computation
// runs on the device of its committed arguments (all on one device, or it
// is an error) and uncommitted arguments follow them there; with none, it
// runs on device 0. Arrays made without naming a device are not
// committed. This is JAX's rule. Sharded arrays (DevicePut) are committed
// to their mesh.
func IsCommitted(x *trace.Array) bool {
	if x == nil || x.Buffer() == nil {
		return false
	}
	if _, ok := x.Buffer().(*shardedBuffer); ok {
		return true
	}
	_, c := backend.BufferDevice(x.Buffer())
	return c
}

// ToDevice returns a concrete array holding x's values on device dev (one
// of Devices()), in x's memory space, committed to dev (like
// jax.device_put(x, device)): jitted functions and eager ops on it run on
// dev and allocate their results there. x is returned as it is when it is
// already committed to dev; otherwise the values are copied into dev's
// pool (an out-of-memory error names the device). Given a sharded array
// (DevicePut), it gathers the blocks (one replica of each) into one
// unsharded array on dev: jax.device_put(x, device).
func ToDevice(x *trace.Array, dev Device) (*trace.Array, error) {
	b, err := concreteBuffer("ToDevice", x)
	if err != nil {
		return nil, err
	}
	be := DefaultBackend()
	want, err := checkDevice("ToDevice", be, dev)
	if err != nil {
		return nil, err
	}
	if id, c := backend.BufferDevice(b); id == want && c {
		return x, nil
	}
	if p, ok := b.(devicePeerCopier); ok {
		// An accelerator's buffer moves between its devices directly (a
		// peer copy), not through a host literal.
		y, err := p.CopyToDevice(want)
		if err != nil {
			return nil, trace.WrapError("ToDevice", err)
		}
		return trace.FromBuffer(y), nil
	}
	l, err := b.Literal()
	if err != nil {
		return nil, trace.WrapError("ToDevice", err)
	}
	y, err := FromLiteralOn(l, dev)
	if err != nil {
		return nil, trace.WrapError("ToDevice", err)
	}
	return y, nil
}

// devicePeerCopier is implemented by the buffers of a backend with several
// devices that copies between them directly (the CUDA backend's:
// cuMemcpyPeerAsync): CopyToDevice returns a copy on device dev, committed
// to it.
type devicePeerCopier interface {
	CopyToDevice(dev int) (ir.Buffer, error)
}

// FromLiteralOn copies a host literal into a new concrete array on device
// dev (one of Devices()), committed to it, without passing through device 0
// as FromLiteral followed by ToDevice would.
func FromLiteralOn(l *ir.Literal, dev Device) (*trace.Array, error) {
	be := DefaultBackend()
	id, err := checkDevice("FromLiteralOn", be, dev)
	if err != nil {
		return nil, err
	}
	var b trace.Buffer
	if p, ok := be.(backend.Placer); ok {
		b, err = p.FromLiteralOn(l, id)
	} else {
		b, err = be.FromLiteral(l) // a single-device backend
	}
	if err != nil {
		return nil, trace.WrapError("FromLiteralOn", err)
	}
	return trace.FromBuffer(b), nil
}

// DeviceMemoryStats returns the statistics of a memory space of one
// device of the default backend (each device has its own pools; see
// MemoryConfig). MemoryStats(space) is DeviceMemoryStats of device 0.
func DeviceMemoryStats(dev Device, space ir.MemorySpace) (MemStats, error) {
	be := DefaultBackend()
	id, err := checkDevice("DeviceMemoryStats", be, dev)
	if err != nil {
		return MemStats{}, err
	}
	if s, ok := memoryStats(be, id, space); ok {
		return s, nil
	}
	return MemStats{}, trace.Errorf("DeviceMemoryStats", "%s holds no %v memory", backend.DeviceName(dev.Platform, dev.ID), space)
}

// memoryStats returns the statistics of a memory space of device dev of
// be (backend.Memory); a backend that does not report its memory runs on
// the host pools, whose statistics it returns.
func memoryStats(be Backend, dev int, space ir.MemorySpace) (MemStats, bool) {
	m, ok := be.(backend.Memory)
	if !ok {
		m, ok = hostMemory().(backend.Memory)
	}
	if !ok {
		return MemStats{Platform: be.Name(), Device: dev, Space: space}, false
	}
	return m.MemoryStats(dev, space)
}

// concreteBuffer returns x's buffer, or an error naming op for an array
// that has none.
func concreteBuffer(op string, x *trace.Array) (trace.Buffer, error) {
	switch {
	case x == nil:
		return nil, trace.Errorf(op, "nil array")
	case x.IsTraced():
		return nil, trace.Errorf(op, "array %v is traced: its device is chosen when the jitted function runs", x.Type())
	case x.Buffer() == nil:
		return nil, trace.Errorf(op, "array %v is abstract (trace.Abstract): it has no device", x.Type())
	}
	return x.Buffer(), nil
}

// checkDevice returns be's ID of dev, or an error naming op unless dev is a
// device of be in this process (in a job of several processes, dev.ID is a
// global device ID: see InitDistributed).
func checkDevice(op string, be Backend, dev Device) (int, error) {
	devs := be.Devices()
	id, ok := localID(dev.ID)
	if dev.Platform == be.Name() && dev.ID >= 0 && ok && id < len(devs) {
		return id, nil
	}
	if dev.Platform == be.Name() && dev.ID >= 0 && dev.ID < len(Devices()) {
		return -1, trace.Errorf(op, "device %s belongs to process %d, not to this process %d: rt.LocalDevices lists this process's",
			backend.DeviceName(dev.Platform, dev.ID), dev.ID/len(devs), ProcessIndex())
	}
	all := Devices()
	names := make([]string, len(all))
	for i, d := range all {
		names[i] = backend.DeviceName(d.Platform, d.ID)
	}
	return -1, trace.Errorf(op, "no device %s: the %s backend has %s (set %s for more CPU devices)",
		backend.DeviceName(dev.Platform, dev.ID), be.Name(), strings.Join(names, ", "), EnvCPUDevices)
}

// placeArgs decides where a computation on bufs runs: on device want if
// want >= 0 (its results committed there), else on the device of its
// committed buffers, or on device 0 when none is; its results are
// committed when an argument is. clash is (i, j) when committed buffers i
// and j are on different devices, (i, -1) when committed buffer i is not on
// device want (errors), else (-1, -1). move reports uncommitted buffers on
// another device, which moveArgs copies there.
func placeArgs(bufs []trace.Buffer, want int) (dev int, commit, move bool, clash [2]int) {
	clash = [2]int{-1, -1}
	first := -1
	if want >= 0 {
		dev, commit = want, true
	}
	for i, b := range bufs {
		d, c := backend.BufferDevice(b)
		switch {
		case !c:
		case want >= 0:
			if d != want {
				clash[0] = i
				return dev, commit, false, clash
			}
		case first < 0:
			first, dev, commit = i, d, true
		case d != dev:
			clash = [2]int{first, i}
			return dev, commit, false, clash
		}
	}
	for _, b := range bufs {
		if d, c := backend.BufferDevice(b); !c && d != dev {
			move = true
			break
		}
	}
	return dev, commit, move, clash
}

// moveArgs replaces the uncommitted buffers of bufs that are not on device
// dev by copies there (as JAX moves uncommitted arguments to the device of
// the committed ones) and returns the copies, which the caller deletes
// (freeCopies) once the call is done. donated[i] (if donated is not nil)
// marks a donated buffer, which is an error to copy: name(i) describes
// buffer i.
func moveArgs(bufs []trace.Buffer, dev int, donated []bool, name func(int) string) (copies []trace.Buffer, err error) {
	be := DefaultBackend()
	p, ok := be.(backend.Placer)
	if !ok {
		return nil, fmt.Errorf("the %s backend cannot place arrays on device %d", be.Name(), dev)
	}
	defer func() {
		if err != nil {
			freeCopies(copies)
			copies = nil
		}
	}()
	for i, b := range bufs {
		d, c := backend.BufferDevice(b)
		if c || d == dev {
			continue
		}
		if i < len(donated) && donated[i] {
			return copies, fmt.Errorf("%s (%v) is donated but on %s, not committed to a device, while the call runs on %s: put it on %s first (rt.ToDevice)",
				name(i), b.Type(), backend.DeviceName(be.Name(), d), backend.DeviceName(be.Name(), dev), backend.DeviceName(be.Name(), dev))
		}
		l, err := b.Literal()
		if err != nil {
			return copies, fmt.Errorf("%s: %w", name(i), err)
		}
		nb, err := p.FromLiteralOn(l, dev)
		if err != nil {
			return copies, fmt.Errorf("moving %s to %s: %w", name(i), backend.DeviceName(be.Name(), dev), err)
		}
		bufs[i] = nb
		copies = append(copies, nb)
	}
	return copies, nil
}

// freeCopies deletes the argument copies moveArgs made.
func freeCopies(copies []trace.Buffer) {
	for _, c := range copies {
		if d, ok := c.(trace.Deleter); ok {
			_ = d.Delete()
		}
	}
}

// clashError reports committed arguments i and j on different devices, or
// (j < 0) committed argument i not on device dev, where the call runs.
func clashError(bufs []trace.Buffer, i, j, dev int, name func(int) string) string {
	di, _ := backend.BufferDevice(bufs[i])
	p := DefaultBackend().Name()
	if j < 0 {
		return fmt.Sprintf("%s (%v) is committed to %s but the call runs on %s; put it there first (rt.ToDevice), the call does not copy between devices",
			name(i), bufs[i].Type(), backend.DeviceName(p, di), backend.DeviceName(p, dev))
	}
	dj, _ := backend.BufferDevice(bufs[j])
	return fmt.Sprintf("arguments on different devices: %s (%v) is committed to %s and %s (%v) to %s; put them on one device first (rt.ToDevice), the call does not copy between devices",
		name(i), bufs[i].Type(), backend.DeviceName(p, di), name(j), bufs[j].Type(), backend.DeviceName(p, dj))
}
