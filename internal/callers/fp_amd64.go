package callers

import "unsafe"

// callerFP returns its caller's frame pointer (written in assembly).
func callerFP() unsafe.Pointer
