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
	MemoryStats(dev int, space ir.MemorySpace) (MemStats, bool)
	// LiveAllocations lists the backend's live allocations on every device,
	// in any order.
	LiveAllocations() []Allocation
	// ResetPeak sets the peak of every space of every device to the bytes
	// in use now.
	ResetPeak()
}

// Fragmentation is 1 − largestFree / freeBytes, 0 when nothing reserved is
// free: MemStats.Fragmentation of a space whose free reserved memory is
// freeBytes, the largest block of it largestFree.
func Fragmentation(largestFree, freeBytes int64) float64 {
	if freeBytes <= 0 {
		return 0
	}
	return 1 - float64(largestFree)/float64(freeBytes)
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
