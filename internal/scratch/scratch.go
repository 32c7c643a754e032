// Package scratch holds helpers for the per-call scratch slices of the
// dispatch paths (runtime's jitted calls, the CPU backend's executions).
package scratch

// ClearSmall is clear(s), element by element for the few elements a call's
// scratch slices hold: cheaper than clear's bulk write barrier while the
// garbage collector marks, and nothing at all for an empty slice.
func ClearSmall[T any](s []T) {
	if len(s) > 8 {
		clear(s)
		return
	}
	var zero T
	for i := range s {
		s[i] = zero
	}
}
