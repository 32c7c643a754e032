package cuda

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// symbolTable resolves the entry points of a library without
// cuGetProcAddress (NVRTC, cuBLASLt) with dlsym. Each entry lists the names to
// try, versioned ones first: the first that resolves is kept under the
// entry's first (canonical) name without its version suffix.
type symbolTable struct {
	lib   *Library
	procs map[string]uintptr
}

// symbolSpec is one entry point: Names in order of preference.
type symbolSpec struct {
	Canonical string
	Names     []string
}

func resolveSymbols(lib *Library, specs []symbolSpec) (*symbolTable, error) {
	t := &symbolTable{lib: lib, procs: map[string]uintptr{}}
	for _, s := range specs {
		var tried []string
		for _, n := range s.Names {
			p, err := purego.Dlsym(lib.handle, n)
			if err == nil && p != 0 {
				t.procs[s.Canonical] = p
				break
			}
			tried = append(tried, n)
		}
		if t.procs[s.Canonical] == 0 {
			return nil, &LoadError{Library: lib.Path, Detail: fmt.Sprintf("missing entry point %s (tried %s)", s.Canonical, strings.Join(tried, ", "))}
		}
	}
	return t, nil
}

// call calls a resolved entry point and returns its status. Arguments may
// be addresses of the caller's variables converted to uintptr: they are kept
// on the heap and alive for the call (go:uintptrescapes), so a goroutine stack
// that moves on entry does not leave C writing to the old stack.
//
//go:uintptrescapes
func (t *symbolTable) call(name string, args ...uintptr) Result {
	p := t.procs[name]
	if p == 0 {
		panic("cuda: entry point " + name + " not resolved")
	}
	r, _, _ := purego.SyscallN(p, args...)
	return Result(int32(r))
}

func plain(names ...string) []symbolSpec {
	out := make([]symbolSpec, len(names))
	for i, n := range names {
		out[i] = symbolSpec{Canonical: n, Names: []string{n}}
	}
	return out
}

// nvrtcEntryPoints are the NVRTC functions used (NVRTC has no versioned
// names).
var nvrtcEntryPoints = plain(
	"nvrtcVersion", "nvrtcGetErrorString", "nvrtcCreateProgram", "nvrtcDestroyProgram",
	"nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
	"nvrtcGetPTXSize", "nvrtcGetPTX", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
)

// cublasLtEntryPoints are the cuBLASLt functions used. cuBLASLt exports
// unversioned names; a _v2 name is preferred should a release add one.
var cublasLtEntryPoints = func() []symbolSpec {
	var out []symbolSpec
	for _, n := range []string{
		"cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion",
		"cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
		"cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute",
		"cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
		"cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul",
	} {
		out = append(out, symbolSpec{Canonical: n, Names: []string{n + "_v2", n}})
	}
	return out
}()

// NVRTC is the loaded run-time compiler.
type NVRTC struct {
	// Path is the libnvrtc file that loaded; Builtins the libnvrtc-builtins
	// preloaded beside it ("" when the system loader is left to find it).
	Path, Builtins string
	syms           *symbolTable
}

