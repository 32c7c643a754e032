package runtime

import (
	"errors"
	"fmt"
	"github.com/ferryml/ferry/backend"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goruntime "runtime"

	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/ir"
)

// Environment variables read by MemoryConfigFromEnv.
const (
	EnvDeviceMemory = "FERRY_DEVICE_MEMORY" // device capacity: bytes or 64MiB, 1.5GiB, 512MB, 1e9; unset or "unlimited" for none
	EnvHostMemory   = "FERRY_HOST_MEMORY"   // pinned_host capacity, same syntax
	EnvAllocator    = "FERRY_ALLOCATOR"     // "bfc" (default) or "platform"
	EnvPreallocate  = "FERRY_PREALLOCATE"   // true (default) or false
	EnvMemFraction  = "FERRY_MEM_FRACTION"  // fraction of device capacity the bfc allocator may use, default 0.75
)

// Allocator names for MemoryConfig.Allocator.
const (
	AllocatorBFC      = "bfc"
	AllocatorPlatform = "platform"
)

// DefaultMemFraction is the fraction of device capacity the bfc allocator uses
// by default, as XLA_PYTHON_CLIENT_MEM_FRACTION.
const DefaultMemFraction = 0.75

const (
	allocAlign         = 64      // alignment and granularity of every allocation
	defaultRegionBytes = 2 << 20 // first growth region of the bfc allocator
	maxStackDepth      = 32      // PCs recorded per allocation
	maxOOMBuffers      = 10      // largest live buffers listed by an OOM report
)

// MemoryConfig sets the memory pools of the CPU backend. The zero value is the
// default: unlimited capacity, bfc, pre-allocation on, fraction 0.75. The
// environment variables FERRY_DEVICE_MEMORY, FERRY_HOST_MEMORY, FERRY_ALLOCATOR,
// FERRY_PREALLOCATE and FERRY_MEM_FRACTION set the same (MemoryConfigFromEnv).
//
// Every concrete array of the CPU backend lives in the pool of its memory
// space, ir.Device or ir.PinnedHost. Both are ordinary Go memory ([]byte slabs,
// 64-byte aligned, no cgo), but each pool has a capacity and an allocator, so
// that out-of-memory, fragmentation and allocator settings behave as on a GPU.
//
// # Capacity, fraction and what fits
//
// Capacity is the size of the simulated memory; 0 (or the variable unset)
// means unlimited. What an allocator may use, its Limit (MemStats.Limit),
// depends on the allocator:
//
//   - bfc (the default), device pool: Limit is Fraction × Capacity (0.75 by
//     default, as JAX pre-allocates 75 % of GPU memory), rounded down to a
//     multiple of 64 bytes. With Preallocate (the default) one slab of Limit
//     bytes is reserved at first use and the pool never holds more; without
//     it the allocator grows by regions on demand (2 MiB, then doubling) up to
//     Limit. Each allocation is rounded up to a multiple of 64 bytes and needs
//     one contiguous free block, so fragmentation can make an allocation fail
//     before BytesInUse reaches Limit.
//   - platform: each buffer is its own Go allocation, returned to Go when the
//     buffer is freed; Limit is Capacity (Fraction and Preallocate do not
//     apply, as in JAX) and buffers count their exact size: a set of live
//     buffers fits iff their sizes add up to at most Capacity.
//   - pinned_host pool: the same allocator with Limit = HostCapacity (rounded
//     down to 64 bytes for bfc), never pre-allocated; Fraction does not apply.
//   - unlimited capacity: nothing is reserved up front; bfc grows as needed.
//
// So with FERRY_DEVICE_MEMORY=X, a program whose memory analysis totals at
// most X bytes runs with FERRY_ALLOCATOR=platform, or with bfc and
// FERRY_MEM_FRACTION=1 when its buffers are multiples of 64 bytes and do not
// fragment; with the defaults only 0.75 × X is usable. Before reporting out
// of memory, a pool runs the garbage collector and retries, since arrays that
// are no longer reachable are freed by cleanups.
type MemoryConfig struct {
	// Capacity is the device pool's capacity in bytes; 0 means unlimited.
	Capacity int64
	// HostCapacity is the pinned_host pool's capacity in bytes; 0 means unlimited.
	HostCapacity int64
	// Allocator is "bfc" (best fit with coalescing, the default) or "platform"
	// (allocate and free each buffer on demand).
	Allocator string
	// Preallocate makes the bfc allocator reserve its whole limit at first use
	// when the capacity is finite; nil means true.
	Preallocate *bool
	// Fraction is the part of Capacity the bfc allocator may use, in (0, 1];
	// 0 means DefaultMemFraction. The platform allocator ignores it.
	Fraction float64
}

