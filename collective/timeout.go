package collective

import (
	"time"

	"github.com/ferryml/ferry/internal/settings"
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
	d, _, err := settings.CollectiveTimeout.Lookup()
	return d, err
}