// LoadNVRTC loads libnvrtc.so* from dirs (then the system loader) and
// preloads libnvrtc-builtins.so* from the same directory, so that NVRTC's own
// dlopen of it succeeds even when that directory is not on the library path.
func LoadNVRTC(dirs []string) (*NVRTC, error) {
	// The glob "libnvrtc.so*" does not match libnvrtc-builtins.so*.
	h, path, err := openLibrary("libnvrtc.so*", "libnvrtc.so", dirs)
	if err != nil {
		return nil, err
	}
	n := &NVRTC{Path: path}
	if d := filepath.Dir(path); d != "." {
		if _, bp, err := openLibrary("libnvrtc-builtins.so*", "", []string{d}); err == nil {
			n.Builtins = bp
		}
	}
	n.syms, err = resolveSymbols(&Library{Path: path, handle: h}, nvrtcEntryPoints)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Version returns NVRTC's major and minor version.
func (n *NVRTC) Version() (major, minor int, err error) {
	var ma, mi int32
	if r := n.syms.call("nvrtcVersion", uintptr(unsafe.Pointer(&ma)), uintptr(unsafe.Pointer(&mi))); r != 0 {
		return 0, 0, fmt.Errorf("cuda: nvrtcVersion: %s", n.errString(r))
	}
	return int(ma), int(mi), nil
}

func (n *NVRTC) errString(r Result) string {
	p, _, _ := purego.SyscallN(n.syms.procs["nvrtcGetErrorString"], uintptr(r))
	if p == 0 {
		return fmt.Sprintf("nvrtcResult %d", r)
	}
	return fmt.Sprintf("%s (%d)", goString(p), r)
}

// goString copies a NUL-terminated C string.
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := ptrFromUintptr(p)
	var b []byte
	for i := 0; ; i++ {
		c := *(*byte)(unsafe.Add(base, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// ptrFromUintptr turns an address owned by C (never by the Go heap) into a
// pointer without tripping vet's unsafeptr check.
func ptrFromUintptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// cstr is s as a NUL-terminated C string. Pass its address to C only in
// the call expression of a go:uintptrescapes function (Driver.Check,
// symbolTable.call), which moves it to the heap and keeps it alive; a short
// cstr may otherwise live on the goroutine's stack, which moves when it
// grows.
func cstr(s string) []byte { return append([]byte(s), 0) }

// cStrings is an array of C strings (char**) in pinned Go heap memory: the
// addresses stored in ptrs stay valid, wherever the goroutine's stack goes,
// until free. (Storing an address as a uintptr in memory, as an array for
// C must, is outside what go:uintptrescapes covers: only a conversion in
// the call expression is.)
type cStrings struct {
	ptrs []uintptr
	bufs [][]byte
	pin  runtime.Pinner
}

func newCStrings(ss ...string) *cStrings {
	c := &cStrings{ptrs: make([]uintptr, len(ss)), bufs: make([][]byte, len(ss))}
	for i, s := range ss {
		c.bufs[i] = cstr(s)
		c.pin.Pin(&c.bufs[i][0]) // Pin's argument escapes: the bytes are on the heap
		c.ptrs[i] = uintptr(unsafe.Pointer(&c.bufs[i][0]))
	}
	c.pin.Pin(&c.ptrs[0])
	return c
}

// free unpins the strings (after the C call that reads them).
func (c *cStrings) free() { c.pin.Unpin() }

// Compile compiles CUDA C source for arch (for example "sm_90") and returns
// the cubin image (or PTX when the NVRTC release cannot emit a cubin for
// arch). A compile error carries NVRTC's log.
func (n *NVRTC) Compile(src, name, arch string) ([]byte, error) {
	img, _, err := n.CompileLog(src, name, arch)
	return img, err
}

// CompileLog is Compile that also returns NVRTC's log, which for a compile
// that succeeded holds its warnings ("" when there are none).
func (n *NVRTC) CompileLog(src, name, arch string) (img []byte, log string, err error) {
	var prog uintptr
	csrc, cname := cstr(src), cstr(name)
	if r := n.syms.call("nvrtcCreateProgram", uintptr(unsafe.Pointer(&prog)), uintptr(unsafe.Pointer(&csrc[0])),
		uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0); r != 0 {
		return nil, "", fmt.Errorf("cuda: nvrtcCreateProgram: %s", n.errString(r))
	}
	// The conversion sits in the deferred call itself, so that
	// go:uintptrescapes keeps prog alive until it runs.
	defer func() { n.syms.call("nvrtcDestroyProgram", uintptr(unsafe.Pointer(&prog))) }()
	opts := newCStrings("--gpu-architecture="+arch, "--std=c++17", "-default-device")
	r := n.syms.call("nvrtcCompileProgram", prog, uintptr(len(opts.ptrs)), uintptr(unsafe.Pointer(&opts.ptrs[0])))
	opts.free()
	log = n.programLog(prog)
	if r != 0 {
		return nil, log, fmt.Errorf("cuda: NVRTC compile of %s for %s: %s\n%s", name, arch, n.errString(r), log)
	}
	get := func(sizeFn, dataFn string) ([]byte, Result) {
		var size uintptr
		if r := n.syms.call(sizeFn, prog, uintptr(unsafe.Pointer(&size))); r != 0 {
			return nil, r
		}
		out := make([]byte, size)
		if size == 0 {
			return out, 0
		}
		if r := n.syms.call(dataFn, prog, uintptr(unsafe.Pointer(&out[0]))); r != 0 {
			return nil, r
		}
		return out, 0
	}
	if strings.HasPrefix(arch, "sm_") {
		if img, r := get("nvrtcGetCUBINSize", "nvrtcGetCUBIN"); r == 0 && len(img) > 0 {
			return img, log, nil
		}
	}
	img, r = get("nvrtcGetPTXSize", "nvrtcGetPTX")
	if r != 0 {
		return nil, log, fmt.Errorf("cuda: nvrtcGetPTX: %s", n.errString(r))
	}
	return img, log, nil
}

// programLog returns the log of a compiled program without its terminating
// NUL and trailing newlines.
func (n *NVRTC) programLog(prog uintptr) string {
	var size uintptr
	if r := n.syms.call("nvrtcGetProgramLogSize", prog, uintptr(unsafe.Pointer(&size))); r != 0 || size == 0 {
		return ""
	}
	buf := make([]byte, size)
	if r := n.syms.call("nvrtcGetProgramLog", prog, uintptr(unsafe.Pointer(&buf[0]))); r != 0 {
		return ""
	}
	return strings.TrimRight(string(buf), "\x00\n")
}

// CublasLt is the loaded cuBLASLt library.
type CublasLt struct {
	// Path is the file that loaded.
	Path string
	syms *symbolTable
}

// LoadCublasLt loads libcublasLt.so* from dirs, then the system loader.
func LoadCublasLt(dirs []string) (*CublasLt, error) {
	h, path, err := openLibrary("libcublasLt.so*", "libcublasLt.so", dirs)
	if err != nil {
		return nil, err
	}
	syms, err := resolveSymbols(&Library{Path: path, handle: h}, cublasLtEntryPoints)
	if err != nil {
		return nil, err
	}
	return &CublasLt{Path: path, syms: syms}, nil
}

// Version returns cublasLtGetVersion (for example 130000).
func (l *CublasLt) Version() int {
	r, _, _ := purego.SyscallN(l.syms.procs["cublasLtGetVersion"])
	return int(r)
}
