//go:build amd64 || arm64

package trace

// gkey returns a key of the calling goroutine: the address of its runtime
// g, unique among live goroutines and read in a couple of instructions
// (goid, which parses a stack trace, costs about a microsecond). A g is
// reused by a later goroutine once its goroutine exits, so a tracer pushed
// on a goroutine must be popped on it before it exits (Push's doc says so;
// Push drops a stack a dead goroutine left behind, see goroutineKey).
func gkey() uintptr
