package optim

import (
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// Schedule gives a learning rate (a scalar array, f32 or weakly typed) for a
// step count: step is the i32 scalar count of updates done so far, kept in the
// optimizer state (traced inside rt.Jit, concrete when run eagerly).
type Schedule func(step *trace.Array) *trace.Array

// Constant is the schedule that is always v.
func Constant(v float64) Schedule {
	return func(*trace.Array) *trace.Array { return trace.Scalar(v) }
}

func stepF32(step *trace.Array) *trace.Array { return trace.Convert(step, ir.Float32) }

// LinearWarmup rises linearly from 0 at step 0 to peak at warmupSteps and stays
// at peak afterwards (optax.linear_schedule(0, peak, warmupSteps)). With
// warmupSteps <= 0 it is Constant(peak).
func LinearWarmup(peak float64, warmupSteps int) Schedule {
	if warmupSteps <= 0 {
		return Constant(peak)
	}
	return func(step *trace.Array) *trace.Array {
		frac := trace.Minimum(trace.Div(stepF32(step), trace.Scalar(float64(warmupSteps))), trace.Scalar(1))
		return trace.Mul(trace.Scalar(peak), frac)
	}
}

// CosineDecay decays from init to alpha·init along a half cosine over
// decaySteps steps and stays there (optax.cosine_decay_schedule):
// init·((1-alpha)·½(1+cos(π·min(step, decaySteps)/decaySteps)) + alpha).
// With decaySteps <= 0 it is Constant(init).
func CosineDecay(init float64, decaySteps int, alpha float64) Schedule {
	if decaySteps <= 0 {
		return Constant(init)
	}
	return func(step *trace.Array) *trace.Array {
		return cosine(stepF32(step), init, init*alpha, decaySteps)
	}
}

// cosine is end + (start-end)·½(1+cos(π·min(s, n)/n)) for an f32 step s.
func cosine(s *trace.Array, start, end float64, n int) *trace.Array {
	frac := trace.Minimum(trace.Maximum(trace.Div(s, trace.Scalar(float64(n))), trace.Scalar(0)), trace.Scalar(1))
	c := trace.Mul(trace.Scalar(0.5), trace.Add(trace.Scalar(1), trace.Cos(trace.Mul(trace.Scalar(math.Pi), frac))))
	return trace.Add(trace.Scalar(end), trace.Mul(trace.Scalar(start-end), c))
}

// WarmupCosine rises linearly from 0 to peak over warmup steps, then decays
// along a half cosine from peak to end at step total, and stays at end
// (optax.warmup_cosine_decay_schedule(0, peak, warmup, total, end)).
func WarmupCosine(peak float64, warmup, total int, end float64) Schedule {
	warm := LinearWarmup(peak, warmup)
	n := total - warmup
	return func(step *trace.Array) *trace.Array {
		s := stepF32(step)
		var decayed *trace.Array
		if n <= 0 {
			decayed = trace.Scalar(end)
		} else {
			decayed = cosine(trace.Sub(s, trace.Scalar(float64(warmup))), peak, end, n)
		}
		if warmup <= 0 {
			return trace.Convert(decayed, ir.Float32)
		}
		return trace.Where(trace.Less(step, trace.ScalarInt(warmup)), warm(step), decayed)
	}
}
