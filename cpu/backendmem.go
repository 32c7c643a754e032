package cpu

import (
	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// MemoryStats reports the pool of space of device dev (backend.Memory).
func (cpuBackend) MemoryStats(dev int, space ir.MemorySpace) (backend.SpaceStats, bool) {
	p, err := memPools.set().pool(dev, space)
	if err != nil {
		return backend.SpaceStats{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.statsLocked()
	st := backend.SpaceStats{Platform: "cpu", Device: s.Device, Space: s.Space, Allocator: s.Allocator, Capacity: s.Capacity, Limit: s.Limit,
		Reserved: s.Reserved, BytesInUse: s.BytesInUse, PeakBytesInUse: s.PeakBytesInUse, LargestFreeBlock: s.LargestFreeBlock,
		NumAllocs: s.NumAllocs, LiveAllocs: s.LiveAllocs}
	if p.bfc != nil {
		_, st.FreeBytes, st.FreeBlocks = p.bfc.freeStats()
	}
	return st, true
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
