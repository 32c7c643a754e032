// Package testseed gives tests fresh random seeds that can be replayed: each
// test (each testing.TB) has one seed, $FERRY_TEST_SEED when set and a new
// random one otherwise, reported in the test's log when it fails:
//
//	seed 1796422394719449883 (FERRY_TEST_SEED=1796422394719449883 replays it)
//
// Run the failing test alone (go test -run) with that variable to replay it.
// Every value a test draws from the package derives from its seed and the
// order of the draws, so a test that draws in a fixed order (not from
// goroutines racing each other) sees the same values again.
package testseed

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
)

// Env names the environment variable that replays a seed.
const Env = "FERRY_TEST_SEED"

// state is one test's seed and the number of values drawn from it.
type state struct {
	seed  uint64
	drawn uint64
}

var (
	mu     sync.Mutex
	states = map[testing.TB]*state{}
)

// Fresh returns $FERRY_TEST_SEED when set, else a new random seed, for code
// outside a test (a TestMain): the caller prints it. A malformed variable is
// an error naming it.
func Fresh() (uint64, error) {
	v, set, err := settings.TestSeed.Lookup()
	switch {
	case err != nil:
		return 0, err
	case !set:
		return rand.Uint64(), nil
	}
	return v, nil
}

// get returns t's state, making it (and the report on failure) on the
// first call.
func get(t testing.TB) *state {
	mu.Lock()
	defer mu.Unlock()
	if st := states[t]; st != nil {
		return st
	}
	seed, err := Fresh()
	if err != nil {
		t.Fatal(err)
	}
	st := &state{seed: seed}
	states[t] = st
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (%s=%d replays it)", seed, Env, seed)
		}
		mu.Lock()
		delete(states, t)
		mu.Unlock()
	})
	return st
}

// Seed returns t's seed; it is reported if t fails.
func Seed(t testing.TB) uint64 { return get(t).seed }

// Uint64 returns the next value derived from t's seed: the seed itself
// first, then a new value on every call (splitmix64 of the seed and the
// call's number). Use it where a test drew rand.Uint64() or the clock for
// a seed.
func Uint64(t testing.TB) uint64 {
	st := get(t)
	mu.Lock()
	n := st.drawn
	st.drawn++
	mu.Unlock()
	if n == 0 {
		return st.seed
	}
	return mix(st.seed + n*0x9e3779b97f4a7c15)
}

// Rand returns a generator seeded with Uint64(t) on the given stream.
func Rand(t testing.TB, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(Uint64(t), stream))
}

// mix is splitmix64's finalizer.
func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
