package testseed

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps its log and its failure, to look at
// what Seed reports.
type recorder struct {
	testing.TB
	failed   bool
	logs     []string
	cleanups []func()
}

func (r *recorder) Failed() bool               { return r.failed }
func (r *recorder) Fail()                      { r.failed = true }
func (r *recorder) Cleanup(f func())           { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Logf(f string, args ...any) { r.logs = append(r.logs, fmt.Sprintf(f, args...)) }
func (r *recorder) Fatal(args ...any)          { r.failed = true; panic(args) }
func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// The environment variable replays a seed, and every value drawn after it.
func TestReplay(t *testing.T) {
	first := &recorder{TB: t}
	seed := Seed(first)
	a := []uint64{Uint64(first), Uint64(first), Rand(first, 3).Uint64()}
	first.end()
	if a[0] != seed || a[1] == seed {
		t.Fatalf("the first value is %d, the second %d; want the seed %d, then another", a[0], a[1], seed)
	}
	t.Setenv(Env, strconv.FormatUint(seed, 10))
	again := &recorder{TB: t}
	b := []uint64{Uint64(again), Uint64(again), Rand(again, 3).Uint64()}
	again.end()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("draw %d: %d, replayed %d", i, a[i], b[i])
		}
	}
}

// A test that fails reports its seed; one that passes does not.
func TestReportOnFailure(t *testing.T) {
	for _, fail := range []bool{false, true} {
		r := &recorder{TB: t}
		seed := Seed(r)
		r.failed = fail
		r.end()
		want := "seed " + strconv.FormatUint(seed, 10) + " (FERRY_TEST_SEED=" + strconv.FormatUint(seed, 10) + " replays it)"
		if fail && (len(r.logs) != 1 || r.logs[0] != want) {
			t.Fatalf("a failed test logged %q, want %q", r.logs, want)
		}
		if !fail && len(r.logs) != 0 {
			t.Fatalf("a passing test logged %q", r.logs)
		}
	}
}

// A malformed variable is an error naming it.
func TestMalformed(t *testing.T) {
	t.Setenv(Env, "soon")
	if _, err := Fresh(); err == nil || !strings.Contains(err.Error(), Env) {
		t.Fatalf("got %v, want an error naming %s", err, Env)
	}
}
