package backend

import "github.com/ferryml/ferry/ir"

// HostPools are memory pools in host memory that executors allocate from:
// the CPU backend's device and pinned_host pools (runtime.MemoryPools).
type HostPools interface {
	// Alloc allocates size bytes in the pool of a memory space of device 0
	// for what (a short description such as "output 0 of fn" or "temp
	// arena", shown in out-of-memory reports and profiles). The memory is
	// zeroed, 64-byte aligned and has len == cap == size; release returns
	// it to the pool and may be called more than once. A request that does
	// not fit returns an *OutOfMemoryError. Alloc is safe for concurrent
	// use.
	Alloc(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error)
	// AllocOn is Alloc in the pool of a memory space of device dev (0 to
	// NumDevices()-1).
	AllocOn(dev int, space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error)
	// AllocUninit is Alloc without zeroing the memory, for executors that
	// write every byte before reading it.
	AllocUninit(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error)
	// NumDevices returns the number of devices, each with its pools.
	NumDevices() int
}

// HostMemory is implemented by a backend whose devices and memory pools are
// set by a MemoryConfig and live in host memory (the CPU backend). The
// runtime reaches those knobs through it (runtime.ConfigureMemory,
// runtime.SetCPUDeviceCount, runtime.MemoryPools) without naming the
// backend's package.
type HostMemory interface {
	// ConfigureMemory replaces the pools with new settings (defaults for
	// zero fields). It may be called before first use, or later when no
	// buffers are live: it returns an error if arrays are still reachable
	// after a garbage collection.
	ConfigureMemory(cfg MemoryConfig) error
	// SetDeviceCount is ConfigureMemory with MemoryConfig.Devices = n,
	// keeping the other settings.
	SetDeviceCount(n int) error
	// MemoryPools returns the backend's pools.
	MemoryPools() HostPools
}

// FindHostMemory returns the first registered backend, in name order, that
// implements HostMemory, or nil if none does.
func FindHostMemory() HostMemory {
	for _, b := range All() {
		if h, ok := b.(HostMemory); ok {
			return h
		}
	}
	return nil
}
