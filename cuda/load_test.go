package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/dynlib"
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

// NVRTC and cuBLASLt report the glob they looked for in each directory.
func TestLoadLibrariesReportSearchedPaths(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadNVRTC([]string{dir}); err == nil {
		t.Skip("NVRTC loaded from the system")
	} else {
		var le *LoadError
		if !errors.As(err, &le) || le.Library != "libnvrtc.so*" || !strings.Contains(err.Error(), filepath.Join(dir, "libnvrtc.so*")) {
			t.Fatalf("NVRTC error: %v", err)
		}
	}
	_, err := LoadCublasLt([]string{dir})
	if err == nil {
		t.Skip("cuBLASLt loaded from the system")
	}
	if !strings.Contains(err.Error(), filepath.Join(dir, "libcublasLt.so*")) || !strings.Contains(err.Error(), "no match") {
		t.Fatalf("cuBLASLt error: %v", err)
	}
}

// A symbol table reports the library and the names it tried for a missing
// entry point.
func TestResolveSymbolsMissing(t *testing.T) {
	_, err := resolve(libc(t), []dynlib.Symbol{{Name: "ferryNoSuchFn", Try: []string{"ferryNoSuchFn_v2", "ferryNoSuchFn"}}})
	if err == nil || !strings.Contains(err.Error(), "cuda: libc.so.6: missing entry point ferryNoSuchFn (tried ferryNoSuchFn_v2, ferryNoSuchFn)") {
		t.Fatalf("err = %v", err)
	}
	tab, err := resolve(libc(t), []dynlib.Symbol{{Name: "strlen", Try: []string{"strlen_v2", "strlen"}}})
	if err != nil || tab.Proc("strlen") == 0 {
		t.Fatalf("strlen not resolved through its fallback name: %v", err)
	}
}

// libc is the C library, loaded through the system loader.
func libc(t testing.TB) *Library {
	l, err := openLibrary("libc.so.6", "libc.so.6", nil)
	if err != nil {
		t.Skipf("no libc: %v", err)
	}
	return l
}

// goString and ptrFromUintptr are the C-memory helpers the fakes use.
func goString(p uintptr) string { return dynlib.GoString(p) }

func ptrFromUintptr(p uintptr) unsafe.Pointer { return dynlib.Ptr(p) }

// The nvidia/*/lib folders of the active virtualenv ($VIRTUAL_ENV), where
// pip puts the CUDA wheels (nvidia-cuda-nvrtc 13: nvidia/cu13/lib), are
// searched, and LoadNVRTC finds the library there.
func TestSearchDirsVirtualenv(t *testing.T) {
	venv := t.TempDir()
	lib := filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "cu13", "lib")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(LibDirEnv, "")
	t.Setenv("VIRTUAL_ENV", venv)
	if ds := SearchDirs(); !slices.Contains(ds, lib) {
		t.Fatalf("%s is not searched: %v", lib, ds)
	}
	_, err := LoadNVRTC(SearchDirs())
	if err == nil {
		t.Skip("NVRTC loaded from elsewhere")
	}
	if !strings.Contains(err.Error(), filepath.Join(lib, "libnvrtc.so*")) {
		t.Fatalf("the virtualenv's folder is not in the error: %v", err)
	}
}
