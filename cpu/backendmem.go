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
		recs := make([]*allocRecord, 0, p.nlive)
		for r := p.live; r != nil; r = r.next {
			recs = append(recs, r)
		}
		sortRecords(recs)
		for _, r := range recs {
			a := backend.Allocation{Platform: "cpu", Device: p.device, Space: p.space, IsArray: r.isArray, What: r.name(), Bytes: r.size,
				Site: r.callSiteLocked(), PCs: append([]uintptr(nil), r.pcs()...), Born: r.bornTime()}
			if r.isArray {
				a.Type = r.typ.Clone()
			}
			out = append(out, a)
		}
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