// normalized fills in defaults and validates the settings.
func (c MemoryConfig) normalized() (MemoryConfig, error) {
	if c.Capacity < 0 {
		return c, fmt.Errorf("memory config: negative device capacity %d", c.Capacity)
	}
	if c.HostCapacity < 0 {
		return c, fmt.Errorf("memory config: negative host capacity %d", c.HostCapacity)
	}
	switch strings.ToLower(strings.TrimSpace(c.Allocator)) {
	case "", AllocatorBFC, "default":
		c.Allocator = AllocatorBFC
	case AllocatorPlatform:
		c.Allocator = AllocatorPlatform
	default:
		return c, fmt.Errorf("memory config: unknown allocator %q (want %q or %q)", c.Allocator, AllocatorBFC, AllocatorPlatform)
	}
	if c.Preallocate == nil {
		t := true
		c.Preallocate = &t
	} else {
		v := *c.Preallocate
		c.Preallocate = &v
	}
	if c.Fraction == 0 {
		c.Fraction = DefaultMemFraction
	}
	if !(c.Fraction > 0 && c.Fraction <= 1) {
		return c, fmt.Errorf("memory config: fraction %v is not in (0, 1]", c.Fraction)
	}
	return c, nil
}

// MemoryConfigFromEnv reads FERRY_DEVICE_MEMORY, FERRY_HOST_MEMORY,
// FERRY_ALLOCATOR, FERRY_PREALLOCATE and FERRY_MEM_FRACTION; unset variables
// keep their defaults. The pools read the environment at first use unless
// ConfigureMemory was called before.
func MemoryConfigFromEnv() (MemoryConfig, error) {
	var c MemoryConfig
	var errs []error
	size := func(name string, dst *int64) {
		v, ok := os.LookupEnv(name)
		if !ok || strings.TrimSpace(v) == "" || strings.EqualFold(strings.TrimSpace(v), "unlimited") {
			return
		}
		n, err := ParseMemorySize(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", name, v, err))
			return
		}
		*dst = n
	}
	size(EnvDeviceMemory, &c.Capacity)
	size(EnvHostMemory, &c.HostCapacity)
	if v, ok := os.LookupEnv(EnvAllocator); ok {
		c.Allocator = v
	}
	if v, ok := os.LookupEnv(EnvPreallocate); ok && strings.TrimSpace(v) != "" {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvPreallocate, v))
		} else {
			c.Preallocate = &b
		}
	}
	if v, ok := os.LookupEnv(EnvMemFraction); ok && strings.TrimSpace(v) != "" {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(f > 0 && f <= 1) {
			errs = append(errs, fmt.Errorf("%s=%q: want a number in (0, 1]", EnvMemFraction, v))
		} else {
			c.Fraction = f
		}
	}
	if err := errors.Join(errs...); err != nil {
		return MemoryConfig{}, err
	}
	n, err := c.normalized()
	if err != nil {
		return MemoryConfig{}, fmt.Errorf("%s: %w", EnvAllocator, err)
	}
	return n, nil
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// ParseMemorySize parses a positive byte count: "123", "1e9", "64MiB", "1.5GiB",
// "512MB" (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024; units
// are case-insensitive and may follow a space). Fractional byte counts round
// down.
func ParseMemorySize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	end := len(t)
	for end > 0 {
		ch := t[end-1]
		if (ch|0x20) >= 'a' && (ch|0x20) <= 'z' {
			end--
			continue
		}
		break
	}
	num, unit := strings.TrimSpace(t[:end]), strings.ToLower(t[end:])
	if num == "" {
		return 0, fmt.Errorf("bad memory size %q: want a number of bytes like 123, 1e9, 64MiB or 1.5GiB", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		hint := ""
		if len(unit) == 1 {
			hint = fmt.Sprintf(" (write %siB for powers of 1024 or %sB for powers of 1000)", strings.ToUpper(unit), strings.ToUpper(unit))
		}
		return 0, fmt.Errorf("bad memory size %q: unknown unit %q%s", s, t[end:], hint)
	}
	if mult == 1 && !strings.ContainsAny(num, ".eE") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bad memory size %q: %v", s, errors.Unwrap(err))
		}
		if n <= 0 {
			return 0, fmt.Errorf("bad memory size %q: must be positive", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || strings.HasPrefix(num, "0x") || strings.HasPrefix(num, "0X") {
		return 0, fmt.Errorf("bad memory size %q: %q is not a number", s, num)
	}
	v := math.Floor(f * mult)
	if math.IsNaN(v) || v >= math.MaxInt64 {
		return 0, fmt.Errorf("bad memory size %q: too large", s)
	}
	if v < 1 {
		return 0, fmt.Errorf("bad memory size %q: must be at least one byte", s)
	}
	return int64(v), nil
}

// formatBytes prints a byte count for humans: "512 B", "4.00 KiB", "1.50 GiB".
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.2f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// formatLimit prints a capacity or limit, 0 meaning unlimited.
func formatLimit(n int64) string {
	if n == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%s (%d bytes)", formatBytes(n), n)
}

// MemStats describes one memory pool (see MemoryStats).
type MemStats struct {
	// Platform is the backend whose memory this is ("cpu", "cuda").
	Platform string
	// Space is the memory space of the pool.
	Space ir.MemorySpace
	// Allocator is "bfc" or "platform".
	Allocator string
	// Capacity is the configured size of the memory space; 0 means unlimited.
	Capacity int64
	// Limit is what the allocator may use (see the package's memory notes);
	// 0 means unlimited.
	Limit int64
	// Reserved is what the allocator holds: for bfc its slab or regions, for
	// platform the live buffers.
	Reserved int64
	// BytesInUse is the memory of live allocations as counted against Limit
	// (bfc: sizes rounded up to 64 bytes; platform: exact sizes).
	BytesInUse int64
	// PeakBytesInUse is the highest BytesInUse since the pool was configured or
	// ResetPeakMemory was called.
	PeakBytesInUse int64
	// LargestFreeBlock is the largest free block inside the reserved memory.
	LargestFreeBlock int64
	// Fragmentation is 1 − LargestFreeBlock / free reserved bytes, 0 when
	// nothing reserved is free.
	Fragmentation float64
	// NumAllocs counts the allocations since the pool was configured.
	NumAllocs int64
	// LiveAllocs is the number of live allocations (arrays and executor
	// scratch memory).
	LiveAllocs int64
}

// OutOfMemoryError is returned when an allocation does not fit in its pool.
// The pool stays usable.
type OutOfMemoryError struct {
	// Platform is the backend whose memory ran out ("cpu", "cuda").
	Platform string
	// Space is the memory space that ran out.
	Space ir.MemorySpace
	// Requested is the size of the failed allocation in bytes.
	Requested int64
	// What says what the memory was for, e.g. "array f32[1024,1024]",
	// "output 0 of fn" or "temp arena".
	What string
	// Allocator is "bfc" or "platform".
	Allocator string
	// Capacity is the pool's configured capacity; 0 means unlimited.
	Capacity int64
	// Limit is what the allocator may use; 0 means unlimited.
	Limit int64
	// Reserved is what the allocator holds (see MemStats.Reserved).
	Reserved int64
	// InUse is MemStats.BytesInUse at the time of the failure.
	InUse int64
	// LargestFree is the largest free block inside the reserved memory.
	LargestFree int64
	// FreeBytes is what the allocator could still hand out in total: for bfc
	// the free blocks inside the reserved memory plus, when it grows on
	// demand, the room left under Limit; for platform Limit − InUse; 0 when
	// the limit is unlimited.
	FreeBytes int64
	// FreeBlocks is the number of free blocks inside the reserved memory (bfc).
	FreeBlocks int
	// Fragmented reports an allocation that failed to fragmentation: FreeBytes
	// would hold the request (rounded up to 64 bytes) but no single free block
	// (nor a new region, for a growing pool) does.
	Fragmented bool
	// LiveAllocs is the number of live allocations.
	LiveAllocs int64
	// Largest lists the largest live allocations (at most 10), largest first.
	Largest []LiveArray
	// Note explains a failure that is not about the pool's limit (e.g. the
	// machine has too little memory for the slab); usually empty.
	Note string
}

// Error prints a multi-line report: the request, the pool's state, the largest
// live buffers with the Go line that made them, and what to do.
func (e *OutOfMemoryError) Error() string {
	var b strings.Builder
	what := ""
	if e.What != "" {
		what = " for " + e.What
	}
	fmt.Fprintf(&b, "out of memory in %s memory: cannot allocate %s (%d bytes)%s\n", e.Space, formatBytes(e.Requested), e.Requested, what)
	fmt.Fprintf(&b, "  allocator %s: capacity %s, limit %s, reserved %s, in use %s, largest free block %s",
		e.Allocator, formatLimit(e.Capacity), formatLimit(e.Limit), formatBytes(e.Reserved), formatBytes(e.InUse), formatBytes(e.LargestFree))
	if e.Note != "" {
		fmt.Fprintf(&b, "\n  %s", e.Note)
	}
	if e.Fragmented {
		fmt.Fprintf(&b, "\n  fragmentation: %s (%d bytes) is free in %d blocks, enough in total, but the largest free block is %s (%d bytes)",
			formatBytes(e.FreeBytes), e.FreeBytes, e.FreeBlocks, formatBytes(e.LargestFree), e.LargestFree)
		if e.FreeBytes > e.LargestFree && e.Limit > e.Reserved {
			fmt.Fprintf(&b, " and a new region may take only %s", formatBytes(e.Limit-e.Reserved))
		}
		fmt.Fprintf(&b, "; allocate long-lived buffers first, free buffers that sit between free blocks, or set %s=platform", EnvAllocator)
	}
	if len(e.Largest) > 0 {
		fmt.Fprintf(&b, "\n  largest of %d live buffers:", e.LiveAllocs)
		var shown int64
		for _, l := range e.Largest {
			shown += l.Bytes
			desc := l.What
			if l.IsArray {
				desc = l.Type.String()
				if l.What != "" && l.What != "array" {
					desc += " (" + l.What + ")"
				}
			}
			fmt.Fprintf(&b, "\n    %10s  %s  made at %s", formatBytes(l.Bytes), desc, l.Site)
		}
		if rest := e.LiveAllocs - int64(len(e.Largest)); rest > 0 {
			fmt.Fprintf(&b, "\n    ... and %d smaller", rest)
		}
	}
	env := EnvDeviceMemory
	if e.Space == ir.PinnedHost {
		env = EnvHostMemory
	}
	fmt.Fprintf(&b, "\n  free arrays you no longer need (Array.Delete), donate arguments to jitted functions, or raise %s", env)
	if e.Allocator == AllocatorBFC && e.Space == ir.Device && e.Capacity > 0 && e.Limit < e.Capacity {
		fmt.Fprintf(&b, " (bfc uses %s=%g of it; %s=platform uses all)", EnvMemFraction, float64(e.Limit)/float64(e.Capacity), EnvAllocator)
	}
	return b.String()
}

// allocRecord is one live allocation of a pool. It never points to the buffer
// or literal that uses the memory, so that cleanups can run.
type allocRecord struct {
	pool    *pool
	size    int64 // requested bytes
	chunk   *bfcChunk
	addr    uintptr
	what    string // what the memory is for: "array", "output 0 of train_step"
	typ     ir.Type
	site    string
	born    int64          // when it was allocated: nanoseconds since epoch (monotonic)
	stack   *callers.Stack // where it was allocated (shared, read-only)
	isArray bool
	freed   bool
	reuse   bool // freed once by its single owner: the pool may recycle it
	// prev and next link the pool's live records (pool.mu).
	prev, next *allocRecord
}

// epoch is the origin of allocRecord.born.
var epoch = time.Now()

// bornTime is when the record was allocated.
func (r *allocRecord) bornTime() time.Time { return epoch.Add(time.Duration(r.born)) }

// pcs is the recorded call stack, at most maxStackDepth PCs.
func (r *allocRecord) pcs() []uintptr {
	if r.stack == nil {
		return nil
	}
	return r.stack.PCs[:min(len(r.stack.PCs), maxStackDepth)]
}

// held is the memory counted against the limit: the bfc chunk (the size
// rounded up), or the size of platform memory.
func (r *allocRecord) held() int64 {
	if r.chunk != nil {
		return r.chunk.Size
	}
	return r.size
}

// name is what the memory is for, as reports show it.
func (r *allocRecord) name() string { return r.what }

// release frees the record's memory; it is safe to call more than once.
func (r *allocRecord) release() { r.pool.free(r) }

// setArray records that the memory is an array of type typ, made at site
// ("" keeps the Go line recorded when the memory was allocated). typ is
// kept as it is (reports copy it): its shape must not be modified.
func (r *allocRecord) setArray(typ ir.Type, site string) {
	r.pool.mu.Lock()
	r.typ, r.isArray = typ, true
	if site != "" {
		r.site = site
	}
	r.pool.mu.Unlock()
}

// pool is one memory space's allocator and its bookkeeping.
type pool struct {
	space    ir.MemorySpace
	kind     string
	capacity int64
	limit    int64

	mu        sync.Mutex
	retired   bool
	bfc       *bfcAllocator
	plat      *platformAllocator
	inUse     int64
	peak      int64
	numAllocs int64
	churn     int64        // bytes allocated since the last collectGarbage
	live      *allocRecord // the live records, newest first, linked by next
	nlive     int
	spare     *allocRecord // freed records to recycle, linked by next
	nspare    int
	frees     atomic.Int64
}

func newPool(space ir.MemorySpace, cfg MemoryConfig) *pool {
	p := &pool{space: space, kind: cfg.Allocator}
	prealloc := false
	if space == ir.Device {
		p.capacity = cfg.Capacity
		if cfg.Allocator == AllocatorBFC && p.capacity > 0 {
			p.limit = int64(math.Floor(cfg.Fraction * float64(p.capacity)))
			prealloc = *cfg.Preallocate
		} else {
			p.limit = p.capacity
		}
	} else {
		p.capacity = cfg.HostCapacity
		p.limit = p.capacity
	}
	if cfg.Allocator == AllocatorPlatform {
		p.plat = &platformAllocator{limit: p.limit}
	} else {
		p.limit = p.limit / allocAlign * allocAlign
		if p.capacity > 0 && p.limit == 0 {
			p.limit = allocAlign // a tiny capacity still has a limit, never "unlimited"
		}
		p.bfc = newBFC(p.limit, prealloc, defaultRegionBytes)
	}
	return p
}

// poisonUninit (FERRY_POISON_UNINIT=1): AllocUninit fills memory with 0xff.
var poisonUninit = os.Getenv("FERRY_POISON_UNINIT") == "1"

var (
	errRetired = errors.New("pool retired")
	errCollect = errors.New("collect garbage before growing")
)

// minChurnBeforeCollect is the least a growing bfc pool allocates between two
// garbage collections it asks for.
const minChurnBeforeCollect = 4 << 20

// maxSpareRecords bounds the freed records a pool keeps for reuse.
const maxSpareRecords = 256

// tryAlloc allocates size bytes (size > 0) for what, born and made at
// stack, and returns the memory's record; or it returns errRetired,
// errCollect or an *OutOfMemoryError. The record is recycled when freed
// if reuse: only for memory whose owner releases it exactly once (an
// execution's arenas, buffers), never for memory whose release function
// is handed out (Pools.Alloc may be released again). A bfc pool that grows on demand returns errCollect
// (if mayCollect) instead of growing when it allocated at least half of what
// it holds since the last collection: some of that is probably garbage whose
// cleanups have not run, and collecting it keeps the pool from growing to
// several times what is live.
func (p *pool) tryAlloc(size int64, what string, born int64, stack *callers.Stack, zero, mayCollect, reuse bool) (*allocRecord, []byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired {
		return nil, nil, errRetired
	}
	var mem []byte
	var note string
	var chunk *bfcChunk
	if p.bfc != nil {
		grow := !mayCollect || p.bfc.prealloc || p.churn < max(p.bfc.reserved()/2, minChurnBeforeCollect)
		c, n := p.bfc.alloc(size, zero, grow)
		if c == nil && !grow {
			return nil, nil, errCollect
		}
		if c == nil {
			note = n
		} else {
			chunk = c
			mem = chunkBytes(c, size)
		}
	} else {
		mem, note = p.plat.alloc(size, p.inUse)
	}
	if mem == nil {
		return nil, nil, p.oomLocked(size, what, note)
	}
	if !zero && poisonUninit {
		for i := range mem {
			mem[i] = 0xff // NaN in every float type, -1 in every integer one
		}
	}
	rec := p.spare
	if rec != nil {
		p.spare, rec.next = rec.next, nil
		p.nspare--
	} else {
		rec = new(allocRecord)
	}
	*rec = allocRecord{pool: p, size: size, chunk: chunk, addr: addrOf(mem), what: what, born: born, stack: stack, reuse: reuse}
	held := rec.held()
	p.inUse += held
	p.churn += held
	p.peak = max(p.peak, p.inUse)
	p.numAllocs++
	p.link(rec)
	return rec, mem, nil
}

// link adds r to the live records (p.mu held).
func (p *pool) link(r *allocRecord) {
	r.prev, r.next = nil, p.live
	if p.live != nil {
		p.live.prev = r
	}
	p.live = r
	p.nlive++
}

// unlink removes r from the live records (p.mu held).
func (p *pool) unlink(r *allocRecord) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		p.live = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	}
	r.prev, r.next = nil, nil
	p.nlive--
}

