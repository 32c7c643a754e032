package runtime

import "github.com/ferryml/ferry/backend"

// Environment variables read by MemoryConfigFromEnv (see backend).
const (
	EnvDeviceMemory = backend.EnvDeviceMemory // device capacity: bytes or 64MiB, 1.5GiB, 512MB, 1e9; unset or "unlimited" for none
	EnvHostMemory   = backend.EnvHostMemory   // pinned_host capacity, same syntax
	EnvAllocator    = backend.EnvAllocator    // "bfc" (default) or "platform"
	EnvPreallocate  = backend.EnvPreallocate  // true (default) or false
	EnvMemFraction  = backend.EnvMemFraction  // fraction of device capacity the bfc allocator may use, default 0.75
)

// Allocator names for MemoryConfig.Allocator.
const (
	AllocatorBFC      = backend.AllocatorBFC
	AllocatorPlatform = backend.AllocatorPlatform
)

// DefaultMemFraction is the fraction of device capacity the bfc allocator uses
// by default, as XLA_PYTHON_CLIENT_MEM_FRACTION.
const DefaultMemFraction = backend.DefaultMemFraction

// MemoryConfig sets the memory pools of the CPU backend (backend.MemoryConfig).
type MemoryConfig = backend.MemoryConfig

// MemStats describes one memory pool (backend.MemStats).
type MemStats = backend.MemStats

// OutOfMemoryError is returned when an allocation does not fit in its pool
// (backend.OutOfMemoryError).
type OutOfMemoryError = backend.OutOfMemoryError

// LiveArray describes one live buffer of a memory pool (backend.LiveArray).
type LiveArray = backend.LiveArray

// MemoryConfigFromEnv reads FERRY_DEVICE_MEMORY, FERRY_HOST_MEMORY,
// FERRY_ALLOCATOR, FERRY_PREALLOCATE and FERRY_MEM_FRACTION
// (backend.MemoryConfigFromEnv).
func MemoryConfigFromEnv() (MemoryConfig, error) { return backend.MemoryConfigFromEnv() }

// ParseMemorySize parses a positive byte count: "123", "1e9", "64MiB",
// "1.5GiB", "512MB" (backend.ParseMemorySize).
func ParseMemorySize(s string) (int64, error) { return backend.ParseMemorySize(s) }

// NewOutOfMemoryError is the out-of-memory report of a backend other than
// the CPU one (backend.NewOutOfMemoryError).
func NewOutOfMemoryError(s MemStats, requested int64, what, note string, live []backend.Allocation) *OutOfMemoryError {
	return backend.NewOutOfMemoryError(s, requested, what, note, live)
}
