package backend

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
)

// Environment variables read by MemoryConfigFromEnv.
const (
	EnvDeviceMemory = "FERRY_DEVICE_MEMORY" // device capacity: bytes or 64MiB, 1.5GiB, 512MB, 1e9; unset or "unlimited" for none
	EnvHostMemory   = "FERRY_HOST_MEMORY"   // pinned_host capacity, same syntax
	EnvAllocator    = "FERRY_ALLOCATOR"     // "bfc" (default) or "platform"
	EnvPreallocate  = "FERRY_PREALLOCATE"   // true (default) or false
	EnvMemFraction  = "FERRY_MEM_FRACTION"  // fraction of device capacity the bfc allocator may use, default 0.75
	EnvCPUDevices   = "FERRY_CPU_DEVICES"   // number of virtual CPU devices, default 1
)

// MaxCPUDevices is the largest number of virtual CPU devices
// (MemoryConfig.Devices, FERRY_CPU_DEVICES).
const MaxCPUDevices = 1024

// Allocator names for MemoryConfig.Allocator.
const (
	AllocatorBFC      = "bfc"
	AllocatorPlatform = "platform"
)

// DefaultMemFraction is the fraction of device capacity the bfc allocator uses
// by default, as XLA_PYTHON_CLIENT_MEM_FRACTION.
const DefaultMemFraction = 0.75

// MemoryConfig sets the devices and memory pools of the CPU backend. The zero
// value is the default: one device, unlimited capacity, bfc, pre-allocation
// on, fraction 0.75. The environment variables FERRY_CPU_DEVICES,
// FERRY_DEVICE_MEMORY, FERRY_HOST_MEMORY, FERRY_ALLOCATOR, FERRY_PREALLOCATE
// and FERRY_MEM_FRACTION set the same (MemoryConfigFromEnv).
//
// # Virtual devices
//
// Devices > 1 gives the CPU backend that many virtual devices, cpu:0 to
// cpu:N-1, in one process, like XLA's
// --xla_force_host_platform_device_count. Each device has pools of its own,
// each sized by the settings below: a device pool of Capacity (with its own
// Fraction, pre-allocated slab and peak) and a pinned_host pool of
// HostCapacity, its own statistics, live arrays and out-of-memory reports.
// Device 0 is the default device: arrays made without naming a device live
// there, so nothing changes for programs that never name one.
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
	// Devices is the number of virtual CPU devices, at most MaxCPUDevices;
	// 0 means 1.
	Devices int
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

