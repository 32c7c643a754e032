package ir

import "math"

// F16 is an IEEE 754 binary16 value stored as its bits.
type F16 uint16

// BF16 is a bfloat16 value (the top 16 bits of a float32) stored as its bits.
type BF16 uint16

// F16FromFloat64 rounds x to the nearest binary16 value, ties to even.
func F16FromFloat64(x float64) F16 { return F16(roundSmallFloat(x, 5, 10)) }

// F16FromFloat32 rounds x to the nearest binary16 value, ties to even
// (overflow gives ±Inf); a NaN becomes the quiet NaN 0x7e00 with x's sign.
func F16FromFloat32(x float32) F16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return F16(sign | 0x7e00)
	case a >= 0x477ff000: // 65520 = 65504 + half an ulp, and above: Inf
		return F16(sign | 0x7c00)
	case a < 0x38800000: // below 2⁻¹⁴: subnormal or zero
		// Adding 0.5 (ulp 2⁻²⁴, the binary16 quantum here) rounds to
		// nearest even in the FPU; the mantissa is then the result,
		// 0x400 (the smallest normal) included.
		v := math.Float32frombits(a) + 0.5
		return F16(sign | uint16(math.Float32bits(v)-0x3f000000))
	}
	a += 0xfff + (a>>13)&1
	return F16(sign | uint16((a-0x38000000)>>13))
}

// BF16FromFloat64 rounds x to the nearest bfloat16 value, ties to even.
func BF16FromFloat64(x float64) BF16 { return BF16(roundSmallFloat(x, 8, 7)) }

// BF16FromFloat32 rounds x to the nearest bfloat16 value, ties to even.
func BF16FromFloat32(x float32) BF16 {
	b := math.Float32bits(x)
	if x != x {
		return BF16(uint16(b>>16) | 0x0040) // keep sign and payload top, force quiet
	}
	b += 0x7FFF + (b>>16)&1
	return BF16(b >> 16)
}

// Float32 widens h exactly; every NaN becomes the float32 quiet NaN 0x7fc00000.
func (h F16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch e {
	case 0: // zero or subnormal: m·2⁻²⁴, exact in float32
		return math.Float32frombits(math.Float32bits(float32(m)*0x1p-24) | sign)
	case 0x1f:
		if m != 0 {
			return math.Float32frombits(0x7fc00000)
		}
		return math.Float32frombits(sign | 0x7f800000)
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// Float64 widens h exactly.
func (h F16) Float64() float64 { return expandSmallFloat(uint16(h), 5, 10) }

// Float32 widens b exactly.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// Float64 widens b exactly.
func (b BF16) Float64() float64 { return float64(b.Float32()) }

// roundSmallFloat rounds x to a binary format with e exponent bits and m mantissa
// bits (sign bit on top, 1+e+m ≤ 16), round to nearest, ties to even.
func roundSmallFloat(x float64, e, m int) uint16 {
	bits := math.Float64bits(x)
	sign := uint16(bits>>63) << (e + m)
	expMask := uint16(1<<e - 1)
	if math.IsNaN(x) {
		return sign | expMask<<m | 1<<(m-1)
	}
	a := math.Abs(x)
	if a == 0 {
		return sign
	}
	bias := 1<<(e-1) - 1
	if math.IsInf(a, 0) {
		return sign | expMask<<m
	}
	emin := 1 - bias
	exp := math.Ilogb(a)
	if exp < emin {
		exp = emin
	}
	// quantum 2^(exp-m); the scaled mantissa is exact in float64.
	r := math.RoundToEven(math.Ldexp(a, m-exp))
	if r >= float64(uint32(1)<<(m+1)) {
		r /= 2
		exp++
	}
	if exp > bias {
		return sign | expMask<<m
	}
	ri := uint16(r)
	if ri < 1<<m { // subnormal (or zero after rounding)
		return sign | ri
	}
	return sign | uint16(exp+bias)<<m | (ri - 1<<m)
}

func expandSmallFloat(h uint16, e, m int) float64 {
	sign := 1.0
	if h>>(e+m)&1 == 1 {
		sign = -1
	}
	expMask := uint16(1<<e - 1)
	ex := int(h >> m & expMask)
	mant := float64(h & (1<<m - 1))
	bias := 1<<(e-1) - 1
	switch ex {
	case 0:
		return sign * math.Ldexp(mant, 1-bias-m)
	case int(expMask):
		if mant != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	}
	return sign * math.Ldexp(mant+float64(uint32(1)<<m), ex-bias-m)
}
