// Package ledger keeps the accounting of live allocations that every backend
// shares: for the memory of one device, which allocations are live (what
// each is for, its size, the Go stack that made it, when), and per memory
// space the bytes they hold, their peak and count; and the reports made of
// them (the common fields of backend.MemStats and backend.OutOfMemoryError,
// the lists of backend.Allocation and backend.LiveArray). A backend keeps
// its allocators and adds what only they know (reserved memory, free
// blocks, limits).
//
// A backend's record of an allocation is a struct of its own that embeds
// Entry first; the ledger links the live records into a list through their
// entries (adding and forgetting one is O(1)) and keeps a bounded list of
// forgotten records to recycle, so a backend whose records have a single
// owner allocates none per allocation. A Ledger is not safe for concurrent
// use: its owner serializes every call, and reads and writes of its
// records' entries, with a lock of its own.
package ledger

import (
	"iter"
	"sort"
	"time"
	"unsafe"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/ir"
)

// MaxSpare is the most forgotten records a ledger keeps for recycling.
const MaxSpare = 256

// numSpaces is the number of memory spaces (ir.AllSpaces).
const numSpaces = int(ir.PinnedHost) + 1

// epoch is the origin of Entry.Born.
var epoch = time.Now()

// Now is the time as Entry.Born counts it: nanoseconds since a fixed
// instant of the process (monotonic).
func Now() int64 { return int64(time.Since(epoch)) }

// Entry is the ledger's part of a backend's allocation record, which embeds
// it as Entry[itself], its first field. It never points to the buffer or
// literal that uses the memory, so that the garbage collector's cleanups
// of those can run.
type Entry[R any] struct {
	// Bytes is the size requested.
	Bytes int64
	// Held is the memory the allocation holds, counted in the bytes in
	// use: its size, or its size rounded up to the allocator's
	// granularity. It must not change while the record is live.
	Held int64
	// Addr is the memory's address (Find); among allocations of the same
	// size and age the lower address lists first.
	Addr uintptr
	// What says what the memory is for: "array", "output 0 of
	// train_step", "temp arena".
	What string
	// Type is the array's type when IsArray (MarkArray).
	Type ir.Type
	// site is the Go file:line that made the memory, computed from Stack
	// at the first report unless MarkArray set it (nil until then).
	site *string
	// Born is when the memory was allocated (Now).
	Born int64
	// Stack is the call stack that allocated it (shared, read-only; may be
	// nil).
	Stack *callers.Stack
	// IsArray says the memory is an array of Type, rather than an
	// executor's scratch memory described by What.
	IsArray bool
	// Reuse lets the ledger recycle the record when it is forgotten: set it
	// only for a record its owner forgets exactly once and never touches
	// again.
	Reuse bool
	live  bool
	space ir.MemorySpace
	// prev and next link the ledger's live records, newest first.
	prev, next *R
}

// entry returns the entry itself: a record embedding it has the method,
// which makes the record a Record.
func (e *Entry[R]) entry() *Entry[R] { return e }

// MarkArray records that the memory is an array of type t, made at site
// ("" keeps the Go line of the allocation's stack). t is kept as it is and
// copied by reports: its shape must not be modified.
func (e *Entry[R]) MarkArray(t ir.Type, site string) {
	e.Type, e.IsArray = t, true
	if site != "" {
		s := site
		e.site = &s
	}
}

// BornTime is when the memory was allocated.
func (e *Entry[R]) BornTime() time.Time { return epoch.Add(time.Duration(e.Born)) }

// Record is what a ledger holds: a pointer to a backend's record type R,
// which embeds Entry[R] as its first field.
type Record[R any] interface {
	*R
	entry() *Entry[R]
}

// entryOf returns r's entry. R embeds it as its first field (New checks
// that), so r points to it: the ledger reads entries this way rather than
// through r's entry method, which a generic function calls indirectly.
func entryOf[R any](r *R) *Entry[R] { return (*Entry[R])(unsafe.Pointer(r)) }

// Ledger is the accounting of the live allocations of one device's memory.
// The zero value, given its Platform and Device, is ready to use.
type Ledger[R any, P Record[R]] struct {
	// Platform and Device name the memory in reports: the backend ("cpu",
	// "cuda") and the device's index (Device.ID).
	Platform string
	Device   int
	// Depth is the most program counters of an allocation's stack that
	// reports use (and find its site in); 0 means all of them.
	Depth int
	// Indexed keeps an index of the live records by address, so that Find
	// is a map lookup rather than a walk of the live records. Set it
	// before the first Add.
	Indexed bool

	use    [numSpaces]figures // per memory space
	live   P                  // the live records, newest first
	spare  P                  // forgotten records to recycle, linked by next
	nspare int
	byAddr map[uintptr]P
}

