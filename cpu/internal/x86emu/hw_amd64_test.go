//go:build amd64 && linux

package x86emu

import (
	"syscall"
	"unsafe"

	"github.com/ferryml/ferry/cpu/cpufeat"
)

// hwHas reports whether this machine runs EVEX (AVX-512F) or VEX (AVX2 and
// FMA) code, as Ferry's kernels see it (FERRY_CPU=avx2 lowers an AVX-512
// host to an AVX2 one).
func hwHas(evex bool) bool {
	if evex {
		return cpufeat.AVX512F
	}
	return cpufeat.AVX2FMA
}

// hwCode is harness code mapped executable.
type hwCode struct {
	mem  []byte
	offs []int
}

// hwMap maps the pieces of code, one after the other, read and execute
// only.
func hwMap(codes [][]byte) (*hwCode, error) {
	n := 0
	var offs []int
	for _, c := range codes {
		offs = append(offs, n)
		n += (len(c) + 63) &^ 63
	}
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, (n+page-1)/page*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, err
	}
	for i, c := range codes {
		copy(mem[offs[i]:], c)
	}
	if err := syscall.Mprotect(mem, syscall.PROT_READ|syscall.PROT_EXEC); err != nil {
		syscall.Munmap(mem)
		return nil, err
	}
	return &hwCode{mem, offs}, nil
}

func (h *hwCode) free() { syscall.Munmap(h.mem) }

// run calls piece i with the block's address in RAX (the first argument
// of Go's register ABI, through a func value whose code is the piece: the
// harness touches only registers that ABI lets a callee clobber).
func (h *hwCode) run(i int, block *[hbWords]uint64) {
	fv := &struct{ pc unsafe.Pointer }{unsafe.Pointer(&h.mem[h.offs[i]])}
	f := *(*func(*[hbWords]uint64))(unsafe.Pointer(&fv))
	f(block)
}
