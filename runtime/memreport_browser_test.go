package runtime_test

import (
	"bytes"
	"context"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/settings"
	rt "github.com/ferryml/ferry/runtime"
)

// chromium returns the headless browser the browser tests use: $FERRY_CHROMIUM,
// or chromium (Debian's package, which .ci/run installs), chromium-browser or
// google-chrome on the PATH. Without one the test skips, unless
// FERRY_REQUIRE_CHROMIUM is set (CI), where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	if p := settings.Chromium.Get(); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if settings.RequireChromium.Get() {
		t.Fatal("no chromium on the PATH and FERRY_REQUIRE_CHROMIUM is set (apt-get install chromium)")
	}
	t.Skip("no headless browser: install Debian's chromium (apt-get install chromium) or set FERRY_CHROMIUM to run the memory viewer's browser test")
	return ""
}

// browse runs the browser on file (with #hash) and returns the DOM after its
// scripts ran and the console lines it logged; with shot set it also saves
// a screenshot there.
func browse(t *testing.T, bin, file, hash, shot string) (dom string, console []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--window-size=1600,900"}
	if shot != "" {
		args = append(args, "--screenshot="+shot)
	} else {
		args = append(args, "--dump-dom")
	}
	cmd := exec.CommandContext(ctx, bin, append(args, "file://"+file+hash)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, errOut.String())
	}
	for _, line := range strings.Split(errOut.String(), "\n") {
		if strings.Contains(line, "CONSOLE") {
			console = append(console, line)
		}
	}
	return out.String(), console
}

// bodyInt reads attribute data-<name> of the rendered page's <body>.
func bodyInt(t *testing.T, dom, name string) int {
	t.Helper()
	m := regexp.MustCompile(`<body[^>]*\sdata-` + name + `="(-?[0-9]+)"`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the rendered page has no data-%s on <body>: %.300s", name, dom)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// checkRendered renders a page and checks that it drew bars bars (any
// number when bars < 0) with no script error and nothing on the console.
func checkRendered(t *testing.T, bin, file, hash string, bars int) {
	t.Helper()
	dom, console := browse(t, bin, file, hash, "")
	if n := bodyInt(t, dom, "errors"); n != 0 || len(console) > 0 {
		m := regexp.MustCompile(`(?s)<pre id="ferry-errors">(.*?)</pre>`).FindStringSubmatch(dom)
		t.Errorf("%s: %d script errors %v, console %q", filepath.Base(file), n, m, console)
	}
	got := bodyInt(t, dom, "bars")
	if bars >= 0 && got != bars || got <= 0 {
		t.Errorf("%s%s: %d bars drawn, the data has %d", filepath.Base(file), hash, got, bars)
	}
}

// spans counts the bars a report's data asks for.
func spans(d *reportJSON) int {
	n := 0
	for _, s := range d.Spaces {
		for _, b := range s.Buffers {
			n += len(b.Spans)
		}
	}
	return n
}

// TestMemoryReportInBrowser renders memory reports in headless Chromium:
// the parameter-offload variant with its baseline beside it and without,
// the activation-offload variant alone, a program under a memory budget
// beside its baseline (with the budget line and the plan), the live pools;
// each draws as many bars as its data has, without a script error, and the
// screenshot shows the colours of arguments and offloaded buffers. A page
// with a broken script shows that errors are seen.
func TestMemoryReportInBrowser(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	write := func(name string, page []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, page, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base, _, param := offloadPrograms(t, 4, 8, 16)
	d, page := compileReport(t, param, base)
	cmp := write("compare.html", page)
	checkRendered(t, bin, cmp, "", spans(d))
	checkRendered(t, bin, cmp, "#baseline", spans(d)+spans(d.Baseline))

	shot := filepath.Join(dir, "compare.png")
	browse(t, bin, cmp, "#baseline", shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	colours := map[[3]uint32]int{{0x4e, 0x79, 0xa7}: 0, {0xe1, 0x57, 0x59}: 0} // argument, offloaded
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			k := [3]uint32{r >> 8, g >> 8, bl >> 8}
			if _, ok := colours[k]; ok {
				colours[k]++
			}
		}
	}
	for c, n := range colours {
		if n < 100 {
			t.Errorf("screenshot %dx%d: %d pixels of colour %x", b.Dx(), b.Dy(), n, c)
		}
	}

	// A variant alone, at another size.
	_, act, _ := offloadPrograms(t, 3, 4, 8)
	da, pa := compileReport(t, act, nil)
	checkRendered(t, bin, write("activation_offload.html", pa), "", spans(da))

	// A program under a memory budget beside its baseline: the device
	// charts draw the budget (the baseline's marked as the other's), the
	// analysis table gives it, and the plan's table is there.
	bbase, bc, _, label, _ := budgetPrograms(t)
	db, pb := compileReport(t, bc, bbase)
	bf := write("budget.html", pb)
	checkRendered(t, bin, bf, "", spans(db))
	checkRendered(t, bin, bf, "#baseline", spans(db)+spans(db.Baseline))
	for _, c := range []struct {
		hash  string
		lines int
	}{{"", 1}, {"#baseline", 2}} {
		dom, _ := browse(t, bin, bf, c.hash, "")
		if n := strings.Count(dom, `<line class="budget"`); n != c.lines {
			t.Errorf("budget.html%s: %d budget lines drawn, want %d", c.hash, n, c.lines)
		}
		for _, want := range []string{">budget " + label + "</text>", "<td>memory budget</td>", "<td>" + label + "</td>", `data-budget="`, `id="plan-program"`} {
			if !strings.Contains(dom, want) {
				t.Errorf("budget.html%s: the rendered page has no %q", c.hash, want)
			}
		}
		if c.lines == 2 && !strings.Contains(dom, ">the program's budget "+label+"</text>") {
			t.Errorf("budget.html#baseline: the baseline's chart does not mark the budget as the program's")
		}
	}

	var live bytes.Buffer
	keep := rt.FromSlice(make([]float32, 1000), 1000)
	defer keep.Delete()
	if err := rt.WriteLiveMemoryReport(&live); err != nil {
		t.Fatal(err)
	}
	checkRendered(t, bin, write("live.html", live.Bytes()), "", -1)

	// The harness sees a script error.
	broken := strings.Replace(string(page), `'use strict';`, `'use strict'; undefinedFunction();`, 1)
	if broken == string(page) {
		t.Fatal("could not break the page's script")
	}
	dom, _ := browse(t, bin, write("broken.html", []byte(broken)), "", "")
	if bodyInt(t, dom, "errors") == 0 {
		t.Errorf("a page with a script error reports none")
	}
}
