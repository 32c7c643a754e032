// Package progress tells a person what a long-running program is doing and how
// far it is. On a terminal it keeps one status line that it rewrites in place
// (a carriage return, the text, then an erase-to-end-of-line), so that
//
//	compiling the training step (the first call takes a while)…
//
// becomes
//
//	step 120/500, loss 0.41, 3.2 steps/s
//
// without scrolling. Anywhere else (a log file, a pipe, CI) it writes whole
// lines only, never a carriage return or an escape sequence: every Phase as a
// line, and Update lines at a modest rate (at most one every Interval, 10 s by
// default), so a log stays short and readable.
//
// A destination is a terminal when it is a character device
// (os.File.Stat's mode has os.ModeCharDevice); no other dependency is used.
//
// Progress can be silenced: FERRY_PROGRESS=0 in the environment makes every
// Reporter made by New quiet, and SetQuiet(true) silences one (the examples
// map their -quiet flag to it). A nil *Reporter is quiet too, so code that
// reports progress can be given none.
//
// Byte counts in reports are printed with backend.FormatBytes ("512 B",
// "4.5 KiB", "1.23 GiB"); this package does not format them again.
package progress

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ferryml/ferry/internal/settings"
)

// Env is the environment variable that silences progress: "0" (or "off",
// "false", "no") makes every Reporter made by New quiet.
const Env = "FERRY_PROGRESS"

// DefaultInterval is the shortest time between two Update lines when the
// destination is not a terminal.
const DefaultInterval = 10 * time.Second

// terminalRefresh is the shortest time between two in-place redraws of the
// status line by Update on a terminal (a faster loop would only flicker).
const terminalRefresh = 100 * time.Millisecond

// Reporter writes progress to one destination. Its methods may be called from
// several goroutines; the zero value is not usable, make one with New or
// NewWriter. A nil *Reporter reports nothing.
type Reporter struct {
	mu       sync.Mutex
	w        io.Writer
	terminal bool
	quiet    bool
	interval time.Duration
	width    int              // the terminal's columns: status lines are cut to width-1
	now      func() time.Time // the clock (tests replace it)
	last     time.Time        // when the last line (or redraw) was written
	open     bool             // a status line is on the terminal, not yet ended
}

// IsTerminal reports whether f is a terminal (a character device).
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// New returns a Reporter writing to f, in place when f is a terminal, as
// whole lines otherwise; quiet when the environment has FERRY_PROGRESS=0.
func New(f *os.File) *Reporter {
	r := NewWriter(f, IsTerminal(f))
	r.quiet = !settings.Progress.Get()
	return r
}

// NewWriter returns a Reporter writing to w, which is treated as a terminal
// when terminal is true. It ignores FERRY_PROGRESS.
func NewWriter(w io.Writer, terminal bool) *Reporter {
	width := 80
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c >= 20 {
		width = c
	}
	return &Reporter{w: w, terminal: terminal, interval: DefaultInterval, width: width, now: time.Now}
}

// SetQuiet silences the Reporter (q true) or lets it report again (q false,
// unless it is nil). It returns r.
func (r *Reporter) SetQuiet(q bool) *Reporter {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q {
		r.clearLocked()
	}
	r.quiet = q
	return r
}

// SetInterval sets the shortest time between two Update lines when the
// destination is not a terminal (DefaultInterval unless set). It returns r.
func (r *Reporter) SetInterval(d time.Duration) *Reporter {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.interval = d
	return r
}

// Terminal reports whether the Reporter rewrites a status line in place.
func (r *Reporter) Terminal() bool { return r != nil && r.terminal }

// Quiet reports whether the Reporter writes nothing.
func (r *Reporter) Quiet() bool { return r == nil || r.quiet }

// Phase says that a new piece of work begins ("compiling the training
// step…"). It is always shown: on a terminal it replaces the status line,
// elsewhere it is written as a line.
func (r *Reporter) Phase(format string, args ...any) {
	r.write(fmt.Sprintf(format, args...), true)
}

// Update says how far the current work is ("step 120/500, loss 0.41, 3.2
// steps/s"). On a terminal it replaces the status line (at most ten times a
// second); elsewhere it is written as a line only when Interval has passed
// since the last line.
func (r *Reporter) Update(format string, args ...any) {
	if r == nil || r.quiet {
		return
	}
	r.write(fmt.Sprintf(format, args...), false)
}

// Done ends the current work with a line that stays ("compiled in 4.1 s"): on
// a terminal the status line is replaced by it and ended, elsewhere it is
// written as a line. Phase and Update lines on a terminal are cut to its width
// ($COLUMNS, else 80) so that they can be rewritten in place; Done lines are
// not.
func (r *Reporter) Done(format string, args ...any) {
	if r == nil || r.quiet {
		return
	}
	text := fmt.Sprintf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.terminal {
		// The line is ended, so it may wrap: it is not cut.
		fmt.Fprintf(r.w, "\r%s\x1b[K\n", oneLine(text))
	} else {
		fmt.Fprintf(r.w, "%s\n", oneLine(text))
	}
	r.open = false
	r.last = r.now()
}

// Clear erases the status line of a terminal, so that what the program
// prints next starts on a clean line. It does nothing elsewhere. Call it
// before printing results to the same terminal.
func (r *Reporter) Clear() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clearLocked()
}

func (r *Reporter) clearLocked() {
	if r.terminal && r.open && !r.quiet {
		io.WriteString(r.w, "\r\x1b[K")
	}
	r.open = false
}

// write shows text: always when force, else subject to the rates of Update.
func (r *Reporter) write(text string, force bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.quiet {
		return
	}
	now := r.now()
	if r.terminal {
		if !force && r.open && now.Sub(r.last) < terminalRefresh {
			return
		}
		fmt.Fprintf(r.w, "\r%s\x1b[K", r.cut(text))
		r.open = true
	} else {
		if !force && !r.last.IsZero() && now.Sub(r.last) < r.interval {
			return
		}
		fmt.Fprintf(r.w, "%s\n", oneLine(text))
	}
	r.last = now
}

// cut makes text one line no wider than the terminal, so that \r returns to
// its start.
func (r *Reporter) cut(text string) string {
	text = oneLine(text)
	if utf8.RuneCountInString(text) < r.width {
		return text
	}
	runes := []rune(text)
	return string(runes[:r.width-2]) + "…"
}

// oneLine replaces line breaks and carriage returns by spaces.
func oneLine(s string) string {
	return strings.Map(func(c rune) rune {
		if c == '\n' || c == '\r' {
			return ' '
		}
		return c
	}, strings.TrimRight(s, "\n"))
}

// Rate returns n events over the time since start, per second (0 before any
// time has passed).
func Rate(n int, start time.Time) float64 {
	s := time.Since(start).Seconds()
	if s <= 0 {
		return 0
	}
	return float64(n) / s
}

// Seconds prints a duration for humans in seconds with one decimal ("4.1 s"),
// or in minutes and seconds from a minute on ("2 min 05 s").
func Seconds(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	s := int(d.Round(time.Second).Seconds())
	return fmt.Sprintf("%d min %02d s", s/60, s%60)
}