// Normalized fills in defaults and validates the settings.
func (c MemoryConfig) Normalized() (MemoryConfig, error) {
	if c.Capacity < 0 {
		return c, fmt.Errorf("memory config: negative device capacity %d", c.Capacity)
	}
	if c.HostCapacity < 0 {
		return c, fmt.Errorf("memory config: negative host capacity %d", c.HostCapacity)
	}
	if c.Devices < 0 || c.Devices > MaxCPUDevices {
		return c, fmt.Errorf("memory config: %d devices is not in [1, %d]", c.Devices, MaxCPUDevices)
	}
	if c.Devices == 0 {
		c.Devices = 1
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

// MemoryConfigFromEnv reads FERRY_CPU_DEVICES, FERRY_DEVICE_MEMORY,
// FERRY_HOST_MEMORY, FERRY_ALLOCATOR, FERRY_PREALLOCATE and
// FERRY_MEM_FRACTION; unset variables
// keep their defaults. The pools read the environment at first use unless
// ConfigureMemory was called before.
func MemoryConfigFromEnv() (MemoryConfig, error) {
	var c MemoryConfig
	var errs []error
	size := func(s *settings.Setting[int64], dst *int64) {
		if n, set, err := s.Lookup(); err != nil {
			errs = append(errs, err)
		} else if set {
			*dst = n
		}
	}
	size(settings.DeviceMemory, &c.Capacity)
	size(settings.HostMemory, &c.HostCapacity)
	if v, set, err := settings.Allocator.Lookup(); err != nil {
		errs = append(errs, err)
	} else if set {
		c.Allocator = v
	}
	if b, set, err := settings.Preallocate.Lookup(); err != nil {
		errs = append(errs, err)
	} else if set {
		c.Preallocate = &b
	}
	if f, set, err := settings.MemFraction.Lookup(); err != nil {
		errs = append(errs, err)
	} else if set {
		c.Fraction = f
	}
	if n, set, err := settings.CPUDevices.Lookup(); err != nil {
		errs = append(errs, err)
	} else if set {
		c.Devices = int(n)
	}
	if err := errors.Join(errs...); err != nil {
		return MemoryConfig{}, err
	}
	n, err := c.Normalized()
	if err != nil {
		return MemoryConfig{}, fmt.Errorf("%s: %w", EnvAllocator, err)
	}
	return n, nil
}

// ParseMemorySize parses a positive byte count: "123", "1e9", "64MiB", "1.5GiB",
// "512MB" (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024; units
// are case-insensitive and may follow a space). Fractional byte counts round
// down. It is the parser of the size settings (FERRY_DEVICE_MEMORY).
func ParseMemorySize(s string) (int64, error) { return settings.ParseSize(s) }

// DeviceName names a device as "platform:id", e.g. "cpu:2".
func DeviceName(platform string, id int) string {
	if platform == "" {
		platform = "device"
	}
	return platform + ":" + strconv.Itoa(id)
}

// FormatBytes prints a byte count for humans in the binary unit that fits it,
// with three significant digits and no trailing zeros: "0 B", "512 B",
// "4.5 KiB", "48.1 MiB", "1.23 GiB", "1 TiB". Counts below 1 KiB are exact;
// larger ones are rounded (use the exact count beside it where it matters, as
// the out-of-memory report does). A negative count prints with a minus sign.
func FormatBytes(n int64) string {
	if n < 0 {
		if n == math.MinInt64 {
			return "-8 EiB"
		}
		return "-" + FormatBytes(-n)
	}
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	const units = "KMGTPE"
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	prec := 0
	switch {
	case v < 10:
		prec = 2
	case v < 100:
		prec = 1
	}
	s := strconv.FormatFloat(v, 'f', prec, 64)
	if s == "1024" && u < len(units)-1 { // 1023.5 KiB and up round to the next unit
		s, u = "1", u+1
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s + " " + units[u:u+1] + "iB"
}

// formatExact prints a byte count as FormatBytes does, followed by the exact
// count where FormatBytes rounds it: "512 B", "4.5 KiB (4608 bytes)".
func formatExact(n int64) string {
	if n > -1024 && n < 1024 {
		return FormatBytes(n)
	}
	return fmt.Sprintf("%s (%d bytes)", FormatBytes(n), n)
}

// formatLimit prints a capacity or limit, 0 meaning unlimited.
func formatLimit(n int64) string {
	if n == 0 {
		return "unlimited"
	}
	return formatExact(n)
}

// MemStats describes one memory pool: a backend's memory of one space on
// one device. Every backend reports its memory with it (Memory.MemoryStats);
// runtime.MemoryStats and runtime.DeviceMemoryStats return it.
type MemStats struct {
	// Platform is the backend whose memory this is ("cpu", "cuda").
	Platform string
	// Device is the index (Device.ID) of the device the pool belongs to.
	Device int
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
	// FreeBytes is the free memory inside the reserved memory, FreeBlocks
	// the number of its blocks.
	FreeBytes  int64
	FreeBlocks int
	// Fragmentation is 1 − LargestFreeBlock / FreeBytes, 0 when nothing
	// reserved is free (see the function Fragmentation).
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
	// Device is the index (Device.ID) of the device whose memory ran out.
	Device int
	// Devices is the number of devices of the platform: the report names
	// the device when there are several (0 counts as 1).
	Devices int
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
	of := ""
	if e.Devices > 1 || e.Device != 0 {
		of = " of " + DeviceName(e.Platform, e.Device)
	}
	fmt.Fprintf(&b, "out of memory in %s memory%s: cannot allocate %s%s\n", e.Space, of, formatExact(e.Requested), what)
	fmt.Fprintf(&b, "  allocator %s: capacity %s, limit %s, reserved %s, in use %s, largest free block %s",
		e.Allocator, formatLimit(e.Capacity), formatLimit(e.Limit), FormatBytes(e.Reserved), FormatBytes(e.InUse), FormatBytes(e.LargestFree))
	if e.Note != "" {
		fmt.Fprintf(&b, "\n  %s", e.Note)
	}
	if e.Fragmented {
		fmt.Fprintf(&b, "\n  fragmentation: %s is free in %d blocks, enough in total, but the largest free block is %s",
			formatExact(e.FreeBytes), e.FreeBlocks, formatExact(e.LargestFree))
		if e.FreeBytes > e.LargestFree && e.Limit > e.Reserved {
			fmt.Fprintf(&b, " and a new region may take only %s", FormatBytes(e.Limit-e.Reserved))
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
			fmt.Fprintf(&b, "\n    %10s  %s  made at %s", FormatBytes(l.Bytes), desc, l.Site)
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

// LiveArray describes one live buffer of a memory pool.
type LiveArray struct {
	// Platform is the backend holding the memory ("cpu", "cuda").
	Platform string
	// Device is the index (Device.ID) of the device holding it.
	Device int
	// Type is the array's dtype, shape and memory space (zero when IsArray is
	// false).
	Type ir.Type
	// IsArray is false for executor scratch memory (arenas, outputs not yet
	// returned as arrays); LiveArrays lists arrays only.
	IsArray bool
	// What says how the memory was made: "array" for arrays made from host
	// data, or the executor's description ("output 0 of fn", "temp arena").
	What string
	// Bytes is the buffer's size.
	Bytes int64
	// Space is the memory space it lives in.
	Space ir.MemorySpace
	// Site is the Go file:line that made it: the innermost caller outside
	// Ferry's library packages.
	Site string
	// Age is the time since it was allocated.
	Age time.Duration
}

// Describe names the buffer: its type, or what it is for.
func (l LiveArray) Describe() string {
	if l.IsArray {
		return l.Type.String()
	}
	return l.What
}

// String formats the entry as "4 KiB f32[1024] at x_test.go:12".
func (l LiveArray) String() string {
	return fmt.Sprintf("%s %s at %s", FormatBytes(l.Bytes), l.Describe(), l.Site)
}

// LiveArrayOf converts a backend's allocation into a LiveArray aged at now,
// finding its site from its stack when the backend recorded none.
func LiveArrayOf(a Allocation, now time.Time) LiveArray {
	l := LiveArray{Platform: a.Platform, Device: a.Device, Type: a.Type, IsArray: a.IsArray, What: a.What, Bytes: a.Bytes,
		Space: a.Space, Site: a.Site, Age: now.Sub(a.Born)}
	if l.Site == "" {
		l.Site = UserSite(a.PCs)
	}
	return l
}

// NewOutOfMemoryError is the out-of-memory report of a backend other than
// the CPU one: the request (requested bytes for what), the backend's
// statistics of the space (whose Device is the device that ran out), the
// largest of its live allocations on that device, and note
// (why, when the failure is not simply a full pool; "" otherwise).
func NewOutOfMemoryError(s MemStats, requested int64, what, note string, live []Allocation) *OutOfMemoryError {
	e := &OutOfMemoryError{Platform: s.Platform, Device: s.Device, Space: s.Space, Requested: requested, What: what, Allocator: s.Allocator,
		Capacity: s.Capacity, Limit: s.Limit, Reserved: s.Reserved, InUse: s.BytesInUse, LargestFree: s.LargestFreeBlock,
		FreeBytes: s.FreeBytes, FreeBlocks: s.FreeBlocks, LiveAllocs: s.LiveAllocs, Note: note}
	e.Fragmented = note == "" && s.FreeBytes >= requested && s.LargestFreeBlock < requested
	now := time.Now()
	var ls []LiveArray
	for _, a := range live {
		if a.Space == s.Space && a.Device == s.Device {
			ls = append(ls, LiveArrayOf(a, now))
		}
	}
	SortLive(ls)
	e.Largest = ls[:min(len(ls), MaxOOMBuffers)]
	return e
}

// SortLive sorts largest first, oldest first among equals.
func SortLive(out []LiveArray) {
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Age > out[j].Age
	})
}

// UserSite returns "dir/file.go:line" of the innermost frame outside Ferry's
// library packages (callers.UserLocation), or "?" for an empty stack.
func UserSite(pcs []uintptr) string {
	file, line := callers.UserLocation(pcs)
	if line == 0 {
		return file
	}
	return fmt.Sprintf("%s:%d", file, line)
}

// MaxOOMBuffers is the number of largest live buffers an OOM report lists.
const MaxOOMBuffers = 10
