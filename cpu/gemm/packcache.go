package gemm

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ferryml/ferry/internal/settings"
)

// The packed-weight cache keeps the packed panels of B operands that lie in
// memory declared read-only (ReadOnly), so that a product whose B is a
// constant weight does not pack it again at every call: ONNX Runtime and
// oneDNN pre-pack constant weights the same way. The packed panels are those
// the product would pack itself, in the same blocking, so a product reading
// them computes the same bits.
//
// A B operand is packed into the cache the second time a product with the
// same B (address, layout, shape, blocking and kernel) is seen: an
// activation read once costs a map entry, not a copy. Entries are dropped
// when the memory is forgotten (Forget: it is freed or about to be written).
// The cache holds at most its limit (SetPackCacheLimit;
// FERRY_GEMM_PACK_CACHE, 256 MiB by default): a new operand takes the place
// of the least recently used ones only if they were not used since it was
// first seen, so weights that no longer run make room, while a model whose
// weights outgrow the cache keeps the part that fits instead of packing
// every weight into it and dropping it again at every call.

// DefaultPackCacheLimit is the packed-weight cache's limit in bytes when
// FERRY_GEMM_PACK_CACHE is unset.
const DefaultPackCacheLimit = 256 << 20

// packKey says which packing of which B an entry holds.
type packKey struct {
	ptr      uintptr        // address of B's first element as passed
	kr       unsafe.Pointer // the kernel (its element type and blocking)
	half     Format
	transB   bool
	ldb      int
	k, n     int
	kc, nc   int
	elemSize uint8
}

// packEntry is one B operand: seen (data nil) or packed.
type packEntry struct {
	data    any   // []T: the packed panels, step after step
	off     []int // start of each step's panel in data
	bytes   int64
	seen    int64 // clock when first seen (or last refused room)
	lastUse int64
}

// maxSeen bounds the operands remembered as seen but not packed.
const maxSeen = 1 << 14

// readOnly is a range of memory [lo, hi) declared read-only.
type readOnly struct{ lo, hi uintptr }

var packs struct {
	mu      sync.Mutex
	regions []readOnly // sorted by lo, disjoint
	entries map[packKey]*packEntry
	clock   int64
	bytes   int64
	hits    int64
	packed  int64
}

// nRegions is len(packs.regions), read without the lock on the fast paths.
var nRegions atomic.Int64

// packLimit is the cache's limit in bytes (0: no cache).
var packLimit atomic.Int64

func init() {
	packLimit.Store(DefaultPackCacheLimit)
	n, set, err := settings.GemmPackCache.Lookup()
	if err != nil {
		settings.Warn(err, fmt.Sprint(DefaultPackCacheLimit))
		return
	}
	if set {
		packLimit.Store(n)
	}
}

// SetPackCacheLimit sets the packed-weight cache's limit in bytes and
// returns the previous one; 0 turns the cache off (and empties it). Entries
// beyond a lower limit are dropped now.
func SetPackCacheLimit(n int64) int64 {
	n = max(n, 0)
	old := packLimit.Swap(n)
	packs.mu.Lock()
	evictLocked(n)
	packs.mu.Unlock()
	return old
}

// PackCacheStats describes the packed-weight cache.
type PackCacheStats struct {
	// Entries is the number of packed B operands held, Bytes their size.
	Entries int
	Bytes   int64
	// Limit is the cache's limit in bytes (0: off).
	Limit int64
	// Regions is the number of memory ranges declared read-only.
	Regions int
	// Hits counts products that read a packed B from the cache, Packed
	// the B operands packed into it, since the process started.
	Hits, Packed int64
}

// PackCache returns the packed-weight cache's statistics.
func PackCache() PackCacheStats {
	packs.mu.Lock()
	defer packs.mu.Unlock()
	s := PackCacheStats{Bytes: packs.bytes, Limit: packLimit.Load(), Regions: len(packs.regions), Hits: packs.hits, Packed: packs.packed}
	for _, e := range packs.entries {
		if e.data != nil {
			s.Entries++
		}
	}
	return s
}

