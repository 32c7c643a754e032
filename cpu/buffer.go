package cpu

import (
	"fmt"
	goruntime "runtime"
	"strconv"
	"sync"
	"unique"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/ir"
)

// freedError reports a read of a deleted or donated buffer: it matches
// backend.ErrDonated or backend.ErrDeleted.
type freedError struct {
	typ     ir.Type
	donated bool
	where   string
}

func (e *freedError) Error() string {
	if e.donated {
		return fmt.Sprintf("array %v was donated at %s: its buffer now belongs to that call's results and the array can no longer be used", e.typ, e.where)
	}
	return fmt.Sprintf("array %v was deleted at %s and can no longer be used", e.typ, e.where)
}

func (e *freedError) Is(target error) bool {
	return (target == backend.ErrDonated && e.donated) || (target == backend.ErrDeleted && !e.donated)
}

type bufState uint8

const (
	bufLive bufState = iota
	bufDeleted
	bufDonated
	bufFailed
)

// releaser frees a buffer's memory once, from Delete, donation or the cleanup
// that runs when the buffer's literal becomes unreachable. Donation takes the
// release function out (take) and gives it to the result's buffer, so a chain
// of donated steps never links releasers together: each buffer's releaser
// holds the pool's release function itself, and releasing is O(1) however
// many times the memory was handed on.
type releaser struct {
	mu sync.Mutex
	f  func()
}

// take returns the release function and disarms r: releasing r afterwards
// does nothing. It returns nil if r was released or taken before.
func (r *releaser) take() func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.f
	r.f = nil
	return f
}

// release calls the release function, once.
func (r *releaser) release() {
	if r == nil {
		return
	}
	if f := r.take(); f != nil {
		f()
	}
}

// cpuBuffer is an array's storage on the CPU backend: a literal whose bytes come
// from the pool of its memory space. It is freed by Delete, by donation, or
// automatically when it is unreachable: a finalizer on the buffer releases
// its memory. The literal is the buffer's first field, so the literal that
// Literal returns points into the buffer and a caller still reading it keeps
// the buffer, and so the memory, alive; code that keeps only lit.Data must
// keep the buffer alive with runtime.KeepAlive.
//
// A finalizer rather than a runtime.AddCleanup: a cleanup cannot be attached
// to the buffer itself when its argument is part of it, and costs two
// allocations per buffer (its argument's box and the generic call's
// closure); the finalizer costs none. The buffer points to nothing that can
// point back to it (records never point to buffers), so it is never part of
// a cycle, which would keep a finalizer from running.
type cpuBuffer struct {
	lit   ir.Literal // must stay the first field (see above); its Type never changes
	mu    sync.Mutex
	rec   *allocRecord // the pool's record of the memory, which frees it; or
	rel   *releaser    // frees memory that has no record (rec nil)
	state bufState
	fin   bool // a finalizer is set
	// dev is the device whose pools hold the memory; committed says the
	// buffer is committed to it (backend.DeviceBuffer). Both are set when
	// the buffer is made and never change.
	dev       uint16
	committed bool
	// donating says a donation hold is taken or awaited (ir.Holder);
	// delLater says Delete was called while a donating call held the
	// buffer: if that call fails, the buffer is deleted when it lets go.
	// waiter says a donation hold waits for uses to fall to 0 (on
	// holdWait).
	donating donation
	delLater bool
	waiter   bool
	// where is where it was donated, or is being donated (a Go file:line),
	// interned: a pointer, which keeps the buffer in a 128-byte allocation.
	where unique.Handle[string]
	// err is why the buffer has no memory (bufFailed) or, as a *deletedAt,
	// where it was deleted (bufDeleted, or delLater): one field for both
	// keeps the buffer small.
	err error
	// uses counts the usage holds of running executions and reads; while
	// it is not 0 a deleted buffer keeps its memory, and a donation hold
	// waits.
	uses int32
}

// holdWait is where donation holds wait for a buffer's usage holds to end:
// a waiter holds holdWaitMu from before it looks at the buffer's uses to
// its Wait, and the Unhold that ends the last usage hold broadcasts under
// it, so no wake-up is lost. Waits are rare (a donation racing a read), so
// one condition for all buffers costs nothing.
var (
	holdWaitMu sync.Mutex
	holdWait   = sync.NewCond(&holdWaitMu)
)

// site is an interned Go file:line ("" is the zero Handle's value).
func siteOf(s string) unique.Handle[string] {
	if s == "" {
		return unique.Handle[string]{}
	}
	return unique.Make(s)
}

