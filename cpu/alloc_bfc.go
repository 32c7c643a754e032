package cpu

import "github.com/ferryml/ferry/internal/bfc"

// bfcAllocator is the pools' best-fit-with-coalescing allocator over Go byte
// slabs: internal/bfc keeps the chunks; this adds the memory and the growth
// policy. Memory is held in regions (one slab when pre-allocated, or regions
// added on demand up to the limit). Sizes are rounded up to a multiple of
// allocAlign (64), so every chunk is 64-byte aligned. It is not safe for
// concurrent use: the pool locks it.
type bfcAllocator struct {
	limit      int64 // 0: unlimited
	prealloc   bool  // one slab of limit bytes, reserved at first use, never grown
	nextRegion int64 // size of the next growth region
	a          *bfc.Allocator[hostRegion]
}

// hostRegion is the memory of one region.
type hostRegion struct {
	mem []byte
	hwm int64 // bytes at or past hwm were never handed out (still zero)
}

// bfcChunk is a piece of a region, free or in use.
type bfcChunk = bfc.Chunk[hostRegion]

// chunkBytes returns the first n bytes of the chunk, with capacity n.
func chunkBytes(c *bfcChunk, n int64) []byte {
	return c.Region.Data.mem[c.Off : c.Off+n : c.Off+n]
}

// newBFC makes an allocator; with prealloc and a finite limit it reserves one
// slab of limit bytes at first use, otherwise it grows by regions of
// regionBytes, doubling, up to limit.
func newBFC(limit int64, prealloc bool, regionBytes int64) *bfcAllocator {
	return &bfcAllocator{limit: limit, prealloc: prealloc && limit > 0, nextRegion: regionBytes, a: bfc.New[hostRegion](allocAlign)}
}

func roundUp(n int64) int64 { return (n + allocAlign - 1) &^ (allocAlign - 1) }

// reserved returns the bytes the regions hold.
func (a *bfcAllocator) reserved() int64 { return a.a.Reserved() }

// addRegion reserves a new region of size bytes, or returns why it cannot.
func (a *bfcAllocator) addRegion(size int64) string {
	if note := checkSystemMemory(size); note != "" {
		return note
	}
	a.a.AddRegion(size, hostRegion{mem: alignedBytes(size)})
	return ""
}

// grow adds a region that can hold n bytes if the limit allows.
func (a *bfcAllocator) grow(n int64) string {
	if a.prealloc {
		return ""
	}
	size := max(n, a.nextRegion)
	if a.limit > 0 {
		room := a.limit - a.reserved()
		if n > room {
			return ""
		}
		size = min(size, room)
	}
	if note := a.addRegion(size); note != "" {
		return note
	}
	if size >= a.nextRegion && a.nextRegion < 1<<40 {
		a.nextRegion *= 2
	}
	return ""
}

// alloc returns a chunk of at least size bytes (size > 0), adding a region if
// none fits and grow allows, or nil and, when the failure is not simply a full
// pool, a note saying why.
func (a *bfcAllocator) alloc(size int64, zero, grow bool) (*bfcChunk, string) {
	n := roundUp(size)
	if a.prealloc && len(a.a.Regions()) == 0 {
		if note := a.addRegion(a.limit); note != "" {
			return nil, note
		}
	}
	c := a.a.Alloc(n)
	if c == nil {
		if !grow {
			return nil, ""
		}
		if note := a.grow(n); note != "" {
			return nil, note
		}
		if c = a.a.Alloc(n); c == nil {
			return nil, ""
		}
	}
	r := &c.Region.Data
	if zero && c.Off < r.hwm {
		clear(r.mem[c.Off:min(c.Off+size, r.hwm)])
	}
	r.hwm = max(r.hwm, c.Off+size)
	return c, ""
}

// free returns a chunk and merges it with free neighbours.
func (a *bfcAllocator) free(c *bfcChunk) { a.a.Free(c) }

// freeEmptyRegions drops growth regions that are entirely free (the slab of a
// pre-allocated allocator is kept).
func (a *bfcAllocator) freeEmptyRegions() {
	if !a.prealloc {
		a.a.RemoveEmptyRegions()
	}
}

// freeStats returns the largest free chunk, the total of free chunks and
// their number.
func (a *bfcAllocator) freeStats() (largest, total int64, count int) { return a.a.FreeStats() }