// ReadOnly declares that mem will not change until Forget is called on it
// (or on memory overlapping it): products whose B operand lies inside it may
// keep B packed between calls. The caller must call Forget before the
// memory is written, freed or reused. Declaring a range again is harmless; one
// that overlaps declared ones merges with them (ranges that only touch stay
// apart, so forgetting one keeps its neighbours).
func ReadOnly(mem []byte) {
	if len(mem) == 0 || packLimit.Load() == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	r := readOnly{lo, lo + uintptr(len(mem))}
	packs.mu.Lock()
	defer packs.mu.Unlock()
	i, _ := slices.BinarySearchFunc(packs.regions, r.lo, func(x readOnly, lo uintptr) int { return cmp.Compare(x.lo, lo) })
	if i > 0 && packs.regions[i-1].hi > r.lo {
		i-- // overlaps the one before: merge
	}
	j := i
	for j < len(packs.regions) && packs.regions[j].lo < r.hi {
		r.lo, r.hi = min(r.lo, packs.regions[j].lo), max(r.hi, packs.regions[j].hi)
		j++
	}
	packs.regions = slices.Replace(packs.regions, i, j, r)
	nRegions.Store(int64(len(packs.regions)))
}

// Forget ends every read-only declaration overlapping mem and drops the
// packed operands that lie in it: call it before memory declared with
// ReadOnly is written, freed or reused.
func Forget(mem []byte) {
	if len(mem) == 0 || nRegions.Load() == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	hi := lo + uintptr(len(mem))
	packs.mu.Lock()
	defer packs.mu.Unlock()
	rs := packs.regions[:0]
	for _, r := range packs.regions {
		if r.hi <= lo || r.lo >= hi {
			rs = append(rs, r)
		}
	}
	packs.regions = rs
	nRegions.Store(int64(len(rs)))
	for k, e := range packs.entries {
		if k.ptr >= lo && k.ptr < hi {
			packs.bytes -= e.bytes
			delete(packs.entries, k)
		}
	}
}

// readOnlyLocked reports whether [lo, hi) lies in one declared range.
func readOnlyLocked(lo, hi uintptr) bool {
	i, found := slices.BinarySearchFunc(packs.regions, lo, func(x readOnly, lo uintptr) int { return cmp.Compare(x.lo, lo) })
	if !found {
		i--
	}
	return i >= 0 && packs.regions[i].lo <= lo && hi <= packs.regions[i].hi
}

// evictLocked drops the least recently used packed operands until the
// cache holds at most limit bytes.
func evictLocked(limit int64) {
	makeRoomLocked(limit, 0, math.MaxInt64)
	if limit == 0 {
		clear(packs.entries)
	}
}

// makeRoomLocked drops the least recently used packed operands last used
// before the clock reads before, until size more bytes fit in limit; it
// drops nothing and returns false when that is not enough.
func makeRoomLocked(limit, size, before int64) bool {
	if packs.bytes+size <= limit {
		return true
	}
	var idle []packKey
	free := int64(0)
	for k, e := range packs.entries {
		if e.data != nil && e.lastUse < before {
			idle = append(idle, k)
			free += e.bytes
		}
	}
	if packs.bytes-free+size > limit {
		return false
	}
	slices.SortFunc(idle, func(a, b packKey) int { return cmp.Compare(packs.entries[a].lastUse, packs.entries[b].lastUse) })
	for _, k := range idle {
		if packs.bytes+size <= limit {
			break
		}
		packs.bytes -= packs.entries[k].bytes
		delete(packs.entries, k)
	}
	return true
}

// bExtent returns the address of B's first element and one past the last
// element a product reads, in bytes, for a B stored as rows×cols with row
// stride ldb (rows, cols ≥ 1).
func bExtent(p unsafe.Pointer, es, rows, cols, ldb int) (lo, hi uintptr) {
	lo = uintptr(p)
	return lo, lo + uintptr(((rows-1)*ldb+cols)*es)
}

