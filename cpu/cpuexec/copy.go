package cpuexec

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Copies between memory spaces.
//
// A device_put whose operand and result live in different memory spaces is a
// step of its own (stepCopy). With asynchronous copies on (the default; set
// FERRY_ASYNC_COPY=0 to turn them off) the step only starts the copy on a
// copy worker — one goroutine per direction, host→device and device→host,
// as CUDA copy streams, each running its copies in the order they were
// started — and the region keeps running. The copy is waited for (its event)
// before the first later step that reads memory the copy writes or writes
// memory the copy reads or writes (the plan reuses a dead buffer's bytes, so
// this covers a source about to be overwritten), and at the end of the
// region at the latest. These positions are the plan's schedule
// (passes.Schedule), which a copy worker's order also covers.
//
// Inside a scan body, a copy of an xs slice (a pinned_host parameter scanned
// over axis 0, say) whose destination bytes belong to it alone for the whole
// iteration is also double buffered: once its last reader of iteration i has
// run (and after the last copy of the same direction in the body, so that it
// does not hold up a copy iteration i still waits for), the copy of the next
// iteration's slice is started into the same bytes, and iteration i+1's
// device_put step only waits for it. A reader that is itself a copy (a round
// trip, device_put(device_put(x, pinned_host), device)) has only been
// started by then, on the other worker: the next slice's copy waits on its
// worker for it before it overwrites the bytes the reader reads, and the
// body runs on. The prefetch pass of package passes reserves such buffers
// where that costs no device memory.
//
// FERRY_HOST_COPY_GBPS=g simulates a host link of g GB/s: a copy between
// spaces takes bytes/g nanoseconds of its direction's link, which runs one
// copy at a time (a synchronous copy sleeps for the rest after its memcpy;
// the waiter of an asynchronous one sleeps until the link is done with it),
// so the overlap of copies with compute is observable on a machine where both
// spaces are the same RAM. Results are bit-identical either way: a copy is a
// memcpy.

// copyDir is the direction of a copy between spaces.
type copyDir uint8

const (
	toDevice copyDir = iota // pinned_host → device
	toHost                  // device → pinned_host
)

func (d copyDir) String() string {
	if d == toDevice {
		return "host→device"
	}
	return "device→host"
}

// copyConfig is how one Execute runs its copies between spaces.
type copyConfig struct {
	async bool
	gbps  float64 // simulated link speed in GB/s; 0: as fast as memory
}

// defaultCopyConfig is the configuration of programs without copies.
var defaultCopyConfig = copyConfig{async: true}

// lastCopyConfig caches copyConfigFromEnv's result for the values it was
// made from (read on every execution; made anew when they change).
var lastCopyConfig atomic.Pointer[copyConfig]

// copyConfigFromEnv reads FERRY_ASYNC_COPY and FERRY_HOST_COPY_GBPS; a bad
// value is an error naming it. The result is shared and must not be
// modified.
func copyConfigFromEnv() (*copyConfig, error) {
	async, _, err := settings.AsyncCopy.Lookup()
	if err != nil {
		return nil, err
	}
	gbps, _, err := settings.HostCopyGBPS.Lookup()
	if err != nil {
		return nil, err
	}
	if p := lastCopyConfig.Load(); p != nil && p.async == async && p.gbps == gbps {
		return p, nil
	}
	c := &copyConfig{async: async, gbps: gbps}
	lastCopyConfig.Store(c)
	return c, nil
}

// copyBytes copies src into dst, taking at least len(src)/gbps ns when a
// simulated link speed is set.
func copyBytes(dst, src []byte, gbps float64) {
	start := time.Now()
	copy(dst, src)
	if gbps > 0 {
		want := time.Duration(float64(len(src)) / gbps)
		if rest := want - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
	}
}

// copyEvent is the completion of one asynchronous copy, or of one
// collective on the collective worker (collective.go).
type copyEvent struct {
	done chan struct{}
	// until is when the copy completes on the simulated link (zero: none).
	until time.Time
	err   error // a collective's error, set before done is closed
}

// wait blocks until the copy is complete and returns its error.
func (e *copyEvent) wait() error {
	<-e.done
	if !e.until.IsZero() {
		if rest := time.Until(e.until); rest > 0 {
			time.Sleep(rest)
		}
	}
	return e.err
}

type copyJob struct {
	dst, src []byte
	ev       *copyEvent
	// after are copies, possibly on the other worker, that must be complete
	// before this one starts (they read its destination).
	after []*copyEvent
}