// free releases a record's memory once.
func (p *pool) free(r *allocRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.freed {
		return
	}
	r.freed = true
	p.unlink(r)
	p.inUse -= r.held()
	if p.bfc != nil {
		p.bfc.free(r.chunk)
		r.chunk = nil
	}
	p.frees.Add(1)
	if r.reuse && p.nspare < maxSpareRecords {
		*r = allocRecord{next: p.spare}
		p.spare = r
		p.nspare++
	}
}

func (p *pool) statsLocked() MemStats {
	s := MemStats{Platform: "cpu", Space: p.space, Allocator: p.kind, Capacity: p.capacity, Limit: p.limit,
		BytesInUse: p.inUse, PeakBytesInUse: p.peak, NumAllocs: p.numAllocs, LiveAllocs: int64(p.nlive)}
	var total int64
	if p.bfc != nil {
		s.Reserved = p.bfc.reserved()
		s.LargestFreeBlock, total, _ = p.bfc.freeStats()
	} else {
		s.Reserved = p.inUse
	}
	if total > 0 {
		s.Fragmentation = 1 - float64(s.LargestFreeBlock)/float64(total)
	}
	return s
}

func (p *pool) oomLocked(size int64, what, note string) *OutOfMemoryError {
	s := p.statsLocked()
	e := &OutOfMemoryError{Platform: "cpu", Space: p.space, Requested: size, What: what, Allocator: p.kind,
		Capacity: p.capacity, Limit: p.limit, Reserved: s.Reserved, InUse: s.BytesInUse,
		LargestFree: s.LargestFreeBlock, LiveAllocs: s.LiveAllocs, Note: note}
	if p.limit > 0 {
		if p.bfc != nil {
			_, free, blocks := p.bfc.freeStats()
			e.FreeBlocks = blocks
			room := int64(0)
			if !p.bfc.prealloc {
				room = max(p.limit-p.bfc.reserved(), 0)
			}
			e.FreeBytes = free + room
			e.Fragmented = note == "" && e.FreeBytes >= roundUp(size)
		} else {
			e.FreeBytes = max(p.limit-p.inUse, 0)
		}
	}
	e.Largest = p.largestLocked(maxOOMBuffers, false)
	return e
}

