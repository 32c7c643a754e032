package cuda

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ferryml/ferry/internal/dynlib"
)

// cuResultNames names the CUresult codes the backend is likely to meet, for
// error messages when cuGetErrorName itself is unavailable.
var cuResultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU", 218: "CUDA_ERROR_INVALID_PTX", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	400: "CUDA_ERROR_INVALID_HANDLE", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS", 701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	719: "CUDA_ERROR_LAUNCH_FAILED", 999: "CUDA_ERROR_UNKNOWN",
}

// ResultName returns the CUresult's name (CUDA_ERROR_OUT_OF_MEMORY), asking
// the driver when it is loaded.
func (d *Driver) ResultName(r Result) string {
	if d != nil && d.procs["cuGetErrorName"] != 0 {
		var p uintptr
		if rr, _, _ := purego.SyscallN(d.procs["cuGetErrorName"], uintptr(r), uintptr(unsafe.Pointer(&p))); rr == 0 && p != 0 {
			return dynlib.GoString(p)
		}
	}
	if n, ok := cuResultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int32(r))
}

// Check calls a driver entry point and turns a failure into an error naming
// the call and the CUresult. Like Call, it keeps addresses passed as uintptr
// on the heap and alive for the call (go:uintptrescapes).
//
// The package's rule for Go memory handed to C: either convert its address
// to uintptr in the argument list of a go:uintptrescapes function (Check,
// Call, dynlib.Table.Call, LtMatmul.check, purego.SyscallN), which moves it
// to the heap and keeps it alive for the call; or, when the address must be
// stored in memory first (an array of pointers such as cuLaunchKernel's
// kernelParams or NVRTC's options), keep it in pinned heap memory
// (runtime.Pinner) until the call returns. A variable whose address is only
// stored may live on the goroutine stack, which moves when it grows.
//
//go:uintptrescapes
func (d *Driver) Check(name string, args ...uintptr) error {
	r, err := d.Call(name, args...)
	if err != nil {
		return err
	}
	if r != 0 {
		return fmt.Errorf("cuda: %s: %s (%d)", name, d.ResultName(r), int32(r))
	}
	return nil
}

// Device attributes (CUdevice_attribute) the backend reads.
const (
	attrMultiprocessorCount   = 16
	attrComputeCapabilityMajr = 75
	attrComputeCapabilityMinr = 76
)

// Attribute returns cuDeviceGetAttribute(attr, dev).
func (d *Driver) Attribute(attr int, dev int32) (int, error) {
	var v int32
	err := d.Check("cuDeviceGetAttribute", uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))
	return int(v), err
}

// MemAlloc allocates n bytes of device memory.
func (d *Driver) MemAlloc(n int64) (uintptr, error) {
	var p uintptr
	err := d.Check("cuMemAlloc", uintptr(unsafe.Pointer(&p)), uintptr(n))
	return p, err
}

// HostAlloc allocates n bytes of page-locked host memory, mapped into the
// device's address space (CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP).
func (d *Driver) HostAlloc(n int64) (uintptr, error) {
	var p uintptr
	err := d.Check("cuMemHostAlloc", uintptr(unsafe.Pointer(&p)), uintptr(n), 0x01|0x02)
	return p, err
}

// CopyHtoD copies host bytes to device memory on stream (asynchronously when
// src is page-locked) and waits for it when sync is true.
func (d *Driver) CopyHtoD(dst uintptr, src unsafe.Pointer, n int64, stream uintptr, sync bool) error {
	if n == 0 {
		return nil
	}
	if err := d.Check("cuMemcpyHtoDAsync", dst, uintptr(src), uintptr(n), stream); err != nil {
		return err
	}
	if sync {
		return d.Check("cuStreamSynchronize", stream)
	}
	return nil
}

// CopyDtoH copies device memory to host bytes on stream.
func (d *Driver) CopyDtoH(dst unsafe.Pointer, src uintptr, n int64, stream uintptr, sync bool) error {
	if n == 0 {
		return nil
	}
	if err := d.Check("cuMemcpyDtoHAsync", uintptr(dst), src, uintptr(n), stream); err != nil {
		return err
	}
	if sync {
		return d.Check("cuStreamSynchronize", stream)
	}
	return nil
}

// Launch launches fn with the given configuration and argument values (each
// passed by address, as cuLaunchKernel wants).
func (d *Driver) Launch(fn uintptr, cfg LaunchConfig, stream uintptr, args []uintptr) error {
	if len(args) == 0 {
		return d.Check("cuLaunchKernel", fn, uintptr(cfg.Grid), 1, 1, uintptr(cfg.Block), 1, 1, 0, stream, 0, 0)
	}
	// The values are copied to pinned heap memory, where the addresses in
	// ptrs stay valid: the caller's args (and a small local slice) may be on
	// a goroutine stack, which can move when Check is entered.
	vals, ptrs := slices.Clone(args), make([]uintptr, len(args))
	var pin runtime.Pinner
	pin.Pin(&vals[0])
	defer pin.Unpin()
	for i := range vals {
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	err := d.Check("cuLaunchKernel", fn, uintptr(cfg.Grid), 1, 1, uintptr(cfg.Block), 1, 1, 0, stream,
		uintptr(unsafe.Pointer(&ptrs[0])), 0)
	runtime.KeepAlive(vals)
	runtime.KeepAlive(ptrs)
	return err
}

// hostBytes views n bytes of C memory at p.
func hostBytes(p uintptr, n int64) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(dynlib.Ptr(p)), n)
}