// figures are the counts the ledger keeps of one memory space.
type figures struct {
	inUse, peak, numAllocs int64
	live                   int
}

// New returns a zeroed record for an allocation: a recycled one when the
// ledger holds any, else a new one.
func (l *Ledger[R, P]) New() P {
	r := l.spare
	if r == nil {
		r = P(new(R))
		if unsafe.Pointer(r.entry()) != unsafe.Pointer(r) {
			panic("ledger: a record type must embed Entry as its first field")
		}
		return r
	}
	l.spare, entryOf(r).next = entryOf(r).next, nil
	l.nspare--
	return r
}

// Add records r, an allocation in space whose entry (Bytes, Held, Addr,
// What, Born, Stack, Reuse) is filled in, as live: it counts its held
// bytes in use (raising the space's peak) and one more allocation.
func (l *Ledger[R, P]) Add(r P, space ir.MemorySpace) {
	e := entryOf(r)
	e.live, e.space, e.prev, e.next = true, space, nil, l.live
	if l.live != nil {
		entryOf(l.live).prev = r
	}
	l.live = r
	if l.Indexed {
		l.index(e.Addr, r)
	}
	u := &l.use[space]
	u.inUse += e.Held
	u.peak = max(u.peak, u.inUse)
	u.numAllocs++
	u.live++
}

// Forget removes r from the live records and its held bytes from the bytes
// in use, and reports whether it was live: forgetting a record twice, or a
// nil one, does nothing. A record with Reuse set is then recycled: zeroed
// and kept for New (up to MaxSpare of them), so its owner must not use it
// again.
func (l *Ledger[R, P]) Forget(r P) bool {
	if r == nil || !entryOf(r).live {
		return false
	}
	e := entryOf(r)
	if e.prev != nil {
		entryOf(e.prev).next = e.next
	} else {
		l.live = e.next
	}
	if e.next != nil {
		entryOf(e.next).prev = e.prev
	}
	if l.Indexed {
		l.index(e.Addr, nil)
	}
	u := &l.use[e.space]
	u.inUse -= e.Held
	u.live--
	e.live, e.prev, e.next = false, nil, nil
	if e.Reuse && l.nspare < MaxSpare {
		l.recycle(r)
	}
	return true
}

// index records r as the live record at addr, or forgets addr if r is nil.
func (l *Ledger[R, P]) index(addr uintptr, r P) {
	switch {
	case r == nil:
		delete(l.byAddr, addr)
	case l.byAddr == nil:
		l.byAddr = map[uintptr]P{addr: r}
	default:
		l.byAddr[addr] = r
	}
}

// recycle zeroes r, forgotten, and keeps it for New.
func (l *Ledger[R, P]) recycle(r P) {
	var zero R
	*r = zero
	entryOf(r).next = l.spare
	l.spare = r
	l.nspare++
}

// Find returns the live record of the memory at addr, or nil.
func (l *Ledger[R, P]) Find(addr uintptr) P {
	if l.Indexed {
		return l.byAddr[addr]
	}
	for r := l.live; r != nil; r = entryOf(r).next {
		if entryOf(r).Addr == addr {
			return r
		}
	}
	return nil
}

// InUse returns the bytes the live allocations of space hold.
func (l *Ledger[R, P]) InUse(space ir.MemorySpace) int64 { return l.use[space].inUse }

// Peak returns the highest bytes in use of space since the ledger began or
// ResetPeak.
func (l *Ledger[R, P]) Peak(space ir.MemorySpace) int64 { return l.use[space].peak }

// Len returns the number of live allocations.
func (l *Ledger[R, P]) Len() int {
	n := 0
	for _, u := range l.use {
		n += u.live
	}
	return n
}

// Spare returns the number of records kept for recycling.
func (l *Ledger[R, P]) Spare() int { return l.nspare }

// All yields the live records, newest first.
func (l *Ledger[R, P]) All() iter.Seq[P] {
	return func(yield func(P) bool) {
		for r := l.live; r != nil; r = entryOf(r).next {
			if !yield(r) {
				return
			}
		}
	}
}

// ResetPeak sets the peak of every space to its bytes in use now.
func (l *Ledger[R, P]) ResetPeak() {
	for i := range l.use {
		l.use[i].peak = l.use[i].inUse
	}
}

