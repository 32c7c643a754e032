package cpu

import (
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
)

// BenchmarkPoolAllocFree measures a pool's allocation and release of a
// recycled record with 64 other allocations live (the executor's path:
// AllocUninit through an execution's allocator, released once).
func BenchmarkPoolAllocFree(b *testing.B) {
	SetMemoryForTest(b, backend.MemoryConfig{})
	poison := poisonUninit
	poisonUninit = false // TestMain's poison would dominate the timing
	b.Cleanup(func() { poisonUninit = poison })
	var keep []func()
	for range 64 {
		_, rel, err := MemoryPools().Alloc(ir.Device, 256, "live")
		if err != nil {
			b.Fatal(err)
		}
		keep = append(keep, rel)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec, _, err := memPools.alloc(0, ir.Device, 256, "temp arena", false, true, 3)
		if err != nil {
			b.Fatal(err)
		}
		rec.release()
	}
	b.StopTimer()
	for _, rel := range keep {
		rel()
	}
}
