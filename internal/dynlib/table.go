package dynlib

import (
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Table holds the resolved entry points of a library, by name.
type Table struct {
	// Lib is the library the entry points belong to (nil for a table made
	// with NewTable without one).
	Lib   *Library
	procs map[string]uintptr
}

// NewTable is a table of the given addresses, for entry points that do not
// come from dlsym (test doubles, or a driver's own lookup function).
func NewTable(lib *Library, procs map[string]uintptr) *Table {
	return &Table{Lib: lib, procs: procs}
}

// Proc returns the address of an entry point, or 0 when it was not resolved
// (an optional one the library lacks).
func (t *Table) Proc(name string) uintptr { return t.procs[name] }

// Call calls the entry point name, which returns a C int status, and returns
// that status. Arguments may be addresses of the caller's variables
// converted to uintptr in the call expression: they are moved to the heap
// and kept alive for the call (go:uintptrescapes), so a goroutine stack that
// moves during the call does not leave C writing to the old one. Calling an
// entry point that was not resolved panics.
//
//go:uintptrescapes
func (t *Table) Call(name string, args ...uintptr) int32 {
	p := t.procs[name]
	if p == 0 {
		panic("dynlib: entry point " + name + " was not resolved")
	}
	r, _, _ := purego.SyscallN(p, args...)
	return int32(r) // a C int is the low half of the return register
}

// GoString copies the NUL-terminated C string at p ("" for NULL).
func GoString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := Ptr(p)
	n := 0
	for *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(base), n))
}

// Ptr turns an address owned by C (never by the Go heap) into a pointer
// without tripping vet's unsafeptr check.
func Ptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// CString is s as a NUL-terminated C string. Pass its address to C only in
// the call expression of a go:uintptrescapes function (Table.Call,
// purego.SyscallN), which moves it to the heap and keeps it alive; a short
// CString may otherwise live on the goroutine's stack, which moves when it
// grows.
func CString(s string) []byte { return append([]byte(s), 0) }

// CStrings is an array of C strings (char**) in pinned Go heap memory: the
// addresses in Ptrs stay valid, wherever the goroutine's stack goes, until
// Free. (Storing an address as a uintptr in memory, as an array for C must,
// is outside what go:uintptrescapes covers: only a conversion in the call
// expression is.)
type CStrings struct {
	// Ptrs holds the address of each string; pass &Ptrs[0] as the char**.
	Ptrs []uintptr
	bufs [][]byte
	pin  runtime.Pinner
}

// NewCStrings copies ss into pinned C strings.
func NewCStrings(ss ...string) *CStrings {
	c := &CStrings{Ptrs: make([]uintptr, len(ss)), bufs: make([][]byte, len(ss))}
	for i, s := range ss {
		c.bufs[i] = CString(s)
		c.pin.Pin(&c.bufs[i][0]) // Pin's argument escapes: the bytes are on the heap
		c.Ptrs[i] = uintptr(unsafe.Pointer(&c.bufs[i][0]))
	}
	if len(ss) > 0 {
		c.pin.Pin(&c.Ptrs[0])
	}
	return c
}

// Free unpins the strings, after the C call that reads them has returned.
func (c *CStrings) Free() { c.pin.Unpin() }
