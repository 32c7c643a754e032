package backend

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// ExecTarget is what the envelope of an execution (Call) needs to know of a
// backend: which buffers are its own, where they live, and how to bring in
// and free one. B is the backend's buffer type.
type ExecTarget[B ir.Buffer] interface {
	// Platform names the backend's devices in errors ("cpu", "cuda").
	Platform() string
	// Own returns buf as one of the backend's buffers, or false when buf
	// is another backend's.
	Own(buf ir.Buffer) (B, bool)
	// Import makes a buffer of the backend, on device dev, holding l, the
	// contents of another backend's buffer.
	Import(l *ir.Literal, dev int) (B, error)
	// Placed returns the device whose memory holds b and whether b must be
	// on the call's device to be read (false for memory every device reads,
	// as pinned host memory).
	Placed(b B) (dev int, bound bool)
	// State returns b's state.
	State(b B) *BufferState
	// Free frees b's memory: b was imported and is no longer needed, or
	// was donated (its State's Donate succeeded) and no result took it.
	Free(b B)
}

// Call is the envelope of one execution of a compiled program, the same on
// every backend: Start checks the arguments against the program's
// parameters and makes them the backend's buffers; the backend runs the
// program over Args, taking the memory of donated arguments its results
// reuse (BufferState.Donate); End then marks the donated arguments no
// result took as donated (freeing their memory) when the run succeeded,
// and frees the buffers Start imported.
//
// The caller of the backend's Execute holds the arguments (HoldArgs) for
// the whole call, so that a Delete or a donation in another goroutine does
// not free them under it; the envelope reads them as held.
type Call[B ir.Buffer] struct {
	// Args are the arguments as the backend's buffers.
	Args []B
	t    ExecTarget[B]
	// donated[i] says parameter i is donated; site is where the call was
	// made (ExecOptions.DonationSite).
	donated []bool
	site    string
	// imported lists the arguments Start imported.
	imported []int
}

// Start checks the arguments of an execution on device dev of t against
// the parameter types params, of which donated are donated, and makes c
// their envelope: the count, each argument's type (dtype, shape and memory
// space) and device, and that none is deleted or donated already, nor
// donated and passed twice. Errors name the argument. Arguments of other
// backends are imported (ExecTarget.Import). site is the call's
// ExecOptions.DonationSite. Start reuses the memory of c's slices, so that
// a backend keeping its Calls in a pool runs its calls without allocating;
// on error, c holds nothing.
func (c *Call[B]) Start(t ExecTarget[B], params []*ir.Value, donated []bool, args []ir.Buffer, dev int, site string) error {
	if len(args) != len(params) {
		return fmt.Errorf("%d arguments, want %d", len(args), len(params))
	}
	c.t, c.donated, c.site = t, donated, site
	c.Args = slices.Grow(c.Args[:0], len(args))[:len(args)]
	c.imported = c.imported[:0]
	for i, a := range args {
		err := c.check(i, a, params[i].Type, args)
		if err == nil {
			err = c.bring(i, a, dev)
		}
		if err != nil {
			c.End(err)
			return err
		}
	}
	return nil
}

// check checks argument i, a, of args against parameter type want.
func (c *Call[B]) check(i int, a ir.Buffer, want ir.Type, args []ir.Buffer) error {
	if a == nil {
		return fmt.Errorf("argument %d is nil", i)
	}
	if at := a.Type(); !at.EqualUnsharded(want) {
		return fmt.Errorf("argument %d is %v, want %v", i, at, want)
	}
	if c.isDonated(i) {
		for k, o := range args {
			if k != i && o == a {
				return &HoldError{Arg: i, Also: k, Type: a.Type()}
			}
		}
	}
	return nil
}

// bring makes argument i, a, the backend's buffer in c.Args[i], checking
// that it is usable and on device dev.
func (c *Call[B]) bring(i int, a ir.Buffer, dev int) error {
	if b, ok := c.t.Own(a); ok {
		// The caller holds it (HoldArgs): a buffer deleted meanwhile keeps
		// its memory for the call.
		if err := c.t.State(b).Usable(a.Type(), true); err != nil {
			return fmt.Errorf("argument %d: %w", i, err)
		}
		if d, bound := c.t.Placed(b); bound && d != dev {
			p := c.t.Platform()
			return fmt.Errorf("argument %d (%v) is on %s:%d, but the call runs on %s:%d: put it there first (rt.ToDevice)", i, a.Type(), p, d, p, dev)
		}
		c.Args[i] = b
		return nil
	}
	l, err := a.Literal()
	if err != nil {
		return fmt.Errorf("argument %d: %w", i, err)
	}
	b, err := c.t.Import(l, dev)
	if err != nil {
		return fmt.Errorf("argument %d: %w", i, err)
	}
	c.Args[i] = b
	c.imported = append(c.imported, i)
	return nil
}

// isDonated reports whether parameter i is donated.
func (c *Call[B]) isDonated(i int) bool { return i < len(c.donated) && c.donated[i] }

// Imported reports whether argument i is a buffer Start imported from
// another backend.
func (c *Call[B]) Imported(i int) bool {
	for _, k := range c.imported {
		if k == i {
			return true
		}
	}
	return false
}

// End ends the call, which failed with err or succeeded (err nil). On
// success, every donated argument that no result took is marked donated
// at the call's site and its memory freed, so that a donated argument is
// unusable after the call whether or not a result reused its memory
// (reads fail with ErrDonated); on failure the arguments stay as they
// were. Either way the imported buffers are freed, and c is emptied for
// the next Start.
func (c *Call[B]) End(err error) {
	if err == nil {
		for i, b := range c.Args {
			if c.isDonated(i) && c.t.State(b).Donate(b.Type(), c.site) == nil {
				c.t.Free(b)
			}
		}
	}
	for _, i := range c.imported {
		b := c.Args[i]
		if c.t.State(b).Delete() {
			c.t.Free(b)
		}
	}
	clear(c.Args)
	c.Args, c.imported = c.Args[:0], c.imported[:0]
	c.t, c.donated, c.site = nil, nil, ""
}

// Results returns a slice of n results: opts.Results when its capacity
// suffices (ExecOptions.Results), else a new one.
func Results(opts ExecOptions, n int) []ir.Buffer {
	if cap(opts.Results) >= n {
		return opts.Results[:n]
	}
	return make([]ir.Buffer, n)
}

// AbortComms aborts the communicators of a per-device execution that
// failed with err (ExecOptions.Comms and DeviceComms), so that the other
// devices' collectives return an error instead of waiting for this one's.
// A second Abort of a communicator changes nothing.
func AbortComms(opts ExecOptions, err error) {
	for _, c := range opts.Comms {
		if c != nil {
			c.Abort(err)
		}
	}
	for _, c := range opts.DeviceComms {
		if c != nil {
			_ = c.Abort()
		}
	}
}
