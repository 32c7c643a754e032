package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/ferryml/ferry/internal/settings"
)

// CacheDirEnv names the environment variable that sets the on-disk kernel
// cache directory (default os.UserCacheDir()/ferry/cuda).
const CacheDirEnv = "FERRY_CACHE_DIR"

// CompileFunc compiles CUDA C source for an architecture ("sm_90") into a
// module image (cubin or PTX) that cuModuleLoadData accepts.
type CompileFunc func(src, name, arch string) ([]byte, error)

// Cache holds compiled module images in memory and on disk, keyed by the
// SHA-256 of the source, the architecture and the compiler version, so a
// kernel is compiled once per machine. Disk entries are written atomically
// (a temporary file renamed into place) and carry a checksum: a truncated or
// corrupt file is ignored, recompiled and rewritten. Safe for concurrent use.
type Cache struct {
	// Dir is the disk directory ("" keeps the cache in memory only).
	Dir string
	// Version identifies the compiler (for example "nvrtc-13.0").
	Version string
	compile CompileFunc
	mu      sync.Mutex
	mem     map[string][]byte
	// Compiles counts calls of the compiler; DiskHits counts images read
	// from disk.
	Compiles, DiskHits int
}

// DefaultCacheDir returns $FERRY_CACHE_DIR, or os.UserCacheDir()/ferry/cuda,
// or "" when neither is available.
func DefaultCacheDir() string {
	if d := settings.CacheDir.Get(); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "ferry", "cuda")
	}
	return ""
}

// NewCache returns a cache over dir that compiles misses with compile.
func NewCache(dir, version string, compile CompileFunc) *Cache {
	return &Cache{Dir: dir, Version: version, compile: compile, mem: map[string][]byte{}}
}

// Key returns the cache key of src for arch: hex SHA-256 of the source, the
// architecture and the compiler version.
func (c *Cache) Key(src, arch string) string {
	h := sha256.Sum256([]byte(src))
	return fmt.Sprintf("%s-%s-%s", hex.EncodeToString(h[:]), sanitize(arch), sanitize(c.Version))
}

func sanitize(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// cacheMagic starts every cache file; the SHA-256 of the payload follows.
var cacheMagic = []byte("FERRYCU1")

// Get returns the image of src for arch: from memory, else from disk, else
// compiled (and stored in both).
func (c *Cache) Get(src, name, arch string) ([]byte, error) {
	key := c.Key(src, arch)
	c.mu.Lock()
	if img, ok := c.mem[key]; ok {
		c.mu.Unlock()
		return img, nil
	}
	c.mu.Unlock()
	if img, ok := c.readDisk(key); ok {
		c.mu.Lock()
		c.mem[key] = img
		c.DiskHits++
		c.mu.Unlock()
		return img, nil
	}
	img, err := c.compile(src, name, arch)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.mem[key] = img
	c.Compiles++
	c.mu.Unlock()
	if err := c.writeDisk(key, img); err != nil {
		// A read-only or full cache directory costs a recompile next run,
		// nothing more.
		fmt.Fprintf(os.Stderr, "ferry: cuda kernel cache: %v\n", err)
	}
	return img, nil
}

// Path returns the disk file of key ("" without a directory).
func (c *Cache) Path(key string) string {
	if c.Dir == "" {
		return ""
	}
	return filepath.Join(c.Dir, key+".bin")
}

func (c *Cache) readDisk(key string) ([]byte, bool) {
	p := c.Path(key)
	if p == "" {
		return nil, false
	}
	data, err := os.ReadFile(p)
	if err != nil || len(data) < len(cacheMagic)+sha256.Size || !bytes.Equal(data[:len(cacheMagic)], cacheMagic) {
		return nil, false
	}
	sum := data[len(cacheMagic) : len(cacheMagic)+sha256.Size]
	payload := data[len(cacheMagic)+sha256.Size:]
	if h := sha256.Sum256(payload); !bytes.Equal(h[:], sum) {
		return nil, false
	}
	return payload, true
}

func (c *Cache) writeDisk(key string, img []byte) error {
	p := c.Path(key)
	if p == "" {
		return nil
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(c.Dir, key+".tmp*")
	if err != nil {
		return err
	}
	h := sha256.Sum256(img)
	_, err = f.Write(append(append(append([]byte{}, cacheMagic...), h[:]...), img...))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
