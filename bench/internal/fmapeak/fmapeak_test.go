package fmapeak

import (
	"testing"
	"time"
)

// TestPeak checks the loop runs and reports a positive rate (its size is a
// benchmark's business, not a test's).
func TestPeak(t *testing.T) {
	g, isa := Peak(20 * time.Millisecond)
	if !(g > 0) || isa == "" {
		t.Fatalf("Peak = %v GFLOP/s, isa %q", g, isa)
	}
}
