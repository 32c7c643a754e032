package randprog

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseFeatures: ParseFeatures never panics; an error names the item it
// refused and leaves the base, and a spec of no items changes nothing.
func FuzzParseFeatures(f *testing.F) {
	for _, s := range []string{"", "all", "none", "+control, +scanconst", "-scancopies", "+hostparams,-extended", "control", "+bogus", ",,,", "+", "-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := ParseFeatures(All(), spec)
		if err != nil {
			require.Equal(t, All(), got, "an error leaves the base")
			require.Contains(t, err.Error(), "unknown feature")
			return
		}
		empty := true
		for _, item := range strings.Split(spec, ",") {
			empty = empty && strings.TrimSpace(item) == ""
		}
		if empty {
			require.Equal(t, All(), got)
		}
		// Applying the same spec to any base ends the same when it starts
		// with all or none.
		if first := strings.TrimSpace(strings.Split(spec, ",")[0]); first == "all" || first == "none" {
			again, err := ParseFeatures(Features{}, spec)
			require.NoError(t, err)
			require.Equal(t, got, again)
		}
	})
}
