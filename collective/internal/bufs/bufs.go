// Package bufs holds the byte-buffer plumbing the collective engines share:
// argument checks of send and receive buffers, and spans (strided runs of
// bytes) with which they cut arrays into blocks along an axis.
package bufs

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/ir"
)

// CheckBuf checks dt and that b holds whole, aligned elements of it.
func CheckBuf(name string, dt ir.DType, b []byte) error {
	if !dt.Valid() {
		return fmt.Errorf("invalid dtype %v", dt)
	}
	esz := dt.Size()
	if len(b)%esz != 0 {
		return fmt.Errorf("%s has %d bytes, not a whole number of %v elements", name, len(b), dt)
	}
	if len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(esz) != 0 {
		return fmt.Errorf("%s is not aligned to %d bytes for %v", name, esz, dt)
	}
	return nil
}

// Overlap reports whether a and b share memory.
func Overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// Same reports whether a and b are the same memory.
func Same(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// CheckDisjoint refuses a send and recv that overlap.
func CheckDisjoint(send, recv []byte) error {
	if Overlap(send, recv) {
		return errors.New("send and recv overlap")
	}
	return nil
}

// Span is Count runs of Run bytes, run k starting at byte Off+k*Stride.
type Span struct{ Off, Run, Stride, Count int }

// BlockSpan is the idx-th of parts equal blocks along axis of a row-major
// array of the given shape and element size.
func BlockSpan(shape []int, axis, parts, idx, esz int) Span {
	outer, row := 1, esz
	for _, d := range shape[:axis] {
		outer *= d
	}
	for _, d := range shape[axis:] {
		row *= d
	}
	b := row / parts
	if outer == 1 || b == row {
		return Span{Off: idx * b, Run: b * outer, Stride: b * outer, Count: 1}
	}
	return Span{Off: idx * b, Run: b, Stride: row, Count: outer}
}

// Whole is the span of all of b.
func Whole(b []byte) Span { return Span{Run: len(b), Stride: len(b), Count: 1} }

// Copy copies the bytes of sv in src, in order, to those of dv in dst
// (both spans hold the same number of bytes).
func Copy(dst []byte, dv Span, src []byte, sv Span) {
	di, dp, si, sp := 0, 0, 0, 0
	for di < dv.Count && si < sv.Count {
		n := min(dv.Run-dp, sv.Run-sp)
		d := dv.Off + di*dv.Stride + dp
		s := sv.Off + si*sv.Stride + sp
		copy(dst[d:d+n], src[s:s+n])
		if dp += n; dp == dv.Run {
			di, dp = di+1, 0
		}
		if sp += n; sp == sv.Run {
			si, sp = si+1, 0
		}
	}
}

// Segments calls f(byte offset in the source, offset from lo, length) for
// the contiguous pieces of bytes [lo, hi) of span sp in span order.
func Segments(sp Span, lo, hi int, f func(src, at, n int)) {
	for p := lo; p < hi; {
		k, in := p/sp.Run, p%sp.Run
		n := min(sp.Run-in, hi-p)
		f(sp.Off+k*sp.Stride+in, p-lo, n)
		p += n
	}
}
