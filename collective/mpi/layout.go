package mpi

import (
	"unsafe"

	"github.com/ferryml/ferry/collective/internal/bufs"
)

// contiguous reports whether the blocks along axis are contiguous runs, so
// that MPI can send or receive them in place.
func contiguous(shape []int, axis, parts, esz int) bool {
	return bufs.BlockSpan(shape, axis, parts, 0, esz).Count == 1
}

// toBlocks copies the parts blocks of src along axis to consecutive blocks of
// dst.
func toBlocks(dst, src []byte, shape []int, axis, parts, esz int) {
	b := len(src) / parts
	for j := range parts {
		bufs.Copy(dst[j*b:(j+1)*b], bufs.Whole(dst[j*b:(j+1)*b]), src, bufs.BlockSpan(shape, axis, parts, j, esz))
	}
}

// fromBlocks copies consecutive blocks of src to the parts blocks of dst
// along axis (shape is dst's).
func fromBlocks(dst, src []byte, shape []int, axis, parts, esz int) {
	b := len(src) / parts
	for j := range parts {
		bufs.Copy(dst, bufs.BlockSpan(shape, axis, parts, j, esz), src[j*b:(j+1)*b], bufs.Whole(src[j*b:(j+1)*b]))
	}
}

// alloc returns n zero bytes aligned to 8.
func alloc(n int) []byte {
	if n == 0 {
		return nil
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

// addr is the address of b's first byte, 0 for an empty b.
func addr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
