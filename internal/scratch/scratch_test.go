package scratch

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// ClearSmall zeroes every element of short and long slices alike.
func TestClearSmall(t *testing.T) {
	for _, n := range []int{0, 1, 8, 9, 40} {
		s := make([]*int, n)
		for i := range s {
			v := i
			s[i] = &v
		}
		ClearSmall(s)
		for i := range s {
			require.Nil(t, s[i], "n=%d, element %d", n, i)
		}
	}
}
