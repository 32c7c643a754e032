package runtime

import (
	"sync"
	"time"

	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/runtime/budget"
	"github.com/ferryml/ferry/trace"
)

// fallbackRates are used when a measurement fails (device memory too small
// for the probes, say): those of a modest CPU.
var fallbackRates = budget.Rates{Flop: 50e9, Elem: 2e9, Bandwidth: 5e9}

// EnvBudgetRates names the environment variable that fixes the memory
// budget planner's rates (see MemoryBudget).
const EnvBudgetRates = "FERRY_BUDGET_RATES"

var rates struct {
	once sync.Once
	r    budget.Rates
}

// measuredRates measures the default backend's rates (the budget planner's
// budget.Rates) once per process: the
// best of eight runs of a 256×512×512 matrix product, of a 1 Mi-element
// multiply-add, and of a 2 MiB device → pinned_host → device round trip (on
// the CPU backend the emulated spaces' copy; on CUDA a pinned copy), less
// the best run of the same program without the copies.
//
// FERRY_BUDGET_RATES="matmul,elementwise,bandwidth" (FLOP/s, FLOP/s, bytes/s,
// e.g. "1e11,2e9,5e9") gives the rates instead, so that a plan does not
// depend on how busy the machine was when it was measured (tests, or a plan
// reproduced on another machine); a malformed value is ignored with a warning.
func measuredRates() budget.Rates {
	if x, set, err := settings.BudgetRates.Lookup(); err != nil {
		settings.Warn(err, "measured rates")
	} else if set {
		return budget.Rates{Flop: x[0], Elem: x[1], Bandwidth: x[2]}
	}
	rates.once.Do(func() {
		r := fallbackRates
		if v, ok := bestRate(2*256*512*512, func(a, b *trace.Array) *trace.Array {
			return trace.Sum(trace.MatMul(a, b))
		}, []int{256, 512}, []int{512, 512}); ok {
			r.Flop = v
		}
		if v, ok := bestRate(2*(1<<20), func(a, b *trace.Array) *trace.Array {
			return trace.Sum(trace.Add(trace.Mul(a, b), a))
		}, []int{1 << 20}, []int{1 << 20}); ok {
			r.Elem = v
		}
		// The round trip's own time: the same program without the copies
		// is taken off (timed with them, the add and the sum around them
		// made the link look half as fast as it is).
		with, ok1 := bestSeconds(func(a, b *trace.Array) *trace.Array {
			h := trace.DevicePut(trace.Add(a, b), ir.PinnedHost)
			return trace.Sum(trace.DevicePut(h, ir.Device))
		}, []int{1 << 19}, []int{1 << 19})
		without, ok2 := bestSeconds(func(a, b *trace.Array) *trace.Array {
			return trace.Sum(trace.Add(a, b))
		}, []int{1 << 19}, []int{1 << 19})
		if ok1 && ok2 {
			r.Bandwidth = roundTripRate(2*4*(1<<19), with, without)
		}
		rates.r = r
	})
	return rates.r
}

// bestRate runs f (jitted) on two f32 arrays of the shapes given nine
// times and returns work divided by the fastest run's seconds (bestSeconds).
func bestRate(work float64, f func(a, b *trace.Array) *trace.Array, sa, sb []int) (rate float64, ok bool) {
	s, ok := bestSeconds(f, sa, sb)
	if !ok {
		return 0, false
	}
	return work / s, true
}

// roundTripRate is the bytes of a round trip over the seconds it adds to a
// program (with, against without it); the whole program's time when the
// difference is lost in the noise (less than a tenth of it).
func roundTripRate(bytes, with, without float64) float64 {
	if d := with - without; d > with/10 {
		return bytes / d
	}
	return bytes / with
}

// bestSeconds runs f (jitted) on two f32 arrays of the shapes given nine
// times and returns the fastest run's seconds, the first (which compiles)
// left out: on a machine busy with other work, the more runs the likelier
// one of them ran alone, as the planned program's arithmetic is assumed
// to.
func bestSeconds(f func(a, b *trace.Array) *trace.Array, sa, sb []int) (secs float64, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	mk := func(shape []int) *trace.Array {
		n := 1
		for _, d := range shape {
			n *= d
		}
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(i%7) * 0.01
		}
		return FromSlice(s, shape...)
	}
	a, b := mk(sa), mk(sb)
	defer a.Delete()
	defer b.Delete()
	j := NewJitted(f, WithName("ferry_rate_probe"), func(o *jitOptions) { o.probe = true })
	best := time.Duration(1 << 62)
	for i := range 9 {
		t0 := time.Now()
		out, err := j.Call(a, b)
		if err != nil {
			return 0, false
		}
		o := out[0].(*trace.Array)
		o.Item()
		d := time.Since(t0)
		o.Delete()
		if i > 0 && d < best { // the first run compiles
			best = d
		}
	}
	if best <= 0 {
		return 0, false
	}
	return best.Seconds(), true
}

// copyOverlapper is the optional method a backend answers
// BudgetCopiesOverlap's question with.
type copyOverlapper interface {
	// CopiesOverlapCompute reports whether the backend's
	// device↔pinned_host copies run beside its arithmetic.
	CopiesOverlapCompute() bool
}

// copiesOverlap reports whether backend b's device↔pinned_host copies run
// beside its arithmetic (see BudgetCopiesOverlap): its answer when it has
// one; else no for the CPU backend (its spaces are both host memory, and a
// copy runs on the cores that compute) and yes for the others.
func copiesOverlap(b Backend) bool {
	if c, ok := b.(copyOverlapper); ok {
		return c.CopiesOverlapCompute()
	}
	return b == nil || b.Name() != "cpu"
}
