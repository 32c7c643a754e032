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
	"github.com/ferryml/ferry/internal/dynlib"
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
//
// It has one device unless withDevices gives it more: each has its primary
// context, its memory (capacity checked by cuMemAlloc, reported by
// cuMemGetInfo), its streams and events, and peer access to the others
// where the test allows it. Every call that names a stream, or device
// memory, checks that it belongs to the device of the calling thread's
// current context (or, for memory, to a device whose peer access that
// device enabled), recording a violation otherwise.
type fakeCUDA struct {
	mu  sync.Mutex
	ctx uintptr // device 0's primary context
	// ctxs[i] is device i's primary context; total[i] its memory; canPeer
	// (i, j) says cuDeviceCanAccessPeer(i, j); peerOn[i][j] that device i
	// enabled access to j.
	ctxs    []uintptr
	total   []uintptr
	canPeer func(i, j int) bool
	peerOn  map[[2]int]bool
	// memDev and streamDev are the device of an allocation (by base; -1
	// for pinned host memory) and of a stream or event.
	memDev     map[uintptr]int
	streamDev  map[uintptr]int
	peerCopies int
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
		for _, n := range append(append([]string(nil), driverEntryPoints...), optionalEntryPoints...) {
			fakeDrvProc[n] = mk((*fakeCUDA).driver, n)
		}
		fakeRTCProc = map[string]uintptr{}
		for _, s := range nvrtcEntryPoints {
			fakeRTCProc[s.Name] = mk((*fakeCUDA).nvrtc, s.Name)
		}
		fakeLtProc = map[string]uintptr{}
		for _, s := range cublasLtEntryPoints {
			name := s.Name
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
		next: 0x1000, mem: map[uintptr][]byte{}, funcs: map[uintptr]string{}, progs: map[uintptr]*fakeProgram{},
		ctxs: []uintptr{0xC0DE0000}, total: []uintptr{1 << 30}, canPeer: func(i, j int) bool { return false },
		peerOn: map[[2]int]bool{}, memDev: map[uintptr]int{}, streamDev: map[uintptr]int{}}
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
		NVRTC: &NVRTC{Path: "fake libnvrtc.so", syms: &symbolTable{dynlib.NewTable(&Library{Path: "fake libnvrtc.so"}, maps(fakeRTCProc))}},
		LtErr: fmt.Errorf("fake: no cuBLASLt"),
	}
	t.Setenv(CacheDirEnv, t.TempDir())
	return f, d
}

// withDevices gives the fake n devices of total bytes each (before a
// backend is made), with peer access between devices i and j where peer(i,
// j) says so (nil: none).
func (f *fakeCUDA) withDevices(n int, total uintptr, peer func(i, j int) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctxs, f.total = nil, nil
	for i := range n {
		f.ctxs = append(f.ctxs, f.ctx+uintptr(i)*0x1000)
		f.total = append(f.total, total)
	}
	if peer != nil {
		f.canPeer = peer
	}
}

// devOfCtx is the device of primary context c, or -1.
func (f *fakeCUDA) devOfCtx(c uintptr) int {
	for i, x := range f.ctxs {
		if x == c {
			return i
		}
	}
	return -1
}

// memOf returns the device of the allocation holding p (-1: pinned host
// memory) and whether p lies in memory the fake allocated.
func (f *fakeCUDA) memOf(p uintptr) (int, bool) {
	for base, buf := range f.mem {
		if p >= base && p < base+uintptr(len(buf)) {
			return f.memDev[base], true
		}
	}
	return 0, false
}

// used is the bytes allocated on device dev.
func (f *fakeCUDA) used(dev int) uintptr {
	var n uintptr
	for base, buf := range f.mem {
		if f.memDev[base] == dev {
			n += uintptr(len(buf)) - 256
		}
	}
	return n
}

// checkStream records a violation unless stream s belongs to device dev.
func (f *fakeCUDA) checkStream(name string, s uintptr, dev int) bool {
	if d, ok := f.streamDev[s]; ok && d != dev {
		f.violations = append(f.violations, fmt.Sprintf("%s: stream %#x of device %d used with device %d's context current", name, s, d, dev))
		return false
	}
	return true
}

// checkPtr records a violation unless p, when it is memory of the fake,
// is pinned host memory or memory of device dev or of a peer dev enabled.
func (f *fakeCUDA) checkPtr(name string, p uintptr, dev int) bool {
	d, ok := f.memOf(p)
	if !ok || d < 0 || d == dev || f.peerOn[[2]int{dev, d}] {
		return true
	}
	f.violations = append(f.violations, fmt.Sprintf("%s: memory %#x of device %d used with device %d's context current", name, p, d, dev))
	return false
}

