//go:build !unix

package parallel

// CPUTime returns 0: the process's CPU time is not measured here (see
// the unix version).
func CPUTime() float64 { return 0 }
