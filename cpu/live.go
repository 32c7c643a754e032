package cpu

import "github.com/ferryml/ferry/backend"

// LiveArrays lists the live arrays of every memory pool of every device, largest first
// (oldest first among equals); runtime.LiveArrays adds those of the other
// backends.
func LiveArrays() []backend.LiveArray { return memPools.liveArrays() }

func (ps *Pools) liveArrays() []backend.LiveArray {
	var out []backend.LiveArray
	for _, p := range ps.set().all {
		p.mu.Lock()
		out = append(out, p.l.Largest(-1, true)...)
		p.mu.Unlock()
	}
	backend.SortLive(out)
	return out
}
