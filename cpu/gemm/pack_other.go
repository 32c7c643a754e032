//go:build !amd64

package gemm

import "unsafe"

// copyRows64 copies rows blocks of 64 bytes, the i-th from src+i*stride
// (stride in bytes) to dst+64*i (see the amd64 version).
func copyRows64(dst, src unsafe.Pointer, stride, rows int) {
	for i := 0; i < rows; i++ {
		v := *(*[64]byte)(unsafe.Add(src, i*stride))
		*(*[64]byte)(unsafe.Add(dst, 64*i)) = v
	}
}
