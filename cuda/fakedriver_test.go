//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// fakeCUDA is a CUDA driver and NVRTC made of Go functions behind C
// function pointers (purego.NewCallback), so that the backend's real call
// path (Driver.Check → purego.SyscallN → C ABI) runs without a GPU. Like
// the real driver it keeps the current context per OS thread (by gettid):
// cuCtxSetCurrent sets it for the calling thread, and every call that needs
// a context fails with CUDA_ERROR_INVALID_CONTEXT, recorded as a violation,
// when the calling thread's current context is not the primary one.
// Device memory is Go memory (so copies really copy); kernel launches are
// recorded, not run. NVRTC "compiles" a program into an image holding its
// options and source.
type fakeCUDA struct {
	mu         sync.Mutex
	ctx        uintptr
	current    map[int]uintptr // OS thread id → current context
	threads    map[int]bool    // threads that made a call needing a context
	violations []string
	calls      map[string]int
	next       uintptr
	mem        map[uintptr][]byte // base address → backing Go memory
	funcs      map[uintptr]string // CUfunction → entry name
	launches   []string
	// launchArgs holds each launch's arguments (the count read from the
	// kernel's signature in the module's source).
	launchArgs []fakeLaunch
	kernels    map[string]*fakeKernel // entry name → signature, of every module loaded
	exec       *fakeExec              // set by executeKernels: launches run
	streams    *fakeStreams           // set by recordStreams: stream operations recorded
	images     []string
	progs      map[uintptr]*fakeProgram
	destroyed  int
	// lt, when set, plays cuBLASLt (see withCublasLt).
	lt *fakeLt
	// burn[name] is the bytes of goroutine stack the entry point name uses
	// before it reads its arguments (set before the calls start).
	burn map[string]int
	// notReady, when set, makes cuStreamQuery answer CUDA_ERROR_NOT_READY
	// (work pending: a collective waiting for its peers).
	notReady bool
}

type fakeProgram struct {
	src, name string
	opts      []string
	image     []byte
}

// fakeNoContext lists the driver calls that need no current context.
var fakeNoContext = map[string]bool{
	"cuInit": true, "cuDriverGetVersion": true, "cuDeviceGet": true, "cuDeviceGetCount": true,
	"cuDeviceGetName": true, "cuDeviceGetAttribute": true, "cuDeviceTotalMem": true,
	"cuDevicePrimaryCtxRetain": true, "cuDevicePrimaryCtxRelease": true, "cuCtxSetCurrent": true,
	"cuGetErrorString": true, "cuGetErrorName": true,
}

var (
	fakeMu      sync.Mutex
	fakeActive  *fakeCUDA
	fakeOnce    sync.Once
	fakeDrvProc map[string]uintptr
	fakeRTCProc map[string]uintptr
	fakeLtProc  map[string]uintptr
	fakeErrStr  = []byte("fake NVRTC error\x00")
)

// fakeCallbacks makes the C function pointers once per process (purego
// callbacks are never freed); they dispatch to the active fake.
func fakeCallbacks() {
	fakeOnce.Do(func() {
		mk := func(call func(f *fakeCUDA, name string, a []uintptr) uintptr, name string) uintptr {
			return purego.NewCallback(func(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10 uintptr) uintptr {
				fakeMu.Lock()
				f := fakeActive
				fakeMu.Unlock()
				if f == nil {
					return 999
				}
				if n := f.burn[name]; n > 0 {
					// The callback runs on the calling goroutine's stack:
					// growing it here moves the stack during the C call.
					burn(n/128, func() {})
				}
				return call(f, name, []uintptr{a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10})
			})
		}
		fakeDrvProc = map[string]uintptr{}
		for _, n := range driverEntryPoints {
			fakeDrvProc[n] = mk((*fakeCUDA).driver, n)
		}
		fakeRTCProc = map[string]uintptr{}
		for _, s := range nvrtcEntryPoints {
			fakeRTCProc[s.Canonical] = mk((*fakeCUDA).nvrtc, s.Canonical)
		}
		fakeLtProc = map[string]uintptr{}
		for _, s := range cublasLtEntryPoints {
			name := s.Canonical
			fakeLtProc[name] = purego.NewCallback(func(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 uintptr) uintptr {
				fakeMu.Lock()
				f := fakeActive
				fakeMu.Unlock()
				if f == nil || f.lt == nil {
					return 999
				}
				return f.cublasLt(name, []uintptr{a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15})
			})
		}
	})
}

