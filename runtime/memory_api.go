package runtime

import (
	"io"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// ErrDeleted is matched (errors.Is) by the error of reading an array whose
// buffer was deleted with Array.Delete, on every backend
// (backend.ErrDeleted).
var ErrDeleted = backend.ErrDeleted

// ErrDonated is matched (errors.Is) by the error of reading an array whose
// buffer was donated to a jitted function, on every backend
// (backend.ErrDonated).
var ErrDonated = backend.ErrDonated

// Pools is the set of memory pools, one per memory space of each device,
// that the CPU backend allocates arrays from (backend.HostPools).
type Pools = backend.HostPools

// MemoryPools returns the process's memory pools, whose Alloc method is the
// allocator executors of the CPU backend use: those of the registered
// backend that keeps its pools in host memory (backend.HostMemory), the CPU
// backend.
func MemoryPools() Pools { return hostMemory().MemoryPools() }

// ConfigureMemory replaces the memory pools with new settings (defaults for
// zero fields; see MemoryConfig and the environment variables it mirrors). It
// may be called before first use, or later when no buffers are live: it returns
// an error if arrays are still reachable after a garbage collection.
func ConfigureMemory(cfg MemoryConfig) error { return hostMemory().ConfigureMemory(cfg) }

// hostMemory is the backend whose pools MemoryConfig sets: the CPU
// backend, registered by this package's import of it.
func hostMemory() backend.HostMemory {
	h := backend.FindHostMemory()
	if h == nil {
		panic("ferry: no registered backend keeps memory pools in host memory (the CPU backend was unregistered)")
	}
	return h
}

// MemoryStats returns the statistics of a memory space of the default
// device (device 0) of the default backend: the CPU pools, or the memory of
// an accelerator backend (cuda) that is the default and reports it
// (backend.Memory). With several devices (FERRY_CPU_DEVICES) each has its
// own pools: DeviceMemoryStats reports any of them.
func MemoryStats(space ir.MemorySpace) MemStats {
	s, _ := memoryStats(DefaultBackend(), 0, space)
	return s
}

// ResetPeakMemory sets the PeakBytesInUse of every pool of every device to
// its current BytesInUse, those of every registered backend that reports
// its memory too.
func ResetPeakMemory() {
	for _, b := range backend.All() {
		if m, ok := b.(backend.Memory); ok {
			m.ResetPeak()
		}
	}
}

// LiveArrays lists the live arrays of every memory pool of every device
// (LiveArray.Device says which) and of every
// registered backend that reports its memory (cuda), largest first (oldest
// first among equals), like jax.live_arrays. Arrays that are unreachable but
// not yet collected are still listed; zero-size arrays hold no memory and are
// not.
func LiveArrays() []LiveArray {
	var out []LiveArray
	now := time.Now()
	for _, a := range backend.AllLiveAllocations() {
		if a.IsArray && a.Bytes > 0 {
			out = append(out, backend.LiveArrayOf(a, now))
		}
	}
	backend.SortLive(out)
	return out
}

// SaveDeviceMemoryProfile writes a profile of the live buffers of every
// registered backend that reports its memory (the CPU pools, cuda), in pprof
// format (gzip-compressed protobuf), like
// jax.profiler.save_device_memory_profile; backend.WriteMemoryProfile says
// what the samples hold.
func SaveDeviceMemoryProfile(w io.Writer) error {
	return backend.WriteMemoryProfile(w, backend.AllLiveAllocations())
}
