package cpu

import (
	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// MemoryStats reports the pool of space of device dev (backend.Memory).
func (cpuBackend) MemoryStats(dev int, space ir.MemorySpace) (backend.MemStats, bool) {
	p, err := memPools.set().pool(dev, space)
	if err != nil {
		return backend.MemStats{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsLocked(), true
}

// LiveAllocations lists the pools' live allocations, pool by pool (device
// by device), largest first (backend.Memory).
func (cpuBackend) LiveAllocations() []backend.Allocation {
	var out []backend.Allocation
	for _, p := range memPools.set().all {
		p.mu.Lock()
		out = p.l.Allocations(out)
		p.mu.Unlock()
	}
	return out
}

// ResetPeak sets the peaks of every device's pools to the bytes in use
// (backend.Memory).
func (cpuBackend) ResetPeak() { memPools.resetPeak() }

var _ backend.HostMemory = cpuBackend{}

// ConfigureMemory replaces the pools (backend.HostMemory; ConfigureMemory).
func (cpuBackend) ConfigureMemory(cfg backend.MemoryConfig) error { return ConfigureMemory(cfg) }

// SetDeviceCount sets the number of virtual devices (backend.HostMemory;
// SetDeviceCount).
func (cpuBackend) SetDeviceCount(n int) error { return SetDeviceCount(n) }

// MemoryPools returns the process's pools (backend.HostMemory).
func (cpuBackend) MemoryPools() backend.HostPools { return memPools }