// newFakeCUDA makes the fake active for the test and returns it with a
// Driver whose entry points are the fake's (cuBLASLt not loaded).
func newFakeCUDA(t *testing.T) (*fakeCUDA, *Driver) {
	t.Helper()
	fakeCallbacks()
	f := &fakeCUDA{ctx: 0xC0DE0000, current: map[int]uintptr{}, threads: map[int]bool{}, calls: map[string]int{},
		next: 0x1000, mem: map[uintptr][]byte{}, funcs: map[uintptr]string{}, progs: map[uintptr]*fakeProgram{}}
	fakeMu.Lock()
	if fakeActive != nil {
		fakeMu.Unlock()
		t.Fatal("two fake CUDA drivers active at once")
	}
	fakeActive = f
	fakeMu.Unlock()
	t.Cleanup(func() {
		fakeMu.Lock()
		fakeActive = nil
		fakeMu.Unlock()
	})
	d := &Driver{
		CUDA:  &Library{Path: "fake libcuda.so.1"},
		procs: maps(fakeDrvProc),
		NVRTC: &NVRTC{Path: "fake libnvrtc.so", syms: &symbolTable{lib: &Library{Path: "fake libnvrtc.so"}, procs: maps(fakeRTCProc)}},
		LtErr: fmt.Errorf("fake: no cuBLASLt"),
	}
	t.Setenv(CacheDirEnv, t.TempDir())
	return f, d
}

func maps(m map[string]uintptr) map[string]uintptr {
	out := make(map[string]uintptr, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (f *fakeCUDA) handle() uintptr {
	f.next += 0x10
	return f.next
}

// alloc returns 256-byte aligned Go memory of n bytes, kept by the fake.
func (f *fakeCUDA) alloc(n uintptr) uintptr {
	buf := make([]byte, n+256)
	base := uintptr(addrOf(buf))
	p := (base + 255) &^ 255
	f.mem[p] = buf
	return p
}

// owns reports whether p lies in memory the fake allocated.
func (f *fakeCUDA) owns(p uintptr) bool {
	for base, buf := range f.mem {
		if p >= base && p < base+uintptr(len(buf)) {
			return true
		}
	}
	return false
}

//go:noinline
func cString(p uintptr) string { return goString(p) }

//go:noinline
func putFloat32(p uintptr, v float32) { putInt32(p, int32(math.Float32bits(v))) }

//go:noinline
func copyMem(dst, src, n uintptr) { copy(bytesAt(dst, int(n)), bytesAt(src, int(n))) }

func (f *fakeCUDA) driver(name string, a []uintptr) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	tid := syscall.Gettid()
	f.calls[name]++
	if !fakeNoContext[name] {
		f.threads[tid] = true
		if cur := f.current[tid]; cur != f.ctx {
			f.violations = append(f.violations, fmt.Sprintf("%s on thread %d with context %#x current", name, tid, cur))
			return 201 // CUDA_ERROR_INVALID_CONTEXT
		}
	}
	if f.streams != nil {
		f.streams.call(name, a)
	}
	switch name {
	case "cuDriverGetVersion":
		putInt32(a[0], 13000)
	case "cuDeviceGetCount":
		putInt32(a[0], 1)
	case "cuDeviceGet":
		putInt32(a[0], 0)
	case "cuDeviceGetAttribute":
		v := map[uintptr]int32{attrMultiprocessorCount: 4, attrComputeCapabilityMajr: 9, attrComputeCapabilityMinr: 0}[a[1]]
		putInt32(a[0], v)
	case "cuDeviceGetName":
		copy(bytesAt(a[0], int(a[1])), "Fake GPU\x00")
	case "cuDevicePrimaryCtxRetain":
		putUintptr(a[0], f.ctx)
	case "cuCtxSetCurrent":
		f.current[tid] = a[0]
	case "cuMemGetInfo":
		putUintptr(a[0], 1<<30)
		putUintptr(a[1], 1<<30)
	case "cuMemAlloc", "cuMemHostAlloc":
		putUintptr(a[0], f.alloc(a[1]))
	case "cuMemFree", "cuMemFreeHost":
		if _, ok := f.mem[a[0]]; !ok {
			return 1
		}
		delete(f.mem, a[0])
	case "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync", "cuMemcpyHtoD", "cuMemcpyDtoH":
		copyMem(a[0], a[1], a[2])
	case "cuStreamCreate", "cuEventCreate":
		putUintptr(a[0], f.handle())
	case "cuModuleLoadData":
		img := cString(a[1])
		f.images = append(f.images, img)
		if src, ks, err := parseFakeImage(img); err == nil {
			if f.kernels == nil {
				f.kernels = map[string]*fakeKernel{}
			}
			for _, k := range ks {
				f.kernels[k.name] = k
			}
			if f.exec != nil {
				f.exec.load(src, ks)
			}
		}
		putUintptr(a[0], f.handle())
	case "cuModuleGetFunction":
		h := f.handle()
		f.funcs[h] = cString(a[2])
		putUintptr(a[0], h)
	case "cuLaunchKernel":
		// kernelParams (a[9]) holds the address of each argument value; the
		// first is a buffer of the fake's memory.
		if p0 := loadUintptr(loadUintptr(a[9])); !f.owns(p0) {
			f.violations = append(f.violations, fmt.Sprintf("cuLaunchKernel: first argument %#x is no allocation", p0))
			return 1
		}
		name := f.funcs[a[0]]
		f.launches = append(f.launches, name)
		if k := f.kernels[name]; k != nil {
			l := fakeLaunch{name: name}
			for i := range k.nargs {
				l.args = append(l.args, loadUintptr(loadUintptr(a[9]+uintptr(i)*8)))
			}
			f.launchArgs = append(f.launchArgs, l)
			if f.streams != nil {
				f.streams.launch(a[8], name, l.args)
			}
			if f.exec != nil {
				if err := f.exec.launch(name, l.args); err != nil {
					f.violations = append(f.violations, fmt.Sprintf("cuLaunchKernel %s: %v", name, err))
					return 1
				}
			}
		}
	case "cuMemsetD8Async":
		dst := bytesAt(a[0], int(a[2]))
		for i := range dst {
			dst[i] = byte(a[1])
		}
	case "cuStreamQuery":
		if f.notReady {
			return 600 // CUDA_ERROR_NOT_READY
		}
	case "cuEventElapsedTime":
		putFloat32(a[0], 1.5)
	}
	return 0
}

// withCublasLt gives d a fake cuBLASLt (fakeLt behind C function
// pointers), whose calls also need the context current.
func (f *fakeCUDA) withCublasLt(d *Driver) *fakeLt {
	f.lt = newFakeLt()
	d.Lt = &CublasLt{Path: "fake libcublasLt.so", syms: &symbolTable{lib: &Library{Path: "fake libcublasLt.so"}, procs: maps(fakeLtProc)}}
	d.LtErr = nil
	return f.lt
}

func (f *fakeCUDA) cublasLt(name string, a []uintptr) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	tid := syscall.Gettid()
	f.calls[name]++
	if name == "cublasLtGetVersion" {
		return 130100
	}
	if cur := f.current[tid]; cur != f.ctx {
		f.violations = append(f.violations, fmt.Sprintf("%s on thread %d with context %#x current", name, tid, cur))
		return 3 // CUBLAS_STATUS_ALLOC_FAILED, as with no context
	}
	switch name {
	case "cublasLtCreate":
		putUintptr(a[0], 0x1770)
		return 0
	case "cublasLtMatmul":
		for _, p := range []uintptr{a[3], a[5], a[8], a[10]} {
			if !f.owns(p) {
				f.violations = append(f.violations, fmt.Sprintf("cublasLtMatmul: matrix %#x is no allocation", p))
			}
		}
	}
	return uintptr(f.lt.call(name, a...))
}

