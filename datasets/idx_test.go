package datasets

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// idx encodes an unsigned-byte IDX file of the given shape and data.
func idx(shape []int, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(shape))})
	for _, d := range shape {
		binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	return b.Bytes()
}

func gz(t *testing.T, p []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestReadIDXPlainAndGzip(t *testing.T) {
	shape := []int{2, 3, 2}
	data := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255}
	raw := idx(shape, data)
	for name, in := range map[string][]byte{"plain": raw, "gzip": gz(t, raw)} {
		t.Run(name, func(t *testing.T) {
			s, d, err := ReadIDX(bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(s, shape) || !bytes.Equal(d, data) {
				t.Fatalf("got %v %v, want %v %v", s, d, shape, data)
			}
		})
	}
}

func TestReadIDXErrors(t *testing.T) {
	good := idx([]int{4, 2}, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	cases := map[string]struct {
		in   []byte
		want string
	}{
		"empty":              {nil, "truncated"},
		"one byte":           {[]byte{0}, "truncated"},
		"bad magic":          {append([]byte{0x12, 0x34}, good[2:]...), "bad magic"},
		"float elements":     {append([]byte{0, 0, 0x0d}, good[3:]...), "not supported"},
		"rank 0":             {[]byte{0, 0, 8, 0}, "rank 0"},
		"truncated dims":     {good[:6], "truncated"},
		"truncated data":     {good[:len(good)-1], "truncated"},
		"truncated gzip":     {gz(t, good)[:20], "unexpected EOF"},
		"gzip of bad magic":  {gz(t, []byte("hello world")), "bad magic"},
		"gzip truncated idx": {gz(t, good[:len(good)-3]), "truncated"},
		"huge shape":         {idx([]int{1 << 20, 1 << 20}, nil), "too large"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := ReadIDX(bytes.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
	_, _, err := ReadIDX(bytes.NewReader(good[:len(good)-1]))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated data: %v does not wrap io.ErrUnexpectedEOF", err)
	}
}

func writeSet(t *testing.T, dir, images, labels string, n int, compress bool) {
	t.Helper()
	pix := make([]byte, n*2*3)
	for i := range pix {
		pix[i] = byte(i * 17)
	}
	lab := make([]byte, n)
	for i := range lab {
		lab[i] = byte(i % 10)
	}
	for name, p := range map[string][]byte{images: idx([]int{n, 2, 3}, pix), labels: idx([]int{n}, lab)} {
		if compress {
			p = gz(t, p)
		} else {
			name = strings.TrimSuffix(name, ".gz")
		}
		if err := os.WriteFile(filepath.Join(dir, name), p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoadFashionMNIST(t *testing.T) {
	dir := t.TempDir()
	writeSet(t, dir, FashionMNISTFiles[0], FashionMNISTFiles[1], 5, true)
	writeSet(t, dir, FashionMNISTFiles[2], FashionMNISTFiles[3], 3, false) // uncompressed, no .gz
	train, test, err := LoadFashionMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 5 || test.N != 3 || train.Rows != 2 || train.Cols != 3 || train.Features() != 6 {
		t.Fatalf("train %d×%d×%d, test %d", train.N, train.Rows, train.Cols, test.N)
	}
	if len(train.Images) != 30 || len(train.Labels) != 5 || len(test.Images) != 18 {
		t.Fatalf("lengths %d %d %d", len(train.Images), len(train.Labels), len(test.Images))
	}
	if want := float32(17) / 255; train.Images[1] != want || train.Image(1)[0] != float32(byte(6*17))/255 {
		t.Errorf("pixels %v", train.Images[:7])
	}
	for _, v := range train.Images {
		if v < 0 || v > 1 {
			t.Fatalf("pixel %v outside [0,1]", v)
		}
	}
	if !reflect.DeepEqual(test.Labels, []int32{0, 1, 2}) {
		t.Errorf("labels %v", test.Labels)
	}
}

func TestLoadFashionMNISTMissing(t *testing.T) {
	_, _, err := LoadFashionMNIST(t.TempDir())
	if !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("err = %v, want ErrNotInstalled", err)
	}
	for _, want := range []string{"apt-get install dataset-fashion-mnist", "-data DIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestLoadFashionMNISTMismatch(t *testing.T) {
	dir := t.TempDir()
	writeSet(t, dir, FashionMNISTFiles[0], FashionMNISTFiles[1], 5, true)
	writeSet(t, dir, FashionMNISTFiles[2], FashionMNISTFiles[3], 3, true)
	// Labels of the wrong count.
	if err := os.WriteFile(filepath.Join(dir, FashionMNISTFiles[3]), gz(t, idx([]int{2}, []byte{1, 2})), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadFashionMNIST(dir); err == nil || !strings.Contains(err.Error(), "labels have shape") {
		t.Fatalf("err = %v", err)
	}
	// A corrupt file names its path.
	if err := os.WriteFile(filepath.Join(dir, FashionMNISTFiles[0]), []byte{1, 2, 3, 4, 5}, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadFashionMNIST(dir); err == nil || !strings.Contains(err.Error(), FashionMNISTFiles[0]) {
		t.Fatalf("err = %v", err)
	}
}

// The real dataset, when installed: only shapes and label range.
func TestLoadFashionMNISTInstalled(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	train, test, err := LoadFashionMNIST("")
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 || train.Features() != 784 {
		t.Fatalf("train %d, test %d, features %d", train.N, test.N, train.Features())
	}
	for _, l := range test.Labels {
		if l < 0 || l > 9 {
			t.Fatalf("label %d", l)
		}
	}
}
