package nn

import (
	"math"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	"github.com/ferryml/ferry/trace"
)

// An Initializer returns a new array of dtype dt and the given shape from a PRNG
// key, like a jax.nn.initializers function. Initialisers generate straight into
// dt (bfloat16 weights are never materialised as float32 first).
type Initializer func(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array

// FanMode selects the fan that VarianceScaling divides the scale by.
type FanMode int

const (
	FanIn  FanMode = iota // the input size: shape[-2] times the receptive field
	FanOut                // the output size: shape[-1] times the receptive field
	FanAvg                // the mean of FanIn and FanOut
)

// Distribution is the distribution VarianceScaling draws from.
type Distribution int

const (
	// TruncatedNormalDist is a normal truncated to two standard deviations,
	// rescaled so that the result has the requested variance.
	TruncatedNormalDist Distribution = iota
	NormalDist                       // an untruncated normal
	UniformDist                      // uniform in [-√(3v), √(3v))
)

// truncNormalStd is the standard deviation of a standard normal truncated to
// (-2, 2), as jax.nn.initializers.variance_scaling divides by.
const truncNormalStd = 0.87962566103423978

// Fans returns the fan-in and fan-out of a weight shape as JAX's
// variance_scaling with in_axis=-2 and out_axis=-1: shape[-2] and shape[-1],
// each times the product of the remaining (receptive field) dimensions. A
// rank-1 shape has fan-in = fan-out = shape[0] and a scalar 1 (JAX rejects both).
func Fans(shape ir.Shape) (fanIn, fanOut float64) {
	switch len(shape) {
	case 0:
		return 1, 1
	case 1:
		return float64(shape[0]), float64(shape[0])
	}
	r := 1.0
	for _, d := range shape[:len(shape)-2] {
		r *= float64(d)
	}
	return float64(shape[len(shape)-2]) * r, float64(shape[len(shape)-1]) * r
}

// VarianceScaling returns jax.nn.initializers.variance_scaling(scale, mode,
// distribution) with in_axis=-2, out_axis=-1: values of variance scale/fan.
func VarianceScaling(scale float64, mode FanMode, dist Distribution) Initializer {
	return func(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
		in, out := Fans(shape)
		fan := in
		switch mode {
		case FanOut:
			fan = out
		case FanAvg:
			fan = (in + out) / 2
		}
		v := scale / math.Max(1, fan)
		w := drawDType(dt)
		switch dist {
		case NormalDist:
			return trace.Convert(trace.Mul(random.Normal(key, w, shape), trace.ScalarAs(math.Sqrt(v), w)), dt)
		case UniformDist:
			b := math.Sqrt(3 * v)
			return trace.Convert(random.Uniform(key, w, shape, -b, b), dt)
		default:
			s := math.Sqrt(v) / truncNormalStd
			return trace.Convert(trace.Mul(random.TruncatedNormal(key, w, shape, -2, 2), trace.ScalarAs(s, w)), dt)
		}
	}
}

// drawDType is the dtype initialisers draw in: f32 for bf16 and f16, dt
// otherwise. jax.random's 16-bit formulas give bf16 only 128 uniform levels
// (from 8 random bits), which biases the mean of a bf16 normal by about 2 % of
// its standard deviation; drawing in f32 and rounding once into dt avoids that.
// The conversion is part of the same fused kernel, so no f32 buffer exists:
// the initialiser still writes straight into dt. (Values in bf16 therefore
// differ from flax's with param_dtype=bf16, which draws in bf16.)
func drawDType(dt ir.DType) ir.DType {
	if dt == ir.BFloat16 || dt == ir.Float16 {
		return ir.Float32
	}
	return dt
}

// LecunNormal is jax.nn.initializers.lecun_normal: truncated normal, variance 1/fan_in.
func LecunNormal(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	return VarianceScaling(1, FanIn, TruncatedNormalDist)(key, dt, shape)
}

// GlorotUniform is jax.nn.initializers.glorot_uniform (Xavier): uniform,
// variance 2/(fan_in+fan_out).
func GlorotUniform(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	return VarianceScaling(1, FanAvg, UniformDist)(key, dt, shape)
}

// GlorotNormal is jax.nn.initializers.glorot_normal: truncated normal, variance
// 2/(fan_in+fan_out).
func GlorotNormal(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	return VarianceScaling(1, FanAvg, TruncatedNormalDist)(key, dt, shape)
}

// HeUniform is jax.nn.initializers.he_uniform (Kaiming): uniform, variance 2/fan_in.
func HeUniform(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	return VarianceScaling(2, FanIn, UniformDist)(key, dt, shape)
}

// HeNormal is jax.nn.initializers.he_normal: truncated normal, variance 2/fan_in.
func HeNormal(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
	return VarianceScaling(2, FanIn, TruncatedNormalDist)(key, dt, shape)
}

// TruncatedNormalInit returns jax.nn.initializers.truncated_normal(stddev): a
// standard normal truncated to (-2, 2), times stddev.
func TruncatedNormalInit(stddev float64) Initializer {
	return func(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
		w := drawDType(dt)
		return trace.Convert(trace.Mul(random.TruncatedNormal(key, w, shape, -2, 2), trace.ScalarAs(stddev, w)), dt)
	}
}

// NormalInit returns jax.nn.initializers.normal(stddev): normal values of
// standard deviation stddev.
func NormalInit(stddev float64) Initializer {
	return func(key *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array {
		w := drawDType(dt)
		return trace.Convert(trace.Mul(random.Normal(key, w, shape), trace.ScalarAs(stddev, w)), dt)
	}
}

// Zeros is an Initializer of zeros (the key is unused).
func Zeros(_ *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array { return trace.Zeros(shape, dt) }

// Ones is an Initializer of ones (the key is unused).
func Ones(_ *trace.Array, dt ir.DType, shape ir.Shape) *trace.Array { return trace.Ones(shape, dt) }
