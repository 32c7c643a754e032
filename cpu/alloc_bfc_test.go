package cpu

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// layout lists the chunks of every region as (offset, size, free) triples.
func layout(a *bfcAllocator) [][3]int64 {
	var out [][3]int64
	for _, r := range a.a.Regions() {
		for c := r.First(); c != nil; c = c.Next() {
			f := int64(0)
			if c.IsFree() {
				f = 1
			}
			out = append(out, [3]int64{c.Off, c.Size, f})
		}
	}
	return out
}

func mustAlloc(t *testing.T, a *bfcAllocator, n int64) *bfcChunk {
	t.Helper()
	c, note := a.alloc(n, true, true)
	require.Empty(t, note)
	require.NotNil(t, c, "alloc %d", n)
	return c
}

// checkInvariants verifies that chunks tile their regions, which are as long
// as their memory, and that the free figures match the free chunks
// (internal/bfc tests the allocator's own invariants).
func checkInvariants(t *testing.T, a *bfcAllocator) {
	t.Helper()
	nfree, freeBytes, reserved := 0, int64(0), int64(0)
	for _, r := range a.a.Regions() {
		require.Equal(t, int64(len(r.Data.mem)), r.Size)
		reserved += r.Size
		off := int64(0)
		for c := r.First(); c != nil; c = c.Next() {
			require.Equal(t, off, c.Off)
			require.Zero(t, c.Off%allocAlign)
			require.Zero(t, c.Size%allocAlign)
			if c.IsFree() {
				nfree++
				freeBytes += c.Size
			}
			off += c.Size
		}
		require.Equal(t, r.Size, off)
	}
	_, total, count := a.freeStats()
	require.Equal(t, nfree, count)
	require.Equal(t, freeBytes, total)
	require.Equal(t, reserved, a.reserved())
}

func fragmentation(a *bfcAllocator) (int64, int64, float64) {
	largest, total, _ := a.freeStats()
	if total == 0 {
		return largest, total, 0
	}
	return largest, total, 1 - float64(largest)/float64(total)
}

func TestBFCSplitAndRound(t *testing.T) {
	a := newBFC(1024, true, defaultRegionBytes)
	c1 := mustAlloc(t, a, 100) // rounded to 128
	c2 := mustAlloc(t, a, 64)
	c3 := mustAlloc(t, a, 200) // rounded to 256
	require.Equal(t, [][3]int64{{0, 128, 0}, {128, 64, 0}, {192, 256, 0}, {448, 576, 1}}, layout(a))
	require.Len(t, chunkBytes(c1, 100), 100)
	require.Equal(t, 100, cap(chunkBytes(c1, 100)))
	_, _ = c2, c3
	l, tot, f := fragmentation(a)
	require.Equal(t, int64(576), l)
	require.Equal(t, int64(576), tot)
	require.Zero(t, f)
	require.Equal(t, int64(1024), a.reserved())
	checkInvariants(t, a)
}

func TestBFCZeroesReusedMemory(t *testing.T) {
	a := newBFC(1024, true, defaultRegionBytes)
	c := mustAlloc(t, a, 256)
	for i := range chunkBytes(c, 256) {
		chunkBytes(c, 256)[i] = 0xff
	}
	a.free(c)
	c2, _ := a.alloc(200, false, true) // uninitialised: old bytes stay
	require.Equal(t, byte(0xff), chunkBytes(c2, 200)[0])
	a.free(c2)
	c3 := mustAlloc(t, a, 256)
	require.Equal(t, make([]byte, 256), chunkBytes(c3, 256))
}

func TestBFCGrowth(t *testing.T) {
	a := newBFC(16<<10, false, 4<<10)
	c1 := mustAlloc(t, a, 1000)
	require.Equal(t, int64(4<<10), a.reserved())
	c2 := mustAlloc(t, a, 8000) // does not fit the 3072 left: a new region of max(8000, 8 KiB)
	require.Equal(t, int64(12<<10), a.reserved())
	require.Len(t, a.a.Regions(), 2)
	require.Equal(t, int64(1), c2.Region.ID)
	// 8000 bytes fit no free chunk and only 4 KiB of the limit is left.
	c, note := a.alloc(8000, true, true)
	require.Nil(t, c)
	require.Empty(t, note)
	// A request that fits the remaining limit gets a region capped to it.
	c3 := mustAlloc(t, a, 4096)
	require.Equal(t, int64(16<<10), a.reserved())
	require.Equal(t, int64(2), c3.Region.ID)
	checkInvariants(t, a)
	// Empty regions can be given back, then the space is reused.
	a.free(c2)
	a.free(c3)
	a.freeEmptyRegions()
	require.Equal(t, int64(4<<10), a.reserved())
	require.Len(t, a.a.Regions(), 1)
	c4 := mustAlloc(t, a, 12000)
	require.Equal(t, int64(16<<10), a.reserved())
	a.free(c1)
	a.free(c4)
	checkInvariants(t, a)
}

func TestBFCUnlimitedGrowth(t *testing.T) {
	a := newBFC(0, true, 1<<10) // unlimited: pre-allocation does not apply
	mustAlloc(t, a, 10)
	require.Equal(t, int64(1<<10), a.reserved())
	mustAlloc(t, a, 5000) // max(5056, 2 KiB)
	require.Equal(t, int64(1<<10+5056), a.reserved())
	mustAlloc(t, a, 100) // fits in the first region
	require.Len(t, a.a.Regions(), 2)
	checkInvariants(t, a)
}

func TestBFCRandomized(t *testing.T) {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for _, grow := range []bool{false, true} {
		a := newBFC(256<<10, !grow, 8<<10)
		type live struct {
			c    *bfcChunk
			n    int64
			fill byte
		}
		var lives []live
		var inUse int64
		for step := 0; step < 3000; step++ {
			if len(lives) > 0 && r.IntN(2) == 0 {
				i := r.IntN(len(lives))
				l := lives[i]
				for _, b := range chunkBytes(l.c, l.n) {
					if b != l.fill {
						t.Fatalf("chunk at %d+%d overwritten", l.c.Off, l.n)
					}
				}
				inUse -= l.c.Size
				a.free(l.c)
				lives = append(lives[:i], lives[i+1:]...)
			} else {
				n := int64(1 + r.IntN(8<<10))
				c, note := a.alloc(n, true, true)
				require.Empty(t, note)
				if c == nil {
					largest, _, _ := a.freeStats()
					require.Less(t, largest, roundUp(n))
					continue
				}
				mem := chunkBytes(c, n)
				require.Zero(t, addrOf(mem)%allocAlign)
				fill := byte(1 + r.IntN(255))
				for i := range mem {
					if mem[i] != 0 {
						t.Fatalf("allocated memory not zeroed at %d", i)
					}
					mem[i] = fill
				}
				inUse += c.Size
				lives = append(lives, live{c, n, fill})
			}
			if step%100 == 0 {
				checkInvariants(t, a)
				require.Equal(t, a.reserved()-freeTotal(a), inUse)
			}
		}
		for _, l := range lives {
			a.free(l.c)
		}
		checkInvariants(t, a)
		require.Equal(t, a.reserved(), freeTotal(a))
	}
}

func freeTotal(a *bfcAllocator) int64 {
	_, total, _ := a.freeStats()
	return total
}
