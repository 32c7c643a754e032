package vmath

import "math"

var sqrt64, tanh64 = math.Sqrt, math.Tanh

var inf32 = float32(math.Inf(1))

// The scalar float32 kernels of the pure-Go path. Each is a range reduction
// and a polynomial evaluated in float32; the amd64 assembly evaluates the
// same formulas with fused multiply-adds (its results may differ from these
// in the last bit, both are within 2 ulp of the correctly rounded value).

const (
	log2e    = 1.44269504088896341
	ln2Hi    = 0.693359375    // high bits of ln 2 (exact product with |n| < 2^14)
	ln2Lo    = -2.12194440e-4 // ln 2 - ln2Hi
	sqrtHf   = 0.707106781186547524
	expHi    = 89                      // exp(x) = +inf above
	expLo    = -104                    // exp(x) = 0 below
	tanhLo   = 0.625                   // odd polynomial below
	tanhHi   = 9.1                     // ±1 above
	erfMid   = 0.875                   // odd polynomial below, 1-exp(Q) above
	erfHi    = 3.9375                  // ±1 above
	ln2F32   = 0.693147182464599609375 // float32(ln 2)
	ln2F32Lo = -1.904654323148236e-09  // ln 2 - ln2F32
	expShift = 786432                  // 1.5 * 2^19 (ulp 1/16): adding it rounds to a multiple of 1/16
	expC2    = 5.000162721e-01         // e^r ≈ 1 + r + expC2 r² + expC3 r³ for |r| ≤ ln2/32
	expC3    = 1.666700840e-01
	signBit  = 0x80000000
)

var logP = [...]float32{7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
	1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1}

var tanhP = [...]float32{-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1}

// erf(x) = x + x*erfS(x²) for |x| < erfMid (least-squares fit, degree 6).
var erfS = [...]float32{8.7370725e-05, -0.0008225737, 0.005208063, -0.026862139, 0.11283744, -0.37612638, 0.12837917}

// erf(x) = 1 - exp(erfL(|x|-erfMid)) for erfMid ≤ |x| < erfHi (fit of log erfc, degree 8).
var erfL = [...]float32{-8.414678e-07, -1.5651069e-05, 0.00029121392, -0.002210701, 0.011352337,
	-0.04690298, -0.8265409, -2.4302197, -1.5328244}

func f32bits(x float32) uint32     { return math.Float32bits(x) }
func f32frombits(b uint32) float32 { return math.Float32frombits(b) }

func abs32(x float32) float32 { return f32frombits(f32bits(x) &^ signBit) }

func copysign32(x, s float32) float32 {
	return f32frombits(f32bits(x)&^signBit | f32bits(s)&signBit)
}

// horner evaluates c[0]*t^(n-1) + ... + c[n-1].
func horner(c []float32, t float32) float32 {
	r := c[0]
	for _, k := range c[1:] {
		r = r*t + k
	}
	return r
}

// scale2 returns p*2^n for n in [-151, 129] with a single rounding.
func scale2(p float32, n int32) float32 {
	n1 := n >> 1
	n2 := n - n1
	return p * f32frombits(uint32(n1+127)<<23) * f32frombits(uint32(n2+127)<<23)
}

// expCore returns e^x for x in [expLo, expHi] as the kernels do (see
// gen.expCore in jit.go): kf = x*log2e rounded to a multiple of 1/16
// (adding expShift), e^x = 2^floor(kf) * 2^(kf-floor(kf)) * e^r with
// r = x - kf*ln2, the middle factor from exp2Tab (corrected by exp2Err),
// e^r by a cubic.
func expCore(x float32) float32 {
	t := x*log2e + expShift
	k := int32(f32bits(t)) - int32(f32bits(expShift)) // 16 kf
	kf := t - expShift
	r := x - kf*ln2Hi
	r = r - kf*ln2Lo
	T := exp2Tab[k&15]
	p := ((expC3*r+expC2)*r+1)*r + exp2Err[k&15]
	return scale2(T+T*p, k>>4)
}

// exp2Tab holds T = 2^(j/16), j = 0..15, rounded to float32, and exp2Err
// the relative rounding errors (2^(j/16) - T) / T, added to e^r - 1 so that
// the result carries no table error.
var exp2Tab, exp2Err = func() (t, d [16]float32) {
	for j := range t {
		v := math.Exp2(float64(j) / 16)
		t[j] = float32(v)
		d[j] = float32((v - float64(t[j])) / float64(t[j]))
	}
	return
}()

func exp32(x float32) float32 {
	if x != x {
		return x + x // quiet NaN (see NaNs in the package doc)
	}
	return expCore(min(max(x, expLo), expHi))
}

func log32(x float32) float32 {
	switch {
	case x != x:
		return x + x
	case x < 0:
		return float32(math.NaN())
	case x == 0:
		return -inf32
	case x == inf32:
		return x
	}
	b := f32bits(x)
	e := int32(0)
	if b < 0x00800000 { // subnormal
		x *= 1 << 23
		b = f32bits(x)
		e = -23
	}
	e += int32(b>>23) - 126
	m := f32frombits(b&0x007fffff | 0x3f000000) // [0.5, 1)
	var f float32
	if m < sqrtHf {
		e--
		f = m + m - 1
	} else {
		f = m - 1
	}
	fe := float32(e)
	z := f * f
	y := horner(logP[:], f) * f * z
	y += ln2Lo * fe
	y += -0.5 * z
	r := f + y
	return r + ln2Hi*fe
}

func tanh32(x float32) float32 {
	a := abs32(x)
	if a < tanhLo {
		z := x * x
		return x + x*z*horner(tanhP[:], z)
	}
	if a > tanhHi {
		return copysign32(1, x)
	}
	e := expCore(a + a)
	return copysign32(1-2/(e+1), x)
}

func logistic32(x float32) float32 {
	if x != x { // quieted, sign bit set (the vector code's -|x|)
		return f32frombits(f32bits(x) | signBit | 0x00400000)
	}
	e := expCore(max(-abs32(x), expLo))
	num := float32(1)
	if x < 0 {
		num = e
	}
	return num / (1 + e)
}

func erf32(x float32) float32 {
	a := abs32(x)
	if a < erfMid {
		return x + x*horner(erfS[:], x*x)
	}
	if a >= erfHi {
		if x != x {
			return x + x
		}
		return copysign32(1, x)
	}
	q := horner(erfL[:], a-erfMid)
	return copysign32(1-expCore(q), x)
}

// log1p32 and expm1f32 round the float64 functions (exact to half an ulp).
func log1p32(x float32) float32 { return float32(math.Log1p(float64(x))) }
func expm132(x float32) float32 { return float32(math.Expm1(float64(x))) }
