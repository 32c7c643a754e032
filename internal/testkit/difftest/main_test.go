package difftest

import (
	"fmt"
	"os"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
)

// TestMain gives the CPU backend the 8 virtual devices of the sharded
// test's meshes. The unsharded test runs cpuexec on its own allocator and
// does not see them.
func TestMain(m *testing.M) {
	if err := rt.SetCPUDeviceCount(8); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
