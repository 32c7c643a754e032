package trace_test

import (
	"fmt"
	"os"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
)

// TestMain gives the CPU backend 8 virtual devices, the meshes of the
// ShardMap tests, whose jitted programs run partitioned over them.
func TestMain(m *testing.M) {
	if err := rt.SetCPUDeviceCount(8); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}
