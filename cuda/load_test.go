package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// On a machine without CUDA, Load fails with a *LoadError that lists the
// paths it searched; with a driver it loads and resolves entry points.
func TestLoadReportsSearchedPaths(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(LibDirEnv, dir)
	d, err := Load()
	if err == nil {
		v, verr := d.Version()
		t.Skipf("a CUDA driver loaded from %s (version %d, %v); nothing to check here", d.CUDA.Path, v, verr)
	}
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("want *LoadError, got %T: %v", err, err)
	}
	msg := err.Error()
	t.Log(msg)
	if le.Library != "libcuda.so.1" || len(le.Attempts) == 0 {
		t.Fatalf("library %q, %d attempts", le.Library, len(le.Attempts))
	}
	for _, want := range []string{"libcuda.so.1", filepath.Join(dir, "libcuda.so.1"), "system loader"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message does not mention %q:\n%s", want, msg)
		}
	}
	if le.Attempts[0].Path != filepath.Join(dir, "libcuda.so.1") {
		t.Errorf("FERRY_CUDA_LIB_DIR is not searched first: %v", le.Attempts[0])
	}
}

// A file named like the library that is not one is reported with the loader's
// reason, not a crash.
func TestLoadReportsBadLibrary(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(bad, []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(LibDirEnv, dir)
	_, err := Load()
	var le *LoadError
	if !errors.As(err, &le) {
		t.Skipf("Load did not fail (%v): a real driver may be installed", err)
	}
	t.Log(err)
	a := le.Attempts[0]
	if a.Path != bad || a.Err == "" || strings.Contains(a.Err, "not found") {
		t.Fatalf("first attempt = %+v, want the dlopen error of %s", a, bad)
	}
}

func TestSearchDirs(t *testing.T) {
	t.Setenv(LibDirEnv, "/a/b")
	t.Setenv("LD_LIBRARY_PATH", "/x/lib:/y/lib")
	ds := SearchDirs()
	if len(ds) < 3 || ds[0] != "/a/b" {
		t.Fatalf("dirs %v", ds)
	}
	s := strings.Join(ds, "|")
	if !strings.Contains(s, "/x/lib|/y/lib") {
		t.Errorf("LD_LIBRARY_PATH entries missing: %v", ds)
	}
}
