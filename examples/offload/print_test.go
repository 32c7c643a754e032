package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// TestTablesCarryUnits prints random rows and checks that every size, device
// and host, is printed in binary units (backend.FormatBytes) on its case's
// line of each table.
func TestTablesCarryUnits(t *testing.T) {
	rng := testseed.Rand(t, 0)
	size := func() int64 { return rng.Int64N(1 << (10 + rng.IntN(25))) }
	rows := []Row{{Case: "baseline"}, {Case: "activation_offload"}, {Case: "optimizer_offload"}}
	for i := range rows {
		r := &rows[i]
		for _, p := range []*int64{&r.TempBytes, &r.ArgumentBytes, &r.OutputBytes, &r.AliasBytes, &r.TotalBytes, &r.PeakDeviceBytes,
			&r.XLATempBytes, &r.XLATotalBytes, &r.HostTempBytes, &r.HostArgumentBytes, &r.HostOutputBytes} {
			*p = size()
		}
	}
	var b bytes.Buffer
	printTables(&b, rows)
	device, host, ok := strings.Cut(b.String(), "host (pinned_host) memory:")
	if !ok {
		t.Fatalf("no host memory table:\n%s", b.String())
	}
	line := func(table, name string) string {
		for _, l := range strings.Split(table, "\n") {
			if strings.HasPrefix(l, name+" ") {
				return l
			}
		}
		t.Fatalf("no line for %s in\n%s", name, table)
		return ""
	}
	for _, r := range rows {
		d, h := line(device, r.Case), line(host, r.Case)
		for _, n := range []int64{r.TempBytes, r.ArgumentBytes, r.OutputBytes, r.AliasBytes, r.TotalBytes, r.PeakDeviceBytes, r.XLATempBytes, r.XLATotalBytes} {
			if !strings.Contains(d, " "+backend.FormatBytes(n)) {
				t.Errorf("device line %q lacks %s", d, backend.FormatBytes(n))
			}
		}
		for _, n := range []int64{r.HostTempBytes, r.HostArgumentBytes, r.HostOutputBytes} {
			if !strings.Contains(h, " "+backend.FormatBytes(n)) {
				t.Errorf("host line %q lacks %s", h, backend.FormatBytes(n))
			}
		}
	}
}
