package datasets

import (
	"bytes"
	"compress/gzip"
	"errors"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// gzStored gzips p without compression (stored blocks), so that p's bytes
// appear verbatim in the result and flipping one of them leaves a stream
// that inflates but fails its CRC-32.
func gzStored(t *testing.T, p []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := gzip.NewWriterLevel(&b, gzip.NoCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func randomBytes(t *testing.T, n int) []byte {
	rng := testseed.Rand(t, 1)
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// TestReadIDXGzipIntegrity: the gzip trailer (CRC-32 and size) is checked,
// so damaged and truncated files are errors, not wrong data.
func TestReadIDXGzipIntegrity(t *testing.T) {
	shape := []int{7, 5, 3}
	data := randomBytes(t, 7*5*3)
	raw := idx(shape, data)
	z := gz(t, raw)
	stored := gzStored(t, raw)
	at := bytes.Index(stored, data)
	if at < 0 {
		t.Fatal("stored gzip does not hold the payload verbatim")
	}
	rng := testseed.Rand(t, 2)
	flip := func(p []byte, i int, bit byte) []byte {
		q := bytes.Clone(p)
		q[i] ^= 1 << bit
		return q
	}
	cases := map[string]struct {
		in   []byte
		want string
	}{
		"truncated trailer":      {z[:len(z)-4], "truncated"},
		"no trailer":             {z[:len(z)-8], "truncated"},
		"flipped payload bit":    {flip(stored, at+rng.IntN(len(data)), byte(rng.IntN(8))), "checksum"},
		"flipped CRC bit":        {flip(z, len(z)-8+rng.IntN(4), byte(rng.IntN(8))), "checksum"},
		"flipped size bit":       {flip(z, len(z)-4+rng.IntN(4), byte(rng.IntN(8))), "checksum"},
		"trailing garbage":       {append(bytes.Clone(z), "garbage"...), "trailing garbage after the gzip stream"},
		"trailing zero byte":     {append(bytes.Clone(z), 0), "trailing garbage after the gzip stream"},
		"payload too long (gz)":  {gz(t, append(bytes.Clone(raw), 9)), "trailing data after the IDX payload"},
		"payload too long":       {append(bytes.Clone(raw), 9, 9), "trailing data after the IDX payload"},
		"second member garbage":  {append(bytes.Clone(z), 0x1f, 0x8b, 0, 0), "gzip"},
		"second member too long": {append(bytes.Clone(z), gz(t, []byte{1})...), "trailing data after the IDX payload"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s, d, err := ReadIDX(bytes.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got shape %v, %d bytes, err = %v; want an error containing %q", s, len(d), err, c.want)
			}
		})
	}

	// A stream of several gzip members (as `cat a.gz b.gz` makes) is one
	// gzip file: the payload may span them.
	half := len(raw) / 2
	two := append(gz(t, raw[:half]), gz(t, raw[half:])...)
	s, d, err := ReadIDX(bytes.NewReader(two))
	if err != nil || !reflect.DeepEqual(s, shape) || !bytes.Equal(d, data) {
		t.Fatalf("two gzip members: shape %v, err %v", s, err)
	}
	// The stored stream, unflipped, is fine.
	if _, d, err := ReadIDX(bytes.NewReader(stored)); err != nil || !bytes.Equal(d, data) {
		t.Fatalf("stored gzip: err %v", err)
	}
}

// TestReadIDXHugeHeaderSmallFile: a header that announces 1 GiB of data in a
// file of a few bytes is reported as truncated without allocating what it
// announces.
func TestReadIDXHugeHeaderSmallFile(t *testing.T) {
	hdr := idx([]int{1 << 30}, nil) // 8 bytes, the largest accepted size
	for name, in := range map[string][]byte{
		"plain":     append(bytes.Clone(hdr), 1),
		"gzip":      gz(t, append(bytes.Clone(hdr), 1)),
		"3d plain":  idx([]int{1 << 10, 1 << 10, 1 << 10}, []byte{1, 2, 3}),
		"2d header": idx([]int{1 << 15, 1 << 15}, nil),
	} {
		t.Run(name, func(t *testing.T) {
			// Sized (the length is checked first) and unsized (the
			// buffer grows as data arrives).
			for _, r := range []io.Reader{bytes.NewReader(in), io.MultiReader(bytes.NewReader(in))} {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				_, _, err := ReadIDX(r)
				runtime.ReadMemStats(&after)
				if err == nil || !strings.Contains(err.Error(), "truncated") || !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("err = %v, want a truncated-file error", err)
				}
				if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
					t.Fatalf("reading a %d-byte file allocated %d bytes", len(in), got)
				}
			}
		})
	}
}

// TestReadIDXLarge reads a payload larger than the first read buffer, so the
// buffer grows, in both encodings.
func TestReadIDXLarge(t *testing.T) {
	shape := []int{3, 500, 1001}
	data := randomBytes(t, 3*500*1001)
	raw := idx(shape, data)
	for name, in := range map[string][]byte{"plain": raw, "gzip": gz(t, raw)} {
		for _, sized := range []bool{true, false} {
			reader := func(p []byte) io.Reader {
				if sized {
					return bytes.NewReader(p)
				}
				return io.MultiReader(bytes.NewReader(p))
			}
			s, d, err := ReadIDX(reader(in))
			if err != nil || !reflect.DeepEqual(s, shape) || !bytes.Equal(d, data) {
				t.Fatalf("%s (sized %v): shape %v, %d bytes, err %v", name, sized, s, len(d), err)
			}
			if _, _, err := ReadIDX(reader(in[:len(in)-1])); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%s (sized %v): truncated by one byte: err %v", name, sized, err)
			}
		}
	}
}