// cachedB returns the packed panels of j's B, one per step (jc outer, pc
// inner), from the cache, or packs them into it the second time this B is
// seen; ok is false when B is not cached (not read-only, placed by offset
// tables, seen for the first time, too large for the cache).
func (j *job[T]) cachedB() (data []T, off []int, ok bool) {
	if nRegions.Load() == 0 || j.br != nil || j.k == 0 || j.n == 0 {
		return nil, nil, false
	}
	limit := packLimit.Load()
	var z T
	es := int(unsafe.Sizeof(z))
	var p unsafe.Pointer
	bes := es
	if j.half != 0 {
		p, bes = unsafe.Pointer(unsafe.SliceData(j.b16)), 2
	} else {
		p = unsafe.Pointer(unsafe.SliceData(j.b))
	}
	rows, cols := j.k, j.n
	if j.transB {
		rows, cols = cols, rows
	}
	lo, hi := bExtent(p, bes, rows, cols, j.ldb)
	key := packKey{ptr: lo, kr: unsafe.Pointer(j.kr), half: j.half, transB: j.transB, ldb: j.ldb,
		k: j.k, n: j.n, kc: j.kc, nc: j.nc, elemSize: uint8(es)}
	size := j.packedSize()
	packs.mu.Lock()
	if !readOnlyLocked(lo, hi) || int64(size*es) > limit {
		packs.mu.Unlock()
		return nil, nil, false
	}
	if packs.entries == nil {
		packs.entries = map[packKey]*packEntry{}
	}
	packs.clock++
	e := packs.entries[key]
	if e == nil {
		if len(packs.entries) < maxSeen {
			packs.entries[key] = &packEntry{seen: packs.clock, lastUse: packs.clock}
		}
		packs.mu.Unlock()
		return nil, nil, false
	}
	e.lastUse = packs.clock
	if e.data != nil {
		packs.hits++
		packs.mu.Unlock()
		return e.data.([]T), e.off, true
	}
	if !makeRoomLocked(limit, int64(size*es), e.seen) {
		e.seen = packs.clock // no room: wait for a round in which others go idle
		packs.mu.Unlock()
		return nil, nil, false
	}
	packs.mu.Unlock()
	// Second sighting: pack every step's panel, then publish them if the
	// memory is still read-only (it may have been forgotten meanwhile).
	data, off = j.packAllB(size)
	packs.mu.Lock()
	defer packs.mu.Unlock()
	if cur := packs.entries[key]; cur == e && e.data == nil && readOnlyLocked(lo, hi) &&
		makeRoomLocked(packLimit.Load(), int64(len(data)*es), e.seen) {
		e.data, e.off, e.bytes = data, off, int64(len(data)*es)
		packs.bytes += e.bytes
		packs.packed++
	}
	return data, off, true
}

// packedSize is the number of elements of all of B's packed panels.
func (j *job[T]) packedSize() int {
	n := 0
	for jc := 0; jc < j.n; jc += j.nc {
		n += roundUp(min(j.nc, j.n-jc), j.kr.nr) * j.k
	}
	return n
}

// packAllB packs every step's panel of B as run would, one after another.
func (j *job[T]) packAllB(size int) ([]T, []int) {
	data := alignedSlice[T](size)
	var off []int
	o := 0
	for jc := 0; jc < j.n; jc += j.nc {
		nc := min(j.nc, j.n-jc)
		for pc := 0; pc < j.k; pc += j.kc {
			kc := min(j.kc, j.k-pc)
			off = append(off, o)
			j.packB(data[o:], pc, jc, kc, nc)
			o += roundUp(nc, j.kr.nr) * kc
		}
	}
	return data, off
}

// alignedSlice returns n elements aligned to 64 bytes.
func alignedSlice[T float](n int) []T {
	var z T
	es := int(unsafe.Sizeof(z))
	raw := make([]T, n+64/es)
	off := 0
	if r := uintptr(unsafe.Pointer(&raw[0])) % 64; r != 0 {
		off = int(64-r) / es
	}
	return raw[off : off+n : off+n]
}
