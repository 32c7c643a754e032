package cpu

import (
	"sync/atomic"
	"testing"

	"github.com/ferryml/ferry/backend"
)

// SetMemoryForTest replaces the global pools with fresh ones for cfg (even if
// buffers of earlier tests are still live: they free into the replaced pools)
// and restores the default, environment-configured pools when t ends. It is
// for tests only: unlike ConfigureMemory it does not wait for live buffers.
func SetMemoryForTest(t testing.TB, cfg backend.MemoryConfig) {
	t.Helper()
	n, err := cfg.Normalized()
	if err != nil {
		t.Fatal(err)
	}
	if err := memPools.configure(&n, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ResetMemoryForTest)
}

// ResetMemoryForTest puts the global pools back in their default state: the
// environment's settings, read at next use. It is for tests only.
func ResetMemoryForTest() { _ = memPools.configure(nil, true) }

// PoisonUninitForTest makes AllocUninit fill memory with 0xff bytes, as
// FERRY_POISON_UNINIT=1 does, so that a kernel reading memory it did not
// write shows up in a test's results. Call it before the tests run
// (TestMain).
func PoisonUninitForTest() { poisonUninit = true }

// HoldEvent is a point of an execution's life that a test hook
// (SetHoldHookForTest) sees.
type HoldEvent int

const (
	// HoldEventRun: an execution has read its arguments and is about to
	// run its steps.
	HoldEventRun HoldEvent = iota
	// HoldEventWait: a donation hold waits for the usage holds of running
	// executions to end.
	HoldEventWait
)

// holdHook is the test hook of SetHoldHookForTest.
var holdHook atomic.Pointer[func(HoldEvent)]

// SetHoldHookForTest makes every execution and every waiting donation
// call hook (from its own goroutine) at the events of HoldEvent, until t
// ends, so that a test can stop an execution while it holds its arguments
// and delete or donate them meanwhile. It is for tests only.
func SetHoldHookForTest(t testing.TB, hook func(HoldEvent)) {
	holdHook.Store(&hook)
	t.Cleanup(func() { holdHook.Store(nil) })
}

// holdEvent calls the test hook, if any.
func holdEvent(e HoldEvent) {
	if h := holdHook.Load(); h != nil {
		(*h)(e)
	}
}
