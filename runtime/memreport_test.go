package runtime_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// reportJSON is the part of a memory report's embedded data the tests read,
// with the field names the page documents.
type reportJSON struct {
	Name     string           `json:"name"`
	Title    string           `json:"title"`
	Budget   *budgetJSON      `json:"budget"`
	Analysis map[string]int64 `json:"analysis"`
	Steps    []struct {
		Op, Loc, Path, Iter string
	} `json:"steps"`
	Spaces []struct {
		Space         string  `json:"space"`
		TotalBytes    int64   `json:"total_bytes"`
		TempBytes     int64   `json:"temp_bytes"`
		ArenaBase     int64   `json:"arena_base"`
		Live          []int64 `json:"live"`
		PeakStep      int     `json:"peak_step"`
		PeakBytes     int64   `json:"peak_bytes"`
		PeakTempBytes int64   `json:"peak_temp_bytes"`
		Buffers       []struct {
			ID     string `json:"id"`
			Value  string `json:"value"`
			Region string `json:"region"`
			Kind   string `json:"kind"`
			Plan   string `json:"plan"`
			Type   string `json:"type"`
			Bytes  int64  `json:"bytes"`
			Op     string `json:"op"`
			Loc    string `json:"loc"`
			Of     string `json:"of"`
			Double bool   `json:"double_buffered"`
			Spans  []struct {
				Start, End int
				Y          int64
				Reserved   int
			} `json:"spans"`
		} `json:"buffers"`
	} `json:"spaces"`
	Baseline *reportJSON `json:"baseline"`
}

var reportDataRE = regexp.MustCompile(`(?s)<script type="application/json" id="` + rt.MemoryReportDataID + `">(.*?)</script>`)

// parseReport extracts and decodes the JSON a report page embeds.
func parseReport(t *testing.T, page []byte, into any) {
	t.Helper()
	m := reportDataRE.FindSubmatch(page)
	if m == nil {
		t.Fatalf("the page has no <script type=\"application/json\" id=%q> block", rt.MemoryReportDataID)
	}
	if err := json.Unmarshal(m[1], into); err != nil {
		t.Fatalf("embedded data: %v", err)
	}
	if bytes.Contains(page, []byte("http://")) && !bytes.Contains(page, []byte("http://www.w3.org/2000/svg")) ||
		bytes.Contains(page, []byte("https://")) || bytes.Contains(page, []byte(" src=")) {
		t.Errorf("the page refers to something outside itself")
	}
}

// lineAfter returns the file:line, as op locations print it, of the line after
// its caller's.
func lineAfter() string {
	_, file, line, _ := goruntime.Caller(1)
	return filepath.Base(filepath.Dir(file)) + "/" + filepath.Base(file) + fmt.Sprint(":", line+1)
}

func memRand(r *rand.Rand, shape ...int) *trace.Array {
	n := 1
	for _, d := range shape {
		n *= d
	}
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return rt.FromSlice(s, shape...)
}

// planValues lists the values of a program's plan that the report draws:
// every value of the top-level plan, and every value of a nested plan but
// its parameters (views of the enclosing op's buffers), with the number of
// times each runs (the product of the lengths of the scans around it).
func planValues(p *passes.Program) map[string]struct {
	buf   passes.Buffer
	typ   string
	times int
} {
	out := map[string]struct {
		buf   passes.Buffer
		typ   string
		times int
	}{}
	var walk func(rp *passes.RegionPlan, top bool, times int)
	walk = func(rp *passes.RegionPlan, top bool, times int) {
		for v, b := range rp.Values {
			if !top && b.Kind == passes.BufParam {
				continue
			}
			out[v.String()] = struct {
				buf   passes.Buffer
				typ   string
				times int
			}{b, v.Type.String(), times}
		}
		for op, subs := range rp.Sub {
			n := times
			if op.Code == ir.Scan {
				n *= op.Attrs.Int("length")
			}
			for _, s := range subs {
				walk(s, false, n)
			}
		}
	}
	walk(p.Plan, true, 1)
	return out
}

// checkReport compares a report's data with the program it draws: every
// value of the plan present once, with its type, plan kind and size, drawn
// once per run; the totals and the peak equal to the analysis's and to
// passes.PeakLive's; every temp inside its space's arena.
func checkReport(t *testing.T, c *rt.Compiled, d *reportJSON) { checkReportRuns(t, c, d, true) }

