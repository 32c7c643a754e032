//go:build amd64

package parallel

// pause executes n PAUSE instructions: a spin-wait hint that lets the
// other hyperthread of the core run and keeps the polling loop from
// flooding the memory system, without entering the Go scheduler.
//
//go:noescape
func pause(n int)
