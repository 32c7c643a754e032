//go:build !(amd64 && linux)

package vmath

// hwRuns reports whether this machine runs the generated code: never here.
func hwRuns(vex bool) bool { return false }
