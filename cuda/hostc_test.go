package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
)

// The host check: generated kernels are compiled with gcc against hostShim
// and run on the CPU, their results compared with internal/eval. A test
// queues its kernels in a hostBatch from its subtests (before they call
// t.Parallel); the parent's deferred hostBatch.run then builds them all with
// one gcc call per CPU, each into one program, and runs each program once;
// the subtests, released when the parent returns, compare. (A gcc call and
// a process per kernel cost about 0.14 s of CPU each, over a minute for the
// op table's 510 kernels; the batch about 10 s.)

// hostShim maps the CUDA names the generated source uses onto C11 with POSIX
// threads: blocks run one after another; in a LaunchReduce entry each thread
// of a block is a thread, __syncthreads a block barrier and a warp shuffle an
// exchange through memory between two warp barriers; loop entries run their
// threads in sequence. Atomics are plain updates (one thread at a time).
const hostShim = `#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define FERRY_KERNEL static void
#define FD static inline
#define __restrict__ restrict
#define __shared__ static
struct dim3 { long long x; };
static _Thread_local struct dim3 threadIdx;
static struct dim3 blockIdx, blockDim, gridDim;
static pthread_barrier_t ferry_block_bar, ferry_warp_bar[32];
static unsigned long long ferry_slots[32][32];
static void __syncthreads(void) { pthread_barrier_wait(&ferry_block_bar); }
static unsigned long long ferry_shfl(unsigned long long v, int d) {
  int t = (int)threadIdx.x, w = t >> 5, l = t & 31;
  ferry_slots[w][l] = v;
  pthread_barrier_wait(&ferry_warp_bar[w]);
  unsigned long long r = l + d < 32 ? ferry_slots[w][l + d] : v;
  pthread_barrier_wait(&ferry_warp_bar[w]);
  return r;
}
#define SHFL(T, sfx) static T ferry_shfl_down_##sfx(T v, int d) { unsigned long long u = 0; memcpy(&u, &v, sizeof v); u = ferry_shfl(u, d); memcpy(&v, &u, sizeof v); return v; }
SHFL(float, f32) SHFL(double, f64) SHFL(int, i32) SHFL(unsigned int, u32) SHFL(long long, i64) SHFL(unsigned long long, u64)
static unsigned int ferry_fbits(float x) { unsigned int b; memcpy(&b, &x, 4); return b; }
static float ferry_bitsf(unsigned int b) { float x; memcpy(&x, &b, 4); return x; }
static unsigned long long ferry_dbits(double x) { unsigned long long b; memcpy(&b, &x, 8); return b; }
static double ferry_bitsd(unsigned long long b) { double x; memcpy(&x, &b, 8); return x; }
static unsigned int atomicCAS(unsigned int* p, unsigned int cmp, unsigned int v) { unsigned int o = *p; if (o == cmp) *p = v; return o; }
static void ferry_aadd_f32(float* p, float v) { *p += v; }
static void ferry_aadd_f64(double* p, double v) { *p += v; }
static void ferry_aadd_i32(int* p, int v) { *p = (int)((unsigned int)*p + (unsigned int)v); }
static void ferry_aadd_u32(unsigned int* p, unsigned int v) { *p += v; }
static void ferry_aadd_u64(unsigned long long* p, unsigned long long v) { *p += v; }
#define atomicAdd(p, v) _Generic((p), float*: ferry_aadd_f32, double*: ferry_aadd_f64, int*: ferry_aadd_i32, unsigned int*: ferry_aadd_u32, unsigned long long*: ferry_aadd_u64)(p, v)
static void (*ferry_fn)(void);
static void* ferry_thread(void* a) { threadIdx.x = (long long)a; ferry_fn(); return 0; }
static void ferry_launch(void (*fn)(void), int grid, int block, int threaded) {
  gridDim.x = grid; blockDim.x = block; ferry_fn = fn;
  for (int b = 0; b < grid; b++) {
    blockIdx.x = b;
    if (!threaded) { for (int t = 0; t < block; t++) { threadIdx.x = t; fn(); } continue; }
    pthread_barrier_init(&ferry_block_bar, 0, block);
    for (int w = 0; w < block / 32; w++) pthread_barrier_init(&ferry_warp_bar[w], 0, 32);
    pthread_t th[1024];
    for (long long t = 0; t < block; t++) pthread_create(&th[t], 0, ferry_thread, (void*)t);
    for (int t = 0; t < block; t++) pthread_join(th[t], 0);
    pthread_barrier_destroy(&ferry_block_bar);
    for (int w = 0; w < block / 32; w++) pthread_barrier_destroy(&ferry_warp_bar[w]);
  }
}
`

