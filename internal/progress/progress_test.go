package progress

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// clock is a fake clock the tests advance by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time            { return c.t }
func (c *clock) advance(d time.Duration)   { c.t = c.t.Add(d) }
func newClock() *clock                     { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }
func fake(r *Reporter, c *clock) *Reporter { r.now = c.now; return r }

// writes records every Write call separately.
type writes struct{ calls []string }

func (w *writes) Write(p []byte) (int, error) {
	w.calls = append(w.calls, string(p))
	return len(p), nil
}

func TestLinesAreWholeAndPlain(t *testing.T) {
	var w writes
	c := newClock()
	r := fake(NewWriter(&w, false), c)
	r.Phase("tracing and compiling the step (the first call takes a while)…")
	r.Update("step %d/%d", 1, 10)
	r.Update("with a\nline break\r")
	r.Done("done in %s", Seconds(1500*time.Millisecond))
	r.Clear()
	for _, s := range w.calls {
		if !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 || strings.ContainsAny(s, "\r\x1b") {
			t.Errorf("write %q: want one whole line without a carriage return or escape", s)
		}
	}
	// The Update right after the Phase comes within the interval: dropped.
	want := []string{"tracing and compiling the step (the first call takes a while)…\n", "done in 1.5 s\n"}
	if fmt.Sprint(w.calls) != fmt.Sprint(want) {
		t.Errorf("writes %q, want %q", w.calls, want)
	}
}

// TestLineRate drives a non-terminal Reporter with a random sequence of
// phases, updates and clock steps and checks its lines against a model: every
// phase and done is written, an update only when the interval has passed since
// the last line.
func TestLineRate(t *testing.T) {
	rng := testseed.Rand(t, 0)
	var b bytes.Buffer
	c := newClock()
	interval := time.Duration(1+rng.IntN(20)) * time.Second
	r := fake(NewWriter(&b, false), c).SetInterval(interval)
	var want []string
	var last time.Time
	for i := range 500 {
		c.advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		text := fmt.Sprintf("event %d", i)
		switch k := rng.IntN(10); {
		case k == 0:
			r.Phase("%s", text)
			want, last = append(want, text), c.t
		case k == 1:
			r.Done("%s", text)
			want, last = append(want, text), c.t
		default:
			r.Update("%s", text)
			if last.IsZero() || c.t.Sub(last) >= interval {
				want, last = append(want, text), c.t
			}
		}
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("interval %v: %d lines, want %d\ngot  %q\nwant %q", interval, len(got), len(want), got, want)
	}
}

func TestTerminalRewritesInPlace(t *testing.T) {
	var b bytes.Buffer
	c := newClock()
	r := fake(NewWriter(&b, true), c)
	r.Phase("compiling the training step…")
	c.advance(time.Second)
	r.Update("step %d/%d, loss %.2f, %.1f steps/s", 120, 500, 0.41, 3.2)
	c.advance(10 * time.Millisecond)
	r.Update("step 121/500") // too soon after the last redraw: dropped
	c.advance(time.Second)
	r.Clear()
	r.Done("trained in %s", Seconds(75*time.Second))
	want := "\rcompiling the training step…\x1b[K" +
		"\rstep 120/500, loss 0.41, 3.2 steps/s\x1b[K" +
		"\r\x1b[K" +
		"\rtrained in 1 min 15 s\x1b[K\n"
	if b.String() != want {
		t.Errorf("terminal output\n%q\nwant\n%q", b.String(), want)
	}
}

func TestTerminalLineFitsTheWidth(t *testing.T) {
	t.Setenv("COLUMNS", "40")
	var b bytes.Buffer
	r := NewWriter(&b, true)
	r.Phase("%s", strings.Repeat("é", 100))
	line := strings.TrimSuffix(strings.TrimPrefix(b.String(), "\r"), "\x1b[K")
	if n := len([]rune(line)); n != 39 || !strings.HasSuffix(line, "…") {
		t.Errorf("status line of %d runes %q, want 39 ending in …", n, line)
	}
	b.Reset()
	long := strings.Repeat("x", 100)
	r.Done("%s", long)
	if b.String() != "\r"+long+"\x1b[K\n" {
		t.Errorf("Done cut its line: %q", b.String())
	}
}

func TestQuiet(t *testing.T) {
	use := func(r *Reporter) {
		r.Phase("phase")
		r.Update("update")
		r.Done("done")
		r.Clear()
	}
	for _, terminal := range []bool{false, true} {
		var b bytes.Buffer
		r := NewWriter(&b, terminal).SetQuiet(true)
		use(r)
		if b.Len() != 0 || !r.Quiet() {
			t.Errorf("terminal %v, SetQuiet(true): wrote %q", terminal, b.String())
		}
		r.SetQuiet(false)
		use(r)
		if b.Len() == 0 {
			t.Errorf("terminal %v, SetQuiet(false): wrote nothing", terminal)
		}
	}
	var nilR *Reporter
	use(nilR) // must not panic
	if !nilR.Quiet() || nilR.Terminal() || nilR.SetQuiet(false) != nil {
		t.Error("a nil Reporter is not quiet")
	}

	path := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, v := range []string{"0", "off"} {
		t.Setenv(Env, v)
		use(New(f))
	}
	t.Setenv(Env, "1")
	r := New(f)
	if r.Terminal() {
		t.Error("a regular file taken for a terminal")
	}
	r.Phase("shown")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "shown\n" {
		t.Errorf("with %s=0 and off, then 1: the file holds %q, want only %q", Env, got, "shown\n")
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0.0 s",
		1234 * time.Millisecond: "1.2 s",
		59 * time.Second:        "59.0 s",
		60 * time.Second:        "1 min 00 s",
		95 * time.Second:        "1 min 35 s",
		3725 * time.Second:      "62 min 05 s",
	} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %q, want %q", d, got, want)
		}
	}
}

func ExampleReporter() {
	// A log (not a terminal): whole lines; Update lines at most once an
	// interval (an hour here), so none of these quick steps is shown.
	r := NewWriter(os.Stdout, false).SetInterval(time.Hour)
	r.Phase("compiling the training step (the first call takes a while)…")
	for step := 1; step <= 3; step++ {
		r.Update("step %d/3", step)
	}
	r.Done("trained 3 steps")
	// Output:
	// compiling the training step (the first call takes a while)…
	// trained 3 steps
}