// PCs returns the stack that allocated r, at most Depth program counters.
func (l *Ledger[R, P]) PCs(r P) []uintptr {
	s := entryOf(r).Stack
	if s == nil {
		return nil
	}
	if l.Depth > 0 && len(s.PCs) > l.Depth {
		return s.PCs[:l.Depth]
	}
	return s.PCs
}

// Site returns the Go file:line that made r (backend.UserSite of its
// stack), computing it the first time.
func (l *Ledger[R, P]) Site(r P) string {
	e := entryOf(r)
	if e.site == nil {
		s := backend.UserSite(l.PCs(r))
		e.site = &s
	}
	return *e.site
}

// Stats returns the statistics the ledger keeps of space: Platform,
// Device, Space, BytesInUse, PeakBytesInUse, NumAllocs and LiveAllocs. The
// backend fills in its allocator's part (Allocator, Capacity, Limit,
// Reserved, the free blocks and Fragmentation).
func (l *Ledger[R, P]) Stats(space ir.MemorySpace) backend.MemStats {
	u := l.use[space]
	return backend.MemStats{Platform: l.Platform, Device: l.Device, Space: space, BytesInUse: u.inUse,
		PeakBytesInUse: u.peak, NumAllocs: u.numAllocs, LiveAllocs: int64(u.live)}
}

// OutOfMemory returns the report of a failed allocation of requested bytes
// in s.Space for what, note saying why when the pool is not simply full (""
// otherwise): backend.NewOutOfMemoryError of s (the ledger's statistics as
// the backend completes them), listing the largest live buffers of the
// space. The backend sets Devices, and FreeBytes, FreeBlocks and
// Fragmented where its allocator judges them otherwise.
func (l *Ledger[R, P]) OutOfMemory(s backend.MemStats, requested int64, what, note string) *backend.OutOfMemoryError {
	e := backend.NewOutOfMemoryError(s, requested, what, note, nil)
	e.Largest = l.largest(l.sorted(func(e *Entry[R]) bool { return e.space == s.Space }), backend.MaxOOMBuffers)
	return e
}

// sorted returns the live records keep accepts (all if keep is nil),
// largest first, oldest first among equals, then by address.
func (l *Ledger[R, P]) sorted(keep func(*Entry[R]) bool) []P {
	recs := make([]P, 0, l.Len())
	for r := l.live; r != nil; r = entryOf(r).next {
		if keep == nil || keep(entryOf(r)) {
			recs = append(recs, r)
		}
	}
	sort.Slice(recs, func(i, j int) bool {
		a, b := entryOf(recs[i]), entryOf(recs[j])
		if a.Bytes != b.Bytes {
			return a.Bytes > b.Bytes
		}
		if a.Born != b.Born {
			return a.Born < b.Born
		}
		return a.Addr < b.Addr
	})
	return recs
}

// Largest lists the n largest live allocations (all of them if n < 0;
// arrays only if arraysOnly), largest first, oldest first among equals.
func (l *Ledger[R, P]) Largest(n int, arraysOnly bool) []backend.LiveArray {
	var keep func(*Entry[R]) bool
	if arraysOnly {
		keep = func(e *Entry[R]) bool { return e.IsArray }
	}
	return l.largest(l.sorted(keep), n)
}

// largest describes the first n of recs (all if n < 0).
func (l *Ledger[R, P]) largest(recs []P, n int) []backend.LiveArray {
	if n >= 0 && len(recs) > n {
		recs = recs[:n]
	}
	now := time.Now()
	out := make([]backend.LiveArray, len(recs))
	for i, r := range recs {
		e := entryOf(r)
		out[i] = backend.LiveArray{Platform: l.Platform, Device: l.Device, IsArray: e.IsArray, What: e.What, Bytes: e.Bytes,
			Space: e.space, Site: l.Site(r), Age: now.Sub(e.BornTime())}
		if e.IsArray {
			out[i].Type = e.Type.Clone() // a copy: the record's shape may be shared
		}
	}
	return out
}

// Allocations appends the live allocations to out, largest first, oldest
// first among equals.
func (l *Ledger[R, P]) Allocations(out []backend.Allocation) []backend.Allocation {
	for _, r := range l.sorted(nil) {
		e := entryOf(r)
		a := backend.Allocation{Platform: l.Platform, Device: l.Device, Space: e.space, IsArray: e.IsArray, What: e.What,
			Bytes: e.Bytes, Site: l.Site(r), PCs: append([]uintptr(nil), l.PCs(r)...), Born: e.BornTime()}
		if e.IsArray {
			a.Type = e.Type.Clone()
		}
		out = append(out, a)
	}
	return out
}
