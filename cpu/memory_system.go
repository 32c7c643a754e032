package cpu

import (
	"bufio"
	"fmt"
	"github.com/ferryml/ferry/backend"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// alignedBytes allocates n zeroed bytes (n > 0) starting at a multiple of
// allocAlign. Large Go allocations are page-aligned already; small ones are
// over-allocated and sliced.
func alignedBytes(n int64) []byte {
	b := make([]byte, n)
	if addrOf(b)%allocAlign == 0 {
		return b[:n:n]
	}
	b = make([]byte, n+allocAlign-1)
	off := (allocAlign - int64(addrOf(b)%allocAlign)) % allocAlign
	return b[off : off+n : off+n]
}

// addrOf is the address of a slice's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

var (
	systemMemoryOnce sync.Once
	systemMemorySize int64
)

// systemMemory returns the machine's RAM plus swap in bytes, 0 if unknown.
func systemMemory() int64 {
	systemMemoryOnce.Do(func() {
		f, err := os.Open("/proc/meminfo")
		if err != nil {
			return
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 || (fields[0] != "MemTotal:" && fields[0] != "SwapTotal:") {
				continue
			}
			if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
				systemMemorySize += kb << 10
			}
		}
	})
	return systemMemorySize
}

// checkSystemMemory returns a note if size bytes cannot be real memory on this
// machine: the Go runtime would abort the process instead of failing.
func checkSystemMemory(size int64) string {
	if sys := systemMemory(); sys > 0 && size > sys {
		return fmt.Sprintf("cannot reserve %s: the machine has only %s of memory and swap (lower the capacity or %s, or set %s=false)",
			backend.FormatBytes(size), backend.FormatBytes(sys), backend.EnvMemFraction, backend.EnvPreallocate)
	}
	return ""
}
