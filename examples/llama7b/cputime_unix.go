//go:build unix

package main

import "syscall"

// cpuSeconds is the CPU time (user and system) this process has used, or 0
// where it cannot be read.
func cpuSeconds() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
}