// siteString is the text of an interned site.
func siteString(h unique.Handle[string]) string {
	if h == (unique.Handle[string]{}) {
		return ""
	}
	return h.Value()
}

// donation is the state of a buffer's donation hold.
type donation uint8

const (
	donNone    donation = iota
	donWaiting          // a donating call waits for the usage holds to end
	donHeld             // a donating call holds the buffer
)

// deletedAt is where a buffer was deleted, symbolised only when reported.
// It is an error only so that it can share cpuBuffer.err (converting the
// pointer to an error allocates nothing); it is never returned.
type deletedAt callers.Stack

func (d *deletedAt) Error() string {
	file, line := (*callers.Stack)(d).Location(callers.UserLocation)
	return file + ":" + strconv.Itoa(line)
}

// finalizeBuffer releases the memory of a buffer that became unreachable.
func finalizeBuffer(b *cpuBuffer) {
	b.mu.Lock()
	rec, rel := b.rec, b.rel
	b.fin = false
	b.rec = nil
	b.mu.Unlock()
	if rec != nil {
		rec.release()
	} else {
		rel.release()
	}
}

// stopFinalizerLocked removes the buffer's finalizer (b.mu held), as its
// memory is freed or handed over now.
func (b *cpuBuffer) stopFinalizerLocked() {
	if b.fin {
		goruntime.SetFinalizer(b, nil)
		b.fin = false
	}
}

// newBuffer copies a host literal into new memory from the pool of its memory
// space on device 0, not committed. It fails with a *backend.OutOfMemoryError
// when the pool is full.
func newBuffer(l *ir.Literal) (*cpuBuffer, error) { return newBufferOn(l, 0, false, 4) }

