package backend_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
)

// FuzzParseMemorySize: ParseMemorySize never panics; what it accepts is a
// positive byte count (a plain integer as itself), and its errors quote
// the value.
func FuzzParseMemorySize(f *testing.F) {
	for _, s := range []string{"123", "1e9", "64MiB", "1.5GiB", "512MB", " 2 kib ", "9223372036854775807", "9223372036854775808", "1e30TB",
		"NaN", "Inf", "-Inf GB", "0", "-5", "0.1", "0x10", "1e-300", "8EiB", "", "M", "12X"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := backend.ParseMemorySize(s)
		if err != nil {
			require.Zero(t, v)
			require.Contains(t, err.Error(), strconv.Quote(s))
			return
		}
		require.GreaterOrEqual(t, v, int64(1), "%q", s)
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			require.Equal(t, n, v, "%q", s)
		}
	})
}
