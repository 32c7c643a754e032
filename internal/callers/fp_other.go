//go:build !amd64

package callers

import "unsafe"

// callerFP reports no frame pointer: Record falls back to runtime.Callers.
func callerFP() unsafe.Pointer { return nil }
