//go:build amd64

package gemm

import "unsafe"

// copyRows64 copies rows blocks of 64 bytes, the i-th from src+i*stride
// (stride in bytes) to dst+64*i: the rows of a whole packed B sliver
// whose row is 64 bytes (nr = 16 float32 or 8 float64 elements), without
// a memmove call per row.
//
//go:noescape
func copyRows64(dst, src unsafe.Pointer, stride, rows int)
