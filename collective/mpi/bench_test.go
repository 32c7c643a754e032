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
