package cpu

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goruntime "runtime"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/backend/ledger"
	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

const (
	allocAlign         = 64      // alignment and granularity of every allocation
	defaultRegionBytes = 2 << 20 // first growth region of the bfc allocator
	maxStackDepth      = 32      // PCs reported per allocation
)

// allocRecord is one live allocation of a pool: the ledger's entry and the
// memory's bfc chunk (nil for the platform allocator). It never points to
// the buffer or literal that uses the memory, so that cleanups can run.
type allocRecord struct {
	ledger.Entry[allocRecord]
	pool  *pool
	chunk *bfcChunk
}

// poolLedger is a pool's accounting of its live allocations.
type poolLedger = ledger.Ledger[allocRecord, *allocRecord]

// release frees the record's memory; it is safe to call more than once.
func (r *allocRecord) release() { r.pool.free(r) }

// setArray records that the memory is an array of type typ, made at site
// ("" keeps the Go line recorded when the memory was allocated). typ is
// kept as it is (reports copy it): its shape must not be modified.
func (r *allocRecord) setArray(typ ir.Type, site string) {
	r.pool.mu.Lock()
	r.MarkArray(typ, site)
	r.pool.mu.Unlock()
}

// pool is the allocator and bookkeeping of one memory space of one device.
type pool struct {
	devices  int // the number of devices of its set
	space    ir.MemorySpace
	kind     string
	capacity int64
	limit    int64

	mu      sync.Mutex
	retired bool
	bfc     *bfcAllocator
	plat    *platformAllocator
	l       poolLedger // its live allocations; it names the device
	churn   int64      // bytes allocated since the last collectGarbage
	frees   atomic.Int64
}

func newPool(device int, space ir.MemorySpace, cfg backend.MemoryConfig) *pool {
	p := &pool{devices: cfg.Devices, space: space, kind: cfg.Allocator, l: poolLedger{Platform: "cpu", Device: device, Depth: maxStackDepth}}
	prealloc := false
	if space == ir.Device {
		p.capacity = cfg.Capacity
		if cfg.Allocator == backend.AllocatorBFC && p.capacity > 0 {
			p.limit = int64(math.Floor(cfg.Fraction * float64(p.capacity)))
			prealloc = *cfg.Preallocate
		} else {
			p.limit = p.capacity
		}
	} else {
		p.capacity = cfg.HostCapacity
		p.limit = p.capacity
	}
	if cfg.Allocator == backend.AllocatorPlatform {
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
var poisonUninit = settings.PoisonUninit.Get()

var (
	errRetired = errors.New("pool retired")
	errCollect = errors.New("collect garbage before growing")
)

// minChurnBeforeCollect is the least a growing bfc pool allocates between two
// garbage collections it asks for.
const minChurnBeforeCollect = 4 << 20

// tryAlloc allocates size bytes (size > 0) for what, born and made at
// stack, and returns the memory's record; or it returns errRetired,
// errCollect or a *backend.OutOfMemoryError. The record is recycled when freed
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
		mem, note = p.plat.alloc(size, p.l.InUse(p.space))
	}
	if mem == nil {
		return nil, nil, p.oomLocked(size, what, note)
	}
	if !zero && poisonUninit {
		for i := range mem {
			mem[i] = 0xff // NaN in every float type, -1 in every integer one
		}
	}
	// The memory counted against the limit: the bfc chunk (the size
	// rounded up), or the size of platform memory.
	held := size
	if chunk != nil {
		held = chunk.Size
	}
	rec := p.l.New()
	rec.Bytes, rec.Held, rec.Addr, rec.What, rec.Born, rec.Stack, rec.Reuse = size, held, addrOf(mem), what, born, stack, reuse
	rec.pool, rec.chunk = p, chunk
	p.l.Add(rec, p.space)
	p.churn += held
	return rec, mem, nil
}

// free releases a record's memory once.
func (p *pool) free(r *allocRecord) {
	p.mu.Lock()
	defer p.mu.Unlock()
	chunk := r.chunk
	if !p.l.Forget(r) { // which may recycle r
		return
	}
	r.chunk = nil
	if p.bfc != nil {
		p.bfc.free(chunk)
	}
	p.frees.Add(1)
}

func (p *pool) statsLocked() backend.MemStats {
	s := p.l.Stats(p.space)
	s.Allocator, s.Capacity, s.Limit = p.kind, p.capacity, p.limit
	if p.bfc != nil {
		s.Reserved = p.bfc.reserved()
		s.LargestFreeBlock, s.FreeBytes, s.FreeBlocks = p.bfc.freeStats()
	} else {
		s.Reserved = s.BytesInUse
	}
	s.Fragmentation = backend.Fragmentation(s.LargestFreeBlock, s.FreeBytes)
	return s
}

