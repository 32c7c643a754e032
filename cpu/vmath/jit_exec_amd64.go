//go:build amd64 && linux

package vmath

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// jitExecOK: generated code can be mapped and called here (the CPU check
// is JITAvailable's).
const jitExecOK = true

// execMem is a mapping of generated code: written while PROT_READ|
// PROT_WRITE, then turned PROT_READ|PROT_EXEC (never writable and
// executable at once); unmapped when unreachable.
type execMem struct {
	mem   []byte
	entry uintptr
}

func mapExec(code []byte) (*execMem, error) {
	page := syscall.Getpagesize()
	size := (len(code) + page - 1) / page * page
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("vmath: mapping generated code: %w", err)
	}
	copy(mem, code)
	if err := syscall.Mprotect(mem, syscall.PROT_READ|syscall.PROT_EXEC); err != nil {
		syscall.Munmap(mem)
		return nil, fmt.Errorf("vmath: making generated code executable: %w", err)
	}
	m := &execMem{mem: mem, entry: uintptr(unsafe.Pointer(&mem[0]))}
	runtime.AddCleanup(m, func(b []byte) { syscall.Munmap(b) }, mem)
	return m, nil
}

// call runs the code with the argument block args (args[0] = element
// count, then one pointer per slot).
func (m *execMem) call(args *uint64) {
	callChain(m.entry, args)
	runtime.KeepAlive(m)
}

// callChain calls the generated code at fn with args in RDI (jit_amd64.s).
//
//go:noescape
func callChain(fn uintptr, args *uint64)

func uintptrOf(p *float32) uintptr { return uintptr(unsafe.Pointer(p)) }

func keepAlive(x any) { runtime.KeepAlive(x) }