func (f *fakeCUDA) nvrtc(name string, a []uintptr) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	prog := func() *fakeProgram { return f.progs[a[0]] }
	switch name {
	case "nvrtcVersion":
		putInt32(a[0], 13)
		putInt32(a[1], 0)
	case "nvrtcGetErrorString":
		return uintptr(addrOf(fakeErrStr))
	case "nvrtcCreateProgram":
		h := f.handle()
		f.progs[h] = &fakeProgram{src: cString(a[1]), name: cString(a[2])}
		putUintptr(a[0], h)
	case "nvrtcCompileProgram":
		p := prog()
		if p == nil {
			return 5 // NVRTC_ERROR_INVALID_PROGRAM
		}
		for i := range a[1] {
			p.opts = append(p.opts, cString(loadUintptr(a[2]+i*8)))
		}
		p.image = []byte("FAKECUBIN " + strings.Join(p.opts, " ") + "\n" + p.src + "\x00")
	case "nvrtcGetProgramLogSize":
		putUintptr(a[1], 1)
	case "nvrtcGetProgramLog":
		copy(bytesAt(a[1], 1), "\x00")
	case "nvrtcGetCUBINSize", "nvrtcGetPTXSize":
		p := prog()
		if p == nil {
			return 5
		}
		putUintptr(a[1], uintptr(len(p.image)))
	case "nvrtcGetCUBIN", "nvrtcGetPTX":
		p := prog()
		if p == nil {
			return 5
		}
		copy(bytesAt(a[1], len(p.image)), p.image)
	case "nvrtcDestroyProgram":
		h := loadUintptr(a[0])
		if f.progs[h] == nil {
			return 5
		}
		delete(f.progs, h)
		f.destroyed++
	}
	return 0
}

//go:noinline
func loadUintptr(p uintptr) uintptr { return *(*uintptr)(ptrFromUintptr(p)) }

// addrOf is the address of b's first byte (b must stay referenced by the
// caller while the address is used).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// snapshot returns the fake's record of calls, launches and violations.
func (f *fakeCUDA) snapshot() (violations []string, threads int, launches []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.violations), len(f.threads), slices.Clone(f.launches)
}
