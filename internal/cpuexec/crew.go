package cpuexec

import (
	"runtime"
	"sync/atomic"
	"time"
)

// crew is the executor's helper goroutines for parallel work. A job is
// posted on the board; helpers that are awake (spinning for up to
// crewSpin after their last job) take it at once, sleeping ones are woken.
// Waking a sleeping thread took 150 µs on the project machine, a sixth of a
// 1 ms fused call; back-to-back calls (a training step's fused groups, a
// benchmark's loop) find the helpers still spinning.
type crew struct {
	board    atomic.Pointer[crewJob]
	wake     chan struct{}
	size     atomic.Int32 // helpers started
	sleeping atomic.Int32 // helpers asleep or about to sleep on wake
}

// crewJob is one parallel call: work is run by the caller and by every
// helper that joins before the call returns; work itself hands out the
// chunks, so a helper that joins late finds none.
type crewJob struct {
	work   func()
	active atomic.Int32 // helpers inside work
	closed atomic.Bool  // the caller is done: join no more
}

// crewSpin is how long an idle helper keeps polling for the next job
// before it sleeps.
const crewSpin = 100 * time.Microsecond

var helpers = crew{wake: make(chan struct{}, 64)}

// run runs job.work on the calling goroutine and on up to n helpers, and
// returns when every one that joined has returned from it.
func (c *crew) run(n int, work func()) {
	c.grow(n)
	j := &crewJob{work: work}
	c.board.Store(j)
	// Wake sleepers (a helper counts itself asleep before its last look
	// at the board, so one of the two always sees the other).
	for range min(n, int(c.sleeping.Load())) {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	work()
	j.closed.Store(true)
	c.board.CompareAndSwap(j, nil)
	for j.active.Load() > 0 {
		runtime.Gosched()
	}
}

// grow starts helpers until there are at least n.
func (c *crew) grow(n int) {
	for {
		have := c.size.Load()
		if int(have) >= n {
			return
		}
		if c.size.CompareAndSwap(have, have+1) {
			go c.helper()
		}
	}
}

// helper takes jobs from the board for ever.
func (c *crew) helper() {
	for {
		if j := c.board.Load(); j != nil && c.join(j) {
			continue
		}
		if !c.poll() {
			c.sleeping.Add(1)
			if c.board.Load() == nil {
				<-c.wake
			}
			c.sleeping.Add(-1)
		}
	}
}

// poll watches the board for up to crewSpin and reports whether a job
// came.
func (c *crew) poll() bool {
	for deadline := time.Now().Add(crewSpin); time.Now().Before(deadline); runtime.Gosched() {
		if c.board.Load() != nil {
			return true
		}
	}
	return false
}

// join runs j's work unless the caller has finished with it, and reports
// whether it ran.
func (c *crew) join(j *crewJob) bool {
	j.active.Add(1)
	defer j.active.Add(-1)
	if j.closed.Load() {
		c.board.CompareAndSwap(j, nil)
		return false
	}
	j.work()
	return true
}
