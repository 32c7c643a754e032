package callers

import (
	"runtime"
	"strings"
)

const modulePrefix = "github.com/ferryml/ferry/"

// libraryPackages, under modulePrefix, are skipped when looking for the user's call site.
var libraryPackages = []string{"trace", "runtime", "backend", "cpu", "ir", "passes", "internal/", "nn", "optim", "random", "cuda", "interop"}

// isLibraryFrame reports whether fr belongs to Ferry's library code.
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

// UserLocation returns the file (base name with its directory) and line of
// the user's frame of a captured call stack (from runtime.Callers or
// Record): the innermost frame outside Ferry's library packages, or the
// outermost frame if all are library frames; ("?", 0) for an empty stack.
// Frames of test files are never library frames.
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
