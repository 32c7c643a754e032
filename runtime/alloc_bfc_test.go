package runtime

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// layout lists the chunks of every region as (offset, size, free) triples.
func layout(a *bfcAllocator) [][3]int64 {
	var out [][3]int64
	for _, r := range a.regions {
		for c := r.first; c != nil; c = c.next {
			f := int64(0)
			if c.free {
				f = 1
			}
			out = append(out, [3]int64{c.off, c.size, f})
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

// checkInvariants verifies that chunks tile their regions, that no two free
// chunks are neighbours, and that the free set holds exactly the free chunks.
func checkInvariants(t *testing.T, a *bfcAllocator) {
	t.Helper()
	nfree, freeBytes, reserved := 0, int64(0), int64(0)
	for _, r := range a.regions {
		reserved += int64(len(r.mem))
		off := int64(0)
		var prev *bfcChunk
		for c := r.first; c != nil; c = c.next {
			require.Equal(t, off, c.off)
			require.Equal(t, prev, c.prev)
			require.Zero(t, c.off%allocAlign)
			require.Zero(t, c.size%allocAlign)
			if c.free {
				nfree++
				freeBytes += c.size
				require.False(t, prev != nil && prev.free, "free neighbours not coalesced")
			}
			off += c.size
			prev = c
		}
		require.Equal(t, int64(len(r.mem)), off)
	}
	require.Equal(t, nfree, len(a.freeSet))
	require.Equal(t, freeBytes, a.freeBytes)
	require.Equal(t, reserved, a.reserved)
	for i := 1; i < len(a.freeSet); i++ {
		require.True(t, chunkLess(a.freeSet[i-1], a.freeSet[i]))
	}
}

func fragmentation(a *bfcAllocator) (int64, int64, float64) {
	largest, total := a.freeStats()
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
	require.Len(t, c1.bytes(100), 100)
	require.Equal(t, 100, cap(c1.bytes(100)))
	_, _ = c2, c3
	l, tot, f := fragmentation(a)
	require.Equal(t, int64(576), l)
	require.Equal(t, int64(576), tot)
	require.Zero(t, f)
	require.Equal(t, int64(1024), a.reserved)
	checkInvariants(t, a)
}

func TestBFCBestFitAndFragmentation(t *testing.T) {
	a := newBFC(1024, true, defaultRegionBytes)
	c1 := mustAlloc(t, a, 128)
	c2 := mustAlloc(t, a, 64)
	c3 := mustAlloc(t, a, 256)
	a.free(c2) // a 64-byte hole between c1 and c3
	require.Equal(t, [][3]int64{{0, 128, 0}, {128, 64, 1}, {192, 256, 0}, {448, 576, 1}}, layout(a))
	l, tot, f := fragmentation(a)
	require.Equal(t, int64(576), l)
	require.Equal(t, int64(640), tot)
	require.InDelta(t, 0.1, f, 1e-12) // 1 - 576/640
	// Best fit takes the 64-byte hole, not the large block.
	c4 := mustAlloc(t, a, 10)
	require.Equal(t, int64(128), c4.off)
	// Freeing c1 and c4 coalesces them into one 192-byte block at 0.
	a.free(c1)
	a.free(c4)
	require.Equal(t, [][3]int64{{0, 192, 1}, {192, 256, 0}, {448, 576, 1}}, layout(a))
	l, tot, f = fragmentation(a)
	require.Equal(t, int64(576), l)
	require.Equal(t, int64(768), tot)
	require.InDelta(t, 0.25, f, 1e-12)
	// Freeing c3 coalesces with both neighbours: the slab is one block again.
	a.free(c3)
	require.Equal(t, [][3]int64{{0, 1024, 1}}, layout(a))
	l, tot, f = fragmentation(a)
	require.Equal(t, int64(1024), l)
	require.Equal(t, int64(1024), tot)
	require.Zero(t, f)
	checkInvariants(t, a)
}

func TestBFCBestFitAmongHoles(t *testing.T) {
	a := newBFC(4096, true, defaultRegionBytes)
	// Blocks: 256 | 64 | 128 | 64 | 192 | 64 | 128 | rest.
	sizes := []int64{256, 64, 128, 64, 192, 64, 128}
	cs := make([]*bfcChunk, len(sizes))
	for i, s := range sizes {
		cs[i] = mustAlloc(t, a, s)
	}
	a.free(cs[0]) // hole 256 at 0
	a.free(cs[2]) // hole 128 at 320
	a.free(cs[4]) // hole 192 at 512
	a.free(cs[6]) // hole 128 at 768, merged with the rest
	checkInvariants(t, a)
	require.Equal(t, int64(512), mustAlloc(t, a, 150).off) // 192: exact fit
	require.Equal(t, int64(320), mustAlloc(t, a, 100).off) // 128 at 320
	require.Equal(t, int64(0), mustAlloc(t, a, 65).off)    // 128 from the 256 hole
	require.Equal(t, int64(128), mustAlloc(t, a, 128).off) // the rest of it: smallest fit
	// Equal sizes: the lowest address wins.
	b := newBFC(1024, true, defaultRegionBytes)
	x := []*bfcChunk{mustAlloc(t, b, 64), mustAlloc(t, b, 64), mustAlloc(t, b, 64), mustAlloc(t, b, 64)}
	b.free(x[2])
	b.free(x[0])
	require.Equal(t, int64(0), mustAlloc(t, b, 64).off)
	require.Equal(t, int64(128), mustAlloc(t, b, 64).off)
	checkInvariants(t, b)
}

func TestBFCFragmentedOOM(t *testing.T) {
	a := newBFC(512, true, defaultRegionBytes)
	var cs []*bfcChunk
	for i := 0; i < 8; i++ {
		cs = append(cs, mustAlloc(t, a, 64))
	}
	for i := 0; i < 8; i += 2 {
		a.free(cs[i])
	}
	// 256 bytes are free, but in four 64-byte holes.
	l, tot, f := fragmentation(a)
	require.Equal(t, int64(64), l)
	require.Equal(t, int64(256), tot)
	require.InDelta(t, 0.75, f, 1e-12)
	c, note := a.alloc(128, true, true)
	require.Nil(t, c)
	require.Empty(t, note)
	a.free(cs[1]) // joins holes 0, 1, 2
	require.Equal(t, int64(0), mustAlloc(t, a, 192).off)
	checkInvariants(t, a)
}

func TestBFCZeroesReusedMemory(t *testing.T) {
	a := newBFC(1024, true, defaultRegionBytes)
	c := mustAlloc(t, a, 256)
	for i := range c.bytes(256) {
		c.bytes(256)[i] = 0xff
	}
	a.free(c)
	c2, _ := a.alloc(200, false, true) // uninitialised: old bytes stay
	require.Equal(t, byte(0xff), c2.bytes(200)[0])
	a.free(c2)
	c3 := mustAlloc(t, a, 256)
	require.Equal(t, make([]byte, 256), c3.bytes(256))
}

func TestBFCGrowth(t *testing.T) {
	a := newBFC(16<<10, false, 4<<10)
	c1 := mustAlloc(t, a, 1000)
	require.Equal(t, int64(4<<10), a.reserved)
	c2 := mustAlloc(t, a, 8000) // does not fit the 3072 left: a new region of max(8000, 8 KiB)
	require.Equal(t, int64(12<<10), a.reserved)
	require.Len(t, a.regions, 2)
	require.Equal(t, int64(1), c2.region.id)
	// 8000 bytes fit no free chunk and only 4 KiB of the limit is left.
	c, note := a.alloc(8000, true, true)
	require.Nil(t, c)
	require.Empty(t, note)
	// A request that fits the remaining limit gets a region capped to it.
	c3 := mustAlloc(t, a, 4096)
	require.Equal(t, int64(16<<10), a.reserved)
	require.Equal(t, int64(2), c3.region.id)
	checkInvariants(t, a)
	// Empty regions can be given back, then the space is reused.
	a.free(c2)
	a.free(c3)
	a.freeEmptyRegions()
	require.Equal(t, int64(4<<10), a.reserved)
	require.Len(t, a.regions, 1)
	c4 := mustAlloc(t, a, 12000)
	require.Equal(t, int64(16<<10), a.reserved)
	a.free(c1)
	a.free(c4)
	checkInvariants(t, a)
}

func TestBFCUnlimitedGrowth(t *testing.T) {
	a := newBFC(0, true, 1<<10) // unlimited: pre-allocation does not apply
	mustAlloc(t, a, 10)
	require.Equal(t, int64(1<<10), a.reserved)
	mustAlloc(t, a, 5000) // max(5056, 2 KiB)
	require.Equal(t, int64(1<<10+5056), a.reserved)
	mustAlloc(t, a, 100) // fits in the first region
	require.Len(t, a.regions, 2)
	checkInvariants(t, a)
}

func TestBFCRandomized(t *testing.T) {
	seed := rand.Uint64()
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
				for _, b := range l.c.bytes(l.n) {
					if b != l.fill {
						t.Fatalf("chunk at %d+%d overwritten", l.c.off, l.n)
					}
				}
				inUse -= l.c.size
				a.free(l.c)
				lives = append(lives[:i], lives[i+1:]...)
			} else {
				n := int64(1 + r.IntN(8<<10))
				c, note := a.alloc(n, true, true)
				require.Empty(t, note)
				if c == nil {
					largest, _ := a.freeStats()
					require.Less(t, largest, roundUp(n))
					continue
				}
				mem := c.bytes(n)
				require.Zero(t, addrOf(mem)%allocAlign)
				fill := byte(1 + r.IntN(255))
				for i := range mem {
					if mem[i] != 0 {
						t.Fatalf("allocated memory not zeroed at %d", i)
					}
					mem[i] = fill
				}
				inUse += c.size
				lives = append(lives, live{c, n, fill})
			}
			if step%100 == 0 {
				checkInvariants(t, a)
				require.Equal(t, a.reserved-a.freeBytes, inUse)
			}
		}
		for _, l := range lives {
			a.free(l.c)
		}
		checkInvariants(t, a)
		require.Equal(t, a.reserved, a.freeBytes)
	}
}
