package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferryml/ferry/checkpoint"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// testSeed returns a fresh seed, or FERRY_TEST_SEED's, and logs it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v, set, err := settings.TestSeed.Lookup(); set {
		require.NoError(t, err, "FERRY_TEST_SEED")
		seed = v
	}
	t.Logf("seed %d (FERRY_TEST_SEED=%d repeats this run)", seed, seed)
	return seed
}

// unsharded is the layout of a tree of plain arrays.
var unsharded, unspecs = make([]*ir.Mesh, 7), make([]ir.PartitionSpec, 7)

// sameValues reports whether got holds want's values, bit for bit, and
// deletes got's arrays.
func sameValues(t *testing.T, got ckTree, want []*ir.Literal) bool {
	t.Helper()
	same := true
	for i, x := range got.leaves() {
		l, err := x.Literal()
		require.NoError(t, err)
		same = same && bytes.Equal(l.Data, want[i].Data)
		require.NoError(t, x.Delete())
	}
	return same
}

// flip returns a copy of b with the byte at pos changed: XORed with a
// random non-zero byte, or (bit) one random bit flipped.
func flip(rng *rand.Rand, b []byte, pos int, bit bool) []byte {
	c := bytes.Clone(b)
	if bit {
		c[pos] ^= 1 << rng.IntN(8)
	} else {
		c[pos] ^= byte(1 + rng.IntN(255))
	}
	return c
}

// TestCorruptFileRefused flips random bytes and bits of a saved file: every
// change to the data is refused naming the tensor, and a change to the
// header either is refused or is one that changes nothing (padding spaces
// turned into other JSON white space), loading the saved values and
// metadata.
func TestCorruptFileRefused(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	want := randomLiterals(seed)
	meta := map[string]string{"step": "41"}
	var buf bytes.Buffer
	require.NoError(t, checkpoint.Save(&buf, place(t, want, unsharded, unspecs), meta))
	good := buf.Bytes()
	hlen := 8 + int(binary.LittleEndian.Uint64(good))
	like := place(t, zeros(), unsharded, unspecs)

	// load reports whether bad was refused; if not, it must hold the saved
	// values and metadata.
	load := func(what string, bad []byte) (error, bool) {
		got, err := checkpoint.Load(bytes.NewReader(bad), like)
		if err != nil {
			return err, true
		}
		_, m, err := checkpoint.ReadHeader(bytes.NewReader(bad))
		require.NoError(t, err, "%s: Load accepted it but ReadHeader did not", what)
		require.Equal(t, meta, m, "%s: loaded with other metadata", what)
		require.True(t, sameValues(t, got, want), "%s: loaded other values", what)
		return nil, false
	}
	err, _ := load("the saved file", good)
	require.NoError(t, err)

	for _, c := range []struct {
		name     string
		from, to int
		tries    int
		bit      bool
		mustFail bool
	}{
		{"data byte", hlen, len(good), 500, false, true},
		{"data bit", hlen, len(good), 200, true, true},
		{"header byte", 0, hlen, 500, false, false},
		{"header bit", 0, hlen, 200, true, false},
	} {
		refused := 0
		var accepted []string
		for range c.tries {
			pos := c.from + rng.IntN(c.to-c.from)
			bad := flip(rng, good, pos, c.bit)
			err, ok := load(c.name+" flip at "+strconv.Itoa(pos), bad)
			if !ok {
				accepted = append(accepted, strconv.Quote(string(good[pos:pos+1]))+"->"+strconv.Quote(string(bad[pos:pos+1]))+" at "+strconv.Itoa(pos))
			}
			if ok {
				refused++
				if c.mustFail {
					require.ErrorContains(t, err, "is corrupt", "%s flip at %d", c.name, pos)
				}
			} else {
				require.False(t, c.mustFail, "%s flip at %d loaded", c.name, pos)
			}
		}
		t.Logf("%s flips: %d tried, %d refused, %d loaded the saved values and metadata %v", c.name, c.tries, refused, c.tries-refused, accepted)
	}

	// The error of LoadFile names the file and the tensor.
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	bad := bytes.Clone(good)
	bad[len(bad)-1] ^= 0x40 // the last byte of the last tensor, G
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	_, err = checkpoint.LoadFile(path, like)
	require.ErrorContains(t, err, path)
	require.ErrorContains(t, err, `tensor "G" is corrupt`)

	// A changed metadata value of the same length.
	bad = bytes.Replace(good, []byte(`"step":"41"`), []byte(`"step":"42"`), 1)
	require.NotEqual(t, good, bad)
	err, _ = load("step changed", bad)
	require.ErrorContains(t, err, "corrupt header")
	_, _, err = checkpoint.ReadHeader(bytes.NewReader(bad))
	require.ErrorContains(t, err, "corrupt header")

	// A removed checksum (the key renamed to a user key).
	bad = bytes.Replace(good, []byte(`"ferry.crc32c.A"`), []byte(`"ferry_crc32c.A"`), 1)
	err, _ = load("checksum key renamed", bad)
	require.ErrorContains(t, err, "corrupt header")
}

