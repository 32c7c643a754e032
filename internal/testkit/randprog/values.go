package randprog

import (
	"math"
	"math/rand/v2"

	"github.com/ferryml/ferry/ir"
)

// Range is a half-open interval [Lo, Hi). For integer dtypes Literal draws
// integers uniformly from it (Lo + IntN(Hi-Lo), both ends rounded toward
// zero); for floats, reals uniformly.
type Range struct{ Lo, Hi float64 }

// Values is the distribution of the elements Literal draws: the one random
// literal generator of the test packages, each keeping its own values.
// Bools are 0 or 1 with equal chance. Integers are stored exactly, wrapped to
// the dtype (two's complement), never through float64.
type Values struct {
	// Float is where floats are drawn uniformly, unless FloatFunc is set.
	Float Range
	// FloatFunc, when set, draws every float element (before it is
	// rounded to the dtype); Float and Special do not apply to floats.
	FloatFunc func(*rand.Rand) float64
	// Int is where signed integers (i32, i64) are drawn, Uint where
	// unsigned ones (u8, u32) are.
	Int, Uint Range
	// ByDType overrides Float, Int or Uint for the dtypes it names.
	ByDType map[ir.DType]Range
	// Special draws floats from SpecialFloat and integers from SpecialInt
	// (NaN, infinities, signed zeros, subnormals, huge values, integer
	// extremes) instead of the ranges.
	Special bool
}

// Literal returns a literal of type t with elements drawn from v.
func (v Values) Literal(rng *rand.Rand, t ir.Type) *ir.Literal {
	l := ir.NewLiteral(t)
	dt := t.DType
	rg, ok := v.ByDType[dt]
	for i := range t.Size() {
		switch {
		case dt == ir.Bool:
			l.Data[i] = byte(rng.IntN(2))
		case dt.IsFloat():
			var x float64
			switch {
			case v.FloatFunc != nil:
				x = v.FloatFunc(rng)
			case v.Special && !ok:
				x = SpecialFloat(rng)
			default:
				r := v.Float
				if ok {
					r = rg
				}
				x = r.Lo + rng.Float64()*(r.Hi-r.Lo)
			}
			l.SetFloat64At(i, x)
		default:
			var x int64
			switch {
			case v.Special && !ok:
				x = SpecialInt(rng, dt)
			default:
				r := v.Int
				if dt.IsUnsigned() {
					r = v.Uint
				}
				if ok {
					r = rg
				}
				lo, hi := int64(r.Lo), int64(r.Hi)
				x = lo
				if hi > lo {
					x += rng.Int64N(hi - lo)
				}
			}
			setInt(l, i, x)
		}
	}
	return l
}

// Args returns one literal per parameter of f, drawn from v.
func (v Values) Args(rng *rand.Rand, f *ir.Func) []*ir.Literal {
	args := make([]*ir.Literal, len(f.Body.Params))
	for i, p := range f.Body.Params {
		args[i] = v.Literal(rng, p.Type)
	}
	return args
}

// setInt stores v into integer element i of l, wrapped to its dtype.
func setInt(l *ir.Literal, i int, v int64) {
	switch l.Type.DType {
	case ir.Uint8:
		l.Data[i] = uint8(v)
	case ir.Int32:
		ir.View[int32](l)[i] = int32(v)
	case ir.Uint32:
		ir.View[uint32](l)[i] = uint32(v)
	case ir.Int64:
		ir.View[int64](l)[i] = v
	default:
		panic("randprog: setInt on " + l.Type.DType.String())
	}
}

// Wrap returns v wrapped to dt as the dtype stores it (two's complement;
// bool is v != 0), as an int64: uint32 in [0, 2³²), uint8 in [0, 256).
func Wrap(dt ir.DType, v int64) int64 {
	switch dt {
	case ir.Bool:
		if v != 0 {
			return 1
		}
		return 0
	case ir.Uint8:
		return int64(uint8(v))
	case ir.Int32:
		return int64(int32(v))
	case ir.Uint32:
		return int64(uint32(v))
	case ir.Int64:
		return v
	}
	panic("randprog: Wrap of " + dt.String())
}

// SpecialFloat draws a float64 from a mix of ordinary values in [-4, 4),
// integers and halves (rounding ties), wide magnitudes and special values:
// NaN, ±Inf, ±0, the f16 subnormal range, values around the f16 maximum,
// magnitudes from 2⁻¹⁵⁰ to 2¹⁵⁰, and ±1e300.
func SpecialFloat(r *rand.Rand) float64 {
	sgn := 1.0
	if r.IntN(2) == 0 {
		sgn = -1
	}
	switch k := r.IntN(40); {
	case k < 24:
		return (r.Float64()*2 - 1) * 4
	case k < 29:
		return float64(r.IntN(17)-8) * 0.5
	case k < 33:
		return sgn * math.Exp2(r.Float64()*60-30)
	case k == 33:
		return math.NaN()
	case k == 34:
		return sgn * math.Inf(1)
	case k == 35:
		return sgn * 0
	case k == 36:
		return sgn * math.Exp2(-float64(r.IntN(12)+14)) * (1 + r.Float64()) // f16 subnormal range
	case k == 37:
		return sgn * (60000 + r.Float64()*10000) // around the f16 maximum
	case k == 38:
		return sgn * math.Exp2(float64(r.IntN(300)-150))
	default:
		return sgn * 1e300
	}
}

// SpecialInt draws an integer of dt (wrapped, see Wrap): half small values
// in [-10, 10], some random bit patterns, the rest extremes (0, ±1, the
// int32 and int64 bounds, 128, 255, 2³¹).
func SpecialInt(r *rand.Rand, dt ir.DType) int64 {
	switch k := r.IntN(10); {
	case k < 5:
		return Wrap(dt, int64(r.IntN(21)-10))
	case k < 8:
		return Wrap(dt, int64(r.Uint64()))
	default:
		ext := []int64{0, 1, -1, math.MinInt64, math.MaxInt64, math.MinInt32, math.MaxInt32, 255, 128, 1 << 31}
		return Wrap(dt, ext[r.IntN(len(ext))])
	}
}

// Default is the distribution of RandomLiteral and Args: floats mostly
// uniform in [-2, 2), a quarter small integers in [-2, 2]; signed integers
// in [-5, 5], unsigned in [0, 10].
var Default = Values{FloatFunc: smallFloat, Int: Range{-5, 6}, Uint: Range{0, 11}}

func smallFloat(rng *rand.Rand) float64 {
	if rng.IntN(4) == 0 {
		return float64(rng.IntN(5) - 2)
	}
	return rng.Float64()*4 - 2
}
