package cpu

import (
	"time"

	"github.com/ferryml/ferry/backend"
)

// LiveArrays lists the live arrays of every memory pool and of every
// registered backend that reports its memory (cuda), largest first (oldest
// first among equals), like jax.live_arrays. Arrays that are unreachable but
// not yet collected are still listed; zero-size arrays hold no memory and are
// not.
func LiveArrays() []backend.LiveArray { return memPools.liveArrays() }

func (ps *Pools) liveArrays() []backend.LiveArray {
	var out []backend.LiveArray
	for _, p := range ps.set().spaces {
		p.mu.Lock()
		out = append(out, p.largestLocked(-1, true)...)
		p.mu.Unlock()
	}
	now := time.Now()
	for _, m := range otherMemories() {
		for _, a := range m.LiveAllocations() {
			if a.IsArray && a.Bytes > 0 {
				out = append(out, backend.LiveArrayOf(a, now))
			}
		}
	}
	backend.SortLive(out)
	return out
}

func (r *allocRecord) liveArrayLocked(now time.Time) backend.LiveArray {
	l := backend.LiveArray{Platform: "cpu", IsArray: r.isArray, What: r.name(), Bytes: r.size, Space: r.pool.space, Site: r.callSiteLocked(), Age: now.Sub(r.bornTime())}
	if r.isArray {
		l.Type = r.typ.WithShape(r.typ.Shape) // a copy: r.typ's shape may be shared
	}
	return l
}

// callSiteLocked returns the record's call site, computing it from the
// recorded stack the first time.
func (r *allocRecord) callSiteLocked() string {
	if r.site == "" {
		r.site = backend.UserSite(r.pcs())
	}
	return r.site
}
