package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ferryml/ferry/internal/dynlib"
	"github.com/ferryml/ferry/internal/settings"
)

// PinnedCUDAVersion is the driver ABI version entry points are resolved for
// (cudaVersion argument of cuGetProcAddress): 12.0. CUDA 13 changed several
// signatures; pinning the version keeps the ones this package calls with.
const PinnedCUDAVersion = 12000

// cuGetProcAddressDefault is CU_GET_PROC_ADDRESS_DEFAULT.
const cuGetProcAddressDefault = 0

// LibDirEnv names the environment variable searched first for CUDA libraries.
const LibDirEnv = "FERRY_CUDA_LIB_DIR"

// Attempt is one place a library was looked for, and why it did not load.
type Attempt = dynlib.Attempt

// LoadError reports a library that could not be loaded, with every place it
// was looked for (Attempts), or one that loaded but was unusable (Detail: a
// missing entry point, for example).
type LoadError = dynlib.LoadError

// Library is one loaded shared library.
type Library = dynlib.Library

// SearchDirs returns the directories searched for CUDA libraries, in order:
// $FERRY_CUDA_LIB_DIR, /usr/local/cuda*/lib64, the $LD_LIBRARY_PATH entries,
// and the nvidia/*/lib folders of Python installs, where pip puts the CUDA
// wheels (nvidia-cuda-nvrtc 13 in nvidia/cu13/lib): the active virtualenv
// ($VIRTUAL_ENV), then system, /usr/local, the user's ~/.local, and any
// python3* under /opt or /root/.pyenv. Glob patterns are expanded; duplicates
// are dropped.
func SearchDirs() []string {
	var dirs []string
	seen := map[string]bool{}
	add := func(ds ...string) {
		for _, d := range ds {
			if d == "" || seen[d] {
				continue
			}
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	glob := func(pattern string) []string {
		m, _ := filepath.Glob(pattern)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest version first
		return m
	}
	if d := settings.CUDALibDir.Get(); d != "" {
		add(filepath.SplitList(d)...)
	}
	add(glob("/usr/local/cuda*/lib64")...)
	add(filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))...)
	var sites []string
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		sites = append(sites, filepath.Join(v, "lib/python3*/site-packages"))
	}
	sites = append(sites,
		"/usr/lib/python3*/site-packages",
		"/usr/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/dist-packages",
		"/usr/local/lib/python3*/site-packages",
		"/opt/*/lib/python3*/site-packages",
		"/opt/*/*/lib/python3*/site-packages",
		"/root/.pyenv/versions/*/lib/python3*/site-packages",
	)
	if home, err := os.UserHomeDir(); err == nil {
		sites = append(sites, filepath.Join(home, ".local/lib/python3*/site-packages"))
	}
	for _, s := range sites {
		add(glob(filepath.Join(s, "nvidia/*/lib"))...)
	}
	return dirs
}

// openLibrary loads the first file matching pattern (a file name, possibly
// with a * glob) in dirs, newest version first, then asks the system loader
// for fallback (a bare soname; empty to skip). A failure is a *LoadError
// listing every path tried.
func openLibrary(pattern, fallback string, dirs []string) (*Library, error) {
	s := dynlib.Spec{Prefix: "cuda", Pattern: pattern, Dirs: dirs}
	if fallback != "" {
		s.Paths = []string{fallback}
	}
	return dynlib.Open(s)
}

// Result is a CUresult (or nvrtcResult, cublasStatus_t) status code.
type Result int32

// Driver is the loaded CUDA driver API with NVRTC and cuBLASLt.
type Driver struct {
	// CUDA is libcuda.so.1.
	CUDA *Library
	// NVRTC is the run-time compiler (libnvrtc.so*).
	NVRTC *NVRTC
	// Lt is cuBLASLt (libcublasLt.so*), or nil when it did not load: LtErr
	// then says why, and the backend computes every dot_general with its
	// generated kernel.
	Lt *CublasLt
	// LtErr is the error of loading cuBLASLt (nil when Lt is set).
	LtErr   error
	getProc uintptr
	procs   map[string]uintptr
}

// driverEntryPoints are the driver functions the backend calls, resolved once
// through cuGetProcAddress at PinnedCUDAVersion.
var driverEntryPoints = []string{
	"cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount",
	"cuDeviceGetName", "cuDeviceGetAttribute", "cuDeviceTotalMem",
	"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuCtxSetCurrent",
	"cuCtxSynchronize", "cuMemAlloc", "cuMemFree", "cuMemAllocHost", "cuMemFreeHost",
	"cuMemHostAlloc", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync",
	"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemsetD8Async",
	"cuMemGetInfo", "cuStreamCreate", "cuStreamDestroy", "cuStreamSynchronize", "cuStreamQuery",
	"cuStreamWaitEvent", "cuEventCreate", "cuEventDestroy", "cuEventRecord",
	"cuEventSynchronize", "cuEventElapsedTime", "cuModuleLoadData", "cuModuleUnload",
	"cuModuleGetFunction", "cuLaunchKernel", "cuGetErrorString", "cuGetErrorName",
}

