package serve

import (
	"context"
	"sync"
	"time"
)

// queue is the bounded request queue both batchers share: callers enqueue
// without blocking, one loop goroutine takes requests off it, and closing
// it waits until that loop has answered every queued request.
type queue[R any] struct {
	ch       chan R
	mu       sync.RWMutex // held to send on ch; close takes it to close ch
	closed   bool
	loopDone chan struct{}
}

func newQueue[R any](size int) *queue[R] {
	return &queue[R]{ch: make(chan R, size), loopDone: make(chan struct{})}
}

// enqueue queues r without blocking: ErrClosed after close, ErrQueueFull
// when the queue is full.
func (q *queue[R]) enqueue(r R) error {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return ErrClosed
	}
	select {
	case q.ch <- r:
		return nil
	default:
		return ErrQueueFull
	}
}

// close stops taking requests and waits until the loop has ended (it
// calls loopEnded once the queue is closed and empty), or until ctx ends.
func (q *queue[R]) close(ctx context.Context) error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
	q.mu.Unlock()
	select {
	case <-q.loopDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loopEnded says that the loop has answered every request.
func (q *queue[R]) loopEnded() { close(q.loopDone) }

// next waits for a request; ok is false once the queue is closed and
// empty.
func (q *queue[R]) next() (r R, ok bool) {
	r, ok = <-q.ch
	return r, ok
}

// gather hands queued requests to add until full says the batch is full
// or the time is up: it waits for more until deadline, and takes only what
// is already queued once deadline has passed (at once when it is past
// already). open is false once the queue is closed.
func (q *queue[R]) gather(deadline time.Time, full func() bool, add func(R)) (open bool) {
	var timeout <-chan time.Time
	if d := time.Until(deadline); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	for !full() {
		if timeout == nil { // take only what is queued
			select {
			case r, ok := <-q.ch:
				if !ok {
					return false
				}
				add(r)
				continue
			default:
				return true
			}
		}
		select {
		case r, ok := <-q.ch:
			if !ok {
				return false
			}
			add(r)
		case <-timeout:
			timeout = nil
		}
	}
	return true
}
