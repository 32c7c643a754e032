package backend

import (
	"fmt"
	"strconv"
	"sync"
	"unique"

	"github.com/ferryml/ferry/internal/callers"
	"github.com/ferryml/ferry/ir"
)

// BufferState is the life of an array's buffer, shared by the backends: a
// buffer is live until it is deleted (Delete), donated to a call's results
// (Donate) or made without memory (Fail), and running executions hold it
// (ir.Holder) so that a Delete meanwhile does not free its memory under
// them. The backend's buffer keeps the memory and frees it when a method
// of its BufferState says so: Delete and Unhold report true at most once
// per buffer, and never after a successful Donate, which hands the memory
// to the caller instead.
//
// A usage hold (an execution reading the buffer) keeps the memory of a
// buffer deleted meanwhile until it ends. A donation hold (an execution
// that will reuse the buffer for its results) waits for the usage holds to
// end, and while it is taken or awaited no other call can hold the buffer;
// a Delete while it is held is settled when it ends: nothing happens if
// the call took the memory (Donate), else the buffer is deleted then.
//
// The zero BufferState is a live buffer. It takes 40 bytes.
type BufferState struct {
	mu       sync.Mutex
	state    bufState
	donating donation
	flags    bufFlags
	// uses counts the usage holds.
	uses int32
	// where is where the buffer was donated, or is being donated (a Go
	// file:line), interned.
	where unique.Handle[string]
	// err is why the buffer has no memory (Fail) or, as a *deletedAt, where
	// it was deleted (also while a Delete waits for a donating call).
	err error
}

type bufState uint8

const (
	bufLive bufState = iota
	bufDeleted
	bufDonated
	bufFailed
)

// donation is the state of a buffer's donation hold.
type donation uint8

const (
	donNone    donation = iota
	donWaiting          // a donating call waits for the usage holds to end
	donHeld             // a donating call holds the buffer
)

type bufFlags uint8

const (
	// flagDelLater: Delete was called while a donating call held the
	// buffer; if the call does not take it, it is deleted when the call
	// lets go.
	flagDelLater bufFlags = 1 << iota
	// flagWaiter: a donation hold waits on holdWait for the uses to end.
	flagWaiter
)

// holdWait is where donation holds wait for a buffer's usage holds to end:
// a waiter holds holdWaitMu from before it looks at the buffer's uses to
// its Wait, and the Unhold that ends the last usage hold broadcasts under
// it, so no wake-up is lost. Waits are rare (a donation racing a read), so
// one condition for all buffers costs nothing.
var (
	holdWaitMu sync.Mutex
	holdWait   = sync.NewCond(&holdWaitMu)
)

// siteOf interns a Go file:line ("" is the zero Handle).
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

// deletedAt is where a buffer was deleted, symbolised only when reported.
// It is an error only so that it can share BufferState.err (converting the
// pointer to an error allocates nothing); it is never returned.
type deletedAt callers.Stack

func (d *deletedAt) Error() string {
	file, line := (*callers.Stack)(d).Location(callers.UserLocation)
	return file + ":" + strconv.Itoa(line)
}

// freedError reports a use of a deleted or donated buffer: it matches
// ErrDonated or ErrDeleted.
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
	return (target == ErrDonated && e.donated) || (target == ErrDeleted && !e.donated)
}

// donatingError reports a hold on a buffer that a running call is taking
// as a donation: it matches ErrDonated.
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

func (e *donatingError) Is(target error) bool { return target == ErrDonated }

// Fail marks a new buffer as one without memory: every use fails with err.
func (s *BufferState) Fail(err error) {
	s.mu.Lock()
	s.state, s.err = bufFailed, err
	s.mu.Unlock()
}

// Usable returns nil if the buffer (of type t) can be read, else the error
// naming where it was deleted or donated. held says the caller holds it (a
// usage or donation hold): a buffer deleted while held keeps its memory
// until its holds end, and the holder may read it.
func (s *BufferState) Usable(t ir.Type, held bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state == bufLive, held && s.state == bufDeleted && s.uses > 0:
		return nil
	case s.state == bufFailed:
		return s.err
	}
	return s.freedErrLocked(t)
}

// Donating reports whether a donation hold is taken or awaited.
func (s *BufferState) Donating() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.donating != donNone
}