// largestLocked lists the n largest live allocations (arrays only if
// arraysOnly), largest first, oldest first among equals.
func (p *pool) largestLocked(n int, arraysOnly bool) []LiveArray {
	recs := make([]*allocRecord, 0, p.nlive)
	for r := p.live; r != nil; r = r.next {
		if !arraysOnly || r.isArray {
			recs = append(recs, r)
		}
	}
	sortRecords(recs)
	if n >= 0 && len(recs) > n {
		recs = recs[:n]
	}
	now := time.Now()
	out := make([]LiveArray, len(recs))
	for i, r := range recs {
		out[i] = r.liveArrayLocked(now)
	}
	return out
}

func sortRecords(recs []*allocRecord) {
	sort.Slice(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		if a.size != b.size {
			return a.size > b.size
		}
		if a.born != b.born {
			return a.born < b.born
		}
		return a.addr < b.addr
	})
}

// reclaim frees memory held for nothing: empty bfc growth regions.
func (p *pool) reclaim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bfc != nil {
		p.bfc.freeEmptyRegions()
	}
}

// Pools is the set of memory pools, one per memory space, that the CPU backend
// allocates arrays from. Its Alloc method serves executors (outputs and arenas).
// Use MemoryPools to get the process's pools.
type Pools struct {
	mu  sync.Mutex // serializes configuration
	cur atomic.Pointer[poolSet]
}

