package runtime_test

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// TestJitConcurrentFirstCallsCompileOnce calls a fresh jitted function from
// many goroutines at once: one of them traces and compiles it, the others wait
// and share the executable (run with -race).
func TestJitConcurrentFirstCallsCompileOnce(t *testing.T) {
	r := newRand(t)
	const workers = 16
	traced := 0
	var mu sync.Mutex
	var j *rt.Jitted[func(x, y *trace.Array) *trace.Array]
	j = rt.NewJitted(func(x, y *trace.Array) *trace.Array {
		mu.Lock()
		traced++
		first := traced == 1
		mu.Unlock()
		if first {
			waitForWaiters(j.Stats, workers-1)
		}
		return trace.Add(trace.Mul(x, y), trace.Exp(y))
	})
	f := j.Fn()
	xs := make([][]float32, workers)
	ys := make([][]float32, workers)
	for i := range xs {
		xs[i], ys[i] = randSlice(r, 33), randSlice(r, 33)
	}
	got := make([][]float32, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i] = f(rt.FromSlice(xs[i]), rt.FromSlice(ys[i])).Float32s()
		}()
	}
	close(start)
	wg.Wait()
	s := j.Stats()
	require.Equal(t, int64(1), s.Misses, "one compile for one signature")
	require.Equal(t, int64(workers-1), s.Hits)
	require.Equal(t, 1, traced, "traced once")
	for i := range got {
		want := make([]float64, len(xs[i]))
		for k := range want {
			want[k] = float64(xs[i][k])*float64(ys[i][k]) + math.Exp(float64(ys[i][k]))
		}
		requireClose(t, want, got[i], 1e-5)
	}
}

// TestJitConcurrentFirstCallsShareTheError: when the one compile fails, every
// waiting caller gets its error, and nothing is cached.
func TestJitConcurrentFirstCallsShareTheError(t *testing.T) {
	const workers = 12
	traced := 0
	var mu sync.Mutex
	var j *rt.Jitted[func(x, y *trace.Array) (*trace.Array, error)]
	j = rt.NewJitted(func(x, y *trace.Array) (*trace.Array, error) {
		mu.Lock()
		traced++
		first := traced == 1
		mu.Unlock()
		if first {
			waitForWaiters(j.Stats, workers-1)
		}
		return trace.Add(x, y), nil // shapes [3] and [4] do not broadcast
	})
	errs := make([]error, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = j.Call(rt.FromSlice([]float32{1, 2, 3}), rt.FromSlice([]float32{1, 2, 3, 4}))
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.ErrorContains(t, err, "do not broadcast")
		var te *trace.Error
		require.True(t, errors.As(err, &te))
	}
	require.Equal(t, int64(1), j.Stats().Misses)
	require.Equal(t, 1, traced)
	// A failed compile is not cached: the next call tries again.
	_, err := j.Call(rt.FromSlice([]float32{1, 2, 3}), rt.FromSlice([]float32{1, 2, 3, 4}))
	require.ErrorContains(t, err, "do not broadcast")
	require.Equal(t, 2, traced)
}

// waitForWaiters holds the first trace until n other callers have found the
// compile in flight (they count as hits before they wait), so that every
// caller really arrives during the compile; it gives up after a while so that
// a broken cache fails the test instead of hanging it.
func waitForWaiters(stats func() rt.CacheStats, n int64) {
	deadline := time.Now().Add(5 * time.Second)
	for stats().Hits < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// TestEagerConcurrentFirstUsesCompileOnce runs one new eager op signature from
// many goroutines: the op cache compiles it once and every result is right.
func TestEagerConcurrentFirstUsesCompileOnce(t *testing.T) {
	r := newRand(t)
	const workers = 16
	n := 1000 + r.IntN(1000) // a shape no other test uses: a fresh cache key
	xs := make([][]float32, workers)
	for i := range xs {
		xs[i] = randSlice(r, n)
	}
	arrays := make([]*trace.Array, workers)
	for i := range arrays {
		arrays[i] = rt.FromSlice(xs[i])
	}
	_, missesBefore := rt.EagerCacheStats()
	got := make([][]float32, workers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i] = trace.Tanh(arrays[i]).Float32s()
		}()
	}
	close(start)
	wg.Wait()
	_, missesAfter := rt.EagerCacheStats()
	require.Equal(t, int64(1), missesAfter-missesBefore)
	for i := range got {
		want := make([]float64, n)
		for k := range want {
			want[k] = math.Tanh(float64(xs[i][k]))
		}
		requireClose(t, want, got[i], 1e-6)
	}
}
