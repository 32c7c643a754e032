package dynlib

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// A library that is nowhere: every folder and the system loader are listed,
// each with its reason, and the variable's file comes first.
func TestOpenMissing(t *testing.T) {
	dir := t.TempDir()
	gone := filepath.Join(dir, "gone")
	for _, pattern := range []string{"libferry-none.so.1", "libferry-none.so*"} {
		_, err := Open(Spec{Prefix: "demo", Hint: " (set DEMO_LIBRARY)", Env: "DEMO_LIBRARY", EnvPath: filepath.Join(dir, "env.so"),
			Pattern: pattern, Dirs: []string{dir, gone}, Paths: []string{"libferry-none.so.1"}})
		var le *LoadError
		if !errors.As(err, &le) || len(le.Attempts) != 4 || le.Library != pattern {
			t.Fatalf("%s: got %v, want a LoadError for %s with 4 attempts", pattern, err, pattern)
		}
		why := "not found"
		if strings.Contains(pattern, "*") {
			why = "no match"
		}
		want := []Attempt{
			{filepath.Join(dir, "env.so") + " ($DEMO_LIBRARY)", ""},
			{filepath.Join(dir, pattern), why},
			{filepath.Join(gone, pattern), why + " (no such directory)"},
			{"libferry-none.so.1" + SystemLoader, ""},
		}
		for i, w := range want {
			a := le.Attempts[i]
			if a.Path != w.Path || (w.Err != "" && a.Err != w.Err) || a.Err == "" {
				t.Errorf("%s: attempt %d = %+v, want %+v", pattern, i, a, w)
			}
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "demo: cannot load "+pattern+" (set DEMO_LIBRARY); looked in:\n") {
			t.Errorf("message: %q", msg)
		}
		for _, a := range le.Attempts {
			if !strings.Contains(msg, "\n  "+a.Path+": "+a.Err) {
				t.Errorf("message %q lacks attempt %+v", msg, a)
			}
		}
	}
}

// libraryFile returns the path of a shared library every Linux machine has.
func libraryFile(t *testing.T) string {
	for _, p := range []string{"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
		"/lib/aarch64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6", "/lib64/libm.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no libm.so.6 in the usual folders")
	return ""
}

// In a folder, the newest match that loads wins; one that fails to load is
// listed only if nothing loads.
func TestOpenNewestThatLoads(t *testing.T) {
	libm := libraryFile(t)
	dir := t.TempDir()
	for _, n := range []string{"libferrym.so.1", "libferrym.so.2"} {
		if err := os.Symlink(libm, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "libferrym.so.3"), []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Open(Spec{Prefix: "demo", Pattern: "libferrym.so*", Dirs: []string{dir}})
	if err != nil || l.Path != filepath.Join(dir, "libferrym.so.2") {
		t.Fatalf("got %v %v, want %s", l, err, filepath.Join(dir, "libferrym.so.2"))
	}
	if _, err := l.Sym("cos"); err != nil {
		t.Fatal(err)
	}
	_, err = Open(Spec{Prefix: "demo", Pattern: "libferrym.so.3", Dirs: []string{dir}, Local: true})
	var le *LoadError
	if !errors.As(err, &le) || len(le.Attempts) != 1 || le.Attempts[0].Path != filepath.Join(dir, "libferrym.so.3") || le.Attempts[0].Err == "not found" {
		t.Fatalf("a file that is not a library: %v", err)
	}
}

// libc loads, lacks made-up entry points (required ones fail Resolve,
// optional ones are left out), and runs strlen on random strings.
func TestResolve(t *testing.T) {
	l, err := Open(Spec{Prefix: "demo", Pattern: "libc.so.6", Paths: []string{"libc.so.6"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Sym("ferryNoSuchFn"); err == nil || !strings.Contains(err.Error(), "demo: libc.so.6: symbol ferryNoSuchFn") {
		t.Fatalf("Sym of a missing symbol: %v", err)
	}
	_, err = l.Resolve([]Symbol{{Name: "strlen"}, {Name: "ferryNoSuchFn", Try: []string{"ferryNoSuchFn_v2", "ferryNoSuchFn"}}, {Name: "ferryGone"}})
	var le *LoadError
	if !errors.As(err, &le) || le.Library != "libc.so.6" ||
		le.Error() != "demo: libc.so.6: missing entry points ferryNoSuchFn (tried ferryNoSuchFn_v2, ferryNoSuchFn), ferryGone" {
		t.Fatalf("Resolve with missing symbols: %v", err)
	}
	if le.Prefix = ""; le.Error() != "libc.so.6: missing entry points ferryNoSuchFn (tried ferryNoSuchFn_v2, ferryNoSuchFn), ferryGone" {
		t.Fatalf("without a prefix: %v", le)
	}
	tab, err := l.Resolve([]Symbol{{Name: "strlen", Try: []string{"strlen_v9", "strlen"}}, {Name: "ferryNoSuchFn", Optional: true}})
	if err != nil || tab.Proc("ferryNoSuchFn") != 0 || tab.Proc("strlen") == 0 || tab.Lib != l {
		t.Fatalf("Resolve with an optional symbol: %v", err)
	}
	rng := testseed.Rand(t, 1)
	for range 20 {
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(1 + rng.IntN(255))
		}
		s := string(b)
		c := CString(s)
		if n := tab.Call("strlen", uintptr(unsafe.Pointer(&c[0]))); int(n) != len(s) {
			t.Fatalf("strlen of %d bytes = %d", len(s), n)
		}
		if got := GoString(uintptr(unsafe.Pointer(&c[0]))); got != s {
			t.Fatalf("GoString(CString(%q)) = %q", s, got)
		}
	}
	if GoString(0) != "" {
		t.Fatal("GoString(0) is not empty")
	}
}

// CStrings holds each string at its address until Free.
func TestCStrings(t *testing.T) {
	rng := testseed.Rand(t, 2)
	ss := make([]string, 1+rng.IntN(8))
	for i := range ss {
		b := make([]byte, rng.IntN(40))
		for j := range b {
			b[j] = byte('a' + rng.IntN(26))
		}
		ss[i] = string(b)
	}
	c := NewCStrings(ss...)
	defer c.Free()
	for i, s := range ss {
		if got := GoString(c.Ptrs[i]); got != s {
			t.Fatalf("string %d = %q, want %q", i, got, s)
		}
	}
}
