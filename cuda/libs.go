package cuda

import (
	"fmt"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ferryml/ferry/internal/dynlib"
)

// symbolTable holds the entry points of a library without cuGetProcAddress
// (NVRTC, cuBLASLt), resolved with dlsym.
type symbolTable struct{ *dynlib.Table }

// resolve resolves the entry points of lib.
func resolve(lib *Library, syms []dynlib.Symbol) (*symbolTable, error) {
	t, err := lib.Resolve(syms)
	if err != nil {
		return nil, err
	}
	return &symbolTable{t}, nil
}

// call is Table.Call with the status as a Result. Arguments converted from
// addresses in the call expression stay on the heap and alive for the call
// (go:uintptrescapes).
//
//go:uintptrescapes
func (t *symbolTable) call(name string, args ...uintptr) Result {
	return Result(t.Call(name, args...))
}

// nvrtcEntryPoints are the NVRTC functions used (NVRTC has no versioned
// names).
var nvrtcEntryPoints = dynlib.Names(
	"nvrtcVersion", "nvrtcGetErrorString", "nvrtcCreateProgram", "nvrtcDestroyProgram",
	"nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog",
	"nvrtcGetPTXSize", "nvrtcGetPTX", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
)

// cublasLtEntryPoints are the cuBLASLt functions used. cuBLASLt exports
// unversioned names; a _v2 name is preferred should a release add one.
var cublasLtEntryPoints = func() []dynlib.Symbol {
	var out []dynlib.Symbol
	for _, n := range []string{
		"cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion",
		"cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
		"cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute",
		"cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
		"cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul",
	} {
		out = append(out, dynlib.Symbol{Name: n, Try: []string{n + "_v2", n}})
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
	lib, err := openLibrary("libnvrtc.so*", "libnvrtc.so", dirs)
	if err != nil {
		return nil, err
	}
	n := &NVRTC{Path: lib.Path}
	if d := filepath.Dir(lib.Path); d != "." {
		if b, err := openLibrary("libnvrtc-builtins.so*", "", []string{d}); err == nil {
			n.Builtins = b.Path
		}
	}
	if n.syms, err = resolve(lib, nvrtcEntryPoints); err != nil {
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
	p, _, _ := purego.SyscallN(n.syms.Proc("nvrtcGetErrorString"), uintptr(r))
	if p == 0 {
		return fmt.Sprintf("nvrtcResult %d", r)
	}
	return fmt.Sprintf("%s (%d)", dynlib.GoString(p), r)
}

// cstr is s as a NUL-terminated C string (see dynlib.CString for how to
// pass it to C).
func cstr(s string) []byte { return dynlib.CString(s) }

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
	opts := dynlib.NewCStrings("--gpu-architecture="+arch, "--std=c++17", "-default-device")
	r := n.syms.call("nvrtcCompileProgram", prog, uintptr(len(opts.Ptrs)), uintptr(unsafe.Pointer(&opts.Ptrs[0])))
	opts.Free()
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
	lib, err := openLibrary("libcublasLt.so*", "libcublasLt.so", dirs)
	if err != nil {
		return nil, err
	}
	syms, err := resolve(lib, cublasLtEntryPoints)
	if err != nil {
		return nil, err
	}
	return &CublasLt{Path: lib.Path, syms: syms}, nil
}

// Version returns cublasLtGetVersion (for example 130000).
func (l *CublasLt) Version() int {
	r, _, _ := purego.SyscallN(l.syms.Proc("cublasLtGetVersion"))
	return int(r)
}