// copyWorkers are the two copy streams of the process, started on first use.
var copyWorkers = sync.OnceValue(func() *[2]chan copyJob {
	var qs [2]chan copyJob
	for d := range qs {
		qs[d] = make(chan copyJob, 256)
		go func(q chan copyJob) {
			for j := range q {
				for _, e := range j.after {
					<-e.done
				}
				copy(j.dst, j.src)
				close(j.ev.done)
			}
		}(qs[d])
	}
	return &qs
})

// link is the simulated host link: per direction, when its last queued copy
// completes. A simulated copy takes the link from the later of its start
// and that time, for len/gbps ns; the waiter sleeps until then. (The copy
// itself is a memcpy as soon as the worker runs, so the simulation does not
// depend on when the Go scheduler gets to the worker.)
var link struct {
	sync.Mutex
	free [2]time.Time
}

// startCopy queues a copy of src into dst on the worker of direction d, to
// start once the copies after are complete. Every copy in after must have
// been started before (so that the workers, each in its own order, cannot
// wait for each other in a cycle).
func startCopy(d copyDir, dst, src []byte, gbps float64, after ...*copyEvent) *copyEvent {
	ev := &copyEvent{done: make(chan struct{})}
	if gbps > 0 {
		now := time.Now()
		link.Lock()
		start := link.free[d]
		if start.Before(now) {
			start = now
		}
		for _, e := range after {
			if start.Before(e.until) {
				start = e.until
			}
		}
		ev.until = start.Add(time.Duration(float64(len(src)) / gbps))
		link.free[d] = ev.until
		link.Unlock()
	}
	copyWorkers()[d] <- copyJob{dst: dst, src: src, ev: ev, after: after}
	return ev
}

// crossSpaceCopy reports whether op is a device_put between two memory
// spaces, and its direction.
func crossSpaceCopy(op *ir.Op) (copyDir, bool) {
	if op.Code != ir.DevicePut || len(op.Args) != 1 || len(op.Results) != 1 {
		return 0, false
	}
	from, to := op.Args[0].Type.Space, op.Results[0].Type.Space
	switch {
	case from == ir.PinnedHost && to == ir.Device:
		return toDevice, true
	case from == ir.Device && to == ir.PinnedHost:
		return toHost, true
	}
	return 0, false
}

// Prefetch starts prefetch p, the next iteration's copy (or all_gather)
// of the next slice next, when copies (collectives) run asynchronously,
// its completion left in *ev (blockrun.Backend).
func (f *frame) Prefetch(p *passes.Prefetch, _ passes.Queue, next []byte, ev **copyEvent) (bool, error) {
	st := &f.g.steps[p.Step]
	if next == nil || st.kind == stepCopy && !f.cfg.async || st.kind == stepCollective && (f.env == nil || !f.env.async) {
		return false, nil
	}
	if err := waitClear(f.Event(p.Step)); err != nil { // it is waited for by now; be sure
		return false, err
	}
	// Readers still running must be done before the bytes are
	// overwritten. A copy waits for the copies among them on its worker;
	// a collective among them is waited for here (the copy workers are
	// the process's, shared by the devices: a copy job waiting for one
	// device's collective could hold up another device's copies that
	// collective needs). A gather waits here for the copies among them,
	// and runs after the collectives among them on the collective
	// worker. Compute readers have run.
	var after []*copyEvent
	for _, j := range p.Wait {
		e := *f.Event(j)
		switch {
		case e == nil:
		case f.g.steps[j].kind == stepCopy && st.kind == stepCopy:
			after = append(after, e)
		case f.g.steps[j].kind == stepCopy || st.kind == stepCopy:
			if err := e.wait(); err != nil {
				return false, err
			}
		}
	}
	if st.kind == stepCollective {
		e, err := f.startGather(p.Step, next)
		if err != nil {
			return false, err
		}
		*ev = e
		return true, nil
	}
	*ev = startCopy(st.dir, f.lits[st.outs[0]].Data, next, f.cfg.gbps, after...)
	return true, nil
}

// runCopy runs copy step i: it starts the copy on its worker (its
// completion in *ev), or copies synchronously.
func (f *frame) runCopy(i int, ev **copyEvent) {
	st := &f.g.steps[i]
	dst, src := f.outs[i][0].Data, f.args[i][0].Data
	if f.cfg.async && len(src) > 0 {
		*ev = startCopy(st.dir, dst, src, f.cfg.gbps)
		return
	}
	copyBytes(dst, src, f.cfg.gbps)
}

// waitClear waits for the copy *ev, if any, clears *ev and returns its
// error.
func waitClear(ev **copyEvent) error {
	if *ev != nil {
		err := (*ev).wait()
		*ev = nil
		return err
	}
	return nil
}
