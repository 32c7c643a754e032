package runtime_test

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
)

// The CPU backend reports its pools through backend.Memory like any other
// backend: its statistics are rt.MemoryStats's, its live allocations are
// the arrays made here (with this file as their site) and the executor's
// scratch memory, and ResetPeak resets the pools' peaks.
func TestCPUBackendReportsMemory(t *testing.T) {
	rt.SetMemoryForTest(t, rt.MemoryConfig{})
	m, ok := backend.Lookup("cpu").(backend.Memory)
	require.True(t, ok, "the CPU backend does not implement backend.Memory")
	rng := testseed.Rand(t, 4)
	var want int64
	var sites []string
	for range 4 {
		n := 1 + rng.IntN(3000)
		x, site := rt.FromSlice(make([]float32, n)), here()
		defer x.Delete()
		want += (int64(4*n) + 63) / 64 * 64
		sites = append(sites, site)
	}
	_, rel, err := rt.MemoryPools().Alloc(ir.Device, 1000, "temp arena")
	require.NoError(t, err)
	want += 1024
	s, ok := m.MemoryStats(0, ir.Device)
	require.True(t, ok)
	require.Equal(t, "cpu", s.Platform)
	require.Equal(t, want, s.BytesInUse)
	require.Equal(t, int64(5), s.LiveAllocs)
	rs := rt.MemoryStats(ir.Device)
	require.Equal(t, s.BytesInUse, rs.BytesInUse)
	require.Equal(t, s.Reserved, rs.Reserved)
	require.Equal(t, s.LargestFreeBlock, rs.LargestFreeBlock)
	require.Equal(t, s.FreeBytes, rs.FreeBytes)
	frag := 0.0 // the part of the free memory outside the largest free block
	if s.FreeBytes > 0 {
		frag = float64(s.FreeBytes-s.LargestFreeBlock) / float64(s.FreeBytes)
	}
	require.InDelta(t, frag, rs.Fragmentation, 1e-12)
	live := m.LiveAllocations()
	require.Len(t, live, 5)
	var arrays int
	for _, a := range live {
		require.Equal(t, "cpu", a.Platform)
		if a.IsArray {
			arrays++
			require.Contains(t, sites, a.Site)
			require.Equal(t, a.Type.Bytes(), a.Bytes)
		} else {
			require.Equal(t, "temp arena", a.What)
		}
	}
	require.Equal(t, 4, arrays)
	rel()
	require.Equal(t, want, rt.MemoryStats(ir.Device).PeakBytesInUse)
	m.ResetPeak()
	require.Equal(t, want-1024, rt.MemoryStats(ir.Device).PeakBytesInUse)
}
