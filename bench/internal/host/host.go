// Package host describes the machine a benchmark runs on, for the reports of
// the programs under bench/.
package host

import (
	"os"
	"runtime"
	"strings"
)

// CPU is the processor's model name from /proc/cpuinfo, or GOARCH where it
// cannot be read.
func CPU() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					return strings.TrimSpace(v)
				}
			}
		}
	}
	return runtime.GOARCH
}

// LoadAverage is the 1-, 5- and 15-minute load averages, or "" where unknown.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
