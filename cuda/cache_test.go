package cuda

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeCompiler returns an image derived from the source and arch and counts
// its calls.
type fakeCompiler struct {
	mu    sync.Mutex
	calls int
	fail  bool
}

func (f *fakeCompiler) compile(src, name, arch string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail {
		return nil, errors.New("fake compile error")
	}
	h := sha256.Sum256([]byte(src + "|" + arch))
	return []byte(fmt.Sprintf("IMG %s %s %x", name, arch, h[:8])), nil
}

func randomSource(rng *rand.Rand) string {
	return fmt.Sprintf("extern \"C\" __global__ void k() { /* %d */ }", rng.Uint64())
}

func TestCacheMemoryAndDisk(t *testing.T) {
	rng := testseed.Rand(t, 7)
	dir := t.TempDir()
	fc := &fakeCompiler{}
	c := NewCache(dir, "nvrtc-13.0", fc.compile)
	src := randomSource(rng)
	want, _ := fc.compile(src, "k", "sm_90")
	fc.calls = 0
	img, err := c.Get(src, "k", "sm_90")
	if err != nil || string(img) != string(want) {
		t.Fatalf("Get = %q, %v; want %q", img, err, want)
	}
	if _, err := c.Get(src, "k", "sm_90"); err != nil || fc.calls != 1 {
		t.Fatalf("second Get compiled again (%d calls, %v)", fc.calls, err)
	}
	// Another arch or compiler version is another key.
	if _, err := c.Get(src, "k", "sm_80"); err != nil || fc.calls != 2 {
		t.Fatalf("sm_80 did not compile (%d calls)", fc.calls)
	}
	if c.Key(src, "sm_90") == NewCache(dir, "nvrtc-12.4", nil).Key(src, "sm_90") {
		t.Fatal("key ignores the compiler version")
	}
	// A fresh cache over the same directory reads from disk.
	fc2 := &fakeCompiler{}
	c2 := NewCache(dir, "nvrtc-13.0", fc2.compile)
	img2, err := c2.Get(src, "k", "sm_90")
	if err != nil || string(img2) != string(want) || fc2.calls != 0 || c2.DiskHits != 1 {
		t.Fatalf("disk read: %q, %v, %d compiles, %d disk hits", img2, err, fc2.calls, c2.DiskHits)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

func TestCacheCorruptFileRewritten(t *testing.T) {
	rng := testseed.Rand(t, 8)
	dir := t.TempDir()
	fc := &fakeCompiler{}
	src := randomSource(rng)
	c := NewCache(dir, "v1", fc.compile)
	want, err := c.Get(src, "k", "sm_90")
	if err != nil {
		t.Fatal(err)
	}
	path := c.Path(c.Key(src, "sm_90"))
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"truncated":   good[:len(good)/2],
		"flipped":     append(append([]byte{}, good[:len(good)-1]...), good[len(good)-1]^0xff),
		"empty":       {},
		"wrong magic": append([]byte("XXXXXXXX"), good[8:]...),
	} {
		if err := os.WriteFile(path, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		fc.calls = 0
		c := NewCache(dir, "v1", fc.compile)
		img, err := c.Get(src, "k", "sm_90")
		if err != nil || string(img) != string(want) || fc.calls != 1 {
			t.Fatalf("%s: got %q, %v after %d compiles", name, img, err, fc.calls)
		}
		now, _ := os.ReadFile(path)
		if string(now) != string(good) {
			t.Fatalf("%s: file not rewritten", name)
		}
	}
}

func TestCacheCompileErrorAndNoDir(t *testing.T) {
	fc := &fakeCompiler{fail: true}
	c := NewCache("", "v", fc.compile)
	if _, err := c.Get("x", "k", "sm_90"); err == nil || !strings.Contains(err.Error(), "fake compile error") {
		t.Fatalf("err = %v", err)
	}
	fc.fail = false
	if _, err := c.Get("x", "k", "sm_90"); err != nil {
		t.Fatal(err)
	}
	if c.Path("k") != "" {
		t.Fatal("memory-only cache has a path")
	}
	// An unwritable directory still returns the image.
	dir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(dir, nil, 0o644)
	c2 := NewCache(filepath.Join(dir, "sub"), "v", fc.compile)
	if _, err := c2.Get("y", "k", "sm_90"); err != nil {
		t.Fatal(err)
	}
}

func TestCacheConcurrent(t *testing.T) {
	fc := &fakeCompiler{}
	c := NewCache(t.TempDir(), "v", fc.compile)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Get(fmt.Sprint("src", i%2), "k", "sm_90"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if _, err := c.Get("src0", "k", "sm_90"); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv(CacheDirEnv, "/some/where")
	if d := DefaultCacheDir(); d != "/some/where" {
		t.Fatalf("got %q", d)
	}
	t.Setenv(CacheDirEnv, "")
	if d := DefaultCacheDir(); d != "" && !strings.HasSuffix(d, filepath.Join("ferry", "cuda")) {
		t.Fatalf("got %q", d)
	}
}
