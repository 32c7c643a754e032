// Package fmapeak measures the float32 fused multiply-add peak of this
// machine: every core runs a loop of independent FMAs on registers (no
// memory traffic), with the widest vectors the CPU has. A benchmark that
// reports a fraction of peak measures the peak in the same run with Peak.
package fmapeak

import (
	"runtime"
	"sync"
	"time"
)

// Peak runs the FMA loop on GOMAXPROCS goroutines for about d and returns
// the float32 FLOP rate of all of them together in GFLOP/s (an FMA counts
// two FLOPs) and the instruction set used ("avx512", "avx2" or "go" where
// there is no assembly loop, in which case the figure is not a peak).
func Peak(d time.Duration) (gflops float64, isa string) {
	threads := runtime.GOMAXPROCS(0)
	perCall, isa := flopsPerCall()
	var wg sync.WaitGroup
	flops := make([]float64, threads)
	start := time.Now()
	for t := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d {
				fmaLoop()
				flops[t] += perCall
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	total := 0.0
	for _, f := range flops {
		total += f
	}
	return total / el / 1e9, isa
}
