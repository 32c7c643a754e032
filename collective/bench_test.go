package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferryml/ferry/ir"
)

// BenchmarkAllReduce measures f32 sum all-reduce (out of place) of 1 to 64
// MiB per rank on 2 to 8 ranks. algGB/s is the algorithm bandwidth (bytes per
// rank / time, as nccl-tests reports it); busGB/s is algGB/s × 2(n-1)/n; MB/s
// (from SetBytes) is the same as algGB/s in MB. memGB/s is the memory
// traffic the engine cannot avoid (n sends read, n recvs written) per second,
// to compare with BenchmarkCopy (one copy on one goroutine: bytes copied per
// second, so its traffic is twice its MB/s).
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, mib := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("f32/ranks=%d/MiB=%d", n, mib), func(b *testing.B) {
				size := mib << 20
				cs, err := NewLocal(n)
				if err != nil {
					b.Fatal(err)
				}
				send, recv := make([][]byte, n), make([][]byte, n)
				for k := range n {
					send[k], recv[k] = alloc(size), alloc(size)
					for i, x := range ir.ViewBytes[float32](send[k]) {
						_ = x
						ir.ViewBytes[float32](send[k])[i] = float32(i%97) * 0.25
					}
					copy(recv[k], send[k]) // touch the pages
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				errs := make([]error, n)
				for r, c := range cs {
					wg.Go(func() {
						for range b.N {
							if err := c.AllReduce(context.Background(), Sum, ir.Float32, send[r], recv[r]); err != nil {
								errs[r] = err
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				noErrors(b, errs)
				alg := float64(size) * float64(b.N) / elapsed.Seconds() / 1e9
				b.ReportMetric(alg, "algGB/s")
				b.ReportMetric(alg*2*float64(n-1)/float64(n), "busGB/s")
				b.ReportMetric(alg*2*float64(n), "memGB/s") // every send read once, every recv written once
			})
		}
	}
}

// BenchmarkCopy is the machine's memory-copy bandwidth for reference: copy
// of 64 MiB on one goroutine (GB/s of bytes copied).
func BenchmarkCopy(b *testing.B) {
	const size = 64 << 20
	src, dst := alloc(size), alloc(size)
	copy(src, dst)
	b.SetBytes(size)
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkBarrier is the latency of one Barrier (one barrier phase) and of a
// 64-byte AllReduce (two phases) on 2 to 8 ranks.
func BenchmarkBarrier(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, small := range []bool{false, true} {
			name := fmt.Sprintf("Barrier/ranks=%d", n)
			if small {
				name = fmt.Sprintf("AllReduce64B/ranks=%d", n)
			}
			b.Run(name, func(b *testing.B) {
				cs, err := NewLocal(n)
				if err != nil {
					b.Fatal(err)
				}
				errs := make([]error, n)
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.ResetTimer()
				for r, c := range cs {
					wg.Go(func() {
						buf := alloc(64)
						for range b.N {
							var err error
							if small {
								err = c.AllReduce(context.Background(), Sum, ir.Float32, buf, buf)
							} else {
								err = c.Barrier(context.Background())
							}
							if err != nil {
								errs[r] = err
								return
							}
						}
					})
				}
				wg.Wait()
				noErrors(b, errs)
			})
		}
	}
}

// BenchmarkOthers measures ReduceScatter (f32 sum, along axis 0) and
// AllGather (along axis 0) with 16 MiB of send per rank; algGB/s is bytes of
// send per rank / time.
func BenchmarkOthers(b *testing.B) {
	const size = 16 << 20
	for _, name := range []string{"ReduceScatter", "AllGather"} {
		for _, n := range []int{2, 4, 8} {
			b.Run(fmt.Sprintf("%s/f32/ranks=%d/MiB=16", name, n), func(b *testing.B) {
				cs, err := NewLocal(n)
				if err != nil {
					b.Fatal(err)
				}
				send, recv := make([][]byte, n), make([][]byte, n)
				for k := range n {
					send[k] = alloc(size)
					if name == "AllGather" {
						recv[k] = alloc(size * n)
					} else {
						recv[k] = alloc(size / n)
					}
					copy(recv[k], send[k])
				}
				shape := []int{size / 4 / 1024, 1024}
				b.SetBytes(size)
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				errs := make([]error, n)
				for r, c := range cs {
					wg.Go(func() {
						for range b.N {
							var err error
							if name == "AllGather" {
								err = c.AllGather(context.Background(), ir.Float32, shape, 0, send[r], recv[r])
							} else {
								err = c.ReduceScatter(context.Background(), Sum, ir.Float32, shape, 0, send[r], recv[r])
							}
							if err != nil {
								errs[r] = err
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				noErrors(b, errs)
				b.ReportMetric(float64(size)*float64(b.N)/elapsed.Seconds()/1e9, "algGB/s")
			})
		}
	}
}

// BenchmarkHybridAllReduce measures the f32 sum all-reduce of 8 ranks as 2
// processes of 4 devices and 4 of 2 (the processes goroutines joined by a
// Local communicator, so what it measures is Hybrid's own cost, without a
// network: at 4 KiB the whole sends all-gathered, at 1 MiB the chunks'
// AllToAll and AllGather), next to Local on 8 ranks. algGB/s is bytes per
// rank / time, as in BenchmarkAllReduce.
func BenchmarkHybridAllReduce(b *testing.B) {
	for _, lay := range [][2]int{{1, 8}, {2, 4}, {4, 2}} {
		for _, kib := range []int{4, 1024} {
			name := fmt.Sprintf("f32/procs=%d/devices=%d/KiB=%d", lay[0], lay[1], kib)
			if lay[0] == 1 {
				name = fmt.Sprintf("f32/local/ranks=8/KiB=%d", kib)
			}
			b.Run(name, func(b *testing.B) {
				var cs []Communicator
				if lay[0] == 1 {
					ls, err := NewLocal(8)
					if err != nil {
						b.Fatal(err)
					}
					cs = asComms(ls)
				} else {
					hs, _ := hybridWorld(b, lay[0], lay[1])
					cs = asComms(hs)
				}
				size := kib << 10
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				errs := runOn(cs, func(ctx context.Context, c Communicator) error {
					send, recv := alloc(size), alloc(size)
					for range b.N {
						if err := c.AllReduce(ctx, Sum, ir.Float32, send, recv); err != nil {
							return err
						}
					}
					return nil
				})
				elapsed := time.Since(start)
				b.StopTimer()
				noErrors(b, errs)
				b.ReportMetric(float64(size)*float64(b.N)/elapsed.Seconds()/1e9, "algGB/s")
			})
		}
	}
}
