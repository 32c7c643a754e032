package backend

import (
	"time"

	"github.com/ferryml/ferry/ir"
)

// Memory is implemented by a backend that holds memory of its own and
// reports it: runtime's MemoryStats, LiveArrays, out-of-memory reports and
// memory profile ask every registered backend that implements it.
type Memory interface {
	// MemoryStats returns the statistics of the backend's memory in space
	// on device dev (Device.ID; each device has its own memory), and false
	// when the backend has no such device or holds no memory of that space.
	MemoryStats(dev int, space ir.MemorySpace) (SpaceStats, bool)
	// LiveAllocations lists the backend's live allocations on every device,
	// in any order.
	LiveAllocations() []Allocation
	// ResetPeak sets the peak of every space of every device to the bytes
	// in use now.
	ResetPeak()
}

// SpaceStats describes a backend's memory in one space.
type SpaceStats struct {
	// Platform is the backend's name.
	Platform string
	// Device is the index (Device.ID) of the device whose memory this is.
	Device int
	// Space is the memory space.
	Space ir.MemorySpace
	// Allocator names the allocator ("bfc", "platform").
	Allocator string
	// Capacity is the size of the memory space; 0 means unlimited or unknown.
	Capacity int64
	// Limit is what the allocator may use; 0 means unlimited.
	Limit int64
	// Reserved is what the allocator holds.
	Reserved int64
	// BytesInUse is the memory of live allocations as counted against Limit.
	BytesInUse int64
	// PeakBytesInUse is the highest BytesInUse so far.
	PeakBytesInUse int64
	// LargestFreeBlock is the largest free block inside the reserved memory.
	LargestFreeBlock int64
	// FreeBytes is the free memory inside the reserved memory, FreeBlocks
	// the number of its blocks.
	FreeBytes  int64
	FreeBlocks int
	// NumAllocs counts the allocations made.
	NumAllocs int64
	// LiveAllocs is the number of live allocations.
	LiveAllocs int64
}

// Fragmentation is 1 − LargestFreeBlock / FreeBytes, 0 when nothing
// reserved is free.
func (s SpaceStats) Fragmentation() float64 {
	if s.FreeBytes <= 0 {
		return 0
	}
	return 1 - float64(s.LargestFreeBlock)/float64(s.FreeBytes)
}

// Allocation is one live allocation of a backend.
type Allocation struct {
	// Platform is the backend's name.
	Platform string
	// Device is the index (Device.ID) of the device holding it.
	Device int
	// Space is the memory space it lives in.
	Space ir.MemorySpace
	// IsArray says the memory is an array of Type; otherwise it is scratch
	// memory (arenas, outputs not yet returned) described by What.
	IsArray bool
	Type    ir.Type
	What    string
	// Bytes is the size requested.
	Bytes int64
	// Site is the Go file:line that made it; when empty, the innermost
	// frame of PCs outside Ferry's library packages.
	Site string
	// PCs is the Go call stack that allocated it (may be empty).
	PCs []uintptr
	// Born is when it was allocated.
	Born time.Time
}

// MemStats converts s to the statistics runtime.MemoryStats reports.
func (s SpaceStats) MemStats() MemStats {
	return MemStats{Platform: s.Platform, Device: s.Device, Space: s.Space, Allocator: s.Allocator, Capacity: s.Capacity, Limit: s.Limit,
		Reserved: s.Reserved, BytesInUse: s.BytesInUse, PeakBytesInUse: s.PeakBytesInUse,
		LargestFreeBlock: s.LargestFreeBlock, Fragmentation: s.Fragmentation(), NumAllocs: s.NumAllocs, LiveAllocs: s.LiveAllocs}
}
