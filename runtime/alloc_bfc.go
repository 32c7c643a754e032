package runtime

import (
	"fmt"
	"sort"
)

// bfcAllocator is a best-fit-with-coalescing allocator, the scheme of
// TensorFlow's and XLA's BFCAllocator: memory is held in regions (one slab when
// pre-allocated, or regions added on demand up to the limit); every region is
// split into chunks that tile it in address order. An allocation takes the
// smallest free chunk that fits (the lowest address among equals) and splits
// off the rest; a free merges the chunk with free neighbours in its region.
// Sizes are rounded up to a multiple of allocAlign (64), so every chunk is
// 64-byte aligned. It is not safe for concurrent use: the pool locks it.
type bfcAllocator struct {
	limit      int64 // 0: unlimited
	prealloc   bool  // one slab of limit bytes, reserved at first use, never grown
	nextRegion int64 // size of the next growth region
	regions    []*bfcRegion
	reserved   int64
	nextID     int64
	freeSet    []*bfcChunk // free chunks sorted by (size, region, offset)
	freeBytes  int64
	spare      []*bfcChunk // chunks merged away, for reuse by splits
}

// maxSpareChunks bounds bfcAllocator.spare.
const maxSpareChunks = 64

// bfcRegion is one contiguous []byte of the allocator.
type bfcRegion struct {
	id    int64
	mem   []byte
	first *bfcChunk
	hwm   int64 // bytes at or past hwm were never handed out (still zero)
}

// bfcChunk is a piece of a region, free or in use.
type bfcChunk struct {
	region     *bfcRegion
	off, size  int64
	prev, next *bfcChunk // neighbours in address order within the region
	free       bool
}

// bytes returns the first n bytes of the chunk, with capacity n.
func (c *bfcChunk) bytes(n int64) []byte { return c.region.mem[c.off : c.off+n : c.off+n] }

// newBFC makes an allocator; with prealloc and a finite limit it reserves one
// slab of limit bytes at first use, otherwise it grows by regions of
// regionBytes, doubling, up to limit.
func newBFC(limit int64, prealloc bool, regionBytes int64) *bfcAllocator {
	return &bfcAllocator{limit: limit, prealloc: prealloc && limit > 0, nextRegion: regionBytes}
}

func roundUp(n int64) int64 { return (n + allocAlign - 1) &^ (allocAlign - 1) }

func chunkLess(a, b *bfcChunk) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	if a.region.id != b.region.id {
		return a.region.id < b.region.id
	}
	return a.off < b.off
}

func (a *bfcAllocator) insertFree(c *bfcChunk) {
	c.free = true
	i := sort.Search(len(a.freeSet), func(i int) bool { return !chunkLess(a.freeSet[i], c) })
	a.freeSet = append(a.freeSet, nil)
	copy(a.freeSet[i+1:], a.freeSet[i:])
	a.freeSet[i] = c
	a.freeBytes += c.size
}

func (a *bfcAllocator) removeFree(c *bfcChunk) {
	i := sort.Search(len(a.freeSet), func(i int) bool { return !chunkLess(a.freeSet[i], c) })
	if i == len(a.freeSet) || a.freeSet[i] != c {
		panic(fmt.Sprintf("bfc: chunk %d+%d of region %d is not in the free set", c.off, c.size, c.region.id))
	}
	a.freeSet = append(a.freeSet[:i], a.freeSet[i+1:]...)
	a.freeBytes -= c.size
	c.free = false
}

// bestFit returns the smallest free chunk of at least n bytes, or nil.
func (a *bfcAllocator) bestFit(n int64) *bfcChunk {
	i := sort.Search(len(a.freeSet), func(i int) bool { return a.freeSet[i].size >= n })
	if i == len(a.freeSet) {
		return nil
	}
	return a.freeSet[i]
}

// addRegion reserves a new region of size bytes, or returns why it cannot.
func (a *bfcAllocator) addRegion(size int64) string {
	if note := checkSystemMemory(size); note != "" {
		return note
	}
	r := &bfcRegion{id: a.nextID, mem: alignedBytes(size)}
	a.nextID++
	r.first = &bfcChunk{region: r, off: 0, size: size}
	a.regions = append(a.regions, r)
	a.reserved += size
	a.insertFree(r.first)
	return ""
}

// grow adds a region that can hold n bytes if the limit allows.
func (a *bfcAllocator) grow(n int64) string {
	if a.prealloc {
		return ""
	}
	size := max(n, a.nextRegion)
	if a.limit > 0 {
		room := a.limit - a.reserved
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
	if a.prealloc && len(a.regions) == 0 {
		if note := a.addRegion(a.limit); note != "" {
			return nil, note
		}
	}
	c := a.bestFit(n)
	if c == nil {
		if !grow {
			return nil, ""
		}
		if note := a.grow(n); note != "" {
			return nil, note
		}
		if c = a.bestFit(n); c == nil {
			return nil, ""
		}
	}
	a.removeFree(c)
	if c.size > n {
		rest := a.newChunk()
		*rest = bfcChunk{region: c.region, off: c.off + n, size: c.size - n, prev: c, next: c.next}
		if c.next != nil {
			c.next.prev = rest
		}
		c.next = rest
		c.size = n
		a.insertFree(rest)
	}
	r := c.region
	if zero && c.off < r.hwm {
		clear(r.mem[c.off:min(c.off+size, r.hwm)])
	}
	r.hwm = max(r.hwm, c.off+size)
	return c, ""
}

// free returns a chunk and merges it with free neighbours.
func (a *bfcAllocator) free(c *bfcChunk) {
	if c == nil || c.free {
		return
	}
	if n := c.next; n != nil && n.free {
		a.removeFree(n)
		c.size += n.size
		c.next = n.next
		if n.next != nil {
			n.next.prev = c
		}
		a.recycle(n)
	}
	if p := c.prev; p != nil && p.free {
		a.removeFree(p)
		p.size += c.size
		p.next = c.next
		if c.next != nil {
			c.next.prev = p
		}
		a.recycle(c)
		c = p
	}
	a.insertFree(c)
}

// newChunk returns a spare chunk or a new one.
func (a *bfcAllocator) newChunk() *bfcChunk {
	if n := len(a.spare); n > 0 {
		c := a.spare[n-1]
		a.spare[n-1] = nil
		a.spare = a.spare[:n-1]
		return c
	}
	return new(bfcChunk)
}

// recycle keeps a chunk merged away for newChunk (its owner, if any, no
// longer refers to it).
func (a *bfcAllocator) recycle(c *bfcChunk) {
	if len(a.spare) < maxSpareChunks {
		*c = bfcChunk{}
		a.spare = append(a.spare, c)
	}
}

// freeEmptyRegions drops growth regions that are entirely free (the slab of a
// pre-allocated allocator is kept).
func (a *bfcAllocator) freeEmptyRegions() {
	if a.prealloc {
		return
	}
	kept := a.regions[:0]
	for _, r := range a.regions {
		if f := r.first; f.free && f.next == nil {
			a.removeFree(f)
			a.reserved -= int64(len(r.mem))
			continue
		}
		kept = append(kept, r)
	}
	clear(a.regions[len(kept):])
	a.regions = kept
}

// freeStats returns the largest free chunk and the total of free chunks.
func (a *bfcAllocator) freeStats() (largest, total int64) {
	if len(a.freeSet) > 0 {
		largest = a.freeSet[len(a.freeSet)-1].size
	}
	return largest, a.freeBytes
}
