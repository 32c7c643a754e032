// Package bfc is the best-fit-with-coalescing bookkeeping shared by Ferry's
// memory pools: the CPU runtime's host and device pools (over Go byte slabs)
// and the CUDA backend's device slab (over offsets into one cuMemAlloc).
//
// It is the scheme of TensorFlow's and XLA's BFCAllocator: memory is held in
// regions, each split into chunks that tile it in address order. An
// allocation takes the smallest free chunk that fits (the lowest region, then
// the lowest address among equals) and splits off the rest; a free merges the
// chunk with its free neighbours. Sizes are rounded up to a multiple of the
// allocator's alignment, so every chunk offset is aligned.
//
// The package owns no memory: a region is a size and a value of type R the
// caller attaches (the CPU pool's byte slab; nothing for a device slab), and
// the caller decides when to add or drop regions. It is not safe for
// concurrent use.
package bfc

import (
	"fmt"
	"sort"
)

// Allocator hands out chunks of its regions, best fit first.
type Allocator[R any] struct {
	align     int64
	regions   []*Region[R]
	reserved  int64
	nextID    int64
	freeSet   []*Chunk[R] // free chunks sorted by (size, region, offset)
	freeBytes int64
	spare     []*Chunk[R] // chunks merged away, for reuse by splits
}

// maxSpareChunks bounds Allocator.spare.
const maxSpareChunks = 64

// Region is one contiguous range of the allocator.
type Region[R any] struct {
	// ID numbers regions in the order they were added, from 0.
	ID int64
	// Size is the region's size in bytes.
	Size int64
	// Data is the caller's value for the region (its memory).
	Data  R
	first *Chunk[R]
}

// First returns the region's first chunk; Chunk.Next walks the rest in
// address order.
func (r *Region[R]) First() *Chunk[R] { return r.first }

// Chunk is a piece of a region, free or in use.
type Chunk[R any] struct {
	// Region is the region the chunk belongs to.
	Region *Region[R]
	// Off is the chunk's offset in its region; Size its size (a multiple of
	// the alignment).
	Off, Size  int64
	prev, next *Chunk[R]
	free       bool
}

// Next returns the chunk after c in its region, or nil.
func (c *Chunk[R]) Next() *Chunk[R] { return c.next }

// Prev returns the chunk before c in its region, or nil.
func (c *Chunk[R]) Prev() *Chunk[R] { return c.prev }

// IsFree says whether the chunk is free.
func (c *Chunk[R]) IsFree() bool { return c.free }

// New returns an empty allocator whose chunks are multiples of align bytes
// (align a power of two).
func New[R any](align int64) *Allocator[R] {
	if align <= 0 || align&(align-1) != 0 {
		panic(fmt.Sprintf("bfc: alignment %d is not a power of two", align))
	}
	return &Allocator[R]{align: align}
}

// RoundUp returns n rounded up to the alignment.
func (a *Allocator[R]) RoundUp(n int64) int64 { return (n + a.align - 1) &^ (a.align - 1) }

// Align returns the alignment.
func (a *Allocator[R]) Align() int64 { return a.align }

// Reserved returns the total size of the regions.
func (a *Allocator[R]) Reserved() int64 { return a.reserved }

// Regions returns the regions in the order they were added (read-only).
func (a *Allocator[R]) Regions() []*Region[R] { return a.regions }

// FreeStats returns the largest free chunk, the total of free chunks and
// their number.
func (a *Allocator[R]) FreeStats() (largest, total int64, count int) {
	if len(a.freeSet) > 0 {
		largest = a.freeSet[len(a.freeSet)-1].Size
	}
	return largest, a.freeBytes, len(a.freeSet)
}

func chunkLess[R any](a, b *Chunk[R]) bool {
	if a.Size != b.Size {
		return a.Size < b.Size
	}
	if a.Region.ID != b.Region.ID {
		return a.Region.ID < b.Region.ID
	}
	return a.Off < b.Off
}

func (a *Allocator[R]) insertFree(c *Chunk[R]) {
	c.free = true
	i := sort.Search(len(a.freeSet), func(i int) bool { return !chunkLess(a.freeSet[i], c) })
	a.freeSet = append(a.freeSet, nil)
	copy(a.freeSet[i+1:], a.freeSet[i:])
	a.freeSet[i] = c
	a.freeBytes += c.Size
}

