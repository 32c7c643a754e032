package eval

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

func isNaNBits(h uint16, f floatFmt) bool {
	e := int(h>>f.mbits) & (1<<f.ebits - 1)
	return e == 1<<f.ebits-1 && h&(1<<f.mbits-1) != 0
}

// wantBits is the reference encoding of x rounded once to the format.
func wantBits(x float64, dt ir.DType) uint16 {
	return encodeSmall(refRound(x, dt), formatOf(dt))
}

func requireBits(t *testing.T, want, got uint16, dt ir.DType, what string, x any) {
	t.Helper()
	f := formatOf(dt)
	if isNaNBits(want, f) {
		require.True(t, isNaNBits(got, f), "%s(%v) = %#04x, want a NaN", what, x, got)
		return
	}
	require.Equal(t, want, got, "%s(%v) = %#04x (%g), want %#04x (%g)", what, x, got, decodeSmall(got, f), want, decodeSmall(want, f))
}

// halfInputs returns float64 inputs around the rounding boundaries of fmt:
// exact midpoints between neighbours (ties), their float64 neighbours, the
// overflow threshold and the subnormal range.
func halfInputs(r *rand.Rand, f floatFmt, maxBits uint16) []float64 {
	var xs []float64
	add := func(v float64) {
		xs = append(xs, v, -v, math.Nextafter(v, math.Inf(1)), math.Nextafter(v, math.Inf(-1)))
	}
	next := func(h uint16) float64 {
		if h == maxBits {
			return math.Ldexp(1, int(1)<<(f.ebits-1)) // the value one step above the maximum
		}
		return decodeSmall(h+1, f)
	}
	for _, h := range []uint16{0, 1, 2, 3, 1<<f.mbits - 1, 1 << f.mbits, maxBits - 1, maxBits} {
		lo := decodeSmall(h, f)
		add(lo)
		add((lo + next(h)) / 2)
	}
	for i := 0; i < 3000; i++ {
		h := uint16(r.IntN(int(maxBits) + 1))
		lo := decodeSmall(h, f)
		add((lo + next(h)) / 2)
		add(lo)
	}
	for i := 0; i < 3000; i++ {
		bias := 1 << (f.ebits - 1)
		e := float64(r.IntN(2*f.mbits+2*bias+8) - f.mbits - bias - 4)
		xs = append(xs, (1+r.Float64())*math.Exp2(e))
		xs = append(xs, math.Float64frombits(r.Uint64()))
	}
	xs = append(xs, 0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.NaN(), 1e300, -1e-300, 5e-324)
	return xs
}

func f64Lit(xs []float64) *ir.Literal {
	l := lit(ir.TypeOf(ir.Float64, len(xs)))
	for i, x := range xs {
		setF(l, i, x)
	}
	return l
}

func convertLit(t *testing.T, x *ir.Literal, dt ir.DType) *ir.Literal {
	return runOp(t, ir.Convert, []*ir.Literal{x}, ir.Attrs{"dtype": dt})[0]
}

func bits16(l *ir.Literal, i int) uint16 { return uint16(l.Data[2*i]) | uint16(l.Data[2*i+1])<<8 }

// TestHalfRoundingBits checks f64 → f16/bf16 and f32 → f16/bf16 rounding, in
// ir's conversion functions and in the convert op, bit for bit against a
// math/big reference: ties to even, subnormals, overflow to Inf, NaN.
func TestHalfRoundingBits(t *testing.T) {
	r := newRand(t)
	for _, dt := range []ir.DType{ir.Float16, ir.BFloat16} {
		f := formatOf(dt)
		maxBits := uint16(1<<(f.ebits+f.mbits) - 1<<f.mbits - 1)
		xs := append(halfInputs(r, f, maxBits), halfInputs(r, fmtF16, 0x7bff)...)

		// float64 sources
		res := convertLit(t, f64Lit(xs), dt)
		for i, x := range xs {
			want := wantBits(x, dt)
			var fn uint16
			if dt == ir.Float16 {
				fn = uint16(ir.F16FromFloat64(x))
			} else {
				fn = uint16(ir.BF16FromFloat64(x))
			}
			requireBits(t, want, fn, dt, dt.String()+"FromFloat64", x)
			requireBits(t, want, bits16(res, i), dt, "convert f64→"+dt.String(), x)
		}

		// float32 sources: the representable inputs, and float32 ties for
		// both formats (low 13 or 16 bits exactly half).
		var x32 []float32
		for _, x := range xs {
			if v := float32(x); float64(v) == x || math.IsNaN(x) {
				x32 = append(x32, v, math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(v, float32(math.Inf(-1))))
			}
		}
		for i := 0; i < 5000; i++ {
			b := r.Uint32()
			x32 = append(x32, math.Float32frombits(b), math.Float32frombits(b&^0xffff|0x8000), math.Float32frombits(b&^0x1fff|0x1000))
		}
		l32 := lit(ir.TypeOf(ir.Float32, len(x32)))
		for i, v := range x32 {
			setF(l32, i, float64(v))
		}
		res = convertLit(t, l32, dt)
		for i, v := range x32 {
			want := wantBits(float64(v), dt)
			var fn uint16
			if dt == ir.Float16 {
				fn = uint16(ir.F16FromFloat32(v))
			} else {
				fn = uint16(ir.BF16FromFloat32(v))
			}
			requireBits(t, want, fn, dt, dt.String()+"FromFloat32", v)
			requireBits(t, want, bits16(res, i), dt, "convert f32→"+dt.String(), v)
		}
	}
}

