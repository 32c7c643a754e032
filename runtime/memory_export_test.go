package runtime

import (
	"testing"

	"github.com/ferryml/ferry/ir"
)

// SetMemoryForTest replaces the global pools with fresh ones for cfg (even if
// buffers of earlier tests are still live: they free into the replaced pools)
// and restores the default, environment-configured pools when t ends.
func SetMemoryForTest(t testing.TB, cfg MemoryConfig) {
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
// environment's settings, read at next use.
func ResetMemoryForTest() { _ = memPools.configure(nil, true) }

// NewBufferForTest copies l into pool memory as the CPU backend's buffer.
func NewBufferForTest(l *ir.Literal) (any, error) { return newBuffer(l) }