// optionalEntryPoints are resolved when the driver has them: without them
// devices never enable peer access, and copies between GPUs go through
// pinned host memory.
var optionalEntryPoints = []string{
	"cuDeviceCanAccessPeer", "cuCtxEnablePeerAccess", "cuMemcpyPeerAsync",
}

// LoadDriver loads libcuda.so.1 alone and resolves the driver entry points
// through cuGetProcAddress_v2 for PinnedCUDAVersion, searching dirs and then
// the system loader. It does not call cuInit.
func LoadDriver(dirs []string) (*Driver, error) {
	d := &Driver{procs: map[string]uintptr{}}
	var err error
	if d.CUDA, err = openLibrary("libcuda.so.1", "libcuda.so.1", dirs); err != nil {
		return nil, err
	}
	gp, err := d.CUDA.Sym("cuGetProcAddress_v2")
	if err != nil {
		return nil, &LoadError{Prefix: "cuda", Library: d.CUDA.Path, Detail: "no cuGetProcAddress_v2 (driver older than CUDA 12): " + err.Error()}
	}
	d.getProc = gp
	for _, name := range driverEntryPoints {
		p, err := d.resolve(name)
		if err != nil {
			return nil, &LoadError{Prefix: "cuda", Library: d.CUDA.Path, Detail: err.Error()}
		}
		d.procs[name] = p
	}
	for _, name := range optionalEntryPoints {
		if p, err := d.resolve(name); err == nil {
			d.procs[name] = p
		}
	}
	return d, nil
}

// Load loads libcuda.so.1 (LoadDriver), then NVRTC (LoadNVRTC) and cuBLASLt
// (LoadCublasLt), searching SearchDirs and then the system loader. A missing
// or unusable driver or NVRTC is a *LoadError naming every path tried.
// cuBLASLt is optional: when it does not load, Load still succeeds with
// d.Lt nil and d.LtErr saying why (dot_general then runs as a generated
// kernel). Load does not call cuInit.
func Load() (*Driver, error) {
	dirs := SearchDirs()
	d, err := LoadDriver(dirs)
	if err != nil {
		return nil, err
	}
	if d.NVRTC, err = LoadNVRTC(dirs); err != nil {
		return nil, err
	}
	d.loadCublasLt(dirs)
	return d, nil
}

// loadCublasLt loads cuBLASLt from dirs into d.Lt, or records in d.LtErr
// why it did not load.
func (d *Driver) loadCublasLt(dirs []string) {
	d.Lt, d.LtErr = LoadCublasLt(dirs)
}

// resolve calls cuGetProcAddress_v2(symbol, &pfn, PinnedCUDAVersion,
// CU_GET_PROC_ADDRESS_DEFAULT, &status).
func (d *Driver) resolve(name string) (uintptr, error) {
	cname := append([]byte(name), 0)
	var pfn uintptr
	var status int32
	r, _, _ := purego.SyscallN(d.getProc,
		uintptr(unsafe.Pointer(&cname[0])), uintptr(unsafe.Pointer(&pfn)),
		uintptr(PinnedCUDAVersion), uintptr(cuGetProcAddressDefault), uintptr(unsafe.Pointer(&status)))
	runtime.KeepAlive(cname)
	if Result(r) != 0 || pfn == 0 {
		return 0, fmt.Errorf("cuGetProcAddress(%s, %d) failed: CUresult %d, symbol status %d", name, PinnedCUDAVersion, int32(r), status)
	}
	return pfn, nil
}

// Proc returns the address of a driver entry point resolved by Load (one of
// the names the backend uses), or 0.
func (d *Driver) Proc(name string) uintptr { return d.procs[name] }

// Call calls the driver entry point name with raw arguments and returns its
// CUresult; an unresolved name returns an error. Arguments may be addresses
// of the caller's variables converted to uintptr: they are kept on the heap
// and alive for the call (go:uintptrescapes).
//
//go:uintptrescapes
func (d *Driver) Call(name string, args ...uintptr) (Result, error) {
	p := d.procs[name]
	if p == 0 {
		return 0, fmt.Errorf("cuda: entry point %s was not resolved", name)
	}
	r, _, _ := purego.SyscallN(p, args...)
	return Result(int32(r)), nil
}

// Init calls cuInit(0).
func (d *Driver) Init() error {
	r, err := d.Call("cuInit", 0)
	if err != nil {
		return err
	}
	if r != 0 {
		return fmt.Errorf("cuda: cuInit: CUresult %d", r)
	}
	return nil
}

// Version returns cuDriverGetVersion (for example 12040 for CUDA 12.4).
func (d *Driver) Version() (int, error) {
	var v int32
	r, err := d.Call("cuDriverGetVersion", uintptr(unsafe.Pointer(&v)))
	if err != nil {
		return 0, err
	}
	if r != 0 {
		return 0, fmt.Errorf("cuda: cuDriverGetVersion: CUresult %d", r)
	}
	return int(v), nil
}