// checkReportRuns is checkReport where, with unrolled false, a nested
// value is drawn once whatever the scans around it (the first iteration
// only).
func checkReportRuns(t *testing.T, c *rt.Compiled, d *reportJSON, unrolled bool) {
	t.Helper()
	p := c.Program()
	m := c.MemoryAnalysis()
	want := planValues(p)
	seen := map[string]bool{}
	total := map[string][2]int64{"device": {m.TotalBytes(), m.TempBytes}, "pinned_host": {m.HostTotalBytes(), m.HostTempBytes}}
	if d.Analysis["total_bytes"] != m.TotalBytes() || d.Analysis["temp_bytes"] != m.TempBytes || d.Analysis["host_temp_bytes"] != m.HostTempBytes {
		t.Errorf("analysis %v, want %v", d.Analysis, m)
	}
	for _, s := range d.Spaces {
		space := ir.Device
		if s.Space == "pinned_host" {
			space = ir.PinnedHost
		}
		if s.TotalBytes != total[s.Space][0] || s.TempBytes != total[s.Space][1] {
			t.Errorf("%s: total %d temp %d, the analysis says %d and %d", s.Space, s.TotalBytes, s.TempBytes, total[s.Space][0], total[s.Space][1])
		}
		pk := passes.PeakLive(p, space)
		if s.PeakTempBytes != pk.Bytes {
			t.Errorf("%s: peak temp bytes %d, passes.PeakLive says %d", s.Space, s.PeakTempBytes, pk.Bytes)
		}
		if base := s.TotalBytes - s.TempBytes; s.PeakBytes != base+pk.Bytes || s.ArenaBase != base {
			t.Errorf("%s: peak %d arena base %d, want %d + %d", s.Space, s.PeakBytes, s.ArenaBase, base, pk.Bytes)
		}
		if len(s.Live) != len(d.Steps) || s.Live[s.PeakStep] != s.PeakBytes {
			t.Errorf("%s: %d live figures for %d steps, peak step %d", s.Space, len(s.Live), len(d.Steps), s.PeakStep)
		}
		for _, b := range s.Buffers {
			w, ok := want[b.Value]
			switch {
			case !ok:
				t.Errorf("%s: buffer %s is not in the plan", s.Space, b.ID)
				continue
			case seen[b.Value]:
				t.Errorf("%s: buffer %s appears twice", s.Space, b.Value)
			}
			seen[b.Value] = true
			if b.Plan != w.buf.Kind.String() || b.Bytes != w.buf.Size || b.Type != w.typ || w.buf.Space.String() != s.Space {
				t.Errorf("buffer %s: %s %s %d B in %s, the plan has %v %s %d B in %v", b.Value, b.Plan, b.Type, b.Bytes, s.Space, w.buf.Kind, w.typ, w.buf.Size, w.buf.Space)
			}
			if !unrolled {
				w.times = 1
			}
			if len(b.Spans) != w.times {
				t.Errorf("buffer %s (%s): %d bars, it runs %d times", b.Value, b.Region, len(b.Spans), w.times)
			}
			for _, sp := range b.Spans {
				if sp.Start < 0 || sp.End < sp.Start || sp.End >= len(d.Steps) {
					t.Errorf("buffer %s: bar over steps %d..%d of %d", b.Value, sp.Start, sp.End, len(d.Steps))
				}
				if sp.Y < 0 || sp.Y+b.Bytes > s.TotalBytes {
					t.Errorf("buffer %s: bar at %d..%d outside 0..%d", b.Value, sp.Y, sp.Y+b.Bytes, s.TotalBytes)
				}
				if w.buf.Kind == passes.BufTemp && (sp.Y < s.ArenaBase || sp.Y+b.Bytes > s.ArenaBase+s.TempBytes) {
					t.Errorf("temp %s: bar at %d..%d outside the arena %d..%d", b.Value, sp.Y, sp.Y+b.Bytes, s.ArenaBase, s.ArenaBase+s.TempBytes)
				}
			}
		}
	}
	for v := range want {
		if !seen[v] {
			t.Errorf("the plan's %s (%v) is not in the report", v, want[v].buf.Kind)
		}
	}
}

type reportBuffer = struct {
	kind, space, loc, op string
}

// buffersOf indexes a report's buffers by value.
func buffersOf(d *reportJSON) map[string]reportBuffer {
	out := map[string]reportBuffer{}
	for _, s := range d.Spaces {
		for _, b := range s.Buffers {
			out[b.Value] = reportBuffer{b.Kind, s.Space, b.Loc, b.Op}
		}
	}
	return out
}

