package main

import (
	"encoding/json"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestHTML: with -html, every case writes its page; the offload cases embed
// the baseline to draw beside them, and each page's analysis is its case's.
func TestHTML(t *testing.T) {
	htmlDir = t.TempDir()
	defer func() { htmlDir, htmlBaseline = "", nil }()
	r := testseed.Rand(t, 2)
	const layers, d, h = 3, 8, 16
	x := randn(r, 1, d, d)
	w := Weights{W1: randn(r, 1/math.Sqrt(d), layers, d, h), W2: randn(r, 1/math.Sqrt(h), layers, h, d)}
	wHost := Weights{W1: trace.DevicePut(w.W1, ir.PinnedHost), W2: trace.DevicePut(w.W2, ir.PinnedHost)}
	rows := map[string]Row{}
	for _, c := range []struct {
		name string
		loss func(Weights, *trace.Array) *trace.Array
		w    Weights
	}{{"baseline", baselineLoss, w}, {"activation_offload", activationOffloadLoss, w}, {"activation_param_offload", paramOffloadLoss, wHost}} {
		row, _, err := run(c.name, c.loss, c.w, x)
		if err != nil {
			t.Fatal(err)
		}
		rows[c.name] = row
	}
	re := regexp.MustCompile(`(?s)id="` + rt.MemoryReportDataID + `">(.*?)</script>`)
	for name, row := range rows {
		page, err := os.ReadFile(filepath.Join(htmlDir, name+".html"))
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindSubmatch(page)
		if m == nil {
			t.Fatalf("%s.html has no data", name)
		}
		var data struct {
			Name     string `json:"name"`
			Analysis struct {
				TotalBytes    int64 `json:"total_bytes"`
				HostTempBytes int64 `json:"host_temp_bytes"`
			} `json:"analysis"`
			Baseline *struct {
				Name string `json:"name"`
			} `json:"baseline"`
		}
		if err := json.Unmarshal(m[1], &data); err != nil {
			t.Fatal(err)
		}
		if data.Name != name || data.Analysis.TotalBytes != row.TotalBytes || data.Analysis.HostTempBytes != row.HostTempBytes {
			t.Errorf("%s.html: %s, total %d host temp %d; the case's row says %d, %d", name, data.Name, data.Analysis.TotalBytes,
				data.Analysis.HostTempBytes, row.TotalBytes, row.HostTempBytes)
		}
		if hasBase := data.Baseline != nil && data.Baseline.Name == "baseline"; hasBase != (name != "baseline") {
			t.Errorf("%s.html: baseline beside it %v", name, hasBase)
		}
	}
}