// gccFlags are the flags of every host build. -Werror keeps the check
// strict: a warning in generated code is a failure.
var gccFlags = []string{"-std=gnu11", "-O1", "-pthread", "-Wall", "-Werror", "-Wno-unused-variable", "-Wno-unused-function", "-Wno-unused-but-set-variable", "-Wno-tautological-compare"}

// hostProgram is the shim, the prelude once, every kernel of ks after it
// (its entries renamed c<i>_<name>, so that kernels with equal entry names
// can share the file) and a main that runs the kernels its arguments name
// (indices into ks) in order: for each it reads the operands and then the
// results' initial contents from stdin, runs every entry, writes the results to stdout and flushes it. Kernel i's
// part of the program is lines first[i] to first[i+1]-1 (first has
// len(ks)+1 entries). Every kernel's source must start with the prelude.
func hostProgram(ks []*Kernel) (prog string, first []int) {
	var b strings.Builder
	b.WriteString(hostShim)
	b.WriteString(Prelude)
	b.WriteString("static long long ferry_n;\n")
	for ci, k := range ks {
		first = append(first, strings.Count(b.String(), "\n")+1)
		body := strings.TrimPrefix(k.Source, Prelude)
		fmt.Fprintf(&b, "/* kernel %d */\n", ci)
		for _, e := range k.Entries {
			fmt.Fprintf(&b, "#define %s c%d_%s\n", e.Name, ci, e.Name)
		}
		b.WriteString(body)
		for _, e := range k.Entries {
			fmt.Fprintf(&b, "#undef %s\n", e.Name)
		}
		var args []string
		for i, p := range k.Params {
			ct, _ := CType(p.DType)
			fmt.Fprintf(&b, "static %s* c%d_p%d;\n", ct, ci, i)
			args = append(args, fmt.Sprintf("c%d_p%d", ci, i))
		}
		for i, r := range k.Results {
			ct, _ := CType(r.DType)
			fmt.Fprintf(&b, "static %s* c%d_out%d;\n", ct, ci, i)
			args = append(args, fmt.Sprintf("c%d_out%d", ci, i))
		}
		for i, e := range k.Entries {
			fmt.Fprintf(&b, "static void c%d_thunk%d(void) { c%d_%s(%s, ferry_n); }\n", ci, i, ci, e.Name, strings.Join(args, ", "))
		}
		fmt.Fprintf(&b, "static int c%d_run(void) {\n", ci)
		for i, p := range k.Params {
			fmt.Fprintf(&b, "  c%d_p%d = malloc(%d);\n  if (fread(c%d_p%d, 1, %d, stdin) != %d) return 1;\n", ci, i, p.Bytes()+8, ci, i, p.Bytes(), p.Bytes())
		}
		for i, r := range k.Results {
			fmt.Fprintf(&b, "  c%d_out%d = calloc(1, %d);\n  if (fread(c%d_out%d, 1, %d, stdin) != %d) return 1;\n", ci, i, r.Bytes()+8, ci, i, r.Bytes(), r.Bytes())
		}
		for i, e := range k.Entries {
			if e.Kind == LaunchReduce {
				fmt.Fprintf(&b, "  ferry_n = %d; ferry_launch(c%d_thunk%d, 2, 64, 1);\n", e.N, ci, i)
			} else {
				fmt.Fprintf(&b, "  ferry_n = %d; ferry_launch(c%d_thunk%d, 3, 5, 0);\n", e.N, ci, i)
			}
		}
		for i, r := range k.Results {
			fmt.Fprintf(&b, "  fwrite(c%d_out%d, 1, %d, stdout);\n", ci, i, r.Bytes())
		}
		for i := range k.Params {
			fmt.Fprintf(&b, "  free(c%d_p%d);\n", ci, i)
		}
		for i := range k.Results {
			fmt.Fprintf(&b, "  free(c%d_out%d);\n", ci, i)
		}
		b.WriteString("  return 0;\n}\n")
	}
	first = append(first, strings.Count(b.String(), "\n")+1)
	b.WriteString("static int (*const ferry_kernels[])(void) = {")
	for ci := range ks {
		fmt.Fprintf(&b, "c%d_run, ", ci)
	}
	b.WriteString("};\n")
	fmt.Fprintf(&b, `int main(int argc, char** argv) {
  for (int a = 1; a < argc; a++) {
    int i = atoi(argv[a]);
    if (i < 0 || i >= %d) return 2;
    if (ferry_kernels[i]()) return 1;
    if (fflush(stdout)) return 1;
  }
  return 0;
}
`, len(ks))
	return b.String(), first
}

