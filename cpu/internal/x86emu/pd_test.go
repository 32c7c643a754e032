package x86emu

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
)

// exact64 rounds the exact value x (computed with enough precision that it
// is exact or, for a quotient, nowhere near a float64 midpoint it is not
// on) once to float64 bits; zero is the caller's (IEEE's sign rules).
func exact64(x *big.Float) uint64 {
	f, _ := x.Float64()
	return math.Float64bits(f)
}

func bigOf(x uint64) *big.Float { return new(big.Float).SetPrec(4400).SetFloat64(d64(x)) }

// refPD is the float64 operation op ("add", "sub", "mul", "div", "fma")
// of finite a, b (and c: a*b + c) rounded once, by math/big; a zero
// result takes the sign IEEE 754 gives it, from Go's float64 arithmetic
// (exact there).
func refPD(op string, a, b, c uint64) uint64 {
	z := new(big.Float).SetPrec(4400)
	switch op {
	case "add":
		z.Add(bigOf(a), bigOf(b))
	case "sub":
		z.Sub(bigOf(a), bigOf(b))
	case "mul":
		z.Mul(bigOf(a), bigOf(b))
	case "div":
		z.SetPrec(256).Quo(bigOf(a), bigOf(b))
	case "fma":
		z.Mul(bigOf(a), bigOf(b))
		z.Add(z, bigOf(c))
	}
	if z.Sign() == 0 {
		x, y, w := d64(a), d64(b), d64(c)
		switch op {
		case "add":
			return math.Float64bits(x + y)
		case "sub":
			return math.Float64bits(x - y)
		case "mul":
			return math.Float64bits(x * y)
		case "div":
			return math.Float64bits(x / y)
		}
		p := x * y // zero or exact enough for its sign when the sum is zero
		if p == 0 {
			return math.Float64bits(p + w)
		}
		return math.Float64bits(0) // x*y = -w ≠ 0: an exact +0
	}
	return exact64(z)
}

// randFinite64 draws finite float64 patterns: normal values of every
// magnitude, subnormals, values near 1, small integers.
func randFinite64(r *rand.Rand) uint64 {
	sign := uint64(r.IntN(2)) << 63
	switch r.IntN(5) {
	case 0:
		return sign | r.Uint64N(0x7ff0000000000000)
	case 1:
		return sign | r.Uint64N(1<<52) // subnormal
	case 2:
		return sign | math.Float64bits(1+r.Float64())
	case 3:
		return sign | math.Float64bits(float64(r.IntN(16)))
	}
	return math.Float64bits(r.NormFloat64() * math.Ldexp(1, r.IntN(80)-40))
}

// TestFloat64LaneOps checks the float64 lane operations on finite operands
// against math/big: random operands of every magnitude, subnormal
// results, cancellations and products a half-ulp from the addend (the
// double rounding cases of a fused multiply-add).
func TestFloat64LaneOps(t *testing.T) {
	r := testseed.Rand(t, 3)
	isInf := func(x uint64) bool { return x&(1<<63-1) == 0x7ff0000000000000 }
	for i := 0; i < 100000; i++ {
		a, b, c := randFinite64(r), randFinite64(r), randFinite64(r)
		switch i % 4 {
		case 1: // cancellation: c ≈ -a*b
			c = math.Float64bits(-d64(a) * d64(b) * (1 + float64(r.IntN(3)-1)*0x1p-52))
		case 2: // a*b of 106 bits plus a tiny c: the rounding tie region
			a = math.Float64bits(1 + float64(r.Uint64N(1<<52))*0x1p-52)
			b = math.Float64bits(1 + 0x1p-1 + float64(r.Uint64N(1<<20))*0x1p-52)
			c = math.Float64bits(math.Ldexp(r.Float64(), -54-r.IntN(60)) * float64(1-2*r.IntN(2)))
		}
		if isNaN64(c) || isInf(c) {
			continue
		}
		for _, op := range []struct {
			name string
			got  uint64
		}{
			{"add", addD(a, b)}, {"sub", subD(a, b)}, {"mul", mulD(a, b)}, {"fma", fmaD(a, b, c, false, false)},
		} {
			if op.name == "fma" && isInf(mulD(a, b)) {
				continue // big.Float has no overflow: the exact product may be finite
			}
			if want := refPD(op.name, a, b, c); op.got != want && !isInf(want) {
				t.Fatalf("%s(%#x, %#x, %#x) = %#x, want %#x", op.name, a, b, c, op.got, want)
			}
		}
		if b&(1<<63-1) != 0 {
			if got, want := divD(a, b), refPD("div", a, b, 0); got != want && !isInf(want) {
				t.Fatalf("div(%#x, %#x) = %#x, want %#x", a, b, got, want)
			}
		}
		// The sign variants negate the product and the addend.
		na, nc := a^1<<63, c^1<<63
		for _, v := range []struct {
			negMul, negAdd bool
			x, z           uint64
		}{{false, true, a, nc}, {true, false, na, c}, {true, true, na, nc}} {
			if got, want := fmaD(a, b, c, v.negMul, v.negAdd), fmaD(v.x, b, v.z, false, false); got != want {
				t.Fatalf("fma(%#x, %#x, %#x) negMul %v negAdd %v = %#x, want %#x", a, b, c, v.negMul, v.negAdd, got, want)
			}
		}
	}
}

// TestFloat64SpecialValues checks the NaN, infinity and zero rules of the
// float64 lane operations (Intel's, checked against the hardware by
// TestPDMatchHardware).
func TestFloat64SpecialValues(t *testing.T) {
	const (
		qnan  = 0x7ff8000000000123
		snan  = 0x7ff0000000000123
		nqnan = 0xfff8000000000456
		inf   = 0x7ff0000000000000
		ninf  = 0xfff0000000000000
		one   = 0x3ff0000000000000
		nzero = 1 << 63
	)
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"add snan", addD(snan, one), 0x7ff8000000000123},
		{"add nan first", addD(nqnan, qnan), nqnan},
		{"add nan second", addD(one, snan), 0x7ff8000000000123},
		{"inf - inf", subD(inf, inf), defaultNaN64},
		{"0 * inf", mulD(0, ninf), defaultNaN64},
		{"0 / 0", divD(nzero, 0), defaultNaN64},
		{"1 / -0", divD(one, nzero), ninf},
		{"-0 + -0", addD(nzero, nzero), nzero},
		{"-0 - 0", subD(nzero, 0), nzero},
		{"fma nan order x", fmaD(snan, nqnan, qnan, true, true), 0x7ff8000000000123},
		{"fma nan order y", fmaD(one, nqnan, qnan, false, false), nqnan},
		{"fma nan order z", fmaD(one, one, snan, false, true), 0x7ff8000000000123},
		{"fma 0*inf + nan", fmaD(0, inf, qnan, false, false), qnan},
		{"fma 0*inf + 1", fmaD(0, inf, one, false, false), defaultNaN64},
		{"fma inf - inf", fmaD(one, inf, inf, false, true), defaultNaN64},
		{"fma -0*1 + -0", fmaD(nzero, one, nzero, false, false), nzero},
		{"fnmadd 0*1 - 0", fmaD(0, one, 0, true, true), nzero},
		{"fma 1*1 - 1", fmaD(one, one, one, false, true), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, c.got, c.want)
		}
	}
}