// TestHalfExhaustive converts every f16 and bf16 bit pattern to f32, f64 and
// to the other 16-bit format.
func TestHalfExhaustive(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float16, ir.BFloat16} {
		f := formatOf(dt)
		all := lit(ir.TypeOf(dt, 1<<16))
		for i := 0; i < 1<<16; i++ {
			all.Data[2*i], all.Data[2*i+1] = uint8(i), uint8(i>>8)
		}
		for _, wide := range []ir.DType{ir.Float32, ir.Float64} {
			res := convertLit(t, all, wide)
			for i := 0; i < 1<<16; i++ {
				want := decodeSmall(uint16(i), f)
				got := getF(res, i)
				require.True(t, closeTo(got, want, wide, 0, true), "convert %v→%v of %#04x: got %g want %g", dt, wide, i, got, want)
			}
			// and back, exactly
			back := convertLit(t, res, dt)
			for i := 0; i < 1<<16; i++ {
				requireBits(t, uint16(i), bits16(back, i), dt, "round trip via "+wide.String(), i)
			}
		}
		other := ir.BFloat16
		if dt == ir.BFloat16 {
			other = ir.Float16
		}
		res := convertLit(t, all, other)
		for i := 0; i < 1<<16; i++ {
			requireBits(t, wantBits(decodeSmall(uint16(i), f), other), bits16(res, i), other, "convert "+dt.String()+"→"+other.String(), i)
		}
	}
}

// TestIntToHalfRounding checks integer → f16/bf16/f32 conversion with a single
// rounding (no double rounding through float64 for large i64 values).
func TestIntToHalfRounding(t *testing.T) {
	r := newRand(t)
	vals := []int64{0, 1, -1, 2049, 2051, 65504, 65519, 65520, 65521, -65520, 1 << 24, 1<<24 + 1, 1<<60 + 1<<52, 1<<60 + 1<<52 + 1, 1<<60 + 1<<53 + 1<<52,
		-(1<<60 + 1<<52 + 1), math.MaxInt64, math.MinInt64, 1<<53 + 1, 1<<62 + 1<<37 + 1, 1<<40 + 1<<16 + 1}
	for i := 0; i < 3000; i++ {
		v := int64(r.Uint64() >> r.IntN(64))
		if r.IntN(2) == 0 {
			v = -v
		}
		vals = append(vals, v)
	}
	for _, sd := range intDTypes {
		x := lit(ir.TypeOf(sd, len(vals)))
		for i, v := range vals {
			setI(x, i, wrapTo(sd, v))
		}
		for _, dd := range []ir.DType{ir.Float16, ir.BFloat16, ir.Float32, ir.Float64} {
			res := convertLit(t, x, dd)
			for i := range vals {
				v := getI(x, i)
				want := roundBig(new(big.Float).SetInt64(v), formatOf(dd))
				require.True(t, closeTo(getF(res, i), want, dd, 0, true), "convert %v→%v of %d: got %g want %g", sd, dd, v, getF(res, i), want)
			}
		}
	}
	// the double-rounding trap, spelled out
	x := lit(ir.TypeOf(ir.Int64, 1))
	setI(x, 0, 1<<60+1<<52+1)
	require.Equal(t, math.Ldexp(1, 60)+math.Ldexp(1, 53), getF(convertLit(t, x, ir.BFloat16), 0))
}