// TestLoadFashionMNISTCorruptGzip: a damaged file is an error naming it.
func TestLoadFashionMNISTCorruptGzip(t *testing.T) {
	dir := t.TempDir()
	writeSet(t, dir, FashionMNISTFiles[0], FashionMNISTFiles[1], 5, true)
	writeSet(t, dir, FashionMNISTFiles[2], FashionMNISTFiles[3], 3, true)
	p := filepath.Join(dir, FashionMNISTFiles[2])
	z, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	z[len(z)-6] ^= 0x10 // the CRC-32
	if err := os.WriteFile(p, z, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = LoadFashionMNIST(dir)
	if err == nil || !strings.Contains(err.Error(), FashionMNISTFiles[2]) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("err = %v, want a checksum error naming %s", err, FashionMNISTFiles[2])
	}
}

// TestNewImageSetValidates: pixel and label counts must match the shapes.
func TestNewImageSetValidates(t *testing.T) {
	pix := make([]byte, 4*2*3)
	lab := make([]byte, 4)
	if s, err := NewImageSet([]int{4, 2, 3}, pix, []int{4}, lab); err != nil || s.N != 4 || len(s.Image(3)) != 6 {
		t.Fatalf("valid set: %v", err)
	}
	cases := map[string]struct {
		ishape, lshape []int
		pix, lab       []byte
		want           string
	}{
		"short pixels":    {[]int{4, 2, 3}, []int{4}, pix[:23], lab, "23 pixels"},
		"long pixels":     {[]int{4, 2, 3}, []int{4}, append(bytes.Clone(pix), 0), lab, "25 pixels"},
		"short labels":    {[]int{4, 2, 3}, []int{4}, pix, lab[:3], "3 labels"},
		"negative dim":    {[]int{4, -2, 3}, []int{4}, pix, lab, "negative"},
		"overflowing dim": {[]int{1 << 40, 1 << 40, 1 << 40}, []int{1 << 40}, pix, lab, "too large"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := NewImageSet(c.ishape, c.pix, c.lshape, c.lab)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
			if s != nil {
				t.Fatal("a set came back with the error")
			}
		})
	}
}

// TestImageBounds: Image of an index out of range, or of a set whose Images
// are too short, panics with a message saying so (not a bare slice error).
func TestImageBounds(t *testing.T) {
	s, err := NewImageSet([]int{2, 1, 3}, make([]byte, 6), []int{2}, make([]byte, 2))
	if err != nil {
		t.Fatal(err)
	}
	hand := &ImageSet{N: 3, Rows: 1, Cols: 3, Images: make([]float32, 7), Labels: make([]int32, 3)}
	for _, c := range []struct {
		s    *ImageSet
		i    int
		want string
	}{
		{s, 2, "image 2 out of range [0, 2)"},
		{s, -1, "image -1 out of range [0, 2)"},
		{hand, 2, "holds 7 pixels"},
	} {
		func() {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, c.want) {
					t.Errorf("Image(%d): panic %q, want one containing %q", c.i, msg, c.want)
				}
			}()
			c.s.Image(c.i)
		}()
	}
	if err := hand.Validate(); err == nil || !strings.Contains(err.Error(), "holds 7 pixels") {
		t.Errorf("Validate: %v", err)
	}
	if err := s.Validate(); err != nil {
		t.Errorf("Validate of a good set: %v", err)
	}
}

// FuzzReadIDX: any input is read without a panic; what is accepted is
// consistent (len(data) = product of shape), and a plain IDX input is
// exactly its header and data.
func FuzzReadIDX(f *testing.F) {
	good := idx([]int{2, 3}, []byte{1, 2, 3, 4, 5, 6})
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write(good)
	w.Close()
	z := b.Bytes()
	for _, seed := range [][]byte{
		good, z, nil, {0}, {0x1f, 0x8b}, good[:len(good)-1], z[:len(z)-1],
		append(bytes.Clone(z), 0), append(bytes.Clone(good), 0), idx([]int{1 << 30}, nil),
		idx([]int{0, 5}, nil), {0, 0, 8, 255},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		shape, data, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			if shape != nil || data != nil {
				t.Fatalf("error %v with results", err)
			}
			if !strings.HasPrefix(err.Error(), "datasets.ReadIDX: ") {
				t.Fatalf("error %q lacks the function's name", err)
			}
			return
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		if len(shape) == 0 || len(data) != n {
			t.Fatalf("shape %v with %d bytes", shape, len(data))
		}
		if len(in) >= 2 && in[0] == 0x1f && in[1] == 0x8b {
			return
		}
		if !bytes.Equal(idx(shape, data), in) {
			t.Fatalf("accepted %x as shape %v data %x", in, shape, data)
		}
	})
}
