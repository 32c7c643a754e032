package x86emu

import "math"

// Float32 lane semantics (MXCSR 0x1F80: round to nearest even, no FTZ or
// DAZ). Arguments and results are bit patterns.

// defaultNaN is the QNaN the instructions return for invalid operations
// ("real indefinite").
const defaultNaN = 0xffc00000

func isNaN(x uint32) bool  { return x&0x7fffffff > 0x7f800000 }
func isInf(x uint32) bool  { return x&0x7fffffff == 0x7f800000 }
func isZero(x uint32) bool { return x&0x7fffffff == 0 }
func quiet(x uint32) uint32 {
	return x | 0x00400000
}

func f64(x uint32) float64 { return float64(math.Float32frombits(x)) }

// round32 rounds v (not NaN) to float32 once.
func round32(v float64) uint32 { return math.Float32bits(float32(v)) }

// result returns the bits of v rounded to float32, or the default NaN when
// the operation was invalid (v is NaN with no NaN operand).
func result(v float64) uint32 {
	if v != v {
		return defaultNaN
	}
	return round32(v)
}

// nan2 returns the NaN result of a two-source operation: the first source
// quieted when it is a NaN, else the second quieted.
func nan2(a, b uint32) (uint32, bool) {
	switch {
	case isNaN(a):
		return quiet(a), true
	case isNaN(b):
		return quiet(b), true
	}
	return 0, false
}

// The four operations and the square root: the float64 result of float32
// operands is rounded once more to float32, which gives the correctly
// rounded float32 result (float64 holds more than twice float32's
// precision plus two bits, so the double rounding is innocuous; the
// product is even exact).
func addF(a, b uint32) uint32 {
	if r, ok := nan2(a, b); ok {
		return r
	}
	return result(f64(a) + f64(b))
}

func subF(a, b uint32) uint32 {
	if r, ok := nan2(a, b); ok {
		return r
	}
	return result(f64(a) - f64(b))
}

func mulF(a, b uint32) uint32 {
	if r, ok := nan2(a, b); ok {
		return r
	}
	return result(f64(a) * f64(b))
}

func divF(a, b uint32) uint32 {
	if r, ok := nan2(a, b); ok {
		return r
	}
	return result(f64(a) / f64(b))
}

func sqrtF(a uint32) uint32 {
	if isNaN(a) {
		return quiet(a)
	}
	if isZero(a) {
		return a // √-0 = -0
	}
	if a>>31 != 0 {
		return defaultNaN
	}
	return round32(math.Sqrt(f64(a)))
}

// maxF and minF: MAXPS/MINPS return the second source b when either is a
// NaN (unquieted) or both are zeros of any sign.
func maxF(a, b uint32) uint32 {
	if isNaN(a) || isNaN(b) {
		return b
	}
	if f64(a) > f64(b) {
		return a
	}
	return b
}

func minF(a, b uint32) uint32 {
	if isNaN(a) || isNaN(b) {
		return b
	}
	if f64(a) < f64(b) {
		return a
	}
	return b
}

// fmaF returns x*y + z rounded once (the sign flags negate the product and
// the addend: VFNMADD is (-x*y) + z, VFMSUB x*y - z), with NaN operands
// propagated in the order x, y, z (the order the form's formula names
// them: 132 is dest*src3 + src2, 213 src2*dest + src3, 231 src2*src3 +
// dest), quieted, unnegated.
func fmaF(x, y, z uint32, negMul, negAdd bool) uint32 {
	switch {
	case isNaN(x):
		return quiet(x)
	case isNaN(y):
		return quiet(y)
	case isNaN(z):
		return quiet(z)
	}
	if negMul {
		x ^= 1 << 31
	}
	if negAdd {
		z ^= 1 << 31
	}
	return fma32(x, y, z)
}

// fma32 returns x*y + z (no NaN operand) rounded once to float32. The
// product is exact in float64; TwoSum splits p + z into s + e exactly (no
// overflow can occur at these magnitudes). Rounding s to odd (where e is
// not zero and s's last bit is even, its neighbour toward e, whose last
// bit is odd) keeps the sticky information in float64's 29 extra bits, so
// rounding that to float32 is the correctly rounded sum.
func fma32(x, y, z uint32) uint32 {
	a, b, c := f64(x), f64(y), f64(z)
	p := a * b
	if p != p {
		return defaultNaN // 0 × inf
	}
	if math.IsInf(p, 0) || math.IsInf(c, 0) || p == 0 || c == 0 {
		return result(p + c) // one term exact, or a special case of IEEE addition
	}
	s := p + c
	bb := s - p
	e := (p - (s - bb)) + (c - bb)
	if e != 0 && math.Float64bits(s)&1 == 0 {
		s = math.Nextafter(s, math.Copysign(math.Inf(1), e))
	}
	return round32(s)
}