// newBufferOn is newBuffer on device dev, committed to it if committed;
// skip is the number of stack frames to leave out of the allocation's
// recorded call stack (3: newBufferOn's caller).
func newBufferOn(l *ir.Literal, dev int, committed bool, skip int) (*cpuBuffer, error) {
	if int64(len(l.Data)) != l.Type.Bytes() {
		return nil, fmt.Errorf("literal %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	rec, mem, err := memPools.alloc(dev, l.Type.Space, l.Type.Bytes(), "array", false, true, skip)
	if err != nil {
		return nil, err
	}
	copy(mem, l.Data)
	b := &cpuBuffer{lit: ir.Literal{Type: l.Type.WithShape(l.Type.Shape), Data: mem}, dev: uint16(dev), committed: committed}
	if rec != nil {
		rec.setArray(b.lit.Type, "")
		return b.wrapRecord(rec), nil
	}
	return b.wrapLiteral(nil), nil
}

// newPoolBuffer wraps memory already allocated from the pools (by Pools.Alloc,
// for an executor's output, or handed over by donate) as a buffer: l.Data is
// that memory and release frees it. The pool's record of the memory becomes
// an array of l's type, made at site ("" keeps the Go line recorded when the
// memory was allocated). Memory not from the pools is accepted: release is
// then called when the buffer is freed. release must not refer to l.
func newPoolBuffer(l *ir.Literal, release func(), site string) *cpuBuffer {
	if rec := memPools.lookup(l.Type.Space, l.Data); rec != nil {
		rec.pool.mu.Lock()
		rec.typ, rec.isArray = l.Type.WithShape(l.Type.Shape), true
		if site != "" {
			rec.site = site
		}
		rec.pool.mu.Unlock()
	}
	return wrapLiteral(l, release)
}

// wrapLiteral makes a live buffer of lit that calls release once when freed.
// lit is copied into the buffer.
func wrapLiteral(lit *ir.Literal, release func()) *cpuBuffer {
	b := &cpuBuffer{lit: *lit}
	return b.wrapLiteral(release)
}

// wrapLiteral makes b, whose literal is set, a live buffer that calls
// release once when freed.
func (b *cpuBuffer) wrapLiteral(release func()) *cpuBuffer {
	b.rel = &releaser{f: release}
	if release != nil {
		b.fin = true
		goruntime.SetFinalizer(b, finalizeBuffer)
	}
	return b
}

// wrapRecord makes b, whose literal is set, a live buffer whose memory is
// the pool allocation rec, which it frees when freed: a buffer of pool
// memory without a release function or releaser of its own. rec frees its
// memory at most once however often it is released.
func (b *cpuBuffer) wrapRecord(rec *allocRecord) *cpuBuffer {
	b.rec, b.fin = rec, true
	goruntime.SetFinalizer(b, finalizeBuffer)
	return b
}

// newCPUBuffer copies a literal into pool memory. If the pool is full the
// buffer carries the *backend.OutOfMemoryError, which reading it returns.
//
// Deprecated: backends should call newBuffer, which returns the error.
func newCPUBuffer(l *ir.Literal) *cpuBuffer {
	b, err := newBuffer(l)
	if err != nil {
		return &cpuBuffer{lit: ir.Literal{Type: l.Type}, state: bufFailed, err: err}
	}
	return b
}

// Type is the buffer's dtype, shape and memory space.
func (b *cpuBuffer) Type() ir.Type { return b.lit.Type }

// Device is the index of the device holding the buffer
// (backend.DeviceBuffer).
func (b *cpuBuffer) Device() int { return int(b.dev) }

// Committed reports whether the buffer is committed to its device
// (backend.DeviceBuffer).
func (b *cpuBuffer) Committed() bool { return b.committed }

// Literal returns the contents (pool memory; the caller must not modify it),
// or an error naming where the buffer was deleted or donated.
func (b *cpuBuffer) Literal() (*ir.Literal, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.literalLocked(false)
}

// heldLiteral is Literal for an execution that holds the buffer (a usage
// or donation hold): a buffer deleted while held keeps its memory until
// its holds end, and the execution reads it.
func (b *cpuBuffer) heldLiteral() (*ir.Literal, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.literalLocked(true)
}

func (b *cpuBuffer) literalLocked(held bool) (*ir.Literal, error) {
	switch {
	case b.state == bufLive, held && b.state == bufDeleted && b.uses > 0:
		return &b.lit, nil
	case b.state == bufFailed:
		return nil, b.err
	default:
		return nil, &freedError{typ: b.lit.Type, donated: b.state == bufDonated, where: b.whereLocked()}
	}
}

// Hold takes a usage hold (donate false) or a donation hold (donate true) on
// the buffer for a running execution (ir.Holder): while a usage hold is
// held, Delete leaves the memory in place until the hold ends; a donation
// hold waits until no usage hold is held. Both fail if the buffer is
// deleted, donated, or being donated at another site.
func (b *cpuBuffer) Hold(donate bool, where string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.holdErrLocked(); err != nil {
		return err
	}
	if !donate {
		b.uses++
		return nil
	}
	b.donating, b.where = donWaiting, siteOf(where)
	if b.uses > 0 {
		b.mu.Unlock()
		holdEvent(HoldEventWait)
		holdWaitMu.Lock()
		b.mu.Lock()
		for b.uses > 0 {
			b.waiter = true
			b.mu.Unlock()
			holdWait.Wait()
			b.mu.Lock()
		}
		holdWaitMu.Unlock()
	}
	if b.state != bufLive { // deleted while waiting
		b.donating, b.where = donNone, unique.Handle[string]{}
		return b.holdErrLocked()
	}
	b.donating = donHeld
	return nil
}

// holdErrLocked is why a hold cannot be taken, or nil (b.mu held).
func (b *cpuBuffer) holdErrLocked() error {
	switch {
	case b.state == bufFailed:
		return b.err
	case b.state != bufLive:
		return &freedError{typ: b.lit.Type, donated: b.state == bufDonated, where: b.whereLocked()}
	case b.donating != donNone:
		return &donatingError{typ: b.lit.Type, where: siteString(b.where)}
	}
	return nil
}

// Unhold ends a hold taken by Hold (ir.Holder). The end of the last
// usage hold frees the memory of a buffer deleted meanwhile and wakes a
// donation waiting for it; the end of a donation hold whose call did not
// take the buffer (it failed) deletes it if Delete was called meanwhile.
func (b *cpuBuffer) Unhold(donate bool) {
	b.mu.Lock()
	if !donate {
		if b.uses <= 0 {
			b.mu.Unlock()
			panic("cpu: Unhold without a usage hold")
		}
		b.uses--
		if b.uses > 0 {
			b.mu.Unlock()
			return
		}
		if b.waiter {
			b.waiter = false
			b.mu.Unlock()
			holdWaitMu.Lock()
			holdWait.Broadcast()
			holdWaitMu.Unlock()
			b.mu.Lock()
		}
		if b.state != bufDeleted || b.uses > 0 {
			b.mu.Unlock()
			return
		}
	} else {
		if b.donating != donHeld {
			b.mu.Unlock()
			panic("cpu: Unhold without a donation hold")
		}
		b.donating = donNone
		del := b.delLater && b.state == bufLive
		b.delLater = false
		if b.state == bufLive {
			b.where = unique.Handle[string]{}
		}
		if !del {
			b.mu.Unlock()
			return
		}
		b.state = bufDeleted // b.err is where Delete was called
	}
	b.freeLocked() // unlocks
}

// freeLocked frees the memory of a deleted buffer (b.mu held; it unlocks
// it). It does nothing if the memory was freed or handed on before.
func (b *cpuBuffer) freeLocked() {
	b.lit.Data = nil
	b.stopFinalizerLocked()
	rec, rel := b.rec, b.rel
	b.rec = nil
	b.mu.Unlock()
	if rec != nil {
		rec.release()
	} else {
		rel.release()
	}
}

// donatingError reports a hold on a buffer that a running call is taking
// as a donation.
type donatingError struct {
	typ   ir.Type
	where string
}

func (e *donatingError) Error() string {
	at := ""
	if e.where != "" {
		at = " at " + e.where
	}
	return fmt.Sprintf("array %v is being donated to a running call%s: its buffer belongs to that call's results and the array can no longer be used", e.typ, at)
}

func (e *donatingError) Is(target error) bool { return target == backend.ErrDonated }

// Delete frees the buffer's memory now (ir.Deleter). Reading it afterwards
// fails with an error naming the line of the Delete call. Deleting twice, or
// deleting a donated buffer, does nothing. A buffer a running execution
// holds (Hold) is unusable at once but keeps its memory until the
// execution lets go of it; one a running call is taking as a donation is
// that call's, and is deleted only if the call fails.
func (b *cpuBuffer) Delete() error {
	at := callers.Record(2)
	b.mu.Lock()
	if b.state != bufLive {
		b.mu.Unlock()
		return nil
	}
	if b.donating == donHeld {
		b.delLater, b.err = true, (*deletedAt)(at)
		b.mu.Unlock()
		return nil
	}
	b.state, b.err = bufDeleted, (*deletedAt)(at)
	if b.uses > 0 {
		b.mu.Unlock() // the last Unhold frees the memory
		return nil
	}
	b.freeLocked()
	return nil
}

// whereLocked is where the buffer was deleted or donated (b.mu held).
func (b *cpuBuffer) whereLocked() string {
	if b.state == bufDeleted {
		return b.err.Error()
	}
	return siteString(b.where)
}

// donate marks the buffer donated at where (a Go file:line) and hands its
// memory to the caller without freeing it: mem is the buffer's bytes and
// release frees them (wrap them as a result with newPoolBuffer, or call
// release). The buffer's own releaser is disarmed, so ownership moves rather
// than nests: the result's buffer holds the same release function the donated
// one held. Reading the buffer afterwards fails with an error naming where.
func (b *cpuBuffer) donate(where string) (mem []byte, release func(), err error) {
	mem, rec, release, err := b.handOver(where)
	if rec != nil {
		// Its release function is handed out, and may be called more than
		// once: the pool must not recycle the record.
		rec.pool.mu.Lock()
		rec.reuse = false
		rec.pool.mu.Unlock()
		release = rec.release
	}
	return mem, release, err
}

// handOver is donate returning the pool's record of the memory (then
// release is nil) or, for memory without one, its release function.
func (b *cpuBuffer) handOver(where string) (mem []byte, rec *allocRecord, release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case bufFailed:
		return nil, nil, nil, b.err
	case bufDeleted, bufDonated:
		return nil, nil, nil, &freedError{typ: b.lit.Type, donated: b.state == bufDonated, where: b.whereLocked()}
	}
	if b.uses > 0 {
		// A running execution reads it: the caller did not take a
		// donation hold (backend.HoldArgs), which would have waited.
		return nil, nil, nil, fmt.Errorf("array %v is read by a running call and cannot be donated now", b.lit.Type)
	}
	// The memory now belongs to the caller: the finalizer must not free it.
	b.stopFinalizerLocked()
	mem = b.lit.Data
	b.state, b.where = bufDonated, siteOf(where)
	if b.rec != nil {
		rec, b.rec = b.rec, nil
		return mem, rec, nil, nil
	}
	release = b.rel.take()
	if release == nil {
		release = func() {} // memory not from the pools, with nothing to free
	}
	return mem, nil, release, nil
}

// markDonated marks the buffer donated at where (a Go file:line) and frees its
// memory. It does nothing if the buffer is already deleted or donated.
func (b *cpuBuffer) markDonated(where string) {
	if _, release, err := b.donate(where); err == nil {
		release()
	}
}