func (p *pool) oomLocked(size int64, what, note string) *backend.OutOfMemoryError {
	s := p.statsLocked()
	e := p.l.OutOfMemory(s, size, what, note)
	e.Devices, e.FreeBytes, e.FreeBlocks, e.Fragmented = p.devices, 0, 0, false
	switch {
	case p.limit == 0:
	case p.bfc != nil:
		room := int64(0)
		if !p.bfc.prealloc {
			room = max(p.limit-s.Reserved, 0)
		}
		e.FreeBytes, e.FreeBlocks = s.FreeBytes+room, s.FreeBlocks
		e.Fragmented = note == "" && e.FreeBytes >= roundUp(size)
	default:
		e.FreeBytes = max(p.limit-s.BytesInUse, 0)
	}
	return e
}

// reclaim frees memory held for nothing: empty bfc growth regions.
func (p *pool) reclaim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bfc != nil {
		p.bfc.freeEmptyRegions()
	}
}

// Pools is the set of memory pools, one per memory space of each device, that
// the CPU backend allocates arrays from. Its Alloc and AllocOn methods serve
// executors (outputs and arenas). Use MemoryPools to get the process's pools.
type Pools struct {
	mu  sync.Mutex // serializes configuration
	cur atomic.Pointer[poolSet]
}

type poolSet struct {
	cfg  backend.MemoryConfig
	err  error     // bad environment settings: every allocation fails with it
	devs [][]*pool // devs[d][space]: the pools of device d (cfg.Devices of them)
	all  []*pool   // every pool, device by device
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
	cfg, err := backend.MemoryConfigFromEnv()
	if err != nil {
		cfg, _ = backend.MemoryConfig{}.Normalized()
		err = fmt.Errorf("invalid memory settings: %w", err)
	}
	s := newPoolSet(cfg)
	s.err = err
	ps.cur.Store(s)
	return s
}

func newPoolSet(cfg backend.MemoryConfig) *poolSet {
	s := &poolSet{cfg: cfg, devs: make([][]*pool, max(cfg.Devices, 1))}
	for d := range s.devs {
		for _, sp := range ir.AllSpaces {
			for len(s.devs[d]) <= int(sp) {
				s.devs[d] = append(s.devs[d], nil)
			}
			p := newPool(d, sp, cfg)
			s.devs[d][sp] = p
			s.all = append(s.all, p)
		}
	}
	return s
}

// numDevices is the number of devices.
func (s *poolSet) numDevices() int { return len(s.devs) }

// pool returns the pool of a memory space of device dev.
func (s *poolSet) pool(dev int, space ir.MemorySpace) (*pool, error) {
	if dev < 0 || dev >= len(s.devs) {
		return nil, deviceError(dev, len(s.devs))
	}
	spaces := s.devs[dev]
	if int(space) >= len(spaces) || spaces[space] == nil {
		return nil, fmt.Errorf("no memory pool for memory space %v", space)
	}
	return spaces[space], nil
}

