package runtime

import (
	"fmt"
	"sort"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// LiveArray describes one live buffer of a memory pool.
type LiveArray struct {
	// Platform is the backend holding the memory ("cpu", "cuda").
	Platform string
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

// describe names the buffer: its type, or what it is for.
func (l LiveArray) describe() string {
	if l.IsArray {
		return l.Type.String()
	}
	return l.What
}

// String formats the entry as "4.00 KiB f32[1024] at x_test.go:12".
func (l LiveArray) String() string {
	return fmt.Sprintf("%s %s at %s", formatBytes(l.Bytes), l.describe(), l.Site)
}

// LiveArrays lists the live arrays of every memory pool and of every
// registered backend that reports its memory (cuda), largest first (oldest
// first among equals), like jax.live_arrays. Arrays that are unreachable but
// not yet collected are still listed; zero-size arrays hold no memory and are
// not.
func LiveArrays() []LiveArray { return memPools.liveArrays() }

func (ps *Pools) liveArrays() []LiveArray {
	var out []LiveArray
	for _, p := range ps.set().spaces {
		p.mu.Lock()
		out = append(out, p.largestLocked(-1, true)...)
		p.mu.Unlock()
	}
	now := time.Now()
	for _, m := range otherMemories() {
		for _, a := range m.LiveAllocations() {
			if a.IsArray && a.Bytes > 0 {
				out = append(out, liveArrayOf(a, now))
			}
		}
	}
	sortLive(out)
	return out
}

// sortLive sorts largest first, oldest first among equals.
func sortLive(out []LiveArray) {
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Age > out[j].Age
	})
}

func (r *allocRecord) liveArrayLocked(now time.Time) LiveArray {
	l := LiveArray{Platform: "cpu", IsArray: r.isArray, What: r.name(), Bytes: r.size, Space: r.pool.space, Site: r.callSiteLocked(), Age: now.Sub(r.bornTime())}
	if r.isArray {
		l.Type = r.typ.WithShape(r.typ.Shape) // a copy: r.typ's shape may be shared
	}
	return l
}

// callSiteLocked returns the record's call site, computing it from the
// recorded stack the first time.
func (r *allocRecord) callSiteLocked() string {
	if r.site == "" {
		r.site = userSite(r.pcs())
	}
	return r.site
}

// userSite returns "dir/file.go:line" of the innermost frame outside Ferry's
// library packages (trace.UserLocation), or "?" for an empty stack.
func userSite(pcs []uintptr) string {
	file, line := trace.UserLocation(pcs)
	if line == 0 {
		return file
	}
	return fmt.Sprintf("%s:%d", file, line)
}
