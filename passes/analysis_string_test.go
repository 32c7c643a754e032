package passes

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"strings"
	"testing"
)

// refUnits formats n bytes the way MemoryAnalysis.String should, computed
// independently: the largest binary unit not above n, two decimals.
func refUnits(n int64) string {
	abs := n
	if abs < 0 {
		abs = -abs
	}
	switch {
	case abs >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case abs >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case abs >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func TestMemoryAnalysisStringUnitsAndFields(t *testing.T) {
	m := MemoryAnalysis{ArgumentBytes: 24, OutputBytes: 12, TempBytes: 1536,
		HostArgumentBytes: 3 << 20, HostOutputBytes: 5 << 30, HostAliasBytes: 64, HostTempBytes: 0, AliasBytes: 8}
	got := m.String()
	want := "device: temp 1.50 KiB, argument 24 B, output 12 B, alias 8 B, total 1.53 KiB; " +
		"host: temp 0 B, argument 3.00 MiB, output 5.00 GiB, alias 64 B, total 5.00 GiB"
	if got != want {
		t.Fatalf("String() =\n%s\nwant\n%s", got, want)
	}
	r := testseed.Rand(t, 7)
	for range 50 {
		m := MemoryAnalysis{}
		fields := []*int64{&m.ArgumentBytes, &m.OutputBytes, &m.AliasBytes, &m.TempBytes,
			&m.HostArgumentBytes, &m.HostOutputBytes, &m.HostAliasBytes, &m.HostTempBytes}
		for _, f := range fields {
			*f = r.Int64N(1 << uint(r.IntN(40)+1))
		}
		s := m.String()
		for _, part := range []string{
			"argument " + refUnits(m.ArgumentBytes), "output " + refUnits(m.OutputBytes),
			"alias " + refUnits(m.AliasBytes), "temp " + refUnits(m.TempBytes),
			"total " + refUnits(m.TotalBytes()),
			"argument " + refUnits(m.HostArgumentBytes), "output " + refUnits(m.HostOutputBytes),
			"alias " + refUnits(m.HostAliasBytes), "temp " + refUnits(m.HostTempBytes),
			"total " + refUnits(m.HostTotalBytes()),
		} {
			if !strings.Contains(s, part) {
				t.Fatalf("%+v: String() = %q lacks %q", m, s, part)
			}
		}
	}
}
