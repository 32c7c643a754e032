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

// MemoryStats reports the backend's device memory (its slab, or
// cuMemAlloc'd buffers with FERRY_ALLOCATOR=platform) and its pinned_host
// memory (backend.Memory). The backend drives one GPU, device 0.
func (b *Backend) MemoryStats(dev int, space ir.MemorySpace) (backend.MemStats, bool) {
	if dev != 0 || int(space) < 0 || int(space) >= len(b.use) {
		return backend.MemStats{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.use[space]
	s := backend.MemStats{Platform: "cuda", Space: space, Allocator: "platform", BytesInUse: u.inUse,
		PeakBytesInUse: u.peak, NumAllocs: u.numAllocs, Reserved: u.inUse}
	for _, l := range b.live {
		if l.space == space {
			s.LiveAllocs++
		}
	}
	if space == ir.Device && b.alloc != nil {
		s.Allocator = "bfc"
		s.Capacity, s.Limit, s.Reserved = b.alloc.Limit, b.alloc.Limit, b.alloc.Limit
		s.LargestFreeBlock, s.FreeBytes, s.FreeBlocks = b.alloc.FreeStats()
		s.Fragmentation = backend.Fragmentation(s.LargestFreeBlock, s.FreeBytes)
	}
	return s, true
}

// LiveAllocations lists the backend's live device and pinned_host
// allocations (backend.Memory).
func (b *Backend) LiveAllocations() []backend.Allocation {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]backend.Allocation, 0, len(b.live))
	for _, l := range b.live {
		a := backend.Allocation{Platform: "cuda", Space: l.space, IsArray: l.isArray, What: l.what, Bytes: l.bytes, Born: l.born}
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

// ResetPeak sets the peaks to the bytes in use now (backend.Memory).
func (b *Backend) ResetPeak() {
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
// runtime's out-of-memory report when the slab is full; driver errors
// (cuMemAlloc, cuMemHostAlloc) are returned as they are.
func (b *Backend) outOfMemory(space ir.MemorySpace, n int64, what string, err error) error {
	if space != ir.Device || b.platform {
		return err
	}
	s, _ := b.MemoryStats(0, space)
	return backend.NewOutOfMemoryError(s, n, what, "", b.LiveAllocations())
}
