package cuda

import (
	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/backend/ledger"
	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/ir"
)

// liveMem is the record of one live allocation (Backend.mu).
type liveMem struct{ ledger.Entry[liveMem] }

// memLedger is the accounting of a device's live allocations (Backend.mu).
type memLedger = ledger.Ledger[liveMem, *liveMem]

// trackLocked records a new allocation m of held bytes (b.mu held), with
// the stack of allocate's caller.
func (b *Backend) trackLocked(m mem, space ir.MemorySpace, what string, held int64) {
	l := b.live.New()
	l.Bytes, l.Held, l.Addr, l.What, l.Stack, l.Born, l.Reuse = m.size, held, m.ptr, what, callers.Record(3), ledger.Now(), true
	b.live.Add(l, space)
}

// markArray records that m holds an array of type t.
func (b *Backend) markArray(m mem, t ir.Type) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l := b.live.Find(m.ptr); l != nil && m.ptr != 0 {
		l.MarkArray(t, "")
		l.What = "array"
	}
}

// newBuffer makes the buffer of an array of type t in m.
func (b *Backend) newBuffer(t ir.Type, m mem) *Buffer {
	b.markArray(m, t)
	return &Buffer{b: b, t: t, m: m}
}

// MemoryStats reports device dev's memory (its slab, or cuMemAlloc'd
// buffers with FERRY_ALLOCATOR=platform) and the pinned_host memory
// allocated through its context (backend.Memory). Each device has its own
// slab, statistics and peaks.
func (b *Backend) MemoryStats(dev int, space ir.MemorySpace) (backend.MemStats, bool) {
	if dev < 0 || dev >= len(b.all) || space > ir.PinnedHost {
		return backend.MemStats{}, false
	}
	g := b.all[dev]
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.statsLocked(space), true
}

// statsLocked is MemoryStats of the handle's device (b.mu held).
func (b *Backend) statsLocked(space ir.MemorySpace) backend.MemStats {
	s := b.live.Stats(space)
	s.Allocator, s.Reserved = "platform", s.BytesInUse
	if space == ir.Device && b.limit > 0 {
		s.Capacity, s.Limit = b.limit, b.limit
	}
	if space == ir.Device && b.alloc != nil {
		s.Allocator = "bfc"
		s.Capacity, s.Limit, s.Reserved = b.alloc.Limit, b.alloc.Limit, b.alloc.Limit
		s.LargestFreeBlock, s.FreeBytes, s.FreeBlocks = b.alloc.FreeStats()
		s.Fragmentation = backend.Fragmentation(s.LargestFreeBlock, s.FreeBytes)
	}
	return s
}

// LiveAllocations lists the live device and pinned_host allocations of
// every device, device by device, largest first (backend.Memory).
func (b *Backend) LiveAllocations() []backend.Allocation {
	var out []backend.Allocation
	for _, g := range b.all {
		g.mu.Lock()
		out = g.live.Allocations(out)
		g.mu.Unlock()
	}
	return out
}

// ResetPeak sets every device's peaks to the bytes in use now
// (backend.Memory).
func (b *Backend) ResetPeak() {
	for _, g := range b.all {
		g.mu.Lock()
		g.live.ResetPeak()
		g.mu.Unlock()
	}
}

// outOfMemory turns a failed allocation of n bytes for what into the
// runtime's out-of-memory report of the handle's device (naming it, with
// its own live arrays) when its slab is full; driver errors (cuMemAlloc,
// cuMemHostAlloc) are returned as they are.
func (b *Backend) outOfMemory(space ir.MemorySpace, n int64, what string, err error) error {
	if space != ir.Device || b.platform && b.limit == 0 {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.live.OutOfMemory(b.statsLocked(space), n, what, "")
	e.Devices = len(b.all)
	return e
}
