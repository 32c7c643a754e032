//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// fakeKernel is an entry of a module the fake driver loaded, read from the
// source in the fake NVRTC's image: its name, the number of its parameters
// (pointers, then the element count n) and whether it synchronises its
// block's threads (a LaunchReduce entry).
type fakeKernel struct {
	name     string
	nargs    int
	threaded bool
	mod      int // index of its module in fakeExec.sources
	call     uintptr
}

// fakeLaunch is one recorded cuLaunchKernel: the entry and its arguments
// (buffer addresses, then n).
type fakeLaunch struct {
	name string
	args []uintptr
}

// parseFakeImage returns the generated source in an image of the fake
// NVRTC ("FAKECUBIN options\n" + source) and its entries.
func parseFakeImage(img string) (src string, ks []*fakeKernel, err error) {
	_, src, ok := strings.Cut(img, "\n")
	if !ok || !strings.HasPrefix(img, "FAKECUBIN") {
		return "", nil, fmt.Errorf("not an image of the fake NVRTC")
	}
	rest := strings.TrimPrefix(src, Prelude)
	for {
		i := strings.Index(rest, "FERRY_KERNEL ")
		if i < 0 {
			break
		}
		rest = rest[i+len("FERRY_KERNEL "):]
		open := strings.IndexByte(rest, '(')
		end := strings.IndexByte(rest, ')')
		if open < 0 || end < open {
			return "", nil, fmt.Errorf("bad kernel signature in\n%s", src)
		}
		k := &fakeKernel{name: rest[:open], nargs: strings.Count(rest[open:end], ",") + 1}
		body := rest[end:]
		if j := strings.Index(body, "FERRY_KERNEL "); j >= 0 {
			body = body[:j]
		}
		k.threaded = strings.Contains(body, "__syncthreads") || strings.Contains(body, "ferry_shfl_down")
		ks = append(ks, k)
	}
	return src, ks, nil
}

// fakeExec makes the fake driver run the kernels it launches: the sources
// of the modules loaded so far are built with gcc (the host check's shim,
// hostc_test.go) into one shared object on the first launch after a load,
// and each launch calls the entry's wrapper there, which runs its blocks
// on the calling thread (the threads of a reduction's block as POSIX
// threads) — so device memory, Go memory in the fake, holds real results.
type fakeExec struct {
	gcc, dir string
	sources  []string
	built    int // sources already in a shared object
	kernels  map[string]*fakeKernel
}

// executeKernels turns on kernel execution (skipping the test without gcc).
func (f *fakeCUDA) executeKernels(t *testing.T) {
	t.Helper()
	gcc := needGCC(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exec = &fakeExec{gcc: gcc, dir: t.TempDir(), kernels: map[string]*fakeKernel{}}
}

// load records a module's source and entries.
func (x *fakeExec) load(src string, ks []*fakeKernel) {
	for _, s := range x.sources {
		if s == src {
			return
		}
	}
	x.sources = append(x.sources, src)
	for _, k := range ks {
		k.mod = len(x.sources) - 1
		x.kernels[k.name] = k
	}
}

// build compiles the sources not built yet into a shared object and finds
// their entries' wrappers in it.
func (x *fakeExec) build() error {
	if x.built == len(x.sources) {
		return nil
	}
	var b strings.Builder
	b.WriteString(hostShim)
	b.WriteString(Prelude)
	var names []string
	for i := x.built; i < len(x.sources); i++ {
		b.WriteString(strings.TrimPrefix(x.sources[i], Prelude))
		for _, k := range x.kernels {
			if k.mod != i {
				continue
			}
			names = append(names, k.name)
			var params []string
			for a := 0; a < k.nargs-1; a++ {
				params = append(params, fmt.Sprintf("(void*)ferry_args[%d]", a))
			}
			params = append(params, "(long long)ferry_args[NARGS-1]")
			fmt.Fprintf(&b, "static void thunk_%[1]s(void) {\n#define NARGS %[2]d\n  %[1]s(%[3]s);\n#undef NARGS\n}\n", k.name, k.nargs, strings.Join(params, ", "))
			fmt.Fprintf(&b, "void call_%[1]s(unsigned long long* args, int grid, int block, int threaded) {\n  memcpy(ferry_args, args, %[2]d * 8);\n  ferry_launch(thunk_%[1]s, grid, block, threaded);\n}\n", k.name, k.nargs)
		}
	}
	prog := strings.Replace(b.String(), "static void (*ferry_fn)(void);", "static void (*ferry_fn)(void);\nstatic unsigned long long ferry_args[256];", 1)
	src := filepath.Join(x.dir, fmt.Sprintf("k%d.c", x.built))
	so := strings.TrimSuffix(src, ".c") + ".so"
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		return err
	}
	args := append(append([]string{}, gccFlags...), "-shared", "-fPIC", "-o", so, src, "-lm")
	if out, err := exec.Command(x.gcc, args...).CombinedOutput(); err != nil {
		return &gccError{err: err, out: string(out), prog: prog}
	}
	h, err := purego.Dlopen(so, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return err
	}
	for _, n := range names {
		p, err := purego.Dlsym(h, "call_"+n)
		if err != nil {
			return err
		}
		x.kernels[n].call = p
	}
	x.built = len(x.sources)
	return nil
}

// launch runs entry name on args: loops with 3 blocks of 5 threads (their
// grid-stride loops cover any n), reductions with 2 blocks of 64 threads,
// as the host check does.
func (x *fakeExec) launch(name string, args []uintptr) error {
	if err := x.build(); err != nil {
		return err
	}
	k := x.kernels[name]
	if k == nil || k.call == 0 {
		return fmt.Errorf("fake: no built kernel %s", name)
	}
	grid, block, threaded := 3, 5, 0
	if k.threaded {
		grid, block, threaded = 2, 64, 1
	}
	vals := make([]uint64, len(args))
	for i, a := range args {
		vals[i] = uint64(a)
	}
	var pin runtime.Pinner
	pin.Pin(&vals[0])
	defer pin.Unpin()
	purego.SyscallN(k.call, uintptr(unsafe.Pointer(&vals[0])), uintptr(grid), uintptr(block), uintptr(threaded))
	return nil
}
