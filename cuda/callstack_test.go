package cuda

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/dynlib"
)

// burn uses about depth*128 bytes of goroutine stack, then calls f.
//
//go:noinline
func burn(depth int, f func()) {
	var pad [96]byte
	pad[depth%96] = byte(depth)
	if depth > 0 {
		burn(depth-1, f)
		return
	}
	f()
	_ = pad
}

// The call wrappers (symbolTable.call, Driver.Call, Driver.Check) take
// addresses of the caller's locals as uintptr, the way the package passes
// out-parameters to C. A goroutine's stack may grow, and move, on entering
// the wrapper; the wrappers must make such locals live on the heap so that C
// writes where the caller reads. libc's time(&t) stands in for an entry point
// with an out-parameter, called from fresh goroutines at every stack depth up
// to a few kilobytes, where a stack copy on entry is certain for some.
func TestCallOutParametersSurviveStackGrowth(t *testing.T) {
	tab, err := resolve(libc(t), dynlib.Names("time"))
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{procs: map[string]uintptr{"time": tab.Proc("time")}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := map[string]int{}
	for depth := range 160 {
		wg.Go(func() {
			burn(depth, func() {
				var a, b, c int64
				tab.call("time", uintptr(unsafe.Pointer(&a)))
				if _, err := d.Call("time", uintptr(unsafe.Pointer(&b))); err != nil {
					t.Error(err)
				}
				if err := d.Check("time", uintptr(unsafe.Pointer(&c))); err == nil {
					t.Error("time returned 0 through Check") // it returns the time: a failure code to Check
				}
				mu.Lock()
				defer mu.Unlock()
				for name, v := range map[string]int64{"symbolTable.call": a, "Driver.Call": b, "Driver.Check": c} {
					if v < 1e9 {
						bad[name]++
					}
				}
			})
		})
	}
	wg.Wait()
	for name, n := range bad {
		t.Errorf("%s: the out-parameter was not written in %d of 160 goroutines (the stack moved under the C call)", name, n)
	}
}