func compileReport(t *testing.T, c *rt.Compiled, baseline *rt.Compiled) (*reportJSON, []byte) {
	t.Helper()
	var buf bytes.Buffer
	var err error
	if baseline != nil {
		err = c.WriteMemoryReportCompare(&buf, baseline)
	} else {
		err = c.WriteMemoryReport(&buf)
	}
	if err != nil {
		t.Fatal(err)
	}
	var d reportJSON
	parseReport(t, buf.Bytes(), &d)
	return &d, buf.Bytes()
}

// TestMemoryReportDonation: a donated SGD-like step. The donated argument,
// its aliased result, the plain argument, a temp made by a matrix product
// at a known line and the result have the right kinds and Go lines.
func TestMemoryReportDonation(t *testing.T) {
	r := testseed.Rand(t, 7)
	var dotLine string
	step := func(p, x *trace.Array) (*trace.Array, *trace.Array) {
		dotLine = lineAfter()
		h := trace.MatMul(x, p)
		s := trace.Sum(h)
		a := trace.Tanh(h) // written over h: an in-place chain shares one block
		g := trace.MatMul(trace.Transpose(x, 1, 0), a)
		return trace.Sub(p, trace.Mul(g, trace.Scalar(0.01))), trace.Add(s, trace.Sum(trace.MatMul(a, p)))
	}
	p, x := memRand(r, 32, 32), memRand(r, 16, 32)
	low, err := rt.NewJitted(step, rt.Donate(0), rt.WithName("sgd")).Lower(p, x)
	if err != nil {
		t.Fatal(err)
	}
	c, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	d, _ := compileReport(t, c, nil)
	checkReport(t, c, d)
	if d.Name != "sgd" {
		t.Errorf("name %q", d.Name)
	}
	body := c.Program().Func.Body
	bufs := buffersOf(d)
	kinds := map[*ir.Value]string{body.Params[0]: "donated", body.Params[1]: "argument", body.Results[0]: "donated", body.Results[1]: "output"}
	for v, k := range kinds {
		if got := bufs[v.String()].kind; got != k {
			t.Errorf("%v (%v): kind %q, want %q", v, c.Program().Plan.Values[v].Kind, got, k)
		}
	}
	// Without nested regions a step is an op of the body: the bytes in use
	// at step k are the arguments, results and the temps live at k, a block
	// shared by an in-place chain once.
	plan, l := c.Program().Plan, passes.ComputeLiveness(body)
	m := c.MemoryAnalysis()
	if len(d.Steps) != len(body.Ops) {
		t.Fatalf("%d steps for %d ops", len(d.Steps), len(body.Ops))
	}
	shared := false
	for k := range body.Ops {
		want := m.TotalBytes() - m.TempBytes
		offsets := map[int64]bool{}
		for v, b := range plan.Values {
			if b.Kind == passes.BufTemp && b.Space == ir.Device && l.Live(v, k) {
				if offsets[b.Offset] {
					shared = true
					continue
				}
				offsets[b.Offset] = true
				want += b.Size
			}
		}
		if got := d.Spaces[0].Live[k]; d.Spaces[0].Space != "device" || got != want {
			t.Errorf("step %d: %d bytes in use, want %d", k, got, want)
		}
	}
	if !shared {
		t.Errorf("no in-place chain in the test program:\n%s", c.Program().PlanString())
	}
	found := false
	for _, b := range bufs {
		if strings.HasPrefix(b.op, "%") && b.loc == dotLine {
			found = true
		}
	}
	if !found {
		t.Errorf("no buffer made by the matrix product at %s: %v", dotLine, bufs)
	}
}

// Layer weights for the offload tests.
type memWeights struct{ W1, W2 *trace.Array }

// offloadLoss is the host-offloading tutorial's scanned model at a small
// size: every layer's input is offloaded to pinned_host; with host set the
// weights live in pinned_host and each layer copies its slice in.
func offloadLoss(host bool) func(w memWeights, x *trace.Array) *trace.Array {
	policy := trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost)
	layer := trace.Remat(func(x *trace.Array, w memWeights) *trace.Array {
		if host {
			w = memWeights{W1: trace.DevicePut(w.W1, ir.Device), W2: trace.DevicePut(w.W2, ir.Device)}
		}
		return trace.MatMul(trace.MatMul(trace.CheckpointName(x, "x"), w.W1), w.W2)
	}, policy)
	return func(w memWeights, x *trace.Array) *trace.Array {
		final, _ := trace.ScanTree(func(x *trace.Array, w memWeights) (*trace.Array, struct{}) {
			return layer(x, w), struct{}{}
		}, x, w)
		return trace.Sum(final)
	}
}

