package readsize

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRemaining(t *testing.T) {
	br := bytes.NewReader(make([]byte, 10))
	br.Read(make([]byte, 3))
	if got := Remaining(br); got != 7 {
		t.Errorf("bytes.Reader: %d, want 7", got)
	}
	if got := Remaining(strings.NewReader("abcd")); got != 4 {
		t.Errorf("strings.Reader: %d, want 4", got)
	}
	if got := Remaining(bufio.NewReader(strings.NewReader("abcd"))); got != -1 {
		t.Errorf("bufio.Reader: %d, want -1", got)
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(40, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if got := Remaining(f); got != 60 {
		t.Errorf("file at 40 of 100: %d, want 60", got)
	}
}