// deviceError reports a device index out of range.
func deviceError(dev, n int) error {
	return fmt.Errorf("no device cpu:%d: the CPU backend has %d device%s (cpu:0 to cpu:%d; set %s or MemoryConfig.Devices for more)",
		dev, n, plural(n), n-1, backend.EnvCPUDevices)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Alloc allocates size bytes in the pool of a memory space for what (a short
// description such as "output 0 of fn" or "temp arena", shown in out-of-memory
// reports and profiles). The memory is zeroed, 64-byte aligned and has
// len == cap == size; release returns it to the pool and may be called more than
// once. A request that does not fit returns a *backend.OutOfMemoryError. Alloc is
// safe for concurrent use.
//
// Alloc allocates on device 0, the default device; AllocOn on another.
func (ps *Pools) Alloc(space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error) {
	return releaseFunc(ps.alloc(0, space, size, what, true, false, 3))
}

// AllocOn is Alloc in the pool of a memory space of device dev (0 to
// NumDevices()-1).
func (ps *Pools) AllocOn(dev int, space ir.MemorySpace, size int64, what string) (mem []byte, release func(), err error) {
	return releaseFunc(ps.alloc(dev, space, size, what, true, false, 3))
}

// NumDevices returns the number of devices, each with its pools.
func (ps *Pools) NumDevices() int { return ps.set().numDevices() }

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
	return releaseFunc(ps.alloc(0, space, size, what, false, false, 3))
}

func releaseFunc(rec *allocRecord, mem []byte, err error) ([]byte, func(), error) {
	if err != nil || rec == nil {
		return mem, func() {}, err
	}
	return mem, rec.release, nil
}

// alloc is AllocOn returning the record (nil for size 0); skip is the number of
// stack frames to leave out of the recorded call stack (1 is alloc's caller).
// With reuse the pool recycles the record once it is freed (see tryAlloc):
// the caller must release it exactly once.
func (ps *Pools) alloc(dev int, space ir.MemorySpace, size int64, what string, zero, reuse bool, skip int) (*allocRecord, []byte, error) {
	if size < 0 {
		return nil, nil, fmt.Errorf("allocate %d bytes in %v memory for %s: negative size", size, space, what)
	}
	s := ps.set()
	if s.err != nil {
		return nil, nil, s.err
	}
	if size == 0 {
		if _, err := s.pool(dev, space); err != nil {
			return nil, nil, err
		}
		return nil, []byte{}, nil
	}
	born, stack := ledger.Now(), callers.Record(skip)
	retried, collected := false, false
	for {
		p, err := s.pool(dev, space)
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
		var oom *backend.OutOfMemoryError
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

// lookup finds the live record of memory allocated from the pools of a
// memory space of any device, walking the live records (executions keep the
// records they allocate, so this serves only memory handed over from
// Pools.Alloc).
func (ps *Pools) lookup(space ir.MemorySpace, mem []byte) *allocRecord {
	if len(mem) == 0 {
		return nil
	}
	s := ps.cur.Load()
	if s == nil {
		return nil
	}
	addr := addrOf(mem)
	for d := range s.devs {
		p, err := s.pool(d, space)
		if err != nil {
			return nil
		}
		p.mu.Lock()
		r := p.l.Find(addr)
		p.mu.Unlock()
		if r != nil {
			return r
		}
	}
	return nil
}

// configure replaces the pools with new ones for cfg (nil: the environment's
// settings, read at next use). Unless force, it fails while allocations are
// live (after collecting garbage). Buffers still live in replaced pools keep
// their memory and free it into the retired pool.
func (ps *Pools) configure(cfg *backend.MemoryConfig, force bool) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	old := ps.cur.Load()
	if old != nil && !force {
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			if err = old.checkIdle(); err == nil {
				break
			}
			for _, p := range old.all {
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
		for _, p := range old.all {
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
	var live []backend.LiveArray
	for _, p := range s.all {
		p.mu.Lock()
		n += int64(p.l.Len())
		live = append(live, p.l.Largest(5, false)...)
		p.mu.Unlock()
	}
	if n == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ConfigureMemory: %d buffers are still live; delete them (Array.Delete) or drop them first:", n)
	for _, l := range live {
		fmt.Fprintf(&b, "\n  %s %s made at %s", backend.FormatBytes(l.Bytes), l.Describe(), l.Site)
	}
	return errors.New(b.String())
}

// ConfigureMemory replaces the memory pools with new settings (defaults for
// zero fields; see backend.MemoryConfig and the environment variables it mirrors). It
// may be called before first use, or later when no buffers are live: it returns
// an error if arrays are still reachable after a garbage collection.
func ConfigureMemory(cfg backend.MemoryConfig) error {
	n, err := cfg.Normalized()
	if err != nil {
		return err
	}
	return memPools.configure(&n, false)
}

// SetDeviceCount gives the CPU backend n virtual devices, cpu:0 to cpu:n-1
// (1 to backend.MaxCPUDevices), each with pools of its own, keeping the
// other memory settings (those of the last ConfigureMemory, or the
// environment's): it is ConfigureMemory with MemoryConfig.Devices = n, and
// like it may be called before first use, or later when no buffers are
// live.
func SetDeviceCount(n int) error {
	s := memPools.set()
	if s.err != nil {
		return s.err
	}
	cfg := s.cfg
	cfg.Devices = n
	if n < 1 {
		return fmt.Errorf("SetDeviceCount(%d): want at least 1 device", n)
	}
	return ConfigureMemory(cfg)
}

// MemoryStats returns the statistics of the CPU pool of a memory space of
// device 0, the default device (runtime.MemoryStats reports the default
// backend's instead).
func MemoryStats(space ir.MemorySpace) backend.MemStats { return memPools.stats(0, space) }

// DeviceMemoryStats returns the statistics of the CPU pool of a memory space
// of device dev, and false if there is no such device.
func DeviceMemoryStats(dev int, space ir.MemorySpace) (backend.MemStats, bool) {
	if dev < 0 || dev >= memPools.NumDevices() {
		return backend.MemStats{Platform: "cpu", Device: dev, Space: space}, false
	}
	return memPools.stats(dev, space), true
}

func (ps *Pools) stats(dev int, space ir.MemorySpace) backend.MemStats {
	p, err := ps.set().pool(dev, space)
	if err != nil {
		return backend.MemStats{Platform: "cpu", Device: dev, Space: space}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statsLocked()
}

var _ backend.Memory = cpuBackend{}

func (ps *Pools) resetPeak() {
	for _, p := range ps.set().all {
		p.mu.Lock()
		p.l.ResetPeak()
		p.mu.Unlock()
	}
}
