package main

import (
	"math/rand/v2"
	"testing"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// testSizes are small versions of every case (a 256 KiB pairwise tensor, a
// 512 KiB matrix, a 0.1 MiB stack).
var testSizes = sizes{
	Nodes: 64, Channels: 16,
	MatRows: 256, MatCols: 512,
	FullRows: 4096, FullCols: 8192,
	Layers: 4, DModel: 64, Heads: 2, Hidden: 128,
}

// TestPeaksHoldTheirOutputs runs the cases in sequence in one process, as the
// program does, twice over, and checks that every measured peak holds at
// least the case's output (it is alive when the peak is read), and the
// outputs against the sizes. An earlier case's memory freed during a later
// case once made attention_jit report 0.0065 × its output.
func TestPeaksHoldTheirOutputs(t *testing.T) {
	s := testSizes
	pairwise := int64(s.Nodes * s.Nodes * s.Channels * 4)
	want := map[string]int64{
		"attention_eager": pairwise, "attention_eager_kept": pairwise, "attention_jit": pairwise,
		"random_matrix":      int64(s.MatRows * s.MatCols * 4),
		"random_matrix_full": int64(s.FullRows * s.FullCols * 4),
		"stack_bf16":         -1, // checked against its leaves in the program
	}
	for round := range 2 {
		rows, err := run(s)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(rows) != len(want) {
			t.Fatalf("round %d: %d rows", round, len(rows))
		}
		for _, r := range rows {
			if w, ok := want[r.Case]; !ok || (w > 0 && r.OutputBytes != w) {
				t.Errorf("round %d: %s: output %d bytes, want %d", round, r.Case, r.OutputBytes, w)
			}
			if r.Case == "random_matrix_full" { // analysed, not run
				if r.PeakDeviceBytes != 0 || r.AnalysedTotalBytes < r.OutputBytes {
					t.Errorf("round %d: %+v", round, r)
				}
				continue
			}
			if r.OutputBytes <= 0 || r.PeakDeviceBytes < r.OutputBytes {
				t.Errorf("round %d: %s: peak %d bytes < output %d bytes (ratio %.4f)", round, r.Case, r.PeakDeviceBytes, r.OutputBytes, r.Ratio)
			}
		}
		// The kept case holds 3 pairwise tensors besides its output.
		if r := rows[1]; r.PeakDeviceBytes < 4*pairwise {
			t.Errorf("round %d: attention_eager_kept: peak %d < 4 × %d", round, r.PeakDeviceBytes, pairwise)
		}
	}
}

// TestMeasureEarlierMemoryFreedDuring: memory in use before a case and
// freed while it runs (as an earlier case's garbage is, by its cleanups)
// must not hide the case's output: measure reports the peak with the output
// in it, or an error, never a smaller peak.
func TestMeasureEarlierMemoryFreedDuring(t *testing.T) {
	n := 1<<14 + rand.IntN(1<<14)
	earlier := rt.FromSlice(make([]float32, n))
	peak, out, err := measure(func() []*trace.Array {
		if err := earlier.Delete(); err != nil {
			t.Fatal(err)
		}
		return []*trace.Array{rt.FromSlice(make([]float32, n))}
	})
	if err == nil && peak < out {
		t.Fatalf("peak %d bytes < output %d bytes, and no error", peak, out)
	}
}