func baselineLoss(w memWeights, x *trace.Array) *trace.Array {
	final, _ := trace.ScanTree(func(x *trace.Array, w memWeights) (*trace.Array, struct{}) {
		return trace.MatMul(trace.MatMul(x, w.W1), w.W2), struct{}{}
	}, x, w)
	return trace.Sum(final)
}

func compileGrad(t *testing.T, name string, loss func(memWeights, *trace.Array) *trace.Array, w memWeights, x *trace.Array) *rt.Compiled {
	t.Helper()
	g := func(w memWeights, x *trace.Array) memWeights {
		return trace.Grad(func(w memWeights) *trace.Array { return loss(w, x) })(w)
	}
	low, err := rt.NewJitted(g, rt.WithName(name)).Lower(w, x)
	if err != nil {
		t.Fatal(err)
	}
	c, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// offloadPrograms compiles the baseline and the two offload variants.
func offloadPrograms(t *testing.T, layers, d, h int) (base, act, param *rt.Compiled) {
	r := testseed.Rand(t, 9)
	x := memRand(r, d, d)
	w := memWeights{W1: memRand(r, layers, d, h), W2: memRand(r, layers, h, d)}
	wh := memWeights{W1: trace.DevicePut(w.W1, ir.PinnedHost), W2: trace.DevicePut(w.W2, ir.PinnedHost)}
	return compileGrad(t, "baseline", baselineLoss, w, x), compileGrad(t, "activation_offload", offloadLoss(false), w, x),
		compileGrad(t, "activation_param_offload", offloadLoss(true), wh, x)
}

// TestMemoryReportOffload: the scanned model and its offload variants. The
// stacked residuals in pinned_host are offloaded, the slices the scan
// writes into them are drawn per iteration inside them, the copies of
// pinned_host weights are prefetched, pinned_host arguments are arguments
// of that space, and the baseline is embedded for the comparison.
func TestMemoryReportOffload(t *testing.T) {
	const layers = 4
	base, act, param := offloadPrograms(t, layers, 8, 16)
	for _, c := range []*rt.Compiled{base, act, param} {
		d, _ := compileReport(t, c, nil)
		checkReport(t, c, d)
		if d.Baseline != nil {
			t.Errorf("%s: a baseline without asking", d.Name)
		}
	}
	d, _ := compileReport(t, param, base)
	checkReport(t, param, d)
	if d.Baseline == nil || d.Baseline.Name != "baseline" {
		t.Fatalf("no baseline in the comparison")
	}
	checkReport(t, base, d.Baseline)

	var offloaded, prefetched, slices, hostArgs, double int
	for _, s := range d.Spaces {
		for _, b := range s.Buffers {
			if b.Double {
				// Kept for the whole iteration: the bar runs to the body's
				// end, reserved after the copy's last reader.
				double++
				for _, sp := range b.Spans {
					if b.Kind != "prefetched" || sp.Reserved < sp.Start || sp.Reserved > sp.End {
						t.Errorf("double-buffered %s (%s): bar %d..%d reserved from %d", b.Value, b.Kind, sp.Start, sp.End, sp.Reserved)
					}
				}
			} else {
				for _, sp := range b.Spans {
					if sp.Reserved != -1 {
						t.Errorf("%s: reserved from %d", b.Value, sp.Reserved)
					}
				}
			}
			switch {
			case b.Plan == "temp" && s.Space == "pinned_host":
				offloaded++
				if b.Kind != "offloaded" {
					t.Errorf("pinned_host temp %s %s: kind %q", b.Value, b.Type, b.Kind)
				}
			case b.Plan == "slice" && s.Space == "pinned_host":
				slices++
				if b.Kind != "offloaded" || b.Of == "" {
					t.Errorf("pinned_host slice %s: kind %q of %q", b.Value, b.Kind, b.Of)
				}
				// Slice i of the stacked buffer, one per iteration.
				var parentY int64 = -1
				for _, p := range s.Buffers {
					if p.ID == b.Of {
						parentY = p.Spans[0].Y
					}
				}
				ys := map[int64]bool{}
				for _, sp := range b.Spans {
					off := sp.Y - parentY
					if parentY < 0 || off < 0 || off%b.Bytes != 0 || off/b.Bytes >= layers {
						t.Errorf("slice %s at %d, the stacked buffer at %d", b.Value, sp.Y, parentY)
					}
					ys[sp.Y] = true
				}
				if len(ys) != layers {
					t.Errorf("slice %s: %d places for %d iterations", b.Value, len(ys), layers)
				}
			case b.Plan == "param":
				hostArgs++
				if b.Kind != "argument" {
					t.Errorf("argument %s: kind %q", b.Value, b.Kind)
				}
			}
			if strings.Contains(b.Op, "device_put") && s.Space == "device" && b.Kind != "prefetched" {
				t.Errorf("copy to device %s: kind %q", b.Value, b.Kind)
			}
			if strings.Contains(b.Op, "device_put") && s.Space == "device" {
				prefetched++
			}
		}
	}
	if offloaded == 0 || slices == 0 || prefetched == 0 || hostArgs != 3 || double == 0 {
		t.Errorf("offloaded %d, slices %d, prefetched %d, arguments %d, double buffered %d", offloaded, slices, prefetched, hostArgs, double)
	}
}

// TestMemoryReportEnv: FERRY_MEMORY_REPORT makes every compiled program
// write its report, named as FERRY_DUMP_IR names its files.
func TestMemoryReportEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(rt.EnvMemoryReport, dir)
	r := testseed.Rand(t, 3)
	x := memRand(r, 8, 8)
	f := rt.Jit(func(x *trace.Array) (*trace.Array, error) { return trace.Sum(trace.MatMul(x, x)), nil }, rt.WithName("env report/1</script>"))
	if _, err := f(x); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 || !regexp.MustCompile(`^[0-9]{3}-env_report_1__script_\.memory\.html$`).MatchString(filepath.Base(files[0])) {
		t.Fatalf("files %v, want one NNN-env_report_1__script_.memory.html", files)
	}
	page, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var d reportJSON
	parseReport(t, page, &d)
	if n := strings.Count(string(page), "</script>"); n != 3 { // the error handler, the data, the script: the name is escaped
		t.Errorf("%d </script> in the page, want 3: a name ends a script block", n)
	}
	if d.Name != "env report/1</script>" || len(d.Spaces) == 0 {
		t.Errorf("report of %q with %d spaces", d.Name, len(d.Spaces))
	}
}

