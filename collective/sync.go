package collective

import (
	"context"
	"fmt"
	"sync"
)

// world is the abort state shared by a set of in-process communicators and
// every communicator split from them.
type world struct {
	once  sync.Once
	done  chan struct{} // closed by abort
	cause error         // written before done is closed
}

func newWorld() *world { return &world{done: make(chan struct{})} }

func (w *world) abort(err error) {
	w.once.Do(func() {
		w.cause = err
		close(w.done)
	})
}

// failed returns the abort error, or nil while the world is healthy.
func (w *world) failed() error {
	select {
	case <-w.done:
		if w.cause == nil {
			return ErrAborted
		}
		return fmt.Errorf("%w: %w", ErrAborted, w.cause)
	default:
		return nil
	}
}

// barrier is a reusable barrier for n goroutines. Arrivals are counted under
// mu; the last arrival of a phase starts the next phase and hands one token to
// each waiter through the channel of its phase's parity. A waiter of phase p
// leaves before anyone can arrive at phase p+1's end, so the tokens of phase p
// are all taken before phase p+2 (same channel) hands out new ones.
type barrier struct {
	n     int
	mu    sync.Mutex
	count int
	phase uint64
	wake  [2]chan struct{}
}

func newBarrier(n int) *barrier {
	return &barrier{n: n, wake: [2]chan struct{}{make(chan struct{}, n), make(chan struct{}, n)}}
}

// errGaveUp marks a wait ended by the caller's context.
type errGaveUp struct{ err error }

func (e errGaveUp) Error() string { return e.err.Error() }

// wait blocks until all n goroutines have called wait for this phase, the
// world is aborted (its error), or ctx is done (an errGaveUp).
func (b *barrier) wait(ctx context.Context, w *world) error {
	b.mu.Lock()
	p := b.phase & 1
	b.count++
	if b.count == b.n {
		b.count = 0
		b.phase++
		b.mu.Unlock()
		for range b.n - 1 {
			b.wake[p] <- struct{}{}
		}
		return nil
	}
	b.mu.Unlock()
	select {
	case <-b.wake[p]:
		return nil
	case <-w.done:
		return w.failed()
	case <-ctx.Done():
		return errGaveUp{ctx.Err()}
	}
}