// checkDevice checks the streams and device pointers of a call made with
// device dev's context current.
func (f *fakeCUDA) checkDevice(name string, a []uintptr, dev int) bool {
	ok := true
	switch name {
	case "cuMemcpyHtoDAsync", "cuMemsetD8Async":
		ok = f.checkStream(name, a[3], dev) && f.checkPtr(name, a[0], dev)
	case "cuMemcpyDtoHAsync":
		ok = f.checkStream(name, a[3], dev) && f.checkPtr(name, a[1], dev)
	case "cuMemcpyDtoDAsync":
		ok = f.checkStream(name, a[3], dev) && f.checkPtr(name, a[0], dev) && f.checkPtr(name, a[1], dev)
	case "cuMemcpyPeerAsync":
		ok = f.checkStream(name, a[5], dev) && f.checkPtr(name, a[0], f.devOfCtx(a[1])) && f.checkPtr(name, a[2], f.devOfCtx(a[3]))
		if src := f.devOfCtx(a[3]); ok && !f.peerOn[[2]int{f.devOfCtx(a[1]), src}] {
			f.violations = append(f.violations, fmt.Sprintf("%s from device %d without peer access", name, src))
			ok = false
		}
	case "cuStreamSynchronize", "cuStreamQuery", "cuStreamWaitEvent":
		ok = f.checkStream(name, a[0], dev)
	case "cuEventRecord":
		ok = f.checkStream(name, a[1], dev)
	case "cuLaunchKernel":
		ok = f.checkStream(name, a[8], dev)
	case "cuMemFree":
		if d, _ := f.memOf(a[0]); d != dev {
			f.violations = append(f.violations, fmt.Sprintf("cuMemFree of device %d's memory with device %d's context current", d, dev))
			ok = false
		}
	}
	return ok
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
	dev := f.devOfCtx(f.current[tid])
	if !fakeNoContext[name] {
		f.threads[tid] = true
		if dev < 0 {
			f.violations = append(f.violations, fmt.Sprintf("%s on thread %d with context %#x current", name, tid, f.current[tid]))
			return 201 // CUDA_ERROR_INVALID_CONTEXT
		}
		if !f.checkDevice(name, a, dev) {
			return 1 // CUDA_ERROR_INVALID_VALUE
		}
	}
	if f.streams != nil {
		f.streams.call(name, a)
	}
	if r, ok := f.deviceCall(name, a, dev); ok {
		return r
	}
	switch name {
	case "cuDriverGetVersion":
		putInt32(a[0], 13000)
	case "cuDeviceGetAttribute":
		v := map[uintptr]int32{attrMultiprocessorCount: 4, attrComputeCapabilityMajr: 9, attrComputeCapabilityMinr: 0}[a[1]]
		putInt32(a[0], v)
	case "cuDeviceGetName":
		copy(bytesAt(a[0], int(a[1])), "Fake GPU\x00")
	case "cuCtxSetCurrent":
		f.current[tid] = a[0]
	case "cuMemFree", "cuMemFreeHost":
		if _, ok := f.mem[a[0]]; !ok {
			return 1
		}
		delete(f.mem, a[0])
		delete(f.memDev, a[0])
	case "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync", "cuMemcpyHtoD", "cuMemcpyDtoH":
		copyMem(a[0], a[1], a[2])
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
	d.Lt = &CublasLt{Path: "fake libcublasLt.so", syms: &symbolTable{dynlib.NewTable(&Library{Path: "fake libcublasLt.so"}, maps(fakeLtProc))}}
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
	if cur := f.current[tid]; f.devOfCtx(cur) < 0 {
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

// deviceCall plays the calls that depend on the devices (their count,
// contexts, memory, streams and peer access), made with device dev's
// context current; ok is false for any other call.
func (f *fakeCUDA) deviceCall(name string, a []uintptr, dev int) (r uintptr, ok bool) {
	switch name {
	case "cuDeviceGetCount":
		putInt32(a[0], int32(len(f.ctxs)))
	case "cuDeviceGet":
		if int(a[1]) >= len(f.ctxs) {
			return 101, true // CUDA_ERROR_INVALID_DEVICE
		}
		putInt32(a[0], int32(a[1]))
	case "cuDeviceCanAccessPeer":
		v := int32(0)
		if f.canPeer(int(a[1]), int(a[2])) {
			v = 1
		}
		putInt32(a[0], v)
	case "cuCtxEnablePeerAccess":
		p := f.devOfCtx(a[0])
		if p < 0 || !f.canPeer(dev, p) {
			return 217, true // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
		}
		f.peerOn[[2]int{dev, p}] = true
	case "cuMemcpyPeerAsync":
		f.peerCopies++
		copyMem(a[0], a[2], a[4])
	case "cuDevicePrimaryCtxRetain":
		putUintptr(a[0], f.ctxs[a[1]])
	case "cuMemGetInfo":
		putUintptr(a[0], f.total[dev]-f.used(dev))
		putUintptr(a[1], f.total[dev])
	case "cuMemAlloc":
		if f.used(dev)+a[1] > f.total[dev] {
			return 2, true // CUDA_ERROR_OUT_OF_MEMORY
		}
		p := f.alloc(a[1])
		f.memDev[p] = dev
		putUintptr(a[0], p)
	case "cuMemHostAlloc":
		p := f.alloc(a[1])
		f.memDev[p] = -1
		putUintptr(a[0], p)
	case "cuStreamCreate", "cuEventCreate":
		h := f.handle()
		f.streamDev[h] = dev
		putUintptr(a[0], h)
	default:
		return 0, false
	}
	return 0, true
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