func (a *Allocator[R]) removeFree(c *Chunk[R]) {
	i := sort.Search(len(a.freeSet), func(i int) bool { return !chunkLess(a.freeSet[i], c) })
	if i == len(a.freeSet) || a.freeSet[i] != c {
		panic(fmt.Sprintf("bfc: chunk %d+%d of region %d is not in the free set", c.Off, c.Size, c.Region.ID))
	}
	a.freeSet = append(a.freeSet[:i], a.freeSet[i+1:]...)
	a.freeBytes -= c.Size
	c.free = false
}

// bestFit returns the smallest free chunk of at least n bytes, or nil.
func (a *Allocator[R]) bestFit(n int64) *Chunk[R] {
	i := sort.Search(len(a.freeSet), func(i int) bool { return a.freeSet[i].Size >= n })
	if i == len(a.freeSet) {
		return nil
	}
	return a.freeSet[i]
}

// AddRegion adds a free region of size bytes (a positive multiple of the
// alignment) carrying data.
func (a *Allocator[R]) AddRegion(size int64, data R) *Region[R] {
	if size <= 0 || size%a.align != 0 {
		panic(fmt.Sprintf("bfc: region size %d is not a positive multiple of %d", size, a.align))
	}
	r := &Region[R]{ID: a.nextID, Size: size, Data: data}
	a.nextID++
	r.first = &Chunk[R]{Region: r, Size: size}
	a.regions = append(a.regions, r)
	a.reserved += size
	a.insertFree(r.first)
	return r
}

// Fits says whether a chunk of n bytes (rounded up) would be found now.
func (a *Allocator[R]) Fits(n int64) bool { return a.bestFit(a.RoundUp(max(n, 1))) != nil }

// Alloc returns a chunk of at least n bytes (n rounded up to the alignment;
// n ≤ 0 takes one aligned unit), the best fit among the free chunks, or nil
// when none fits.
func (a *Allocator[R]) Alloc(n int64) *Chunk[R] {
	n = a.RoundUp(max(n, 1))
	c := a.bestFit(n)
	if c == nil {
		return nil
	}
	a.removeFree(c)
	if c.Size > n {
		rest := a.newChunk()
		*rest = Chunk[R]{Region: c.Region, Off: c.Off + n, Size: c.Size - n, prev: c, next: c.next}
		if c.next != nil {
			c.next.prev = rest
		}
		c.next = rest
		c.Size = n
		a.insertFree(rest)
	}
	return c
}

// Free returns a chunk and merges it with its free neighbours; c must not be
// used afterwards (it may be recycled for another chunk). Freeing nil does
// nothing.
func (a *Allocator[R]) Free(c *Chunk[R]) {
	if c == nil || c.free {
		return
	}
	if n := c.next; n != nil && n.free {
		a.removeFree(n)
		a.absorb(c, n)
	}
	if p := c.prev; p != nil && p.free {
		a.removeFree(p)
		a.absorb(p, c)
		c = p
	}
	a.insertFree(c)
}

// absorb merges chunk r into its left neighbour l and recycles r; neither
// is in the free set.
func (a *Allocator[R]) absorb(l, r *Chunk[R]) {
	l.Size += r.Size
	l.next = r.next
	if r.next != nil {
		r.next.prev = l
	}
	a.recycle(r)
}

// newChunk returns a spare chunk or a new one.
func (a *Allocator[R]) newChunk() *Chunk[R] {
	if n := len(a.spare); n > 0 {
		c := a.spare[n-1]
		a.spare[n-1] = nil
		a.spare = a.spare[:n-1]
		return c
	}
	return new(Chunk[R])
}

// recycle keeps a chunk merged away for newChunk (its owner, if any, no
// longer refers to it).
func (a *Allocator[R]) recycle(c *Chunk[R]) {
	if len(a.spare) < maxSpareChunks {
		*c = Chunk[R]{}
		a.spare = append(a.spare, c)
	}
}

// RemoveEmptyRegions drops the regions that are entirely free and returns
// them (the caller releases their memory).
func (a *Allocator[R]) RemoveEmptyRegions() []*Region[R] {
	var removed []*Region[R]
	kept := a.regions[:0]
	for _, r := range a.regions {
		if f := r.first; f.free && f.next == nil {
			a.removeFree(f)
			a.reserved -= r.Size
			removed = append(removed, r)
			continue
		}
		kept = append(kept, r)
	}
	clear(a.regions[len(kept):])
	a.regions = kept
	return removed
}
