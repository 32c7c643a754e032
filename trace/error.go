package trace

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

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

const modulePrefix = "github.com/ferryml/ferry/"

// libraryPackages are skipped when looking for the user's call site.
var libraryPackages = []string{"trace", "runtime", "backend", "cpu", "ir", "passes", "internal/", "nn", "optim", "random", "cuda", "interop"}

func isLibraryFrame(fr runtime.Frame) bool {
	if strings.HasSuffix(fr.File, "_test.go") {
		return false
	}
	fn := fr.Function
	if strings.HasPrefix(fn, "reflect.") || strings.HasPrefix(fn, "runtime.") {
		return true
	}
	if !strings.HasPrefix(fn, modulePrefix) {
		return false
	}
	rest := fn[len(modulePrefix):]
	for _, p := range libraryPackages {
		if strings.HasPrefix(rest, p) {
			next := rest[len(p):]
			if strings.HasSuffix(p, "/") || strings.HasPrefix(next, ".") || strings.HasPrefix(next, "/") {
				return true
			}
		}
	}
	return false
}

// CallerLocation returns the file (base name with its directory) and line of the
// innermost caller outside Ferry's library packages: the user's line.
//
// The stack is recorded through internal/callers and symbolised once per
// distinct stack, so a repeated call from one place costs well under a
// microsecond.
func CallerLocation() (string, int) {
	return callers.Record(2).Location(UserLocation)
}

// UserLocation is CallerLocation for a captured call stack (from
// runtime.Callers): the innermost frame outside Ferry's library packages, or the
// outermost frame if all are library frames; ("?", 0) for an empty stack.
func UserLocation(pcs []uintptr) (string, int) {
	if len(pcs) == 0 {
		return "?", 0
	}
	frames := runtime.CallersFrames(pcs)
	var last runtime.Frame
	for {
		fr, more := frames.Next()
		if fr.Function != "" {
			last = fr
			if !isLibraryFrame(fr) {
				return shortFile(fr.File), fr.Line
			}
		}
		if !more {
			break
		}
	}
	if last.File == "" {
		return "?", 0
	}
	return shortFile(last.File), last.Line
}

func shortFile(f string) string {
	i := strings.LastIndexByte(f, '/')
	if i < 0 {
		return f
	}
	j := strings.LastIndexByte(f[:i], '/')
	return f[j+1:]
}

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
