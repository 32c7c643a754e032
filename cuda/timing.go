package cuda

import (
	"fmt"
	"unsafe"
)

// Timer measures device time on the compute stream with a pair of timing
// events (cuEventRecord, cuEventElapsedTime). Because Execute makes the
// compute stream wait for the copy streams before it returns (Plan.Final),
// an interval from Start to Stop around Execute calls covers their copies.
type Timer struct {
	b          *Backend
	start, end uintptr
}

// NewTimer creates the two events (with timing enabled).
func (b *Backend) NewTimer() (*Timer, error) {
	if err := b.enter(); err != nil {
		return nil, err
	}
	defer b.exit()
	t := &Timer{b: b}
	for _, ev := range []*uintptr{&t.start, &t.end} {
		if err := b.d.Check("cuEventCreate", uintptr(unsafe.Pointer(ev)), 0); err != nil {
			t.close()
			return nil, err
		}
	}
	return t, nil
}

// Start records the start event on the compute stream.
func (t *Timer) Start() error {
	if err := t.b.enter(); err != nil {
		return err
	}
	defer t.b.exit()
	return t.b.d.Check("cuEventRecord", t.start, t.b.streams[Compute])
}

// Stop records the end event on the compute stream, waits for it and
// returns the milliseconds between the two events.
func (t *Timer) Stop() (float64, error) {
	if err := t.b.enter(); err != nil {
		return 0, err
	}
	defer t.b.exit()
	if err := t.b.d.Check("cuEventRecord", t.end, t.b.streams[Compute]); err != nil {
		return 0, err
	}
	if err := t.b.d.Check("cuEventSynchronize", t.end); err != nil {
		return 0, err
	}
	var ms float32
	if err := t.b.d.Check("cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), t.start, t.end); err != nil {
		return 0, fmt.Errorf("%w (timer)", err)
	}
	return float64(ms), nil
}

// Close destroys the events.
func (t *Timer) Close() {
	if err := t.b.enter(); err != nil {
		return
	}
	defer t.b.exit()
	t.close()
}

func (t *Timer) close() {
	for _, ev := range []*uintptr{&t.start, &t.end} {
		if *ev != 0 {
			_ = t.b.d.Check("cuEventDestroy", *ev)
			*ev = 0
		}
	}
}
