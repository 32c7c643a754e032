package mpi

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

// BenchmarkMPIAllReduce measures sum all-reduce (out of place) over the
// job's processes: f32 (MPI's reduction), bf16 (gathered and reduced in rank
// order) and a 4-byte f32 (the latency, descriptor exchange included).
// algGB/s is bytes per rank / time, busGB/s algGB/s × 2(n-1)/n, as in
// collective.BenchmarkAllReduce. Every rank must run the same iterations, so
// fix them:
//
//	go test -c -o /tmp/mpi.test ./collective/mpi
//	mpirun -np 2 /tmp/mpi.test -test.run '^$' -test.bench MPI -test.benchtime 20x
func BenchmarkMPIAllReduce(b *testing.B) {
	if job.err != nil {
		b.Skip(job.err)
	}
	w := job.world
	n := w.Size()
	for _, tc := range []struct {
		dt    ir.DType
		bytes int
	}{{ir.Float32, 4}, {ir.Float32, 1 << 20}, {ir.Float32, 16 << 20}, {ir.BFloat16, 1 << 20}, {ir.BFloat16, 16 << 20}} {
		b.Run(fmt.Sprintf("%v/ranks=%d/bytes=%d", tc.dt, n, tc.bytes), func(b *testing.B) {
			send, recv := inputs(tc.dt, tc.bytes/tc.dt.Size(), 9000, w.Rank()), alloc(tc.bytes)
			copy(recv, send) // touch the pages
			ctx := context.Background()
			if err := w.Barrier(ctx); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(tc.bytes))
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := w.AllReduce(ctx, collective.Sum, tc.dt, send, recv); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			alg := float64(tc.bytes) * float64(b.N) / elapsed.Seconds() / 1e9
			b.ReportMetric(alg, "algGB/s")
			b.ReportMetric(alg*2*float64(n-1)/float64(n), "busGB/s")
			b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/op")
			if w.Rank() == 0 { // one summary line, as every rank prints the benchmark's
				fmt.Printf("mpibench %s: %d iterations, %.1f µs/op, %.3f algGB/s\n", b.Name(), b.N, float64(elapsed.Nanoseconds())/1e3/float64(b.N), alg)
			}
		})
	}
}

// BenchmarkMPIHybridAllReduce measures the f32 sum all-reduce of a
// collective.Hybrid world of 2 devices per process over the job's processes
// (rt.InitDistributed's communicator), per rank and bytes per rank:
//
//	go test -c -o /tmp/mpi.test ./collective/mpi
//	mpirun -np 2 /tmp/mpi.test -test.run '^$' -test.bench MPIHybrid -test.benchtime 50x
func BenchmarkMPIHybridAllReduce(b *testing.B) {
	if job.err != nil {
		b.Skip(job.err)
	}
	const local = 2
	ctx := context.Background()
	hs, err := collective.NewHybrid(ctx, job.world, local)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{4, 16 << 10, 256 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("f32/devices=%dx%d/bytes=%d", job.world.Size(), local, size), func(b *testing.B) {
			b.SetBytes(int64(size))
			errs := make([]error, local)
			start := time.Now()
			done := make(chan int)
			for d, h := range hs {
				go func() {
					defer func() { done <- d }()
					send, recv := alloc(size), alloc(size)
					for range b.N {
						if err := h.AllReduce(ctx, collective.Sum, ir.Float32, send, recv); err != nil {
							errs[d] = err
							return
						}
					}
				}()
			}
			for range hs {
				<-done
			}
			elapsed := time.Since(start)
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/op")
			if job.world.Rank() == 0 {
				fmt.Printf("mpibench %s: %d iterations, %.1f µs/op\n", b.Name(), b.N, float64(elapsed.Nanoseconds())/1e3/float64(b.N))
			}
		})
	}
}
