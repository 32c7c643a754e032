package backend

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// HoldArgs takes, for one execution, a hold (ir.Holder) on every
// argument buffer that has holds: a donation hold on args[i] where
// donated[i], a usage hold on the others. The caller runs the execution
// and then calls ReleaseArgs with the same arguments, whatever the
// execution returned. On error nothing is held.
//
// While an execution holds its arguments, deleting one of them (in another
// goroutine) does not free its memory under the execution: the memory is
// freed when the execution releases it. A donated argument is taken only
// once the executions that read it are done (the donation hold waits for
// them); an array being donated cannot be read or donated by another call
// meanwhile (that call fails, naming the donating call's site).
//
// The donation holds are taken first and the usage holds after, and usage
// holds never wait: an execution that holds usage holds is past taking its
// holds, so every wait for usage holds to end is a wait for executions
// that are running, and no two executions wait for each other.
func HoldArgs(args []ir.Buffer, donated []bool, site string) error {
	for i, a := range args {
		if i >= len(donated) || !donated[i] || a == nil {
			continue
		}
		for k, o := range args {
			if k != i && o == a {
				return &HoldError{Arg: i, Also: k, Type: a.Type()}
			}
		}
	}
	for i, a := range args {
		if i >= len(donated) || !donated[i] {
			continue
		}
		if h, ok := a.(ir.Holder); ok {
			if err := h.Hold(true, site); err != nil {
				unhold(args[:i], donated, true)
				return &HoldError{Arg: i, Also: -1, Type: a.Type(), Err: err}
			}
		}
	}
	for i, a := range args {
		if i < len(donated) && donated[i] {
			continue
		}
		if h, ok := a.(ir.Holder); ok {
			if err := h.Hold(false, site); err != nil {
				unhold(args[:i], donated, false)
				unhold(args, donated, true)
				return &HoldError{Arg: i, Also: -1, Type: a.Type(), Err: err}
			}
		}
	}
	return nil
}

// HoldError is HoldArgs's error: argument Arg (of type Type) could not be
// held because of Err, or (Also >= 0) is donated and also passed as
// argument Also.
type HoldError struct {
	Arg, Also int
	Type      ir.Type
	Err       error
}

func (e *HoldError) Error() string { return e.Describe(nil) }

// Describe is the error with name(i) naming argument i ("argument i" if
// name is nil).
func (e *HoldError) Describe(name func(i int) string) string {
	if name == nil {
		name = func(i int) string { return fmt.Sprintf("argument %d", i) }
	}
	if e.Also >= 0 {
		return fmt.Sprintf("%s (%v) is donated and also passed as %s: a call cannot both read an array and reuse its buffer for its results", name(e.Arg), e.Type, name(e.Also))
	}
	return fmt.Sprintf("%s: %v", name(e.Arg), e.Err)
}

// Unwrap returns the reason the argument could not be held.
func (e *HoldError) Unwrap() error { return e.Err }

// ReleaseArgs ends the holds HoldArgs took on args.
func ReleaseArgs(args []ir.Buffer, donated []bool) {
	unhold(args, donated, false)
	unhold(args, donated, true)
}

// unhold ends the donation holds (donate) or the usage holds (!donate) on
// args.
func unhold(args []ir.Buffer, donated []bool, donate bool) {
	for i, a := range args {
		if (i < len(donated) && donated[i]) != donate {
			continue
		}
		if h, ok := a.(ir.Holder); ok {
			h.Unhold(donate)
		}
	}
}
