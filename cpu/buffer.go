package cpu

import (
	"fmt"
	goruntime "runtime"
	"sync"
	"sync/atomic"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/cpu/gemm"
	"github.com/ferryml/ferry/ir"
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
//
// The buffer's life (live, deleted, donated; the holds of running
// executions) is its backend.BufferState; the buffer frees its memory when
// that says so, exactly once. Only the one path that frees or hands over
// the memory touches rec, rel and fin after the buffer is made (and the
// finalizer, which runs only when no other path can).
type cpuBuffer struct {
	lit ir.Literal // must stay the first field (see above); its Type never changes
	st  backend.BufferState
	rec *allocRecord // the pool's record of the memory, which frees it; or
	rel *releaser    // frees memory that has no record (rec nil)
	// dev is the device whose pools hold the memory; committed says the
	// buffer is committed to it (backend.DeviceBuffer). Both are set when
	// the buffer is made and never change.
	dev       uint16
	committed bool
	fin       bool // a finalizer is set
	// readOnly says the memory was declared read-only to the matrix
	// products' packed-weight cache (gemm.ReadOnly), which must forget it
	// before the memory is freed or handed over.
	readOnly atomic.Bool
}

// markReadOnly declares the buffer's memory read-only to the packed-weight
// cache: it is an argument of a call that does not donate it, and an array's
// contents never change while it lives.
func (b *cpuBuffer) markReadOnly() {
	if len(b.lit.Data) > 0 && !b.readOnly.Load() && b.readOnly.CompareAndSwap(false, true) {
		gemm.ReadOnly(b.lit.Data)
	}
}

// forgetReadOnly drops what the packed-weight cache keeps of the memory,
// before it is freed or handed over.
func (b *cpuBuffer) forgetReadOnly(mem []byte) {
	if b.readOnly.Load() {
		gemm.Forget(mem)
		b.readOnly.Store(false)
	}
}

// finalizeBuffer releases the memory of a buffer that became unreachable.
func finalizeBuffer(b *cpuBuffer) {
	b.forgetReadOnly(b.lit.Data)
	rec, rel := b.rec, b.rel
	b.fin = false
	b.rec = nil
	if rec != nil {
		rec.release()
	} else {
		rel.release()
	}
}

// stopFinalizer removes the buffer's finalizer, as its memory is freed or
// handed over now.
func (b *cpuBuffer) stopFinalizer() {
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
		rec.setArray(l.Type.WithShape(l.Type.Shape), site)
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
		b := &cpuBuffer{lit: ir.Literal{Type: l.Type}}
		b.st.Fail(err)
		return b
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
	if err := b.st.Usable(b.lit.Type, false); err != nil {
		return nil, err
	}
	return &b.lit, nil
}

// heldLiteral is Literal for an execution that holds the buffer (a usage
// or donation hold): a buffer deleted while held keeps its memory until
// its holds end, and the execution reads it.
func (b *cpuBuffer) heldLiteral() (*ir.Literal, error) {
	if err := b.st.Usable(b.lit.Type, true); err != nil {
		return nil, err
	}
	return &b.lit, nil
}

// Hold takes a usage hold (donate false) or a donation hold (donate true) on
// the buffer for a running execution (ir.Holder, backend.BufferState.Hold).
func (b *cpuBuffer) Hold(donate bool, where string) error {
	return b.st.Hold(b.lit.Type, donate, where, holdWaiting)
}

// holdWaiting tells the test hook that a donation hold waits.
func holdWaiting() { holdEvent(HoldEventWait) }

// Unhold ends a hold taken by Hold (ir.Holder), freeing the memory of a
// buffer deleted meanwhile when backend.BufferState.Unhold says so.
func (b *cpuBuffer) Unhold(donate bool) {
	if b.st.Unhold(donate) {
		b.free()
	}
}

// free frees the memory of a deleted buffer.
func (b *cpuBuffer) free() {
	b.forgetReadOnly(b.lit.Data)
	b.lit.Data = nil
	b.stopFinalizer()
	rec, rel := b.rec, b.rel
	b.rec = nil
	if rec != nil {
		rec.release()
	} else {
		rel.release()
	}
}

// Delete frees the buffer's memory now (ir.Deleter), or when the
// executions holding it let go (backend.BufferState.Delete). Reading it
// afterwards fails with an error naming the line of the Delete call.
func (b *cpuBuffer) Delete() error {
	if b.st.Delete() {
		b.free()
	}
	return nil
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
		rec.Reuse = false
		rec.pool.mu.Unlock()
		release = rec.release
	}
	return mem, release, err
}

// handOver is donate returning the pool's record of the memory (then
// release is nil) or, for memory without one, its release function.
func (b *cpuBuffer) handOver(where string) (mem []byte, rec *allocRecord, release func(), err error) {
	if err := b.st.Donate(b.lit.Type, where); err != nil {
		return nil, nil, nil, err
	}
	// The memory now belongs to the caller: the finalizer must not free it.
	b.stopFinalizer()
	mem = b.lit.Data
	b.forgetReadOnly(mem)
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