// liveJSON is the embedded data of the live memory page.
type liveJSON struct {
	Pools []struct {
		Platform         string `json:"platform"`
		Device           int    `json:"device"`
		Space            string `json:"space"`
		BytesInUse       int64  `json:"bytes_in_use"`
		LargestFreeBlock int64  `json:"largest_free_block"`
		FreeBlocks       int    `json:"free_blocks"`
		Reserved         int64  `json:"reserved"`
		Largest          []struct {
			Bytes int64  `json:"bytes"`
			Type  string `json:"type"`
			Site  string `json:"site"`
		} `json:"largest"`
		Map []struct {
			Region, Offset, Size int64
			Free                 bool
			What, Site           string
		} `json:"map"`
	} `json:"pools"`
}

// TestLiveMemoryReport: the live page lists an array with the line that
// made it, the pool's figures are MemoryStats's, and its address map
// covers the reserved memory block after block, with a hole freed between
// two live arrays as a free block.
func TestLiveMemoryReport(t *testing.T) {
	const n = 3<<18 + 13 // a size no other test makes
	line := lineAfter()
	a := rt.FromSlice(make([]float32, n), n)
	defer a.Delete()
	const m = 5<<14 + 3
	hole := rt.FromSlice(make([]float32, m), m)
	b := rt.FromSlice(make([]float32, 1<<10), 1<<10)
	defer b.Delete()
	hole.Delete()
	// Arrays other tests dropped are freed by finalizers at any moment:
	// read the page and the statistics until a reading is not disturbed
	// by one (the page agrees with the statistics read right after it).
	var d liveJSON
	var st rt.MemStats
	for try := 0; ; try++ {
		var buf bytes.Buffer
		if err := rt.WriteLiveMemoryReport(&buf); err != nil {
			t.Fatal(err)
		}
		d = liveJSON{}
		parseReport(t, buf.Bytes(), &d)
		st = rt.MemoryStats(ir.Device)
		agrees := false
		for _, p := range d.Pools {
			agrees = agrees || p.Platform == "cpu" && p.Device == 0 && p.Space == "device" &&
				p.LargestFreeBlock == st.LargestFreeBlock && p.BytesInUse == st.BytesInUse
		}
		if agrees || try == 20 {
			break
		}
		goruntime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	found := false
	for _, p := range d.Pools {
		if p.Platform != "cpu" || p.Device != 0 || p.Space != "device" {
			continue
		}
		if p.LargestFreeBlock != st.LargestFreeBlock || p.BytesInUse != st.BytesInUse {
			t.Errorf("pool: largest free %d, in use %d; MemoryStats says %d, %d", p.LargestFreeBlock, p.BytesInUse, st.LargestFreeBlock, st.BytesInUse)
		}
		for _, b := range p.Largest {
			if b.Bytes == 4*n && b.Type == fmt.Sprintf("f32[%d]", n) && b.Site == line {
				found = true
			}
		}
		if st.Allocator != rt.AllocatorBFC {
			continue
		}
		var total, largest int64
		var inMap, holeFree bool
		next := map[int64]int64{}
		for i, b := range p.Map {
			if b.Offset != next[b.Region] {
				t.Errorf("map: block at %d of region %d, the previous ends at %d", b.Offset, b.Region, next[b.Region])
			}
			next[b.Region] = b.Offset + b.Size
			total += b.Size
			if b.Free {
				largest = max(largest, b.Size)
			}
			if !b.Free && b.Site == line && b.What == fmt.Sprintf("f32[%d]", n) && b.Size >= 4*n && b.Size < 4*n+64 {
				inMap = true
			}
			if b.Free && b.Size >= 4*m && i > 0 && i+1 < len(p.Map) && !p.Map[i-1].Free && !p.Map[i+1].Free {
				holeFree = true // between two held blocks
			}
		}
		if total != p.Reserved || largest != st.LargestFreeBlock || !inMap || !holeFree {
			t.Errorf("map: %d bytes (reserved %d), largest free %d (MemoryStats %d), the array in it %v, the hole free %v",
				total, p.Reserved, largest, st.LargestFreeBlock, inMap, holeFree)
		}
	}
	if !found {
		t.Errorf("the f32[%d] made at %s is not on the page: %+v", n, line, d.Pools)
	}
}

// TestMemoryReportLoops: a scan too long to draw every iteration shows its
// first one; while and cond bodies are drawn after the op that runs them;
// every buffer of the plan is there once.
func TestMemoryReportLoops(t *testing.T) {
	r := testseed.Rand(t, 5)
	x, xs := memRand(r, 4, 4), memRand(r, 1000, 4, 4)
	long := func(x, xs *trace.Array) *trace.Array {
		c, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.Tanh(trace.MatMul(c[0], x[0]))}, nil
		}, []*trace.Array{x}, []*trace.Array{xs})
		return trace.Sum(c[0])
	}
	low, err := rt.Lower(long, x, xs)
	if err != nil {
		t.Fatal(err)
	}
	c, err := low.Compile()
	if err != nil {
		t.Fatal(err)
	}
	d, _ := compileReport(t, c, nil)
	checkReportRuns(t, c, d, false)
	if n := len(d.Steps); n > 50 {
		t.Errorf("%d steps for a scan of 1000 shown once", n)
	}
	iters := map[string]bool{}
	for _, s := range d.Steps {
		if s.Iter != "" {
			iters[s.Iter] = true
		}
	}
	if len(iters) != 1 || !iters["iteration 1 of 1000"] {
		t.Errorf("iterations shown: %v", iters)
	}

	loops := func(x *trace.Array) *trace.Array {
		s := trace.While(func(s []*trace.Array) *trace.Array { return trace.Less(trace.Sum(s[0]), trace.Scalar(100)) },
			func(s []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Add(trace.MatMul(s[0], s[0]), trace.Scalar(1))}
			}, x)
		y := trace.Cond(trace.Less(trace.Sum(s[0]), trace.Scalar(0)),
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.MatMul(o[0], o[0])} },
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Exp(o[0])} }, s[0])
		return trace.Sum(y[0])
	}
	low, err = rt.Lower(loops, trace.Abs(x))
	if err != nil {
		t.Fatal(err)
	}
	if c, err = low.Compile(); err != nil {
		t.Fatal(err)
	}
	d, _ = compileReport(t, c, nil)
	checkReport(t, c, d)
	paths := map[string]bool{}
	for _, s := range d.Steps {
		paths[s.Path] = true
	}
	var regions int
	for p := range paths {
		if strings.Contains(p, "region") {
			regions++
		}
	}
	if regions != 4 { // while: cond and body; cond: two branches
		t.Errorf("steps in %d nested regions, want 4: %v", regions, paths)
	}
}
