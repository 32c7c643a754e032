// Package callers records call stacks cheaply. runtime.Callers walks the
// stack with the general unwinder, which costs several microseconds for a
// typical depth; Ferry records a stack for every allocation and every deleted
// array, so on amd64 this package walks the frame-pointer chain instead (a few
// nanoseconds) and uses it as the key of a small cache of runtime.Callers
// results: the logical stack (with inlined frames expanded) is a function of
// the physical return addresses, so it is computed once per distinct stack.
package callers

import (
	"runtime"
	"slices"
	"sync/atomic"
	"unsafe"
)

// MaxDepth is the most program counters a Stack holds.
const MaxDepth = 64

// Stack is a recorded call stack. It is shared between the calls that record
// the same stack and must not be modified.
type Stack struct {
	// PCs are the program counters as runtime.Callers returns them.
	PCs []uintptr

	skip int
	phys []uintptr // the frame-pointer key (nil where unavailable)
	loc  atomic.Pointer[location]
}

type location struct {
	file string
	line int
}

// Location returns f(s.PCs), computing it once per Stack: callers use it for a
// symbolised location (a file and line), which is the same for every call with
// this stack. f must be a pure function of the PCs. A nil Stack gives ("?", 0).
func (s *Stack) Location(f func(pcs []uintptr) (string, int)) (string, int) {
	if s == nil {
		return "?", 0
	}
	if l := s.loc.Load(); l != nil {
		return l.file, l.line
	}
	file, line := f(s.PCs)
	s.loc.Store(&location{file, line})
	return file, line
}

// Record returns the calling goroutine's stack as runtime.Callers(skip, ...)
// would return it in Record's caller: skip 1 starts at the caller of Record, 2
// at its caller. At most MaxDepth PCs are kept.
//
//go:noinline
func Record(skip int) *Stack {
	if skip < 0 {
		skip = 0
	}
	var phys [MaxDepth + 8]uintptr
	lim := min(MaxDepth+skip+1, len(phys))
	n := 0
	// Walk the frame-pointer chain from Record's own frame: each frame holds
	// the caller's frame pointer, with the return address above it. No calls
	// happen during the walk, so the stack cannot move under it.
	for fp := callerFP(); n < lim && fp != nil; n++ {
		phys[n] = *(*uintptr)(unsafe.Pointer(uintptr(fp) + 8))
		fp = *(*unsafe.Pointer)(fp)
	}
	if n == 0 {
		return slow(skip, nil) // no frame pointers on this architecture
	}
	h := uint64(skip) + 0x9e3779b97f4a7c15
	for _, pc := range phys[:n] {
		h ^= uint64(pc)
		h *= 0x100000001b3
		h ^= h >> 29
	}
	slot := &cache[h&(cacheSize-1)]
	if s := slot.Load(); s != nil && s.skip == skip && slices.Equal(s.phys, phys[:n]) {
		return s
	}
	s := slow(skip, append([]uintptr(nil), phys[:n]...))
	slot.Store(s)
	return s
}

// slow records the stack with runtime.Callers; skip is relative to Record's caller.
func slow(skip int, phys []uintptr) *Stack {
	var buf [MaxDepth]uintptr
	// 0 is runtime.Callers, 1 slow, 2 Record, 3 Record's caller.
	n := runtime.Callers(skip+2, buf[:])
	return &Stack{PCs: append([]uintptr(nil), buf[:n]...), skip: skip, phys: phys}
}

const cacheSize = 4096

// cache is a direct-mapped table of recorded stacks, indexed by a hash of the
// physical return addresses; a collision replaces the older entry.
var cache [cacheSize]atomic.Pointer[Stack]
