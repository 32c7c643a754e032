package cpu

import (
	"time"

	"github.com/ferryml/ferry/backend"
)

// LiveArrays lists the live arrays of every memory pool of every device, largest first
// (oldest first among equals); runtime.LiveArrays adds those of the other
// backends.
func LiveArrays() []backend.LiveArray { return memPools.liveArrays() }

func (ps *Pools) liveArrays() []backend.LiveArray {
	var out []backend.LiveArray
	for _, p := range ps.set().all {
		p.mu.Lock()
		out = append(out, p.largestLocked(-1, true)...)
		p.mu.Unlock()
	}
	backend.SortLive(out)
	return out
}

func (r *allocRecord) liveArrayLocked(now time.Time) backend.LiveArray {
	l := backend.LiveArray{Platform: "cpu", Device: r.pool.device, IsArray: r.isArray, What: r.name(), Bytes: r.size, Space: r.pool.space, Site: r.callSiteLocked(), Age: now.Sub(r.bornTime())}
	if r.isArray {
		l.Type = r.typ.Clone() // a copy: r.typ's shape may be shared
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