type poolSet struct {
	cfg    MemoryConfig
	err    error // bad environment settings: every allocation fails with it
	spaces []*pool
}

var memPools = &Pools{}

// MemoryPools returns the process's memory pools, whose Alloc method is the
// allocator executors of the CPU backend use.
func MemoryPools() *Pools { return memPools }

// set returns the current pools, reading the environment at first use.
func (ps *Pools) set() *poolSet {
	if s := ps.cur.Load(); s != nil {
		return s
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if s := ps.cur.Load(); s != nil {
		return s
	}
	cfg, err := MemoryConfigFromEnv()
	if err != nil {
		cfg, _ = MemoryConfig{}.normalized()
		err = fmt.Errorf("invalid memory settings: %w", err)
	}
	s := newPoolSet(cfg)
	s.err = err
	ps.cur.Store(s)
	return s
}

func newPoolSet(cfg MemoryConfig) *poolSet {
	s := &poolSet{cfg: cfg}
	for _, sp := range ir.AllSpaces {
		for len(s.spaces) <= int(sp) {
			s.spaces = append(s.spaces, nil)
		}
		s.spaces[sp] = newPool(sp, cfg)
	}
	return s
}

func (s *poolSet) pool(space ir.MemorySpace) (*pool, error) {
	if int(space) >= len(s.spaces) || s.spaces[space] == nil {
		return nil, fmt.Errorf("no memory pool for memory space %v", space)
	}
	return s.spaces[space], nil
}

// Alloc allocates size bytes in the pool of a memory space for what (a short
// description such as "output 0 of fn" or "temp arena", shown in out-of-memory
// reports and profiles). The memory is zeroed, 64-byte aligned and has
// len == cap == size; release returns it to the pool and may be called more than
// once. A request that does not fit returns an *OutOfMemoryError. Alloc is
// safe for concurrent use.
func (ps *Pools) Alloc(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error) {
	return releaseFunc(ps.alloc(space, size, what, true, false, 3))
}

// AllocUninit is Alloc without zeroing the memory: for executors that write
// every byte of an output or arena value before reading it. With the
// environment variable FERRY_POISON_UNINIT=1 the memory is filled with 0xff
// bytes instead (NaN in every float type): a debugging aid that makes a
// kernel reading memory it did not write show up in results.
//
// The CPU backend runs its programs over such memory: every kernel writes
// all of its results (the arena reuses memory between values anyway), so
// zeroing a fresh 16 MiB output would only cost a pass over memory.
func (ps *Pools) AllocUninit(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error) {
	return releaseFunc(ps.alloc(space, size, what, false, false, 3))
}

func releaseFunc(rec *allocRecord, mem []byte, err error) ([]byte, func(), error) {
	if err != nil || rec == nil {
		return mem, func() {}, err
	}
	return mem, rec.release, nil
}

// alloc is Alloc returning the record (nil for size 0); skip is the number of
// stack frames to leave out of the recorded call stack (1 is alloc's caller).
// With reuse the pool recycles the record once it is freed (see tryAlloc):
// the caller must release it exactly once.
func (ps *Pools) alloc(space ir.MemorySpace, size int64, what string, zero, reuse bool, skip int) (*allocRecord, []byte, error) {
	if size < 0 {
		return nil, nil, fmt.Errorf("allocate %d bytes in %v memory for %s: negative size", size, space, what)
	}
	s := ps.set()
	if s.err != nil {
		return nil, nil, s.err
	}
	if size == 0 {
		if _, err := s.pool(space); err != nil {
			return nil, nil, err
		}
		return nil, []byte{}, nil
	}
	born, stack := int64(time.Since(epoch)), callers.Record(skip)
	retried, collected := false, false
	for {
		p, err := s.pool(space)
		if err != nil {
			return nil, nil, err
		}
		rec, mem, err := p.tryAlloc(size, what, born, stack, zero, !collected, reuse)
		if err == nil {
			return rec, mem, nil
		}
		switch err {
		case errRetired:
			if s = ps.set(); s.err != nil {
				return nil, nil, s.err
			}
			continue
		case errCollect:
			collected = true
			collectGarbage(p)
			continue
		}
		var oom *OutOfMemoryError
		if retried || !errors.As(err, &oom) || oom.Note != "" || (oom.Limit > 0 && size > oom.Limit) {
			return nil, nil, err
		}
		// Unreachable arrays still hold memory until the garbage collector
		// runs their cleanups: collect, free empty regions and try again.
		retried = true
		p.reclaim()
		collectGarbage(p)
	}
}

// collectGarbage runs the garbage collector and waits a little for the
// cleanups of unreachable buffers to return their memory to p.
func collectGarbage(p *pool) {
	p.mu.Lock()
	p.churn = 0
	p.mu.Unlock()
	before := p.frees.Load()
	goruntime.GC()
	last, stable := before, 0
	for i := 0; i < 200 && stable < 3; i++ {
		time.Sleep(50 * time.Microsecond)
		n := p.frees.Load()
		switch {
		case n != last:
			last, stable = n, 0
		case n != before || i >= 20:
			stable++ // settled after frees, or nothing came within ~1 ms
		}
	}
	p.reclaim()
}

// lookup finds the live record of memory allocated from the pools, walking
// the live records (executions keep the records they allocate, so this
// serves only memory handed over from Pools.Alloc).
func (ps *Pools) lookup(space ir.MemorySpace, mem []byte) *allocRecord {
	if len(mem) == 0 {
		return nil
	}
	s := ps.cur.Load()
	if s == nil {
		return nil
	}
	p, err := s.pool(space)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	addr := addrOf(mem)
	for r := p.live; r != nil; r = r.next {
		if r.addr == addr {
			return r
		}
	}
	return nil
}

// configure replaces the pools with new ones for cfg (nil: the environment's
// settings, read at next use). Unless force, it fails while allocations are
// live (after collecting garbage). Buffers still live in replaced pools keep
// their memory and free it into the retired pool.
func (ps *Pools) configure(cfg *MemoryConfig, force bool) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	old := ps.cur.Load()
	if old != nil && !force {
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			if err = old.checkIdle(); err == nil {
				break
			}
			for _, p := range old.spaces {
				collectGarbage(p)
			}
		}
		if err != nil {
			return err
		}
	}
	if cfg == nil {
		ps.cur.Store(nil)
	} else {
		ps.cur.Store(newPoolSet(*cfg))
	}
	if old != nil {
		// Allocations racing with this one find the pools retired and retry
		// with the new ones.
		for _, p := range old.spaces {
			p.mu.Lock()
			p.retired = true
			p.mu.Unlock()
		}
	}
	return nil
}

