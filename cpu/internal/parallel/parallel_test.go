package parallel

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunRunsEveryPartOnce has several goroutines call Run at once, with
// and without pauses (workers blocked or still polling), with parts that
// take chunks from a shared counter as cpu/cpuexec's do, and checks
// that every part and every chunk ran exactly once and had finished when
// Run returned.
func TestRunRunsEveryPartOnce(t *testing.T) {
	const callers, calls, chunks = 6, 150, 40
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range calls {
				nt := 1 + (c+k)%4
				var next atomic.Int64
				var done [chunks]atomic.Int32
				parts := make([]atomic.Int32, nt)
				Run(nt, func(p int) {
					parts[p].Add(1)
					for {
						i := int(next.Add(1)) - 1
						if i >= chunks {
							return
						}
						if i%7 == 0 {
							time.Sleep(time.Microsecond)
						}
						done[i].Add(1)
					}
				})
				for p := range parts {
					if n := parts[p].Load(); n != 1 {
						t.Errorf("caller %d call %d: part %d of %d ran %d times", c, k, p, nt, n)
						return
					}
				}
				for i := range done {
					if n := done[i].Load(); n != 1 {
						t.Errorf("caller %d call %d: chunk %d ran %d times", c, k, i, n)
						return
					}
				}
				if k%50 == 0 {
					time.Sleep(2 * SpinTime) // let the workers block
				}
			}
		}()
	}
	wg.Wait()
}

// TestRunNested runs Run inside the parts of a Run (as a matrix product
// inside a parallel fused group could): every inner part runs once and
// nothing deadlocks, even with more parts than workers.
func TestRunNested(t *testing.T) {
	var n atomic.Int32
	Run(4, func(int) {
		Run(8, func(int) { n.Add(1) })
	})
	if got := n.Load(); got != 32 {
		t.Fatalf("inner parts ran %d times, want 32", got)
	}
}

// TestRunZeroAndOne checks the degenerate sizes: nothing for 0, f(0) on
// the caller for 1.
func TestRunZeroAndOne(t *testing.T) {
	Run(0, func(int) { t.Fatal("Run(0) ran a part") })
	ran := -1
	Run(1, func(p int) { ran = p })
	if ran != 0 {
		t.Fatalf("Run(1) ran part %d, want 0", ran)
	}
}

// BenchmarkRun measures a fork/join of two parts of about 5 µs each,
// back to back and after 50 µs of work on the caller alone (the workers
// then poll meanwhile), and reports the process's CPU time per call
// beside the wall time.
func BenchmarkRun(b *testing.B) {
	spin := func(d time.Duration) {
		for t0 := time.Now(); time.Since(t0) < d; {
		}
	}
	for _, gap := range []time.Duration{0, 50 * time.Microsecond, time.Millisecond} {
		b.Run("gap="+gap.String(), func(b *testing.B) {
			cpu0 := CPUTime()
			for i := 0; i < b.N; i++ {
				if gap > 0 {
					spin(gap)
				}
				Run(2, func(int) { spin(5 * time.Microsecond) })
			}
			if cpu := CPUTime() - cpu0; cpu > 0 {
				b.ReportMetric(cpu/float64(b.N)*1e9, "cpu-ns/op")
			}
		})
	}
}

// An idle worker polls for SpinTime while its work comes within that, and
// shortens its polling (down to minSpin) while the work comes later.
func TestNextSpin(t *testing.T) {
	spin := SpinTime
	for range 10 {
		spin = nextSpin(spin, 3*SpinTime)
	}
	if spin != minSpin {
		t.Fatalf("after long gaps the worker polls %v, want %v", spin, minSpin)
	}
	if s := nextSpin(spin, SpinTime/2); s != SpinTime {
		t.Fatalf("after a gap of %v (within SpinTime) it polls %v, want %v", SpinTime/2, s, SpinTime)
	}
	if s := nextSpin(SpinTime, 2*SpinTime); s != SpinTime/4 {
		t.Fatalf("after one long gap it polls %v, want %v", s, SpinTime/4)
	}
}
