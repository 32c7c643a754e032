package cpu

import (
	"errors"
	"github.com/ferryml/ferry/backend"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/ir"
)

// A slab or buffer larger than the machine's memory is an error, not a crash
// of the Go runtime.
func TestLargerThanTheMachine(t *testing.T) {
	sys := systemMemory()
	if sys == 0 {
		t.Skip("machine memory unknown")
	}
	huge := sys * 4
	for _, cfg := range []backend.MemoryConfig{{Capacity: huge}, {Capacity: huge, Allocator: backend.AllocatorPlatform}, {}} {
		SetMemoryForTest(t, cfg)
		_, _, err := MemoryPools().Alloc(ir.Device, huge/2, "huge")
		var oom *backend.OutOfMemoryError
		require.True(t, errors.As(err, &oom), "%+v: %v", cfg, err)
		require.Contains(t, oom.Note, "the machine has only")
		require.Contains(t, err.Error(), "the machine has only")
		// The pool still works.
		_, rel, err := MemoryPools().Alloc(ir.Device, 1000, "small")
		if cfg.Capacity > 0 && cfg.Allocator == "" {
			// The pre-allocated slab itself cannot be reserved.
			require.Error(t, err)
			continue
		}
		require.NoError(t, err)
		rel()
	}
}

func TestAlignedBytes(t *testing.T) {
	for n := int64(1); n < 5000; n += 37 {
		b := alignedBytes(n)
		require.Len(t, b, int(n))
		require.Equal(t, int(n), cap(b))
		require.Zero(t, addrOf(b)%allocAlign)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 3 << 29: "1.5 GiB", 5 << 40: "5 TiB"} {
		require.Equal(t, want, backend.FormatBytes(n))
	}
}
