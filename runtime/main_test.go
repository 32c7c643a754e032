package runtime

import (
	"os"
	"testing"

	"github.com/ferryml/ferry/cpu"
)

// TestMain runs the package's tests with uninitialised pool memory poisoned
// (0xff bytes, NaN in every float type), so that a CPU kernel reading
// memory it did not write shows up as a wrong result in any test.
func TestMain(m *testing.M) {
	cpu.PoisonUninitForTest()
	os.Exit(m.Run())
}
