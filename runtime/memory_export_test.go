package runtime

import (
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/cpu"
	"github.com/ferryml/ferry/ir"
)

// SetMemoryForTest replaces the global pools with fresh ones for cfg
// (cpu.SetMemoryForTest).
func SetMemoryForTest(t testing.TB, cfg MemoryConfig) {
	t.Helper()
	cpu.SetMemoryForTest(t, cfg)
}

// ResetMemoryForTest puts the global pools back in their default state
// (cpu.ResetMemoryForTest).
func ResetMemoryForTest() { cpu.ResetMemoryForTest() }

// NewBufferForTest copies l into pool memory as the CPU backend's buffer.
func NewBufferForTest(l *ir.Literal) (any, error) { return backend.Lookup("cpu").FromLiteral(l) }
