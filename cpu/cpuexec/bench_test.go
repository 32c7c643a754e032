package cpuexec

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
)

// reuseAlloc hands out the same memory for the same request every time, so
// that benchmarks measure execution, not allocation.
type reuseAlloc struct{ mem map[string][]byte }

func (a *reuseAlloc) Alloc(space ir.MemorySpace, size int64, what string) ([]byte, func(), error) {
	if a.mem == nil {
		a.mem = map[string][]byte{}
	}
	m, ok := a.mem[what]
	if !ok || int64(len(m)) < size {
		m = alignedBytes(int(size))
		a.mem[what] = m
	}
	return m[:size], func() {}, nil
}

// chain10Func is a chain of ten elementwise ops over x (with a row vector w).
func chain10Func(t testing.TB, dt ir.DType, rows, cols int) *ir.Func {
	return traceFunc(t, "chain10", []ir.Type{ir.TypeOf(dt, rows, cols), ir.TypeOf(dt, cols)}, func(x []*trace.Array) []*trace.Array {
		v := trace.Mul(x[0], x[1])          // 1 (broadcast of w)
		v = trace.Add(v, fsc(0.5))          // 2
		v = trace.Tanh(v)                   // 3
		v = trace.Mul(v, v)                 // 4
		v = trace.Sub(v, x[0])              // 5
		v = trace.Maximum(v, fsc(-1))       // 6
		v = trace.Exp(v)                    // 7
		v = trace.Div(v, fsc(3))            // 8
		v = trace.Add(v, x[1])              // 9
		return []*trace.Array{trace.Neg(v)} // 10
	})
}

// TestFusedChainMemory checks that a fused chain of ten elementwise ops over
// 2M elements runs with no full-size buffer beyond the plan: the plan has no
// arena, and the Go heap grows by far less than one intermediate per
// Execute (f16 included, whose kernels widen to float32 in pooled scratch).
func TestFusedChainMemory(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float32, ir.Float16} {
		t.Run(dt.String(), func(t *testing.T) { testChainMemory(t, dt) })
	}
}

func testChainMemory(t *testing.T, dt ir.DType) {
	const rows, cols = 1024, 2048
	f := chain10Func(t, dt, rows, cols)
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(t, err)
	nFusion := 0
	for _, op := range p.Func.Body.Ops {
		if op.Code == ir.Fusion {
			nFusion++
		}
	}
	require.Equal(t, 1, nFusion, "the chain is one fused group:\n%v", p.Func)
	require.Zero(t, p.Plan.Arena[ir.Device], "no temporaries in the plan")
	e, err := New(p)
	require.NoError(t, err)
	args := randArgs(newRand(), p.Func)
	a := &reuseAlloc{}
	_, _, err = e.Execute(args, a) // warm the worker pool
	require.NoError(t, err)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const runs = 3
	for range runs {
		_, _, err := e.Execute(args, a)
		require.NoError(t, err)
	}
	runtime.ReadMemStats(&after)
	perRun := (after.TotalAlloc - before.TotalAlloc) / runs
	intermediate := uint64(rows * cols * dt.Size())
	t.Logf("Go heap allocated per Execute: %d bytes (one intermediate: %d bytes)", perRun, intermediate)
	if !raceEnabled {
		require.Less(t, perRun, intermediate/16, "heap growth per Execute")
	}

	// And the result is eval's.
	want, err := eval.Run(p.Func, args)
	require.NoError(t, err)
	got, _, err := e.Execute(args, a)
	require.NoError(t, err)
	require.Equal(t, want[0].Data, got[0].Data)
}

// geluFunc is gelu(x*w + b) with x f32[2048,2048] (4M elements) and row
// vectors w and b.
func geluFunc(t testing.TB) *ir.Func {
	return traceFunc(t, "gelu", []ir.Type{f32(2048, 2048), f32(2048), f32(2048)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(x[0], x[1]), x[2]), true)}
	})
}