// TestTrailingDataRefused: bytes after the last tensor are refused, by
// readers that know the size and those that do not.
func TestTrailingDataRefused(t *testing.T) {
	want := randomLiterals(3)
	var buf bytes.Buffer
	require.NoError(t, checkpoint.Save(&buf, place(t, want, unsharded, unspecs), nil))
	bad := append(bytes.Clone(buf.Bytes()), "garbage"...)
	like := place(t, zeros(), unsharded, unspecs)

	_, err := checkpoint.Load(bytes.NewReader(bad), like)
	require.ErrorContains(t, err, "7 bytes of trailing data after the last tensor")
	_, err = checkpoint.Load(io.MultiReader(bytes.NewReader(bad)), like) // size unknown
	require.ErrorContains(t, err, "trailing data after the last tensor")
	_, _, err = checkpoint.ReadHeader(bytes.NewReader(bad))
	require.ErrorContains(t, err, "trailing data")
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	_, err = checkpoint.LoadFile(path, like)
	require.ErrorContains(t, err, "trailing data")

	// Without it, all of them load.
	got, err := checkpoint.Load(io.MultiReader(bytes.NewReader(buf.Bytes())), like)
	require.NoError(t, err)
	require.True(t, sameValues(t, got, want))
}

// TestForeignFileLoadsUnverified: a file without Ferry's checksums (another
// tool's) loads, its metadata intact.
func TestForeignFileLoadsUnverified(t *testing.T) {
	hdr := `{"__metadata__":{"format":"pt"},"X":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	file := string(n[:]) + hdr + "\x00\x00\x80\x3f\x00\x00\x00\x40"
	_, meta, err := checkpoint.ReadHeader(strings.NewReader(file))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"format": "pt"}, meta)
	got, err := checkpoint.Load(strings.NewReader(file), struct{ X *trace.Array }{trace.Zeros(ir.Shape{2}, ir.Float32)})
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2}, got.X.Float32s())
}

// TestReservedMetadataKeys: user metadata may not use Ferry's prefix.
func TestReservedMetadataKeys(t *testing.T) {
	tree := place(t, randomLiterals(4), unsharded, unspecs)
	err := checkpoint.Save(io.Discard, tree, map[string]string{"ferry.crc32c.A": "00000000"})
	require.ErrorContains(t, err, `metadata key "ferry.crc32c.A": keys beginning with "ferry." are reserved`)
	err = checkpoint.SaveSharded(t.TempDir(), tree, map[string]string{"ferry.x": ""})
	require.ErrorContains(t, err, `metadata key "ferry.x"`)
}

// TestCorruptShardedRefused flips random bytes of a sharded checkpoint's
// data file and index: every change to the data file is refused naming it;
// a change to the index is refused or changes nothing.
func TestCorruptShardedRefused(t *testing.T) {
	if inJob {
		t.Skip("one process")
	}
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	want := randomLiterals(seed)
	m24 := mesh(t, []int{2, 4}, []string{"x", "y"})
	m8 := mesh(t, []int{8}, []string{"x"})
	meshes := []*ir.Mesh{m24, m8, m24, m24, nil, m24, nil}
	specs := []ir.PartitionSpec{ir.P("x", "y"), ir.P("x"), ir.P("y"), ir.P(), nil, ir.P("", "x"), nil}
	dir := t.TempDir()
	require.NoError(t, checkpoint.SaveSharded(dir, place(t, want, meshes, specs), map[string]string{"step": "7"}))
	idx, err := checkpoint.ReadIndex(dir)
	require.NoError(t, err)
	data := filepath.Join(dir, idx.Files[0].Name)
	index := filepath.Join(dir, checkpoint.IndexFile)
	goodData, err := os.ReadFile(data)
	require.NoError(t, err)
	goodIndex, err := os.ReadFile(index)
	require.NoError(t, err)
	like := place(t, zeros(), unsharded, unspecs)

	try := func(path string, bad []byte) (error, bool) {
		require.NoError(t, os.WriteFile(path, bad, 0o644))
		got, err := checkpoint.LoadSharded(dir, like)
		if err != nil {
			return err, true
		}
		i, err := checkpoint.ReadIndex(dir)
		require.NoError(t, err)
		require.Equal(t, map[string]string{"step": "7"}, i.Metadata)
		require.True(t, sameValues(t, got, want), "loaded other values")
		return nil, false
	}
	const tries = 300
	refused := 0
	for range tries {
		pos := rng.IntN(len(goodData))
		err, ok := try(data, flip(rng, goodData, pos, rng.IntN(2) == 0))
		require.True(t, ok, "data file flip at %d loaded", pos)
		require.ErrorContains(t, err, idx.Files[0].Name)
		refused++
	}
	t.Logf("data file flips: %d tried, %d refused", tries, refused)
	require.NoError(t, os.WriteFile(data, goodData, 0o644))
	refused = 0
	for range tries {
		pos := rng.IntN(len(goodIndex))
		if _, ok := try(index, flip(rng, goodIndex, pos, rng.IntN(2) == 0)); ok {
			refused++
		}
	}
	t.Logf("index flips: %d tried, %d refused, %d loaded the saved values and metadata (white space changed)", tries, refused, tries-refused)
	require.NoError(t, os.WriteFile(index, goodIndex, 0o644))

	// Trailing data after a data file's last tensor.
	_, ok := try(data, append(bytes.Clone(goodData), 0))
	require.True(t, ok)
	err, _ = try(data, append(bytes.Clone(goodData), 0))
	require.ErrorContains(t, err, "trailing data")
	require.NoError(t, os.WriteFile(data, goodData, 0o644))

	// A changed metadata value in the index.
	err, _ = try(index, bytes.Replace(goodIndex, []byte(`"step": "7"`), []byte(`"step": "8"`), 1))
	require.ErrorContains(t, err, "corrupt index")
	require.NoError(t, os.WriteFile(index, goodIndex, 0o644))

	// A data file of another checkpoint with the same save id and name.
	other := t.TempDir()
	require.NoError(t, checkpoint.SaveSharded(other, place(t, randomLiterals(seed+1), meshes, specs), nil))
	otherData, err := os.ReadFile(filepath.Join(other, idx.Files[0].Name))
	require.NoError(t, err)
	err, _ = try(data, otherData)
	require.ErrorContains(t, err, "a file of another save")
	// A data file of another save, renamed.
	require.NoError(t, checkpoint.SaveSharded(other, place(t, want, meshes, specs), map[string]string{"step": "7"}))
	oi, err := checkpoint.ReadIndex(other)
	require.NoError(t, err)
	require.Equal(t, "2", oi.SaveID)
	otherData, err = os.ReadFile(filepath.Join(other, oi.Files[0].Name))
	require.NoError(t, err)
	err, _ = try(data, otherData)
	require.ErrorContains(t, err, idx.Files[0].Name)
	require.NoError(t, os.WriteFile(data, goodData, 0o644))

	got, err := checkpoint.LoadSharded(dir, like)
	require.NoError(t, err)
	require.True(t, sameValues(t, got, want))
}

// tempFiles lists dir's temporary files of saves.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".checkpoint-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestStaleTempFilesRemoved: the next save or load of a directory removes
// the temporary files that saves which died left there, and only those:
// not other files, nor those of a save under way.
func TestStaleTempFilesRemoved(t *testing.T) {
	if inJob {
		t.Skip("one process")
	}
	tree := place(t, randomLiterals(6), unsharded, unspecs)
	like := place(t, zeros(), unsharded, unspecs)
	dir := t.TempDir()
	stale := func(name string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("a part of a checkpoint"), 0o644))
	}
	for _, name := range []string{".checkpoint-other.txt", "notes.tmp", ".checkpoint-.tmp"} {
		stale(name) // not ours
	}
	stale(".checkpoint-123456.tmp")
	require.NoError(t, checkpoint.SaveFile(filepath.Join(dir, "a"), tree, nil))
	require.Equal(t, []string{".checkpoint-.tmp", ".checkpoint-other.txt"}, tempFiles(t, dir))
	stale(".checkpoint-0123abcd.tmp")
	_, err := checkpoint.LoadFile(filepath.Join(dir, "a"), like)
	require.NoError(t, err)
	require.Equal(t, []string{".checkpoint-.tmp", ".checkpoint-other.txt"}, tempFiles(t, dir))
	_, err = os.Stat(filepath.Join(dir, "notes.tmp"))
	require.NoError(t, err)

	// A save paused after writing its temporary file keeps it through
	// another save and a load of the directory, and completes.
	paused, resume := make(chan struct{}), make(chan struct{})
	checkpoint.SetStepHook(func(step string) {
		if step == "wrote b" {
			close(paused)
			<-resume
		}
	})
	defer checkpoint.SetStepHook(nil)
	var wg sync.WaitGroup
	var saveErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		saveErr = checkpoint.SaveFile(filepath.Join(dir, "b"), tree, nil)
	}()
	<-paused
	require.Len(t, tempFiles(t, dir), 3)
	require.NoError(t, checkpoint.SaveFile(filepath.Join(dir, "c"), tree, nil))
	_, err = checkpoint.LoadFile(filepath.Join(dir, "a"), like)
	require.NoError(t, err)
	require.Len(t, tempFiles(t, dir), 3, "the live save's file was removed")
	close(resume)
	wg.Wait()
	require.NoError(t, saveErr)
	require.Len(t, tempFiles(t, dir), 2)
	got, err := checkpoint.LoadFile(filepath.Join(dir, "b"), like)
	require.NoError(t, err)
	require.True(t, sameValues(t, got, randomLiterals(6)))
}

// TestLegacyShardedIndex: a checkpoint of the "/1" format (no save id, no
// checksums in its index) still loads, unverified, and the next save
// replaces it, removing its files.
func TestLegacyShardedIndex(t *testing.T) {
	if inJob {
		t.Skip("one process")
	}
	want := randomLiterals(8)
	m8 := mesh(t, []int{8}, []string{"x"})
	meshes := []*ir.Mesh{m8, m8, nil, nil, nil, nil, nil}
	specs := []ir.PartitionSpec{ir.P("x"), ir.P("x"), nil, nil, nil, nil, nil}
	dir := t.TempDir()
	require.NoError(t, checkpoint.SaveSharded(dir, place(t, want, meshes, specs), map[string]string{"step": "1"}))
	idx, err := checkpoint.ReadIndex(dir)
	require.NoError(t, err)
	// Rewrite it as an earlier version wrote it.
	const old = "process-0-of-1.safetensors"
	require.NoError(t, os.Rename(filepath.Join(dir, idx.Files[0].Name), filepath.Join(dir, old)))
	arrays, err := json.Marshal(idx.Arrays)
	require.NoError(t, err)
	legacy := strings.ReplaceAll(string(arrays), idx.Files[0].Name, old)
	require.NoError(t, os.WriteFile(filepath.Join(dir, checkpoint.IndexFile),
		[]byte(`{"format":"ferry-sharded-checkpoint/1","processes":1,"files":["`+old+`"],"metadata":{"step":"1"},"arrays":`+legacy+`}`), 0o644))
	like := place(t, zeros(), unsharded, unspecs)
	got, err := checkpoint.LoadSharded(dir, like)
	require.NoError(t, err)
	require.True(t, sameValues(t, got, want))

	require.NoError(t, checkpoint.SaveSharded(dir, place(t, randomLiterals(9), meshes, specs), nil))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, "process-0-of-1.save1.safetensors", entries[1].Name())
	got, err = checkpoint.LoadSharded(dir, like)
	require.NoError(t, err)
	require.True(t, sameValues(t, got, randomLiterals(9)))
}
