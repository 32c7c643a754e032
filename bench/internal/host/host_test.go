package host

import (
	"os"
	"strings"
	"testing"
)

func TestCPUAndLoadAverage(t *testing.T) {
	if CPU() == "" {
		t.Error("CPU() is empty")
	}
	la := LoadAverage()
	if _, err := os.Stat("/proc/loadavg"); err == nil && len(strings.Fields(la)) != 3 {
		t.Errorf("LoadAverage() = %q, want three numbers", la)
	}
}
