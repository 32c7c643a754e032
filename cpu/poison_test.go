package cpu

import (
	"os"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// TestMain runs the package's tests with uninitialised pool memory poisoned
// (0xff bytes, NaN in every float type), so that a CPU kernel reading
// memory it did not write shows up as a wrong result in any test.
func TestMain(m *testing.M) {
	poisonUninit = true
	os.Exit(m.Run())
}

// TestAllocUninitPoison checks the poison itself: AllocUninit fills with
// 0xff, Alloc still zeroes, over fresh and reused memory.
func TestAllocUninitPoison(t *testing.T) {
	var ps Pools
	for range 2 {
		mem, rel, err := ps.AllocUninit(ir.Device, 1000, "poisoned")
		require.NoError(t, err)
		for i, b := range mem {
			require.Equal(t, byte(0xff), b, "byte %d", i)
		}
		rel()
		mem, rel, err = ps.Alloc(ir.Device, 1000, "zeroed")
		require.NoError(t, err)
		for i, b := range mem {
			require.Equal(t, byte(0), b, "byte %d", i)
		}
		rel()
	}
}
