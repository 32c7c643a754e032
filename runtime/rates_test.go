package runtime

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The bandwidth probe prices the copies alone: the time the round trip adds
// to the program, unless that difference is lost in the noise.
func TestRoundTripRate(t *testing.T) {
	const bytes = 4 << 20
	// 1.7 ms with the copies, 0.7 ms without: 4 MiB in 1 ms.
	require.InDelta(t, bytes/1e-3, roundTripRate(bytes, 1.7e-3, 0.7e-3), 1)
	// The program without copies timed slower than with them (noise): the
	// whole program's time.
	require.InDelta(t, bytes/1.7e-3, roundTripRate(bytes, 1.7e-3, 1.8e-3), 1)
	// A difference under a tenth of the program: the whole program's time.
	require.InDelta(t, bytes/1.7e-3, roundTripRate(bytes, 1.7e-3, 1.6e-3), 1)
}