// gccError is a failed host build: gcc's output and the program it read.
type gccError struct {
	err       error
	out, prog string
}

func (e *gccError) Error() string {
	return fmt.Sprintf("gcc: %v\n%s\n%s", e.err, e.out, numbered(e.prog))
}

// runHostKernels builds ks into one binary in dir and runs kernel i on
// ins[i]: its operands, then the initial contents of its first results
// (zeros for the ones ins[i] leaves out). It returns each kernel's results, or in errs[i] why there are
// none: a source without the prelude, a failed build (a *gccError) or a run
// that stopped in kernel i. Kernels that gcc's errors point into are left
// out and the rest built again; if an error points elsewhere, every kernel
// gets it. After a run stops, the kernels after the one it stopped in run
// in a fresh process.
func runHostKernels(gcc, dir string, ks []*Kernel, ins [][]*ir.Literal) (res [][]*ir.Literal, errs []error) {
	res, errs = make([][]*ir.Literal, len(ks)), make([]error, len(ks))
	var live []int // the kernels still in the build
	for i, k := range ks {
		if !strings.HasPrefix(k.Source, Prelude) {
			errs[i] = errors.New("the source does not start with the prelude")
			continue
		}
		live = append(live, i)
	}
	cfile, bin := filepath.Join(dir, "k.c"), filepath.Join(dir, "k")
	errLine := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(cfile) + `:(\d+):\d+: error`)
	for len(live) > 0 {
		var sub []*Kernel
		for _, i := range live {
			sub = append(sub, ks[i])
		}
		prog, first := hostProgram(sub)
		if err := os.WriteFile(cfile, []byte(prog), 0o644); err != nil {
			for _, i := range live {
				errs[i] = err
			}
			return res, errs
		}
		args := append(append([]string(nil), gccFlags...), "-o", bin, cfile, "-lm")
		out, err := exec.Command(gcc, args...).CombinedOutput()
		if err == nil {
			break
		}
		ge := &gccError{err, string(out), prog}
		bad := map[int]bool{} // positions in live
		for _, m := range errLine.FindAllStringSubmatch(ge.out, -1) {
			line, _ := strconv.Atoi(m[1])
			at := sort.SearchInts(first, line+1) - 1 // the last part starting at or before line
			if at < 0 || at == len(sub) {
				bad = nil // the shim, prelude or main
				break
			}
			bad[at] = true
		}
		if len(bad) == 0 {
			for _, i := range live {
				errs[i] = ge
			}
			return res, errs
		}
		var keep []int
		for at, i := range live {
			if bad[at] {
				errs[i] = ge
			} else {
				keep = append(keep, i)
			}
		}
		live = keep
	}
	built := live // the binary's kernels; run the binary's kernel at for ks[built[at]]
	for pos := 0; pos < len(built); {
		var stdin bytes.Buffer
		var argv []string
		for at := pos; at < len(built); at++ {
			k, in := ks[built[at]], ins[built[at]]
			for _, l := range in {
				stdin.Write(l.Data)
			}
			for _, r := range k.Results[max(len(in)-len(k.Params), 0):] {
				stdin.Write(make([]byte, r.Bytes()))
			}
			argv = append(argv, strconv.Itoa(at))
		}
		cmd := exec.Command(bin, argv...)
		cmd.Stdin = &stdin
		out, runErr := cmd.Output()
		start := pos
		for ; pos < len(built); pos++ {
			k, nb := ks[built[pos]], 0
			for _, r := range k.Results {
				nb += int(r.Bytes())
			}
			if len(out) < nb {
				break
			}
			for _, r := range k.Results {
				l := ir.NewLiteral(r)
				copy(l.Data, out[:r.Bytes()])
				out = out[r.Bytes():]
				res[built[pos]] = append(res[built[pos]], l)
			}
		}
		if runErr == nil && pos == len(built) {
			break
		}
		if runErr == nil {
			runErr = errors.New("short output")
		}
		if pos == len(built) && pos > start { // it failed after writing the last results
			pos--
		}
		i := built[pos]
		errs[i], res[i] = fmt.Errorf("run: %v", runErr), nil
		pos++
	}
	return res, errs
}