// Hold takes a usage hold (donate false) or a donation hold (donate true)
// on the buffer, of type t, for a running execution (ir.Holder); where is
// the donating call's site. A donation hold waits until no usage hold is
// held, calling waiting (unless nil) first. Both fail if the buffer is
// deleted, donated, or being donated.
func (s *BufferState) Hold(t ir.Type, donate bool, where string, waiting func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.holdErrLocked(t); err != nil {
		return err
	}
	if !donate {
		s.uses++
		return nil
	}
	s.donating, s.where = donWaiting, siteOf(where)
	if s.uses > 0 {
		s.mu.Unlock()
		if waiting != nil {
			waiting()
		}
		holdWaitMu.Lock()
		s.mu.Lock()
		for s.uses > 0 {
			s.flags |= flagWaiter
			s.mu.Unlock()
			holdWait.Wait()
			s.mu.Lock()
		}
		holdWaitMu.Unlock()
	}
	if s.state != bufLive { // deleted while waiting
		s.donating, s.where = donNone, unique.Handle[string]{}
		return s.holdErrLocked(t)
	}
	s.donating = donHeld
	return nil
}

// holdErrLocked is why a hold cannot be taken, or nil (s.mu held).
func (s *BufferState) holdErrLocked(t ir.Type) error {
	switch {
	case s.state == bufFailed:
		return s.err
	case s.state != bufLive:
		return s.freedErrLocked(t)
	case s.donating != donNone:
		return &donatingError{typ: t, where: siteString(s.where)}
	}
	return nil
}

// freedErrLocked is the error of using the deleted or donated buffer (s.mu
// held).
func (s *BufferState) freedErrLocked(t ir.Type) error {
	if s.state == bufDeleted {
		return &freedError{typ: t, where: s.err.Error()}
	}
	return &freedError{typ: t, donated: true, where: siteString(s.where)}
}

// Unhold ends a hold taken by Hold (ir.Holder) and reports whether the
// backend must free the memory now: at the end of the last usage hold of
// a buffer deleted meanwhile (which also wakes a donation waiting for it),
// or at the end of a donation hold whose call did not take the buffer when
// Delete was called meanwhile.
func (s *BufferState) Unhold(donate bool) (free bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !donate {
		if s.uses <= 0 {
			panic("backend: Unhold without a usage hold")
		}
		s.uses--
		if s.uses > 0 {
			return false
		}
		// Decided before the lock is let go below: a Delete meanwhile sees
		// no uses and frees the memory itself.
		free = s.state == bufDeleted
		if s.flags&flagWaiter != 0 {
			s.flags &^= flagWaiter
			s.mu.Unlock()
			holdWaitMu.Lock()
			holdWait.Broadcast()
			holdWaitMu.Unlock()
			s.mu.Lock()
		}
		return free
	}
	if s.donating != donHeld {
		panic("backend: Unhold without a donation hold")
	}
	s.donating = donNone
	del := s.flags&flagDelLater != 0 && s.state == bufLive
	s.flags &^= flagDelLater
	if s.state == bufLive {
		s.where = unique.Handle[string]{}
	}
	if !del {
		return false
	}
	s.state = bufDeleted // s.err is where Delete was called
	return true
}

// Delete marks the buffer deleted (ir.Deleter) and reports whether the
// backend must free its memory now. Using the buffer afterwards fails with
// an error naming the line that called the backend's Delete method (the
// caller of Delete's caller). Deleting twice, or deleting a donated buffer,
// does nothing. A buffer an execution holds is unusable at once but keeps
// its memory until the last usage hold ends (Unhold frees it); one a
// running call is taking as a donation is that call's, and is deleted only
// if the call does not take it.
func (s *BufferState) Delete() (free bool) {
	at := callers.Record(3)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != bufLive {
		return false
	}
	if s.donating == donHeld {
		s.flags |= flagDelLater
		s.err = (*deletedAt)(at)
		return false
	}
	s.state, s.err = bufDeleted, (*deletedAt)(at)
	return s.uses == 0
}

// Donate marks the buffer, of type t, donated at where (a Go file:line)
// and hands its memory to the caller, which frees it or gives it to a
// result: the buffer never reports it as to be freed afterwards. It fails,
// leaving the buffer as it was, if the buffer is not live or an execution
// reads it (holds it with a usage hold): the caller did not take a
// donation hold (HoldArgs), which would have waited.
func (s *BufferState) Donate(t ir.Type, where string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state == bufFailed:
		return s.err
	case s.state != bufLive:
		return s.freedErrLocked(t)
	case s.uses > 0:
		return fmt.Errorf("array %v is read by a running call and cannot be donated now", t)
	}
	s.state, s.where = bufDonated, siteOf(where)
	return nil
}
