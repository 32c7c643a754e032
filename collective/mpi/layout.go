package mpi

import "unsafe"

// span is count runs of run bytes, run k starting at byte off+k*stride.
type span struct{ off, run, stride, count int }

// blockSpan is the idx-th of parts equal blocks along axis of a row-major
// array of the given shape and element size.
func blockSpan(shape []int, axis, parts, idx, esz int) span {
	outer, row := 1, esz
	for _, d := range shape[:axis] {
		outer *= d
	}
	for _, d := range shape[axis:] {
		row *= d
	}
	b := row / parts
	if outer == 1 || b == row {
		return span{off: idx * b, run: b * outer, stride: b * outer, count: 1}
	}
	return span{off: idx * b, run: b, stride: row, count: outer}
}

// contiguous reports whether the blocks along axis are contiguous runs, so
// that MPI can send or receive them in place.
func contiguous(shape []int, axis, parts, esz int) bool {
	return blockSpan(shape, axis, parts, 0, esz).count == 1
}

func whole(b []byte) span { return span{run: len(b), stride: len(b), count: 1} }

// copySpan copies the bytes of sv in src, in order, to those of dv in dst
// (both spans hold the same number of bytes).
func copySpan(dst []byte, dv span, src []byte, sv span) {
	di, dp, si, sp := 0, 0, 0, 0
	for di < dv.count && si < sv.count {
		n := min(dv.run-dp, sv.run-sp)
		d := dv.off + di*dv.stride + dp
		s := sv.off + si*sv.stride + sp
		copy(dst[d:d+n], src[s:s+n])
		if dp += n; dp == dv.run {
			di, dp = di+1, 0
		}
		if sp += n; sp == sv.run {
			si, sp = si+1, 0
		}
	}
}

// toBlocks copies the parts blocks of src along axis to consecutive blocks of
// dst.
func toBlocks(dst, src []byte, shape []int, axis, parts, esz int) {
	b := len(src) / parts
	for j := range parts {
		copySpan(dst[j*b:(j+1)*b], whole(dst[j*b:(j+1)*b]), src, blockSpan(shape, axis, parts, j, esz))
	}
}

// fromBlocks copies consecutive blocks of src to the parts blocks of dst
// along axis (shape is dst's).
func fromBlocks(dst, src []byte, shape []int, axis, parts, esz int) {
	b := len(src) / parts
	for j := range parts {
		copySpan(dst, blockSpan(shape, axis, parts, j, esz), src[j*b:(j+1)*b], whole(src[j*b:(j+1)*b]))
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
