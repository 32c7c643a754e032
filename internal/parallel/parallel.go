// Package parallel runs the parts of one parallel call on the calling
// goroutine and on a pool of worker goroutines shared by the whole process
// (the matrix products of internal/gemm and the fused groups of
// internal/cpuexec): one pool, so that the idle workers of one user never
// spin beside the other's.
//
// Workers are started on demand and never exit. An idle worker polls for
// new work for a while (SpinTime) before it blocks: waking a blocked
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
	for i := 0; i < 1000 && pending.Load() != 0; i++ {
		runtime.Gosched()
	}
	<-done
}

func worker() {
	for {
		var f func()
		select {
		case f = <-work:
		default:
			f = spinRecv()
		}
		f()
	}
}

// spinRecv polls for work for SpinTime, then blocks until some comes.
func spinRecv() func() {
	var deadline time.Time
	for i := 0; ; i++ {
		select {
		case f := <-work:
			return f
		default:
		}
		if i%64 == 0 {
			if now := time.Now(); deadline.IsZero() {
				deadline = now.Add(SpinTime)
			} else if now.After(deadline) {
				return <-work
			}
		}
		runtime.Gosched()
	}
}
