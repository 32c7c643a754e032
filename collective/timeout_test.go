package collective_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
)

// TestTimeoutFromEnv parses FERRY_COLLECTIVE_TIMEOUT: unset is the default,
// 0 and off no limit, a bad value an error naming the variable.
func TestTimeoutFromEnv(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		bad  bool
	}{
		{"", collective.DefaultTimeout, false},
		{"90s", 90 * time.Second, false},
		{"250ms", 250 * time.Millisecond, false},
		{"off", 0, false},
		{"0", 0, false},
		{"soon", 0, true},
		{"-1s", 0, true},
	} {
		t.Setenv(collective.TimeoutEnv, tc.v)
		got, err := collective.TimeoutFromEnv()
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), collective.TimeoutEnv) {
				t.Errorf("%q: got %v, %v; want an error naming %s", tc.v, got, err, collective.TimeoutEnv)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %v, %v; want %v", tc.v, got, err, tc.want)
		}
	}
}