// runHost compiles k's host program with gcc and runs it on ins. A failure
// prints the program gcc read, or k's source.
func runHost(t *testing.T, gcc string, k *Kernel, ins []*ir.Literal) []*ir.Literal {
	t.Helper()
	res, errs := runHostKernels(gcc, t.TempDir(), []*Kernel{k}, [][]*ir.Literal{ins})
	var ge *gccError
	if errors.As(errs[0], &ge) {
		t.Fatal(ge) // with the whole program
	}
	if errs[0] != nil {
		t.Fatalf("%v\n%s", errs[0], numbered(k.Source))
	}
	return res[0]
}

// hostBatch collects the kernels of a test's subtests and runs them
// together. Subtests add their kernels and then call t.Parallel; the parent
// defers run, which builds and runs everything after its t.Run loop, and the
// subtests, released when the parent returns, read their results.
type hostBatch struct {
	gcc  string
	jobs []*hostJob
	done chan struct{}
}

// hostJob is one queued kernel and, after the batch ran, its results or why
// there are none.
type hostJob struct {
	k   *Kernel
	ins []*ir.Literal
	got []*ir.Literal
	err error
}

func newHostBatch(gcc string) *hostBatch { return &hostBatch{gcc: gcc, done: make(chan struct{})} }

// add queues k to run on ins. Call it before t.Parallel.
func (b *hostBatch) add(k *Kernel, ins []*ir.Literal) *hostJob {
	j := &hostJob{k: k, ins: ins}
	b.jobs = append(b.jobs, j)
	return j
}

// run builds and runs the queued kernels, in one gcc call and one process
// per CPU, then releases the subtests waiting in results.
func (b *hostBatch) run() {
	defer close(b.done)
	if len(b.jobs) == 0 {
		return
	}
	dir, err := os.MkdirTemp("", "ferry-hostc-")
	if err != nil {
		for _, j := range b.jobs {
			j.err = err
		}
		return
	}
	defer os.RemoveAll(dir)
	parts := min(runtime.GOMAXPROCS(0), len(b.jobs))
	var wg sync.WaitGroup
	for p := range parts {
		var jobs []*hostJob // every parts'th, for builds of about equal cost
		for i := p; i < len(b.jobs); i += parts {
			jobs = append(jobs, b.jobs[i])
		}
		wg.Go(func() {
			sub := filepath.Join(dir, strconv.Itoa(p))
			if err := os.Mkdir(sub, 0o755); err != nil {
				for _, j := range jobs {
					j.err = err
				}
				return
			}
			ks, ins := make([]*Kernel, len(jobs)), make([][]*ir.Literal, len(jobs))
			for i, j := range jobs {
				ks[i], ins[i] = j.k, j.ins
			}
			res, errs := runHostKernels(b.gcc, sub, ks, ins)
			for i, j := range jobs {
				j.got, j.err = res[i], errs[i]
			}
		})
	}
	wg.Wait()
}

// results waits for the batch and returns j's results. A kernel the batch
// could not build or run is built and run alone, so that a failure names
// this kernel and prints its program; if alone it works, the batch's error
// is the failure.
func (b *hostBatch) results(t *testing.T, j *hostJob) []*ir.Literal {
	t.Helper()
	<-b.done
	if j.err == nil {
		return j.got
	}
	got := runHost(t, b.gcc, j.k, j.ins)
	var ge *gccError
	if errors.As(j.err, &ge) {
		t.Fatalf("the batch build failed though this kernel builds alone: gcc: %v\n%s", ge.err, ge.out)
	}
	t.Fatalf("the batch run failed in this kernel though it runs alone: %v\n%s", j.err, numbered(j.k.Source))
	return got
}

