// Package readsize tells how many bytes a reader has left when it can, so
// that file readers (datasets' IDX, checkpoint's safetensors) can check a
// header's announced sizes against the input before allocating them.
package readsize

import (
	"io"
	"os"
)

// Remaining returns the number of bytes left in r if it can tell (readers
// with a Len method such as bytes.Reader and strings.Reader, regular files),
// or -1.
func Remaining(r io.Reader) int64 {
	switch r := r.(type) {
	case interface{ Len() int }:
		return int64(r.Len())
	case *os.File:
		fi, err := r.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return -1
		}
		pos, err := r.Seek(0, io.SeekCurrent)
		if err != nil {
			return -1
		}
		return fi.Size() - pos
	}
	return -1
}
