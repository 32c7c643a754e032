//go:build linux && (amd64 || arm64)

package cuda

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/dynlib"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// onDyingThread runs fn on a goroutine locked to its OS thread that exits
// locked, so that the thread ends with it: whatever fn made current on its
// thread is gone afterwards, and the next call runs on another thread.
func onDyingThread(fn func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		fn()
	}()
	<-done
}

// churn moves the calling goroutine around: it yields, collects, ends a
// thread and keeps other goroutines busy for a moment.
func churn() {
	runtime.Gosched()
	runtime.GC()
	onDyingThread(func() {})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			x := 0
			for i := range 20000 {
				x += i
				if i%1000 == 0 {
					runtime.Gosched()
				}
			}
			_ = x
		})
	}
	wg.Wait()
}

// Every driver call of every public entry of the backend sees the primary
// context current on its own OS thread, however the calling goroutine moves
// between threads: New runs on a thread that then ends, and the entries
// (FromLiteral, Compile, Execute, Buffer.Literal and Delete, the Timer)
// run from fresh threads, from this goroutine after churn and from several
// goroutines at once. The fake driver keeps the current context per thread
// as the real one does and records every call that finds none.
func TestContextCurrentOnEveryThread(t *testing.T) {
	fake, d := newFakeCUDA(t)
	t.Setenv(rt.EnvAllocator, "")
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	var b *Backend
	var err error
	onDyingThread(func() { b, err = newBackend(d) })
	if err != nil {
		t.Fatal(err)
	}
	rng := testseed.Rand(t, 3)
	f32 := func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
	f := traceFn(t, []ir.Type{f32(8, 16), f32(16, 4), f32(4)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.MatMul(x[0], x[1]), x[2]), true)}
	})
	var ins []*ir.Literal
	var bufs []trace.Buffer
	for i, p := range f.Body.Params {
		l := randomLiteral(rng, p.Type)
		ins = append(ins, l)
		var buf trace.Buffer
		call := func() { buf, err = b.FromLiteral(l) }
		if i%2 == 0 {
			onDyingThread(call)
		} else {
			churn()
			call()
		}
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, buf)
	}
	churn()
	var exe rt.Executable
	onDyingThread(func() { exe, err = b.Compile(f, rt.CompileOptions{}) })
	if err != nil {
		t.Fatal(err)
	}
	churn()
	var tm *Timer
	onDyingThread(func() { tm, err = b.NewTimer() })
	if err != nil {
		t.Fatal(err)
	}
	churn()
	if err := tm.Start(); err != nil {
		t.Fatal(err)
	}
	var outs []trace.Buffer
	onDyingThread(func() { outs, err = exe.Execute(bufs, rt.ExecOptions{}) })
	if err != nil {
		t.Fatal(err)
	}
	churn()
	if ms, err := tm.Stop(); err != nil || ms != 1.5 {
		t.Fatalf("timer: %v ms, %v (the fake reports 1.5)", ms, err)
	}
	onDyingThread(tm.Close)
	// Copies round-trip through the fake's memory, from several goroutines.
	var wg sync.WaitGroup
	for i, buf := range bufs {
		wg.Go(func() {
			churn()
			got, err := buf.Literal()
			if err != nil {
				t.Error(err)
				return
			}
			if string(got.Data) != string(ins[i].Data) {
				t.Errorf("argument %d did not round-trip through device memory", i)
			}
		})
	}
	wg.Wait()
	for _, o := range outs {
		if _, err := o.Literal(); err != nil {
			t.Fatal(err)
		}
		onDyingThread(func() { err = o.(*Buffer).Delete() })
		if err != nil {
			t.Fatal(err)
		}
	}
	violations, threads, launches := fake.snapshot()
	if len(violations) > 0 {
		t.Fatalf("%d driver calls without the context current, first ones:\n%s", len(violations), strings.Join(violations[:min(8, len(violations))], "\n"))
	}
	if threads < 3 {
		t.Errorf("the driver calls ran on %d OS threads; the test meant to spread them over many", threads)
	}
	if len(launches) == 0 {
		t.Errorf("no kernel was launched")
	}
	t.Logf("driver calls on %d OS threads, kernels launched: %v", threads, launches)
}

// BenchmarkContextEntry compares the two ways of keeping a context current
// for driver calls from goroutines, with libc's labs standing in for
// cuCtxSetCurrent (so it measures the Go side: a purego call, thread
// locking, channel hand-off): "lock" is Backend.enter and exit (lock the
// thread, one C call, unlock); "goroutine" hands a call to a dedicated
// goroutine locked to the thread that owns the context and waits for its
// answer.
func BenchmarkContextEntry(b *testing.B) {
	tab, err := resolve(libc(b), dynlib.Names("labs"))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("lock", func(b *testing.B) {
		for i := range b.N {
			runtime.LockOSThread()
			tab.call("labs", uintptr(i))
			runtime.UnlockOSThread()
		}
	})
	b.Run("goroutine", func(b *testing.B) {
		req, resp := make(chan uintptr), make(chan Result)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for x := range req {
				resp <- tab.call("labs", x)
			}
		}()
		for i := range b.N {
			req <- uintptr(i)
			<-resp
		}
		close(req)
	})
}

