package collective

import (
	"fmt"
	"os"
	"time"
)

// TimeoutEnv names the environment variable bounding how long the engines
// between processes (collective/mpi, collective/rendezvous) wait for the
// other ranks in one collective: a Go duration ("30s", "5m"); 0 or "off"
// waits forever (until the context is done). Unset, the bound is
// DefaultTimeout. See TimeoutFromEnv.
const TimeoutEnv = "FERRY_COLLECTIVE_TIMEOUT"

// DefaultTimeout is the collective timeout when $FERRY_COLLECTIVE_TIMEOUT is
// unset: five minutes, long enough for the slowest process of a job to
// reach a collective after a long step. A dead process is found sooner than
// that where the engine watches the processes (collective/mpi's liveness
// connections name it within milliseconds).
const DefaultTimeout = 5 * time.Minute

// TimeoutFromEnv returns the collective timeout that $FERRY_COLLECTIVE_TIMEOUT
// sets (0: no limit), DefaultTimeout when it is unset, and an error naming the
// variable when it is neither a non-negative duration nor "off".
func TimeoutFromEnv() (time.Duration, error) {
	switch v := os.Getenv(TimeoutEnv); v {
	case "":
		return DefaultTimeout, nil
	case "0", "off":
		return 0, nil
	default:
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%s=%q: want a duration such as 30s or 5m, or 0 or off for none", TimeoutEnv, v)
		}
		return d, nil
	}
}
