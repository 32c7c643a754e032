//go:build !amd64 && !arm64

package trace

// gkey returns a key of the calling goroutine: its id, from a stack trace,
// on architectures without the fast path (gkey_asm.go).
func gkey() uintptr { return uintptr(goid()) }