func numbered(s string) string {
	var b strings.Builder
	for i, l := range strings.Split(s, "\n") {
		fmt.Fprintf(&b, "%4d %s\n", i+1, l)
	}
	return b.String()
}

// hostCheck is one op queued in a hostBatch with eval's results on the same
// operands.
type hostCheck struct {
	op   *ir.Op
	job  *hostJob
	want []*ir.Literal
}

// queueOnHost generates op, checks the source is well formed, draws fresh
// random operands, evaluates op on them with internal/eval and queues the
// kernel in b. Call it before t.Parallel; check compares afterwards.
func queueOnHost(t *testing.T, b *hostBatch, rng *rand.Rand, op *ir.Op) *hostCheck {
	t.Helper()
	k, err := GenerateOp(op)
	if err != nil {
		t.Fatal(err)
	}
	checkWellFormed(t, k)
	var ins []*ir.Literal
	for _, a := range op.Args {
		ins = append(ins, randomLiteral(rng, a.Type))
	}
	want, err := eval.EvalOp(op, ins)
	if err != nil {
		t.Fatal(err)
	}
	return &hostCheck{op: op, job: b.add(k, ins), want: want}
}

// check compares the host's results with eval's.
func (c *hostCheck) check(t *testing.T, b *hostBatch) {
	t.Helper()
	got := b.results(t, c.job)
	for i, w := range c.want {
		if !got[i].Type.Shape.Equal(w.Type.Shape) || got[i].Type.DType != w.Type.DType {
			t.Fatalf("result %d is %v, want %v", i, got[i].Type, w.Type)
		}
		compareKernel(t, fmt.Sprintf("%v result %d", c.op.Code, i), c.job.k, got[i], w)
	}
}

func needGCC(t *testing.T) string {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	return gcc
}

// runHostKernels runs the kernels of one build each on its own operands,
// also when two have the same entry names, and a kernel that does not build
// or that aborts fails alone, with the others' results intact.
func TestRunHostKernels(t *testing.T) {
	gcc := needGCC(t)
	rng := testseed.Rand(t, 21)
	add := buildOp(t, opCase{name: "add", params: []ir.Type{f32(3, 5), f32(3, 5)}, code: ir.Add})
	sum := buildOp(t, opCase{name: "sum", params: []ir.Type{f64(4, 70)}, code: ir.ReduceSum, attrs: ir.Attrs{"axes": []int{1}}})
	gen := func(op *ir.Op) *Kernel {
		k, err := GenerateOp(op)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	broken, aborts, bare := *gen(add), *gen(sum), *gen(add)
	broken.Source += "int broken = ;\n"
	body := len(Prelude) + strings.Index(aborts.Source[len(Prelude):], ") {\n") + len(") {\n")
	aborts.Source = aborts.Source[:body] + "  abort();\n" + aborts.Source[body:]
	bare.Source = strings.TrimPrefix(bare.Source, Prelude)
	ks := []*Kernel{gen(add), &broken, gen(add), &aborts, gen(sum), &bare, gen(sum)}
	ops := []*ir.Op{add, add, add, sum, sum, add, sum}
	var ins [][]*ir.Literal
	for _, op := range ops {
		var in []*ir.Literal
		for _, a := range op.Args {
			in = append(in, randomLiteral(rng, a.Type))
		}
		ins = append(ins, in)
	}
	res, errs := runHostKernels(gcc, t.TempDir(), ks, ins)
	var ge *gccError
	if !errors.As(errs[1], &ge) || !strings.Contains(ge.out, "int broken = ;") {
		t.Errorf("the kernel that does not build: %v", errs[1])
	}
	if errs[3] == nil || !strings.Contains(errs[3].Error(), "run:") || res[3] != nil {
		t.Errorf("the kernel that aborts: %v, %d results", errs[3], len(res[3]))
	}
	if errs[5] == nil || !strings.Contains(errs[5].Error(), "prelude") {
		t.Errorf("the kernel without the prelude: %v", errs[5])
	}
	for _, i := range []int{0, 2, 4, 6} {
		if errs[i] != nil {
			t.Fatalf("kernel %d: %v", i, errs[i])
		}
		want, err := eval.EvalOp(ops[i], ins[i])
		if err != nil {
			t.Fatal(err)
		}
		compareKernel(t, fmt.Sprintf("kernel %d", i), ks[i], res[i][0], want[0])
	}
}
