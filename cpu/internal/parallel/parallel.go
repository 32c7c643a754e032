// Package parallel runs the parts of one parallel call on the calling
// goroutine and on a pool of worker goroutines shared by the whole process
// (the matrix products of cpu/gemm and the fused groups of
// cpu/cpuexec): one pool, so that the idle workers of one user never
// spin beside the other's.
//
// Workers are started on demand and never exit. An idle worker polls for
// new work for a while (SpinTime, shorter after its idle gaps outlasted
// that: see nextSpin) before it blocks: waking a blocked
// thread (and its idle CPU) took 150 µs on the project machine, more than a
// small product and a sixth of a 1 ms fused call, while back-to-back calls
// (a training step, a benchmark loop) find the workers still polling.
package parallel

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// SpinTime is how long an idle worker polls for new work before it blocks.
const SpinTime = 500 * time.Microsecond

// A polling goroutine (an idle worker, a caller waiting for its workers)
// checks for its event, then waits pauseN PAUSE instructions (about
// 0.1 µs on the project machine), and yields to the Go scheduler only
// every yieldEvery polls: runtime.Gosched at every poll took the
// scheduler's lock a million times a second and cost 9 % of a training
// step's CPU time, while never yielding would keep other goroutines off
// the worker's P.
const (
	pauseN     = 4
	yieldEvery = 64
)

var (
	mu      sync.Mutex
	workers int
	work    = make(chan func(), 64)
)

// Run runs f(0), …, f(nt-1) and returns when all have returned: f(0) on the
// calling goroutine, the others on pool workers. A part that no worker has
// started when the caller is done with its own is run by the caller, so a
// late worker (or a pool busy with other calls) delays nobody and nested
// calls cannot deadlock. Parts that share their work through a counter (each
// takes chunks until none is left) then simply find nothing to do.
func Run(nt int, f func(t int)) {
	if nt <= 1 {
		if nt == 1 {
			f(0)
		}
		return
	}
	mu.Lock()
	for workers < nt-1 {
		workers++
		go worker()
	}
	mu.Unlock()
	var pending atomic.Int32
	pending.Store(int32(nt - 1))
	done := make(chan struct{})
	claimed := make([]atomic.Bool, nt)
	part := func(t int) {
		if claimed[t].CompareAndSwap(false, true) {
			f(t)
			if pending.Add(-1) == 0 {
				close(done)
			}
		}
	}
	for t := 1; t < nt; t++ {
		work <- func() { part(t) }
	}
	f(0)
	for t := 1; t < nt; t++ {
		part(t)
	}
	// The parts not yet done run on workers: poll for them (as long as
	// an idle worker polls for work) before blocking.
	poll(SpinTime, func() bool { return pending.Load() == 0 })
	<-done
}

func worker() {
	spin := SpinTime
	for {
		var f func()
		select {
		case f = <-work:
		default:
			t0 := time.Now()
			f = spinRecv(spin)
			spin = nextSpin(spin, time.Since(t0))
		}
		f()
	}
}

// minSpin is the shortest an idle worker polls (see nextSpin).
const minSpin = 20 * time.Microsecond

// nextSpin is how long an idle worker polls next time, after it polled for
// spin and found work gap after it went idle: SpinTime again when polling
// that long would have caught the work, a quarter of spin (down to minSpin)
// when the work came later. A worker whose idle gaps are longer than
// SpinTime (the serial stretches of a training step, the time between
// steps) then burns minSpin per gap instead of SpinTime, while one whose
// gaps are short keeps catching its work by polling.
func nextSpin(spin, gap time.Duration) time.Duration {
	if gap <= SpinTime {
		return SpinTime
	}
	return max(spin/4, minSpin)
}

// spinRecv polls for work for about d, then blocks until some comes.
// A poll reads the queue's length (no lock); only a non-empty queue is
// received from.
func spinRecv(d time.Duration) func() {
	var f func()
	if poll(d, func() bool {
		if len(work) == 0 {
			return false
		}
		select {
		case f = <-work:
			return true
		default:
			return false
		}
	}) {
		return f
	}
	return <-work
}

// poll calls ready until it returns true, for at most about d, and
// reports whether it did.
func poll(d time.Duration, ready func() bool) bool {
	var deadline time.Time
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		pause(pauseN)
		if i%yieldEvery == 0 {
			if now := time.Now(); deadline.IsZero() {
				deadline = now.Add(d)
			} else if now.After(deadline) {
				return false
			}
			runtime.Gosched()
		}
	}
}
