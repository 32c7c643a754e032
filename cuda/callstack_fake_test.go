//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// efenceChildEnv marks the child process of a test that re-runs itself with
// GODEBUG=efence=1.
const efenceChildEnv = "FERRY_TEST_EFENCE_CHILD"

// inEfenceChild runs the calling test again in a child process with
// GODEBUG=efence=1, where the Go runtime unmaps a goroutine stack when it
// moves (it faults on free), so that C reading an address of the old stack
// crashes instead of reading stale bytes that happen to be intact. It
// returns true in the child, where the test body should run; in the parent
// it reports the child's failure and returns false.
func inEfenceChild(t *testing.T) bool {
	if settings.TestEfenceChild.Get() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), efenceChildEnv+"=1", "GODEBUG="+strings.TrimPrefix(os.Getenv("GODEBUG")+",efence=1", ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		s := string(out)
		if len(s) > 3000 {
			s = s[:3000] + "\n..."
		}
		t.Fatalf("child with GODEBUG=efence=1: %v\n%s", err, s)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("child did not run the test:\n%s", out)
	}
	return false
}

// NVRTC calls get their strings (source, name, the option array and its
// strings) and out-parameters right even when the goroutine's stack moves
// between taking their addresses and the C side reading them: CompileLog
// runs against the fake NVRTC from fresh goroutines at many stack depths,
// in a child process where a moved stack is unmapped, and the fake's
// nvrtcCompileProgram, nvrtcGetCUBIN and nvrtcDestroyProgram grow the
// calling goroutine's stack (a callback runs on it) before they touch their
// arguments. The fake compiles a program into an image of its options and
// source, which must come back intact, and counts destroyed programs.
func TestNVRTCArgumentsSurviveStackGrowth(t *testing.T) {
	if !inEfenceChild(t) {
		return
	}
	fake, d := newFakeCUDA(t)
	fake.burn = map[string]int{"nvrtcCompileProgram": 64 << 10, "nvrtcGetCUBIN": 64 << 10, "nvrtcDestroyProgram": 64 << 10}
	var wg sync.WaitGroup
	const n = 120
	for depth := range n {
		wg.Go(func() {
			burn(depth, func() {
				src := fmt.Sprintf("// program %d\nextern \"C\" __global__ void k%d() {}\n", depth, depth)
				arch := fmt.Sprintf("sm_%d", 50+depth%50)
				img, _, err := d.NVRTC.CompileLog(src, fmt.Sprintf("k%d.cu", depth), arch)
				if err != nil {
					t.Error(err)
					return
				}
				want := "FAKECUBIN --gpu-architecture=" + arch + " --std=c++17 -default-device\n" + src + "\x00"
				if string(img) != want {
					t.Errorf("depth %d: image %q, want %q", depth, img, want)
				}
			})
		})
	}
	wg.Wait()
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.destroyed != n || len(fake.progs) != 0 {
		t.Errorf("%d programs destroyed, %d left, want %d and 0", fake.destroyed, len(fake.progs), n)
	}
}

// The backend's driver calls get their arguments right when the goroutine's
// stack moves during the call: in a child process where a moved stack is
// unmapped (GODEBUG=efence=1), the backend comes up, uploads, compiles,
// executes, reads back and times over the fake driver, each entry on a
// fresh goroutine, once for each entry point below with that entry point
// growing the calling goroutine's stack before it touches its arguments
// (out-parameters written, strings, images and the kernel parameter array
// read).
func TestDriverArgumentsSurviveStackGrowth(t *testing.T) {
	if !inEfenceChild(t) {
		return
	}
	for _, name := range []string{
		"cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute", "cuDeviceGetName", "cuDevicePrimaryCtxRetain",
		"cuStreamCreate", "cuMemGetInfo", "cuMemAlloc", "cuMemHostAlloc", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
		"cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel", "cuEventCreate", "cuEventElapsedTime",
		"nvrtcVersion", "nvrtcCreateProgram", "nvrtcGetCUBINSize",
	} {
		t.Run(name, func(t *testing.T) {
			fake, d := newFakeCUDA(t)
			fake.burn = map[string]int{name: 64 << 10}
			t.Setenv(rt.EnvDeviceMemory, "16MiB")
			onFreshGoroutine := func(fn func()) {
				done := make(chan struct{})
				go func() { defer close(done); fn() }()
				<-done
			}
			var b *Backend
			var err error
			onFreshGoroutine(func() { b, err = newBackend(d) })
			if err != nil {
				t.Fatal(err)
			}
			if b.name != "Fake GPU" || b.arch != "sm_90" || b.sms != 4 || b.ctx != fake.ctx {
				t.Fatalf("device %q %s, %d SMs, context %#x", b.name, b.arch, b.sms, b.ctx)
			}
			f32 := func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
			f := traceFn(t, []ir.Type{f32(4, 8), f32(8, 2)}, func(x []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Tanh(trace.MatMul(x[0], x[1]))}
			})
			rng := testseed.Rand(t, 9)
			var ins []*ir.Literal
			var bufs []trace.Buffer
			for _, p := range f.Body.Params {
				l := randomLiteral(rng, p.Type)
				var buf trace.Buffer
				onFreshGoroutine(func() { buf, err = b.FromLiteral(l) })
				if err != nil {
					t.Fatal(err)
				}
				ins, bufs = append(ins, l), append(bufs, buf)
			}
			// A pinned_host buffer (cuMemHostAlloc), written and read by the
			// host.
			pinned := randomLiteral(rng, ir.Type{DType: ir.Float32, Shape: ir.Shape{5}, Space: ir.PinnedHost})
			var pbuf trace.Buffer
			onFreshGoroutine(func() { pbuf, err = b.FromLiteral(pinned) })
			if err != nil {
				t.Fatal(err)
			}
			ins, bufs = append(ins, pinned), append(bufs, pbuf)
			var exe rt.Executable
			onFreshGoroutine(func() { exe, err = b.Compile(f, rt.CompileOptions{}) })
			if err != nil {
				t.Fatal(err)
			}
			var tm *Timer
			onFreshGoroutine(func() { tm, err = b.NewTimer() })
			if err != nil {
				t.Fatal(err)
			}
			onFreshGoroutine(func() {
				if err = tm.Start(); err == nil {
					_, err = exe.Execute(bufs[:2], rt.ExecOptions{})
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			var ms float64
			onFreshGoroutine(func() { ms, err = tm.Stop() })
			if err != nil || ms != 1.5 {
				t.Fatalf("timer %v ms, %v", ms, err)
			}
			for i, buf := range bufs {
				var got *ir.Literal
				onFreshGoroutine(func() { got, err = buf.Literal() })
				if err != nil {
					t.Fatal(err)
				}
				if string(got.Data) != string(ins[i].Data) {
					t.Fatalf("argument %d did not round-trip", i)
				}
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if len(fake.launches) == 0 || fake.launches[0] == "" {
				t.Fatalf("launches %q: the kernel's function handle was lost", fake.launches)
			}
			if len(fake.images) == 0 || !strings.HasPrefix(fake.images[0], "FAKECUBIN --gpu-architecture=sm_90 ") {
				t.Fatalf("module images %q", fake.images)
			}
			if fake.calls[name] == 0 {
				t.Fatalf("%s was never called", name)
			}
		})
	}
}