// checkIdle returns an error naming the live allocations, if any.
func (s *poolSet) checkIdle() error {
	var n int64
	var live []LiveArray
	for _, p := range s.spaces {
		p.mu.Lock()
		n += int64(p.nlive)
		live = append(live, p.largestLocked(5, false)...)
		p.mu.Unlock()
	}
	if n == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ConfigureMemory: %d buffers are still live; delete them (Array.Delete) or drop them first:", n)
	for _, l := range live {
		fmt.Fprintf(&b, "\n  %s %s made at %s", formatBytes(l.Bytes), l.describe(), l.Site)
	}
	return errors.New(b.String())
}

// ConfigureMemory replaces the memory pools with new settings (defaults for
// zero fields; see MemoryConfig and the environment variables it mirrors). It
// may be called before first use, or later when no buffers are live: it returns
// an error if arrays are still reachable after a garbage collection.
func ConfigureMemory(cfg MemoryConfig) error {
	n, err := cfg.normalized()
	if err != nil {
		return err
	}
	return memPools.configure(&n, false)
}

// MemoryStats returns the statistics of a memory space of the default
// backend: the CPU pools, or the memory of an accelerator backend (cuda)
// that is the default and reports it (backend.Memory).
func MemoryStats(space ir.MemorySpace) MemStats {
	if s, ok := defaultMemoryStats(space); ok {
		return s
	}
	return memPools.stats(space)
}

func (ps *Pools) stats(space ir.MemorySpace) MemStats {
	p, err := ps.set().pool(space)
	if err != nil {
		return MemStats{Space: space}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsLocked()
}

// ResetPeakMemory sets every pool's PeakBytesInUse to its current BytesInUse,
// those of every registered backend that reports its memory too.
func ResetPeakMemory() {
	memPools.resetPeak()
	for _, m := range otherMemories() {
		m.ResetPeak()
	}
}

var _ backend.Memory = cpuBackend{}

func (ps *Pools) resetPeak() {
	for _, p := range ps.set().spaces {
		p.mu.Lock()
		p.peak = p.inUse
		p.mu.Unlock()
	}
}