func benchExec(b *testing.B, p *passes.Program) {
	e, err := New(p)
	require.NoError(b, err)
	args := randArgs(newRand(), p.Func)
	a := &reuseAlloc{}
	b.SetBytes(int64(len(args[0].Data)))
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := e.Execute(args, a); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGeluFused runs the compiled program: one fused loop over 4M f32.
func BenchmarkGeluFused(b *testing.B) {
	p, err := passes.Compile(geluFunc(b), passes.Options{})
	require.NoError(b, err)
	benchExec(b, p)
}

// BenchmarkGeluFused1 is BenchmarkGeluFused on one core.
func BenchmarkGeluFused1(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	BenchmarkGeluFused(b)
}

// BenchmarkGeluUnfusedExec runs the program compiled without fusion: one
// eval kernel per op over planned arena buffers.
func BenchmarkGeluUnfusedExec(b *testing.B) {
	p, err := passes.Compile(geluFunc(b), passes.Options{Disable: []string{"fusion"}})
	require.NoError(b, err)
	benchExec(b, p)
}

// BenchmarkGeluEval runs the unfused ops with eval.Run (fresh results per op).
func BenchmarkGeluEval(b *testing.B) {
	f := geluFunc(b)
	args := randArgs(newRand(), f)
	b.SetBytes(int64(len(args[0].Data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := eval.Run(f, args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSoftmaxFused is a row softmax over f32[2048,2048]: reductions fused
// with their producers.
func BenchmarkSoftmaxFused(b *testing.B) {
	f := traceFunc(b, "softmax", []ir.Type{f32(2048, 2048)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Softmax(x[0], 1)}
	})
	p, err := passes.Compile(f, passes.Options{})
	require.NoError(b, err)
	benchExec(b, p)
}

// BenchmarkSoftmaxEval is the same softmax on eval.
func BenchmarkSoftmaxEval(b *testing.B) {
	f := traceFunc(b, "softmax", []ir.Type{f32(2048, 2048)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Softmax(x[0], 1)}
	})
	args := randArgs(newRand(), f)
	b.SetBytes(int64(len(args[0].Data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := eval.Run(f, args); err != nil {
			b.Fatal(err)
		}
	}
}

// scanRNN is a 1000-step scan over small vectors: per-op overhead dominates.
func scanRNN(t testing.TB) *ir.Func {
	return traceFunc(t, "rnn", []ir.Type{f32(16, 16), f32(16), f32(1000, 16)}, func(x []*trace.Array) []*trace.Array {
		c, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			h := trace.Tanh(trace.Add(trace.MatMul(x[0], c[0]), xs[0]))
			return []*trace.Array{h}, []*trace.Array{trace.Mul(h, h)}
		}, []*trace.Array{x[1]}, []*trace.Array{x[2]})
		return append(c, ys...)
	})
}

// BenchmarkScanRNN runs the compiled 1000-step scan.
func BenchmarkScanRNN(b *testing.B) {
	p, err := passes.Compile(scanRNN(b), passes.Options{})
	require.NoError(b, err)
	benchExec(b, p)
}

// BenchmarkScanRNNEval runs the same scan on eval.
func BenchmarkScanRNNEval(b *testing.B) {
	f := scanRNN(b)
	args := randArgs(newRand(), f)
	b.SetBytes(int64(len(args[0].Data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := eval.Run(f, args); err != nil {
			b.Fatal(err)
		}
	}
}

// geluXWFunc is gelu(x*w + b) (tanh form) with x and w f32[2048,2048] (4M
// elements each) and b a row vector broadcast on the last axis.
func geluXWFunc(t testing.TB) *ir.Func {
	return traceFunc(t, "gelu_xw", []ir.Type{f32(2048, 2048), f32(2048, 2048), f32(2048)}, func(x []*trace.Array) []*trace.Array {
		return []*trace.Array{trace.Gelu(trace.Add(trace.Mul(x[0], x[1]), x[2]), true)}
	})
}

// geluBytes is the memory traffic of one gelu(x*w+b): x and w read, y
// written (b is 8 KiB).
const geluBytes = 3 * 2048 * 2048 * 4

// BenchmarkFusedGeluBandwidth runs the fused gelu(x*w+b) on every core
// (GOMAXPROCS) and reports the bytes read and written per second.
func BenchmarkFusedGeluBandwidth(b *testing.B) {
	defer vmath.SetContract(vmath.SetContract(true)) // the default outside this package's tests
	p, err := passes.Compile(geluXWFunc(b), passes.Options{})
	require.NoError(b, err)
	e, err := New(p)
	require.NoError(b, err)
	args := randArgs(newRand(), p.Func)
	a := &reuseAlloc{}
	_, _, err = e.Execute(args, a)
	require.NoError(b, err)
	b.SetBytes(geluBytes)
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := e.Execute(args, a); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(geluBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkCopyBandwidth copies geluBytes/2 bytes (so geluBytes read and
// written) with copy, split across GOMAXPROCS goroutines like the fused
// loops.
func BenchmarkCopyBandwidth(b *testing.B) {
	const n = geluBytes / 2
	src, dst := alignedBytes(n), alignedBytes(n)
	for i := range src {
		src[i] = byte(i)
	}
	workers := runtime.GOMAXPROCS(0)
	chunk := (n + workers - 1) / workers
	run := func() {
		var wg sync.WaitGroup
		for lo := 0; lo < n; lo += chunk {
			hi := min(n, lo+chunk)
			wg.Add(1)
			go func() {
				defer wg.Done()
				copy(dst[lo:hi], src[lo:hi])
			}()
		}
		wg.Wait()
	}
	run()
	b.SetBytes(geluBytes)
	b.ResetTimer()
	for b.Loop() {
		run()
	}
	b.ReportMetric(float64(geluBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// TestGeluBandwidthRatio prints the fused gelu's bandwidth over copy's (the
// goal is ≥ 0.8) when FERRY_BENCH_RATIO is set:
//
//	FERRY_BENCH_RATIO=1 go test ./cpu/cpuexec -run GeluBandwidthRatio -v
//
// It never fails on time.
func TestGeluBandwidthRatio(t *testing.T) {
	if !settings.BenchRatio.Get() {
		t.Skip("set FERRY_BENCH_RATIO=1")
	}
	gbs := func(r testing.BenchmarkResult) float64 { return float64(r.Bytes) * float64(r.N) / r.T.Seconds() / 1e9 }
	cp := testing.Benchmark(BenchmarkCopyBandwidth)
	g := testing.Benchmark(BenchmarkFusedGeluBandwidth)
	cp2 := testing.Benchmark(BenchmarkCopyBandwidth)
	c := (gbs(cp) + gbs(cp2)) / 2
	t.Logf("GOMAXPROCS=%d vmath=%s: copy %.2f GB/s (%.2f, %.2f), fused gelu(x*w+b) %.2f GB/s (%v/op): ratio %.2f",
		runtime.GOMAXPROCS(0), vmath.Impl(), c, gbs(cp), gbs(cp2), gbs(g), time.Duration(g.NsPerOp()), gbs(g)/c)
}
