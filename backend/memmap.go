package backend

import "github.com/ferryml/ferry/ir"

// MemoryMap is implemented by a backend whose allocator can list its
// reserved memory in address order (the CPU pools' bfc allocator): the live
// memory page draws it, so that fragmentation — free blocks between live
// ones — can be seen.
type MemoryMap interface {
	// MemoryMap returns the blocks of the reserved memory of space on
	// device dev, region by region in address order, and false when the
	// allocator keeps no such map (the platform allocator) or there is no
	// such pool.
	MemoryMap(dev int, space ir.MemorySpace) ([]Block, bool)
}

// Block is one piece of an allocator's reserved memory: free, or held by
// one allocation.
type Block struct {
	// Region numbers the allocator's regions (slabs); Offset is the block's
	// offset in its region and Size its size in bytes (rounded up to the
	// allocator's alignment).
	Region int64 `json:"region"`
	Offset int64 `json:"offset"`
	Size   int64 `json:"size"`
	Free   bool  `json:"free"`
	// What and Site describe the allocation holding a block that is not
	// free (Allocation.What, or the array's type, and the Go file:line that
	// made it).
	What string `json:"what,omitempty"`
	Site string `json:"site,omitempty"`
}
