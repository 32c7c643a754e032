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

// load records a module's source and entries. A module whose entries are
// known already is the same code (entry names hash the signature and the
// bodies; the sources may differ in their comment line).
func (x *fakeExec) load(src string, ks []*fakeKernel) {
	known := true
	for _, k := range ks {
		known = known && x.kernels[k.name] != nil
	}
	if known {
		return
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
	prog, err := coroutineShim(b.String())
	if err != nil {
		return err
	}
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

// coShim runs the threads of a block as coroutines on the calling thread
// (ucontext), switched round-robin at every barrier: each thread runs to its
// next barrier, so when a thread passes one every thread has reached it.
// (The host check's POSIX threads cost tens of milliseconds per reduction
// launch on a loaded machine; this, well under one.) Barriers must be
// reached by every thread of the block, as __syncthreads requires; warp
// barriers are then block barriers, which is right for one-warp blocks.
const coShim = `#include <ucontext.h>
static unsigned long long ferry_args[256];
static ucontext_t co_main, co_ctx[32];
static char co_stack[32][1 << 16];
static int co_n, co_cur, co_done[32];
static void co_next(void) {
  int from = co_cur;
  for (int k = 1; k < co_n; k++) {
    int t = (from + k) % co_n;
    if (!co_done[t]) {
      co_cur = t;
      swapcontext(&co_ctx[from], &co_ctx[t]);
      threadIdx.x = co_cur;
      return;
    }
  }
  if (co_done[from]) swapcontext(&co_ctx[from], &co_main);
}
static void co_entry(void) { threadIdx.x = co_cur; ferry_fn(); co_done[co_cur] = 1; co_next(); }
static void co_block(int block) {
  co_n = block;
  for (int t = 0; t < block; t++) {
    co_done[t] = 0;
    getcontext(&co_ctx[t]);
    co_ctx[t].uc_stack.ss_sp = co_stack[t];
    co_ctx[t].uc_stack.ss_size = sizeof co_stack[t];
    co_ctx[t].uc_link = 0;
    makecontext(&co_ctx[t], co_entry, 0);
  }
  co_cur = 0;
  swapcontext(&co_main, &co_ctx[0]);
}
`

// coroutineShim rewrites a program built on hostShim to run the threads of
// a threaded launch as coroutines (coShim), with one-warp blocks.
func coroutineShim(prog string) (string, error) {
	for _, r := range [][2]string{
		{"static void __syncthreads(void) { pthread_barrier_wait(&ferry_block_bar); }", "static void co_next(void);\nstatic void __syncthreads(void) { co_next(); }"},
		{"pthread_barrier_wait(&ferry_warp_bar[w]);", "co_next();"},
		{"static void* ferry_thread(void* a)", coShim + "static void* ferry_thread(void* a)"},
		{"    pthread_barrier_init(&ferry_block_bar, 0, block);", "    if (block <= 32) { co_block(block); continue; }\n    pthread_barrier_init(&ferry_block_bar, 0, block);"},
	} {
		if !strings.Contains(prog, r[0]) {
			return "", fmt.Errorf("fake: the host shim has no %q", r[0])
		}
		prog = strings.ReplaceAll(prog, r[0], r[1])
	}
	return prog, nil
}

// launch runs entry name on args: loops with 3 blocks of 5 threads (their
// grid-stride loops cover any n), reductions with 2 blocks of 32 threads
// (coroutines, see coShim).
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
		grid, block, threaded = 2, 32, 1
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
