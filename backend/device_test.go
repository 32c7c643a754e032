package backend

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
)

// An out-of-memory report names the device when its platform has several,
// and NewOutOfMemoryError lists the live allocations of that device only.
func TestOutOfMemoryNamesDevice(t *testing.T) {
	s := MemStats{Platform: "cpu", Device: 2, Space: ir.Device, Allocator: AllocatorPlatform, Capacity: 1000, Limit: 1000, BytesInUse: 900}
	live := []Allocation{
		{Platform: "cpu", Device: 2, Space: ir.Device, What: "a", Bytes: 500, Site: "x.go:1", Born: time.Now()},
		{Platform: "cpu", Device: 1, Space: ir.Device, What: "b", Bytes: 700, Site: "x.go:2", Born: time.Now()},
		{Platform: "cpu", Device: 2, Space: ir.PinnedHost, What: "c", Bytes: 600, Site: "x.go:3", Born: time.Now()},
	}
	e := NewOutOfMemoryError(s, 200, "output 0 of f", "", live)
	if e.Device != 2 || len(e.Largest) != 1 || e.Largest[0].What != "a" || e.Largest[0].Device != 2 {
		t.Fatalf("report %+v lists %+v, want device 2's device allocation a only", e, e.Largest)
	}
	if msg := e.Error(); !strings.HasPrefix(msg, "out of memory in device memory of cpu:2: cannot allocate 200 B for output 0 of f") {
		t.Errorf("report does not name the device:\n%s", msg)
	}
	one := &OutOfMemoryError{Platform: "cpu", Space: ir.Device, Requested: 10, Devices: 1}
	if msg := one.Error(); !strings.HasPrefix(msg, "out of memory in device memory: cannot allocate 10 B") {
		t.Errorf("a single device is not named:\n%s", msg)
	}
	many := &OutOfMemoryError{Platform: "cpu", Space: ir.PinnedHost, Requested: 10, Devices: 8}
	if msg := many.Error(); !strings.HasPrefix(msg, "out of memory in pinned_host memory of cpu:0: ") {
		t.Errorf("device 0 of 8 is not named:\n%s", msg)
	}
}

// FERRY_CPU_DEVICES sets MemoryConfig.Devices; unset, one device.
func TestCPUDevicesEnv(t *testing.T) {
	t.Setenv(EnvCPUDevices, "")
	c, err := MemoryConfigFromEnv()
	if err != nil || c.Devices != 1 {
		t.Fatalf("unset: %+v, %v; want 1 device", c, err)
	}
	t.Setenv(EnvCPUDevices, " 8 ")
	if c, err = MemoryConfigFromEnv(); err != nil || c.Devices != 8 {
		t.Fatalf("8: %+v, %v", c, err)
	}
	for _, bad := range []string{"0", "1.5", "x", "1025"} {
		t.Setenv(EnvCPUDevices, bad)
		if _, err := MemoryConfigFromEnv(); err == nil || !strings.Contains(err.Error(), EnvCPUDevices) {
			t.Errorf("%q: error %v does not name %s", bad, err, EnvCPUDevices)
		}
	}
	if DeviceName("cpu", 3) != "cpu:3" {
		t.Error(DeviceName("cpu", 3))
	}
}
