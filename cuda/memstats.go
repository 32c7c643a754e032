package cuda

import (
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/ir"
)

// liveMem is the record of one live allocation (Backend.mu).
type liveMem struct {
	space   ir.MemorySpace
	bytes   int64 // requested
	held    int64 // counted against the space's use (slab: rounded up)
	what    string
	typ     ir.Type
	isArray bool
	stack   *callers.Stack
	born    time.Time
}

// spaceUse is the accounting of one memory space (Backend.mu).
type spaceUse struct {
	inUse, peak, numAllocs int64
}

// trackLocked records a new allocation m of held bytes (b.mu held), with
// the stack of allocate's caller.
func (b *Backend) trackLocked(m mem, space ir.MemorySpace, what string, held int64) {
	if b.live == nil {
		b.live = map[uintptr]*liveMem{}
	}
	b.live[m.ptr] = &liveMem{space: space, bytes: m.size, held: held, what: what, stack: callers.Record(3), born: time.Now()}
	u := &b.use[space]
	u.inUse += held
	u.peak = max(u.peak, u.inUse)
	u.numAllocs++
}

// untrackLocked forgets the allocation at ptr (b.mu held).
func (b *Backend) untrackLocked(ptr uintptr) {
	if l, ok := b.live[ptr]; ok {
		b.use[l.space].inUse -= l.held
		delete(b.live, ptr)
	}
}

// markArray records that m holds an array of type t.
func (b *Backend) markArray(m mem, t ir.Type) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l, ok := b.live[m.ptr]; ok && m.ptr != 0 {
		l.typ, l.isArray, l.what = t, true, "array"
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
	if dev < 0 || dev >= len(b.all) || int(space) < 0 || int(space) >= len(b.use) {
		return backend.MemStats{}, false
	}
	return b.all[dev].stats(space), true
}

// stats is MemoryStats of the handle's device.
func (b *Backend) stats(space ir.MemorySpace) backend.MemStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.use[space]
	s := backend.MemStats{Platform: "cuda", Device: b.ord, Space: space, Allocator: "platform", BytesInUse: u.inUse,
		PeakBytesInUse: u.peak, NumAllocs: u.numAllocs, Reserved: u.inUse}
	for _, l := range b.live {
		if l.space == space {
			s.LiveAllocs++
		}
	}
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
// every device (backend.Memory).
func (b *Backend) LiveAllocations() []backend.Allocation {
	var out []backend.Allocation
	for _, g := range b.all {
		out = g.liveAllocations(out)
	}
	return out
}

// liveAllocations appends the handle's device's live allocations to out.
func (b *Backend) liveAllocations(out []backend.Allocation) []backend.Allocation {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.live {
		a := backend.Allocation{Platform: "cuda", Device: b.ord, Space: l.space, IsArray: l.isArray, What: l.what, Bytes: l.bytes, Born: l.born}
		if l.isArray {
			a.Type = l.typ.Clone()
		}
		if l.stack != nil {
			a.PCs = append([]uintptr(nil), l.stack.PCs...)
		}
		out = append(out, a)
	}
	return out
}

// ResetPeak sets every device's peaks to the bytes in use now
// (backend.Memory).
func (b *Backend) ResetPeak() {
	for _, g := range b.all {
		g.resetPeak()
	}
}

// resetPeak is ResetPeak of the handle's device.
func (b *Backend) resetPeak() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.use {
		b.use[i].peak = b.use[i].inUse
	}
	if b.alloc != nil {
		b.alloc.Peak = b.alloc.InUse
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
	e := backend.NewOutOfMemoryError(b.stats(space), n, what, "", b.liveAllocations(nil))
	e.Devices = len(b.all)
	return e
}
