package trace

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ferryml/ferry/internal/callers"
)

// Error is a programming error found while tracing or running an op: a shape or
// dtype mismatch, a bad axis, a leaked tracer. It carries the Go source position
// of the user's call that caused it. Ops panic with *Error; rt.Jit's
// error-returning entry points recover it and return it.
type Error struct {
	// Op is the op or function that failed (for example "Add" or "rt.Jit").
	Op string
	// Msg says what was wrong.
	Msg string
	// File and Line locate the user's call.
	File string
	Line int
	// Err is the underlying error, if any (for example an out-of-memory error).
	Err error
}

// Error formats the error as file:line: op: message.
func (e *Error) Error() string {
	loc := ""
	if e.File != "" {
		loc = fmt.Sprintf("%s:%d: ", e.File, e.Line)
	}
	return loc + e.Op + ": " + e.Msg
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Errorf makes an *Error located at the first caller outside Ferry's library
// packages.
func Errorf(op, format string, args ...any) *Error {
	file, line := CallerLocation()
	return &Error{Op: op, Msg: fmt.Sprintf(format, args...), File: file, Line: line}
}

// WrapError makes an *Error for an underlying error (kept for errors.Is/As).
func WrapError(op string, err error) *Error {
	var te *Error
	if errors.As(err, &te) {
		return te
	}
	file, line := CallerLocation()
	return &Error{Op: op, Msg: err.Error(), File: file, Line: line, Err: err}
}

// CallerLocation returns the file (base name with its directory) and line of the
// innermost caller outside Ferry's library packages: the user's line.
//
// The stack is recorded through internal/callers and symbolised once per
// distinct stack, so a repeated call from one place costs well under a
// microsecond.
func CallerLocation() (string, int) {
	return callers.Record(2).Location(callers.UserLocation)
}

// UserLocation is CallerLocation for a captured call stack (from
// runtime.Callers): the innermost frame outside Ferry's library packages, or the
// outermost frame if all are library frames; ("?", 0) for an empty stack
// (callers.UserLocation).
func UserLocation(pcs []uintptr) (string, int) { return callers.UserLocation(pcs) }

// Recover turns a panic into *err: an *Error as it is, anything else as an
// internal error carrying the stack. Use it in a defer: `defer trace.Recover(&err)`.
func Recover(err *error) {
	r := recover()
	if r == nil {
		return
	}
	switch e := r.(type) {
	case *Error:
		*err = e
	case error:
		*err = &Error{Op: "ferry", Msg: "internal error: " + e.Error() + "\n" + string(debug.Stack()), Err: e}
	default:
		*err = &Error{Op: "ferry", Msg: fmt.Sprintf("internal error: %v\n%s", e, debug.Stack())}
	}
}