// Without cuBLASLt (searched in an empty directory) the backend still comes
// up: its Info names the driver and NVRTC with their versions and says why
// cuBLASLt is missing, and a matrix product compiles to the generated dot
// kernel, which Execute launches.
func TestBackendWithoutCublasLt(t *testing.T) {
	fake, d := newFakeCUDA(t)
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	empty := t.TempDir()
	d.loadCublasLt([]string{empty})
	if d.Lt != nil {
		t.Skipf("cuBLASLt loaded from %s through the system loader; nothing to check", d.Lt.Path)
	}
	if d.LtErr == nil || !strings.Contains(d.LtErr.Error(), empty) {
		t.Fatalf("LtErr = %v, want the paths searched", d.LtErr)
	}
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := b.MatmulStatus(); ok || why == nil || !strings.Contains(why.Error(), "libcublasLt.so*") {
		t.Fatalf("MatmulStatus = %v, %v", ok, why)
	}
	info := b.Info().String()
	t.Log("\n" + info)
	for _, want := range []string{"CUDA driver: fake libcuda.so.1, version 13.0", "NVRTC: fake libnvrtc.so, version 13.0",
		"cuBLASLt: not loaded: cuda: cannot load libcublasLt.so*", "Fake GPU (sm_90, 4 multiprocessors)", "dot_general: generated kernel"} {
		if !strings.Contains(info, want) {
			t.Errorf("Info does not say %q:\n%s", want, info)
		}
	}
	f32 := func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
	f := traceFn(t, []ir.Type{f32(8, 16), f32(16, 4)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.MatMul(x[0], x[1])}
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var dot *step
	for i, s := range exe.(*executable).steps {
		if s.kind == stepMatmul {
			t.Fatalf("step %d uses cuBLASLt, which did not load", i)
		}
		if s.op.Code == ir.DotGeneral {
			dot = &exe.(*executable).steps[i]
		}
	}
	if dot == nil || dot.kind != stepKernel {
		t.Fatalf("the dot_general is not a generated kernel step: %+v", dot)
	}
	rng := testseed.Rand(t, 5)
	bufs := uploadRandom(t, b, f, rng)
	if _, err := exe.Execute(bufs, rt.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, launches := fake.snapshot()
	if len(launches) != 1 || launches[0] != dot.kernel.Entries[0].Name {
		t.Fatalf("launched %v, want the generated dot kernel %s", launches, dot.kernel.Entries[0].Name)
	}
}

// Probe reports every library on its own; on a machine without CUDA it
// says where it looked. The GPU machine's run.sh logs this test's output.
func TestProbeLibraries(t *testing.T) {
	i := Probe()
	t.Log("\n" + i.String())
	if i.Driver.Path == "" && (i.Driver.Err == nil || !strings.Contains(i.Driver.Err.Error(), "libcuda.so.1")) {
		t.Errorf("no driver and no reason: %+v", i.Driver)
	}
	if i.NVRTC.Path == "" && i.NVRTC.Err == nil {
		t.Errorf("no NVRTC and no reason")
	}
	if i.CublasLt.Path == "" && i.CublasLt.Err == nil {
		t.Errorf("no cuBLASLt and no reason")
	}
}

// With cuBLASLt (a fake one), a matrix product over arena temporaries is
// prepared for the alignment the buffer plan gives them (64-byte arena
// offsets, not cuBLASLt's default 256) and that alignment is the real one:
// Execute asks the heuristic nothing more, and every cuBLASLt call finds the
// context current.
func TestBackendMatmulAlignment(t *testing.T) {
	fake, d := newFakeCUDA(t)
	lt := fake.withCublasLt(d)
	t.Setenv(rt.EnvDeviceMemory, "64MiB")
	b, err := newBackend(d)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := b.MatmulStatus(); !ok {
		t.Fatalf("fake cuBLASLt not used: %v", why)
	}
	if s := b.Info().String(); !strings.Contains(s, "cuBLASLt: fake libcublasLt.so, version 13.1.0") || !strings.Contains(s, "dot_general: cuBLASLt") {
		t.Errorf("Info:\n%s", s)
	}
	f32 := func(d ...int) ir.Type { return ir.TypeOf(ir.Float32, d...) }
	f := traceFn(t, []ir.Type{f32(4, 4), f32(4, 8), f32(8, 3)}, func(x []*trace.Array) []*trace.Array {
		h := trace.MatMul(trace.Tanh(x[0]), trace.Sin(x[1]))
		return []*trace.Array{trace.MatMul(trace.Exp(h), x[2])}
	})
	exe, err := b.Compile(f, rt.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var aligns []LtAlign
	for _, s := range exe.(*executable).steps {
		if s.kind == stepMatmul {
			aligns = append(aligns, s.mm.Align)
		}
	}
	t.Logf("prepared alignments %v\n%v", aligns, exe.Program().Func)
	below := false
	for _, a := range aligns {
		for _, x := range a {
			below = below || x < ltMaxAlignment
		}
	}
	if !below {
		t.Errorf("no matrix below 256-byte alignment: the program was chosen so that the plan puts the second dot's lhs at a 128-byte arena offset; pick another if buffer assignment changed")
	}
	heuristics := len(lt.find("cublasLtMatmulAlgoGetHeuristic"))
	if len(aligns) == 0 || heuristics != len(aligns) {
		t.Fatalf("%d cuBLASLt steps, %d heuristic calls", len(aligns), heuristics)
	}
	rng := testseed.Rand(t, 7)
	bufs := uploadRandom(t, b, f, rng)
	if _, err := exe.Execute(bufs, rt.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := len(lt.find("cublasLtMatmulAlgoGetHeuristic")); n != heuristics {
		t.Fatalf("Execute asked the heuristic %d more times: the prepared alignment was not the real one", n-heuristics)
	}
	if len(lt.find("cublasLtMatmul")) != len(aligns) {
		t.Fatalf("%d cublasLtMatmul calls, want %d", len(lt.find("cublasLtMatmul")), len(aligns))
	}
	if v, _, _ := fake.snapshot(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}
