package runtime_test

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
)

// TestOutOfMemorySaysFragmentation fragments a small pre-allocated bfc pool on
// purpose (every other block freed) and asks for more than any free block but
// less than the free total: the report says fragmentation, with the numbers.
func TestOutOfMemorySaysFragmentation(t *testing.T) {
	r := testseed.Rand(t, 3)
	blocks := 6 + r.IntN(6)                  // 6..11 blocks
	block := int64(64 * (64 + r.IntN(1024))) // 4 KiB .. 68 KiB, a multiple of 64
	rt.SetMemoryForTest(t, exact(int64(blocks)*block))
	pools := rt.MemoryPools()
	rels := make([]func(), blocks)
	for i := range rels {
		_, rel, err := pools.Alloc(ir.Device, block, "block")
		require.NoError(t, err)
		rels[i] = rel
	}
	freed := 0
	for i := 0; i < blocks; i += 2 { // free blocks 0, 2, 4, ...: none adjacent
		rels[i]()
		freed++
	}
	free := int64(freed) * block
	want := 2 * block // fits the free total, not one free block
	_, _, err := pools.Alloc(ir.Device, want, "output 0 of f")
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.True(t, oom.Fragmented, "free %d in %d blocks of %d, asked %d", free, freed, block, want)
	require.Equal(t, free, oom.FreeBytes)
	require.Equal(t, freed, oom.FreeBlocks)
	require.Equal(t, block, oom.LargestFree)
	msg := err.Error()
	t.Log(msg)
	require.Contains(t, msg, "fragmentation: ")
	require.Contains(t, msg, fmtBytes(free))
	require.Contains(t, msg, fmtBytes(block))

	// More than the free total is plain out of memory, not fragmentation.
	_, _, err = pools.Alloc(ir.Device, free+64, "too big")
	require.ErrorAs(t, err, &oom)
	require.False(t, oom.Fragmented)
	require.NotContains(t, err.Error(), "fragmentation:") // the test file name says fragmentation too
	for i := 1; i < blocks; i += 2 {
		rels[i]()
	}
	// Everything free and coalesced: the request fits.
	_, rel, err := pools.Alloc(ir.Device, want, "output 0 of f")
	require.NoError(t, err)
	rel()
}

// TestOutOfMemoryFragmentationGrowth: a growing bfc pool counts the room it may
// still reserve as free, but a request must fit one region.
func TestOutOfMemoryFragmentationGrowth(t *testing.T) {
	f := false
	rt.SetMemoryForTest(t, rt.MemoryConfig{Capacity: 8 << 20, Fraction: 1, Preallocate: &f})
	pools := rt.MemoryPools()
	_, rel1, err := pools.Alloc(ir.Device, 1024, "a") // region 1: 2 MiB
	require.NoError(t, err)
	_, rel2, err := pools.Alloc(ir.Device, 3<<20, "b") // region 2: 4 MiB; 2 MiB left to reserve
	require.NoError(t, err)
	_, _, err = pools.Alloc(ir.Device, 5<<19, "c") // 2.5 MiB
	var oom *rt.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.True(t, oom.Fragmented)
	require.Equal(t, int64(8<<20-1024-3<<20), oom.FreeBytes)
	require.Contains(t, err.Error(), "fragmentation: ")
	rel2()
	rel1()
}

// fmtBytes is the report's byte format, written independently: plain bytes
// below 1 KiB, else three significant digits (%.3g, whole units from 1000
// on) in the largest binary unit reached.
func fmtBytes(n int64) string {
	if n < 1<<10 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < 1<<10 {
			break
		}
		v, unit = v/(1<<10), u
	}
	if v >= 1000 {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}
