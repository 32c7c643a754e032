package rendezvous_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective/rendezvous"
)

// join starts a job of n processes as goroutines on a 127.0.0.1 port and
// returns their communicators (by process id), closed at the end of the
// test. edit, if not nil, changes each process's Config.
func join(t *testing.T, n int, edit func(*rendezvous.Config)) []*rendezvous.Comm {
	t.Helper()
	comms, errs := joinAll(t, n, edit)
	for p, err := range errs {
		if err != nil {
			t.Fatalf("process %d: Join: %v", p, err)
		}
	}
	t.Cleanup(func() { closeAll(t, comms) })
	return comms
}

// joinAll runs Join in n goroutines (process 0 on a fresh listener) and
// returns what each got.
func joinAll(t *testing.T, n int, edit func(*rendezvous.Config)) ([]*rendezvous.Comm, []error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	comms, errs := make([]*rendezvous.Comm, n), make([]error, n)
	var wg sync.WaitGroup
	for p := range n {
		cfg := rendezvous.Config{CoordinatorAddress: addr, NumProcesses: n, ProcessID: p, ConnectTimeout: 20 * time.Second}
		if p == 0 {
			cfg.Listener = ln
		}
		if edit != nil {
			edit(&cfg)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[p], errs[p] = rendezvous.Join(context.Background(), cfg)
		}()
	}
	wg.Wait()
	return comms, errs
}

// closeAll closes every process's communicator at once (process 0's Close
// waits for the others).
func closeAll(t *testing.T, comms []*rendezvous.Comm) {
	var wg sync.WaitGroup
	for p, c := range comms {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Close(); err != nil {
				t.Errorf("process %d: Close: %v", p, err)
			}
		}()
	}
	wg.Wait()
}

// onEach runs fn for every rank at once and returns the errors by rank.
func onEach(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

// unsetenv unsets name for the rest of the test (t.Setenv first, so that
// it is restored).
func unsetenv(t *testing.T, name string) {
	t.Helper()
	t.Setenv(name, "")
	os.Unsetenv(name)
}
