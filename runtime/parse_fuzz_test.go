package runtime_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/backend"
	rt "github.com/ferryml/ferry/runtime"
)

// FuzzParseMemoryBudget: ParseMemoryBudget never panics; what it accepts is
// a positive byte count or -1 for "device", and its errors name the
// variable and quote the value.
func FuzzParseMemoryBudget(f *testing.F) {
	for _, s := range []string{"3000000", "512M", "2k", "1.5G", "64MiB", "1MB", "device", " Device ", "7T", "0.5K",
		"1e30T", "NaN K", "Inf G", "0.0000001K", "-5M", "0", " 0", "", "abc", "M", "12X", "9223372036854775807", "8192P", "1e19"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := rt.ParseMemoryBudget(s)
		if err != nil {
			require.Contains(t, err.Error(), rt.EnvMemoryBudget)
			require.Contains(t, err.Error(), strconv.Quote(s))
			return
		}
		if strings.EqualFold(strings.TrimSpace(s), "device") {
			require.Equal(t, int64(-1), v)
			return
		}
		require.GreaterOrEqual(t, v, int64(1), "%q", s)
	})
}

// FuzzParseMemorySize: runtime's ParseMemorySize is backend's.
func FuzzParseMemorySize(f *testing.F) {
	for _, s := range []string{"123", "64MiB", "1.5GiB", "1e30TB", "NaN", "Inf", "0", "", "8EiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := rt.ParseMemorySize(s)
		bv, berr := backend.ParseMemorySize(s)
		require.Equal(t, bv, v)
		require.Equal(t, berr == nil, err == nil)
		if err == nil {
			require.GreaterOrEqual(t, v, int64(1), "%q", s)
		}
	})
}