// cmpF evaluates VCMPPS predicate imm (0-31; bit 4 only changes which
// operands signal) for a and b.
func cmpF(imm uint8, a, b uint32) bool {
	un := isNaN(a) || isNaN(b)
	x, y := f64(a), f64(b)
	switch imm & 15 {
	case 0: // EQ_OQ
		return !un && x == y
	case 1: // LT_OS
		return !un && x < y
	case 2: // LE_OS
		return !un && x <= y
	case 3: // UNORD_Q
		return un
	case 4: // NEQ_UQ
		return un || x != y
	case 5: // NLT_US
		return un || !(x < y)
	case 6: // NLE_US
		return un || !(x <= y)
	case 7: // ORD_Q
		return !un
	case 8: // EQ_UQ
		return un || x == y
	case 9: // NGE_US
		return un || x < y
	case 10: // NGT_US
		return un || x <= y
	case 11: // FALSE_OQ
		return false
	case 12: // NEQ_OQ
		return !un && x != y
	case 13: // GE_OS
		return !un && x >= y
	case 14: // GT_OS
		return !un && x > y
	}
	return true // TRUE_UQ
}

// getexpF is VGETEXPPS: floor(log2 |a|) as a float32 (denormals
// normalised).
func getexpF(a uint32) uint32 {
	switch {
	case isNaN(a):
		return quiet(a)
	case isZero(a):
		return 0xff800000 // -inf
	case isInf(a):
		return 0x7f800000
	}
	_, e := math.Frexp(math.Abs(f64(a)))
	return round32(float64(e - 1))
}

// getmantF is VGETMANTPS with imm's interval (bits 1:0) and sign control
// (bits 3:2).
func getmantF(imm uint8, a uint32) uint32 {
	if isNaN(a) {
		return quiet(a)
	}
	sign := a >> 31
	if imm&4 != 0 {
		sign = 0
	}
	if isZero(a) {
		return sign<<31 | 0x3f800000
	}
	if imm&8 != 0 && a>>31 != 0 { // checked after zeros, before infinities
		return defaultNaN
	}
	if isInf(a) {
		return sign<<31 | 0x3f800000
	}
	// Normalise: mantissa bits 1.f and the unbiased exponent.
	exp := int(a >> 23 & 0xff)
	frac := a & 0x7fffff
	if exp == 0 { // denormal
		for frac&0x800000 == 0 {
			frac <<= 1
			exp--
		}
		exp++
		frac &= 0x7fffff
	}
	e := exp - 127
	var be uint32 // biased exponent of the result
	switch imm & 3 {
	case 0: // [1, 2)
		be = 127
	case 1: // [1/2, 2): [1/2, 1) for odd exponents
		be = 127
		if e&1 != 0 {
			be = 126
		}
	case 2: // [1/2, 1)
		be = 126
	case 3: // [3/4, 3/2)
		be = 127
		if frac&0x400000 != 0 {
			be = 126
		}
	}
	return sign<<31 | be<<23 | frac
}

// scalefF is VSCALEFPS: a * 2^floor(b), rounded once, with the special
// cases of Intel's table (a quiet NaN a scaled by ±inf gives +inf or +0).
func scalefF(a, b uint32) uint32 {
	switch {
	case isNaN(a) && a&0x00400000 != 0 && isInf(b): // a quiet NaN
		if b>>31 == 0 {
			return 0x7f800000
		}
		return 0
	case isNaN(a):
		return quiet(a)
	case isNaN(b):
		return quiet(b)
	case isInf(b) && b>>31 == 0: // +inf: 0 * 2^inf is invalid
		if isZero(a) {
			return defaultNaN
		}
		return a&0x80000000 | 0x7f800000
	case isInf(b): // -inf: inf * 2^-inf is invalid
		if isInf(a) {
			return defaultNaN
		}
		return a & 0x80000000
	}
	n := math.Floor(f64(b))
	n = math.Max(-400, math.Min(400, n)) // beyond, the result saturates the same
	return round32(math.Ldexp(f64(a), int(n)))
}

