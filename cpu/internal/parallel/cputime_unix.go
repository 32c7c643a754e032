//go:build unix

package parallel

import "syscall"

// CPUTime returns the user and system CPU time of the process so far, in
// seconds (0 where it is not measured): for benchmarks that report CPU
// time per operation next to wall time.
func CPUTime() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
