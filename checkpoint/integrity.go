package checkpoint

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Metadata keys Ferry adds to the "__metadata__" of the files it writes.
// Their values are strings, so other safetensors readers still read the
// files (and show these keys as metadata).
const (
	// reservedPrefix begins every key Ferry adds; Save refuses user
	// metadata keys that begin with it.
	reservedPrefix = "ferry."
	// tensorSumPrefix + a tensor's name holds the CRC-32C (Castagnoli) of
	// the tensor's data bytes, 8 lowercase hex digits.
	tensorSumPrefix = "ferry.crc32c."
	// headerSumKey holds the CRC-32C of the header's content (headerDigest):
	// every other metadata key and value and every tensor's name, dtype,
	// shape and offsets.
	headerSumKey = "ferry.header_crc32c"
	// saveIDKey holds the save id of a sharded checkpoint's data file.
	saveIDKey = "ferry.save_id"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crcHex(c uint32) string { return fmt.Sprintf("%08x", c) }

// parseCRC parses 8 lowercase hex digits.
func parseCRC(s string) (uint32, bool) {
	if len(s) != 8 || strings.ToLower(s) != s {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 16, 32)
	return uint32(v), err == nil
}

// headerDigest is the CRC-32C of a header's content in a canonical form:
// the metadata (without headerSumKey) by key, then the tensors by name with
// their dtype, shape and offsets, every string length-prefixed. It does not
// depend on the JSON's layout, only on what the header says.
func headerDigest(meta map[string]string, tensors map[string]TensorInfo) uint32 {
	var b bytes.Buffer
	str := func(s string) {
		b.Write(binary.AppendUvarint(nil, uint64(len(s))))
		b.WriteString(s)
	}
	num := func(v int64) { b.Write(binary.AppendVarint(nil, v)) }
	keys := make([]string, 0, len(meta))
	for k := range meta {
		if k != headerSumKey {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	num(int64(len(keys)))
	for _, k := range keys {
		str(k)
		str(meta[k])
	}
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	slices.Sort(names)
	num(int64(len(names)))
	for _, n := range names {
		t := tensors[n]
		str(n)
		str(t.DType)
		num(int64(len(t.Shape)))
		for _, d := range t.Shape {
			num(int64(d))
		}
		num(t.DataOffsets[0])
		num(t.DataOffsets[1])
	}
	return crc32.Checksum(b.Bytes(), castagnoli)
}

// verifyHeader checks the checksums of a parsed header: a header with no
// key of Ferry's is a file of another tool, left unverified; one with any
// must hold the header checksum, and it must match, and a checksum for
// every tensor. It moves the checksums and the save id out of h.meta, so
// that h.meta holds the user's metadata.
func verifyHeader(h *header) error {
	hasOurs := false
	for k := range h.meta {
		if strings.HasPrefix(k, reservedPrefix) {
			hasOurs = true
			break
		}
	}
	if !hasOurs {
		return nil
	}
	rec, ok := h.meta[headerSumKey]
	if !ok {
		return fmt.Errorf("corrupt header: it holds Ferry's checksums but no %q", headerSumKey)
	}
	want, ok := parseCRC(rec)
	if !ok {
		return fmt.Errorf("corrupt header: %s %q is not 8 hex digits", headerSumKey, rec)
	}
	if got := headerDigest(h.meta, h.tensors); got != want {
		return fmt.Errorf("corrupt header: its content has CRC-32C %08x, the header records %08x (a name, dtype, shape, offset or metadata value changed after it was written)", got, want)
	}
	h.sums = make(map[string]uint32, len(h.tensors))
	user := make(map[string]string, len(h.meta))
	for k, v := range h.meta {
		switch {
		case strings.HasPrefix(k, tensorSumPrefix):
			name := k[len(tensorSumPrefix):]
			if _, ok := h.tensors[name]; !ok {
				return fmt.Errorf("corrupt header: a checksum for tensor %q, which it does not describe", name)
			}
			c, ok := parseCRC(v)
			if !ok {
				return fmt.Errorf("corrupt header: tensor %q's checksum %q is not 8 hex digits", name, v)
			}
			h.sums[name] = c
		case k == saveIDKey:
			h.saveID = v
		case strings.HasPrefix(k, reservedPrefix):
			// Covered by the header checksum; kept out of the user's metadata.
		default:
			user[k] = v
		}
	}
	for _, name := range h.order {
		if _, ok := h.sums[name]; !ok {
			return fmt.Errorf("corrupt header: tensor %q has no checksum", name)
		}
	}
	h.meta = user
	h.verified = true
	return nil
}

// checkTensor checks data, the bytes of tensor name, against h's checksum
// (if h has checksums).
func checkTensor(h *header, name string, data []byte) error {
	if !h.verified {
		return nil
	}
	if got, want := crc32.Checksum(data, castagnoli), h.sums[name]; got != want {
		return fmt.Errorf("tensor %q is corrupt: its data has CRC-32C %08x, the header records %08x", name, got, want)
	}
	return nil
}

// fullMetadata returns the metadata of a file Ferry writes: the user's
// (whose keys must not begin with "ferry."), the internal keys, a checksum
// per tensor and the header checksum.
func fullMetadata(user, internal map[string]string, tensors map[string]TensorInfo, sums map[string]uint32) (map[string]string, error) {
	meta := make(map[string]string, len(user)+len(internal)+len(sums)+1)
	for k, v := range user {
		if strings.HasPrefix(k, reservedPrefix) {
			return nil, fmt.Errorf("metadata key %q: keys beginning with %q are reserved for Ferry's checksums", k, reservedPrefix)
		}
		meta[k] = v
	}
	for k, v := range internal {
		meta[k] = v
	}
	for name, c := range sums {
		meta[tensorSumPrefix+name] = crcHex(c)
	}
	meta[headerSumKey] = crcHex(headerDigest(meta, tensors))
	return meta, nil
}

// ---- files ----

// Option changes how SaveFile and SaveSharded write files.
type Option func(*options)

type options struct {
	perm os.FileMode
}

func makeOptions(opts []Option) options {
	o := options{perm: 0o644}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

// WithFileMode creates the files with permissions perm (before the umask)
// instead of 0644.
func WithFileMode(perm os.FileMode) Option {
	return func(o *options) { o.perm = perm.Perm() }
}

// stepHook, when set (by tests), is called at each step of writing files
// that a crash could interrupt, with the step's name.
var stepHook func(step string)

func step(name string) {
	if stepHook != nil {
		stepHook(name)
	}
}

// tempPattern matches the names of the temporary files this package writes
// (and those of its earlier versions, made by os.CreateTemp).
var tempPattern = regexp.MustCompile(`^\.checkpoint-[0-9A-Za-z]+\.tmp$`)

// createTemp creates a temporary file in dir, named by tempPattern, with
// permissions perm (the umask applies), locked (where the platform can) so
// that removeStale leaves it while it is being written.
func createTemp(dir string, perm os.FileMode) (*os.File, error) {
	var rnd [8]byte
	for range 100 {
		_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails
		name := filepath.Join(dir, ".checkpoint-"+hex.EncodeToString(rnd[:])+".tmp")
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := lockFile(f); err != nil {
			f.Close()
			os.Remove(name)
			return nil, fmt.Errorf("locking %s: %w", name, err)
		}
		// A removeStale may have taken it for stale between its creation
		// and the lock: then it is no longer at name, and we make another.
		st, err1 := f.Stat()
		at, err2 := os.Stat(name)
		if err1 == nil && err2 == nil && os.SameFile(st, at) {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("could not create a temporary file in %s", dir)
}

// removeStale removes the temporary files of saves that died in dir: those
// named by tempPattern that no live writer holds locked. Errors are
// ignored (a read-only directory keeps its files; the next save retries).
func removeStale(dir string) {
	if !canLock {
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !tempPattern.MatchString(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		if tryLock(f) {
			st, err1 := f.Stat()
			at, err2 := os.Stat(path)
			if err1 == nil && err2 == nil && os.SameFile(st, at) {
				os.Remove(path)
			}
		}
		f.Close()
	}
}

// writeAtomic writes the file at path through write: into a temporary file
// beside it, synced to storage, renamed to path, and the directory synced,
// so that after a crash path holds either its previous content or the new
// one, complete, and never a part.
func writeAtomic(path string, perm os.FileMode, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := createTemp(dir, perm)
	if err != nil {
		return err
	}
	tmp := f.Name()
	closed := false
	defer func() {
		if !closed {
			f.Close()
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	step("created " + filepath.Base(path))
	if err = write(f); err != nil {
		return err
	}
	step("wrote " + filepath.Base(path))
	if err = f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", tmp, err)
	}
	step("synced " + filepath.Base(path))
	if !canLock {
		// Where files are not locked, they cannot be renamed open either.
		closed = true
		if err = f.Close(); err != nil {
			return err
		}
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	step("renamed " + filepath.Base(path))
	if !closed {
		// Closed after the rename: until then it is locked, a live save's.
		closed = true
		if err = f.Close(); err != nil {
			return err
		}
	}
	if err = syncDir(dir); err != nil {
		return err
	}
	step("synced the directory of " + filepath.Base(path))
	return nil
}