// rndscaleF is VRNDSCALEPS: a rounded to imm>>4 fraction bits, by imm's
// rounding mode (bits 1:0, or nearest even, MXCSR's, with bit 2 set).
func rndscaleF(imm uint8, a uint32) uint32 {
	if isNaN(a) {
		return quiet(a)
	}
	if isInf(a) || isZero(a) {
		return a
	}
	m := int(imm >> 4)
	v := math.Ldexp(f64(a), m)
	mode := imm & 3
	if imm&4 != 0 {
		mode = 0
	}
	switch mode {
	case 0:
		v = math.RoundToEven(v)
	case 1:
		v = math.Floor(v)
	case 2:
		v = math.Ceil(v)
	default:
		v = math.Trunc(v)
	}
	r := round32(math.Ldexp(v, -m))
	if r&0x7fffffff == 0 {
		r = a&0x80000000 | r // keep the sign of a zero result
	}
	return r
}

// cvtF2I is VCVTPS2DQ (trunc false: MXCSR rounding, nearest even) and
// VCVTTPS2DQ (trunc): out of range and NaN give the integer indefinite
// 0x80000000.
func cvtF2I(a uint32, trunc bool) uint32 {
	if isNaN(a) {
		return 0x80000000
	}
	v := f64(a)
	if trunc {
		v = math.Trunc(v)
	} else {
		v = math.RoundToEven(v)
	}
	if v >= 1<<31 || v < -(1<<31) {
		return 0x80000000
	}
	return uint32(int32(v))
}

// cvtI2F is VCVTDQ2PS: the int32 rounded once to float32.
func cvtI2F(a uint32) uint32 { return round32(float64(int32(a))) }

// Float64 lane semantics (the PD instructions), the same rules on 64-bit
// patterns: a NaN operand is quieted and propagated (the first source
// first), an invalid operation gives the default NaN 0xFFF8000000000000,
// every result is rounded once to nearest even.

const defaultNaN64 = 0xfff8000000000000

func isNaN64(x uint64) bool   { return x&(1<<63-1) > 0x7ff0000000000000 }
func quiet64(x uint64) uint64 { return x | 1<<51 }
func d64(x uint64) float64    { return math.Float64frombits(x) }

// result64 returns the bits of v, or the default NaN when the operation
// was invalid (v is NaN with no NaN operand).
func result64(v float64) uint64 {
	if v != v {
		return defaultNaN64
	}
	return math.Float64bits(v)
}

// nan2d is nan2 for float64 patterns.
func nan2d(a, b uint64) (uint64, bool) {
	switch {
	case isNaN64(a):
		return quiet64(a), true
	case isNaN64(b):
		return quiet64(b), true
	}
	return 0, false
}

// The four operations: Go's float64 arithmetic is IEEE 754's, correctly
// rounded to nearest even.
func addD(a, b uint64) uint64 {
	if r, ok := nan2d(a, b); ok {
		return r
	}
	return result64(d64(a) + d64(b))
}

func subD(a, b uint64) uint64 {
	if r, ok := nan2d(a, b); ok {
		return r
	}
	return result64(d64(a) - d64(b))
}

func mulD(a, b uint64) uint64 {
	if r, ok := nan2d(a, b); ok {
		return r
	}
	return result64(d64(a) * d64(b))
}

func divD(a, b uint64) uint64 {
	if r, ok := nan2d(a, b); ok {
		return r
	}
	return result64(d64(a) / d64(b))
}

// fmaD is fmaF for float64: x*y + z rounded once (math.FMA), the signs
// negating the product and the addend, NaNs propagated in the order x, y,
// z, quieted, unnegated.
func fmaD(x, y, z uint64, negMul, negAdd bool) uint64 {
	switch {
	case isNaN64(x):
		return quiet64(x)
	case isNaN64(y):
		return quiet64(y)
	case isNaN64(z):
		return quiet64(z)
	}
	if negMul {
		x ^= 1 << 63
	}
	if negAdd {
		z ^= 1 << 63
	}
	return result64(math.FMA(d64(x), d64(y), d64(z)))
}
