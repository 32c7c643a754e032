package memview

import (
	"cmp"
	"slices"
	"time"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// MaxLiveShown is how many of a pool's largest live buffers the live page
// lists; the rest are summed.
const MaxLiveShown = 40

// Live is the data of the live memory page: one entry per pool.
type Live struct {
	Pools []Pool `json:"pools"`
}

// Pool is one memory space of one device of one backend.
type Pool struct {
	Platform         string  `json:"platform"`
	Device           int     `json:"device"`
	Space            string  `json:"space"`
	Allocator        string  `json:"allocator"`
	Capacity         int64   `json:"capacity"`
	Limit            int64   `json:"limit"`
	Reserved         int64   `json:"reserved"`
	BytesInUse       int64   `json:"bytes_in_use"`
	PeakBytesInUse   int64   `json:"peak_bytes_in_use"`
	LargestFreeBlock int64   `json:"largest_free_block"`
	FreeBytes        int64   `json:"free_bytes"`
	FreeBlocks       int     `json:"free_blocks"`
	Fragmentation    float64 `json:"fragmentation"`
	LiveAllocs       int64   `json:"live_allocs"`
	// Largest are the largest live buffers, largest first; OtherBytes and
	// OtherCount sum the rest.
	Largest    []LiveBuffer `json:"largest"`
	OtherBytes int64        `json:"other_bytes"`
	OtherCount int          `json:"other_count"`
	// Map is the reserved memory in address order, free blocks and held
	// ones, where the backend's allocator keeps one (backend.MemoryMap);
	// at most MaxMapBlocks blocks, MapTruncated saying when there were more.
	Map          []backend.Block `json:"map,omitempty"`
	MapTruncated bool            `json:"map_truncated,omitempty"`
}

// maxDevices bounds the devices LivePools asks a backend about.
const maxDevices = 1 << 12

// MaxMapBlocks bounds the blocks of a pool's map on the live page.
const MaxMapBlocks = 5000

// LiveBuffer is one live allocation.
type LiveBuffer struct {
	Bytes   int64   `json:"bytes"`
	Type    string  `json:"type"` // dtype and shape, or what scratch memory is for
	IsArray bool    `json:"is_array"`
	What    string  `json:"what"`
	Site    string  `json:"site"` // the user's Go file:line that made it
	AgeSecs float64 `json:"age_secs"`
}

// LivePools gathers, from every registered backend that reports its memory
// (backend.Memory: the same data as the pprof memory profile), the
// statistics of every pool that holds or reserves memory and its live
// allocations.
func LivePools() *Live {
	now := time.Now()
	type key struct {
		platform string
		dev      int
		space    ir.MemorySpace
	}
	allocs := map[key][]backend.Allocation{}
	for _, a := range backend.AllLiveAllocations() {
		k := key{a.Platform, a.Device, a.Space}
		allocs[k] = append(allocs[k], a)
	}
	out := &Live{Pools: []Pool{}}
	for _, b := range backend.All() {
		m, ok := b.(backend.Memory)
		if !ok {
			continue
		}
		for dev := 0; dev < maxDevices; dev++ {
			any := false
			for _, s := range ir.AllSpaces {
				st, ok := m.MemoryStats(dev, s)
				if !ok {
					continue
				}
				any = true
				list := allocs[key{st.Platform, dev, s}]
				if st.Reserved == 0 && st.BytesInUse == 0 && len(list) == 0 {
					continue
				}
				p := pool(st, list, now)
				if mm, ok := b.(backend.MemoryMap); ok {
					if blocks, ok := mm.MemoryMap(dev, s); ok {
						p.Map, p.MapTruncated = blocks, len(blocks) > MaxMapBlocks
						if p.MapTruncated {
							p.Map = p.Map[:MaxMapBlocks]
						}
					}
				}
				out.Pools = append(out.Pools, p)
			}
			if !any {
				break
			}
		}
	}
	return out
}

func pool(st backend.MemStats, list []backend.Allocation, now time.Time) Pool {
	p := Pool{Platform: st.Platform, Device: st.Device, Space: st.Space.String(), Allocator: st.Allocator, Capacity: st.Capacity,
		Limit: st.Limit, Reserved: st.Reserved, BytesInUse: st.BytesInUse, PeakBytesInUse: st.PeakBytesInUse,
		LargestFreeBlock: st.LargestFreeBlock, FreeBytes: st.FreeBytes, FreeBlocks: st.FreeBlocks, Fragmentation: st.Fragmentation,
		LiveAllocs: st.LiveAllocs, Largest: []LiveBuffer{}}
	slices.SortStableFunc(list, func(a, b backend.Allocation) int { return cmp.Compare(b.Bytes, a.Bytes) })
	for i, a := range list {
		if i >= MaxLiveShown {
			p.OtherBytes += a.Bytes
			p.OtherCount++
			continue
		}
		l := backend.LiveArrayOf(a, now)
		p.Largest = append(p.Largest, LiveBuffer{Bytes: l.Bytes, Type: l.Describe(), IsArray: l.IsArray, What: l.What, Site: l.Site,
			AgeSecs: l.Age.Seconds()})
	}
	return p
}
