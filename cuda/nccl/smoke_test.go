package nccl

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"runtime"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/cuda"
	"github.com/ferryml/ferry/ir"
)

// TestSmokeRealNCCL loads the real NCCL and CUDA driver, makes a one-device
// communicator with CommInitAll and runs an all-reduce, a broadcast and an
// all-gather on a CUDA stream over device buffers. It skips without NCCL or
// a GPU.
func TestSmokeRealNCCL(t *testing.T) {
	l, err := Load()
	if err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	d, err := cuda.LoadDriver(cuda.SearchDirs())
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if err := d.Init(); err != nil {
		t.Skipf("no GPU: %v", err)
	}
	var ndev int32
	if err := d.Check("cuDeviceGetCount", uintptr(unsafe.Pointer(&ndev))); err != nil || ndev == 0 {
		t.Skipf("no GPU: %d devices, %v", ndev, err)
	}
	v, err := l.Version()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NCCL %d from %s", v, l.Path)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var dev int32
	var ctx, stream uintptr
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(d.Check("cuDeviceGet", uintptr(unsafe.Pointer(&dev)), 0))
	must(d.Check("cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&ctx)), uintptr(dev)))
	defer d.Check("cuDevicePrimaryCtxRelease", uintptr(dev))
	must(d.Check("cuCtxSetCurrent", ctx))
	must(d.Check("cuStreamCreate", uintptr(unsafe.Pointer(&stream)), 1))
	defer d.Check("cuStreamDestroy", stream)

	const n = 4096
	in := make([]float32, n)
	rng := testseed.Rand(t, 1)
	for i := range in {
		in[i] = rng.Float32()*2 - 1
	}
	send, err := d.MemAlloc(4 * n)
	must(err)
	defer d.Check("cuMemFree", send)
	recv, err := d.MemAlloc(4 * n)
	must(err)
	defer d.Check("cuMemFree", recv)
	must(d.CopyHtoD(send, unsafe.Pointer(&in[0]), 4*n, stream, true))

	cs, err := l.CommInitAll([]int{int(dev)})
	must(err)
	c := cs[0]
	defer func() {
		if c.Handle() != 0 {
			c.Destroy()
		}
	}()
	// With one rank every collective below is a copy of send into recv:
	// recv is cleared first so a call that did nothing shows.
	for name, run := range map[string]func() error{
		"AllReduce sum": func() error { return c.AllReduce(send, recv, n, ir.Float32, Sum, stream) },
		"AllReduce max": func() error { return c.AllReduce(send, recv, n, ir.Float32, Max, stream) },
		"Broadcast":     func() error { return c.Broadcast(send, recv, n, ir.Float32, 0, stream) },
		"AllGather":     func() error { return c.AllGather(send, recv, n, ir.Float32, stream) },
	} {
		must(d.Check("cuMemsetD8Async", recv, 0, 4*n, stream))
		must(run())
		out := make([]float32, n)
		must(d.CopyDtoH(unsafe.Pointer(&out[0]), recv, 4*n, stream, true))
		for i := range out {
			if out[i] != in[i] {
				t.Fatalf("%s: out[%d] = %v, want %v", name, i, out[i], in[i])
			}
		}
	}
	if r, err := c.AsyncError(); err != nil || r != Success {
		t.Fatalf("AsyncError = %v, %v", r, err)
	}
	must(c.Destroy())
}
