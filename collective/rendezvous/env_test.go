package rendezvous_test

import (
	"os"
	"testing"
)

// unsetenv unsets name for the rest of the test (t.Setenv first, so that
// it is restored).
func unsetenv(t *testing.T, name string) {
	t.Helper()
	t.Setenv(name, "")
	os.Unsetenv(name)
}
