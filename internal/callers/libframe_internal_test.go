package callers

import (
	"runtime"
	"testing"
)

// Frames of Ferry's library packages, backend included, are skipped when
// looking for the user's line; a package whose name only starts like one,
// user code and test files are not.
func TestIsLibraryFrame(t *testing.T) {
	for fn, want := range map[string]bool{
		"github.com/ferryml/ferry/backend.Register":      true,
		"github.com/ferryml/ferry/runtime.FromSlice":     true,
		"github.com/ferryml/ferry/cuda.(*Backend).alloc": true,
		"github.com/ferryml/ferry/cpu/cpuexec.Run":       true,
		"github.com/ferryml/ferry/backendx.F":            false,
		"github.com/ferryml/ferry/examples/mlp.main":     false,
		"example.com/user.main":                          false,
		"runtime.goexit":                                 true,
	} {
		if got := isLibraryFrame(runtime.Frame{Function: fn, File: "/src/x.go"}); got != want {
			t.Errorf("isLibraryFrame(%s) = %v, want %v", fn, got, want)
		}
	}
	if isLibraryFrame(runtime.Frame{Function: "github.com/ferryml/ferry/backend.TestX", File: "/src/backend/backend_test.go"}) {
		t.Error("a test file's frame counts as library code")
	}
}
