package cpu

import (
	"testing"

	"github.com/ferryml/ferry/backend"
)

// SetMemoryForTest replaces the global pools with fresh ones for cfg (even if
// buffers of earlier tests are still live: they free into the replaced pools)
// and restores the default, environment-configured pools when t ends. It is
// for tests only: unlike ConfigureMemory it does not wait for live buffers.
func SetMemoryForTest(t testing.TB, cfg backend.MemoryConfig) {
	t.Helper()
	n, err := cfg.Normalized()
	if err != nil {
		t.Fatal(err)
	}
	if err := memPools.configure(&n, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ResetMemoryForTest)
}

// ResetMemoryForTest puts the global pools back in their default state: the
// environment's settings, read at next use. It is for tests only.
func ResetMemoryForTest() { _ = memPools.configure(nil, true) }

// PoisonUninitForTest makes AllocUninit fill memory with 0xff bytes, as
// FERRY_POISON_UNINIT=1 does, so that a kernel reading memory it did not
// write shows up in a test's results. Call it before the tests run
// (TestMain).
func PoisonUninitForTest() { poisonUninit = true }
