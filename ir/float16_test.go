package ir

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// refRound rounds x to a binary format (e exponent bits, m mantissa bits) with
// exact rational arithmetic, ties to even, as an independent reference.
func refRound(x float64, e, m int) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return x
	}
	bias := 1<<(e-1) - 1
	maxFinite := (2 - math.Ldexp(1, -m)) * math.Ldexp(1, bias)
	sign := 1.0
	if x < 0 {
		sign, x = -1, -x
	}
	// Candidates are multiples of the quantum at x's binade (or the subnormal quantum).
	exp := math.Ilogb(x)
	if exp < 1-bias {
		exp = 1 - bias
	}
	q := new(big.Rat).SetFloat64(math.Ldexp(1, exp-m))
	xr := new(big.Rat).SetFloat64(x)
	ratio := new(big.Rat).Quo(xr, q)
	fl := new(big.Int).Quo(ratio.Num(), ratio.Denom())
	rem := new(big.Rat).Sub(ratio, new(big.Rat).SetInt(fl))
	half := big.NewRat(1, 2)
	switch rem.Cmp(half) {
	case 1:
		fl.Add(fl, big.NewInt(1))
	case 0:
		if fl.Bit(0) == 1 {
			fl.Add(fl, big.NewInt(1))
		}
	}
	res, _ := new(big.Rat).Mul(new(big.Rat).SetInt(fl), q).Float64()
	// Overflow: values rounding past the largest finite number become infinite.
	if res > maxFinite {
		return sign * math.Inf(1)
	}
	return sign * res
}

func TestFloat16ExhaustiveRoundTrip(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		h := F16(b)
		v := h.Float64()
		if math.IsNaN(v) {
			if !math.IsNaN(F16FromFloat64(v).Float64()) {
				t.Fatalf("NaN %04x did not stay NaN", b)
			}
			continue
		}
		if got := F16FromFloat64(v); got != h {
			t.Fatalf("f16 %04x → %v → %04x", b, v, uint16(got))
		}
		if got := F16FromFloat32(float32(v)); got != h {
			t.Fatalf("f16 from f32 %04x → %v → %04x", b, v, uint16(got))
		}
		bf := BF16(b)
		w := bf.Float64()
		if math.IsNaN(w) {
			continue
		}
		if got := BF16FromFloat64(w); got != bf {
			t.Fatalf("bf16 %04x → %v → %04x", b, w, uint16(got))
		}
		if got := BF16FromFloat32(float32(w)); got != bf {
			t.Fatalf("bf16 from f32 %04x → %v → %04x", b, w, uint16(got))
		}
	}
}

func TestSmallFloatRoundingAgainstExactReference(t *testing.T) {
	seed := testseed.Uint64(t)
	r := rand.New(rand.NewPCG(seed, 7))
	cases := []float64{1 + math.Ldexp(1, -11), 1 + 3*math.Ldexp(1, -11), 65504, 65519.99, 65520, 1e-8, 5.960464477539063e-08, 2.98e-8, 2.9802322387695312e-08, -0.0, 3.4e38, 1e-40}
	for i := 0; i < 20000; i++ {
		exp := r.IntN(80) - 40
		cases = append(cases, math.Ldexp(r.Float64()+1, exp)*float64(1-2*r.IntN(2)))
		// Exact ties between two f16 neighbours.
		h := F16(r.IntN(0x7bff))
		lo, hi := h.Float64(), F16(uint16(h)+1).Float64()
		cases = append(cases, (lo+hi)/2)
	}
	for _, x := range cases {
		if got, want := F16FromFloat64(x).Float64(), refRound(x, 5, 10); got != want && !(got == 0 && want == 0) {
			t.Fatalf("seed %d: f16(%v) = %v, want %v", seed, x, got, want)
		}
		if got, want := BF16FromFloat64(x).Float64(), refRound(x, 8, 7); got != want && !(got == 0 && want == 0) {
			t.Fatalf("seed %d: bf16(%v) = %v, want %v", seed, x, got, want)
		}
		if math.Abs(x) < math.MaxFloat32 {
			x32 := float32(x)
			if got, want := F16FromFloat32(x32), F16FromFloat64(float64(x32)); got != want {
				t.Fatalf("seed %d: f16 from f32(%v) = %04x, the float64 path gives %04x", seed, x32, uint16(got), uint16(want))
			}
			if got, want := BF16FromFloat32(x32).Float64(), refRound(float64(x32), 8, 7); got != want && !(got == 0 && want == 0) {
				t.Fatalf("seed %d: bf16 from f32(%v) = %v, want %v", seed, x32, got, want)
			}
		}
	}
	if !math.Signbit(F16FromFloat64(math.Copysign(0, -1)).Float64()) {
		t.Fatal("-0 lost its sign")
	}
	if !math.IsInf(F16FromFloat64(1e6).Float64(), 1) || !math.IsInf(BF16FromFloat64(-1e39).Float64(), -1) {
		t.Fatal("overflow must give infinity")
	}
}

func TestTypeStringParse(t *testing.T) {
	for _, ty := range []Type{TypeOf(Float32, 2, 3), TypeOf(BFloat16), TypeOf(Bool, 0, 4), {DType: Int64, Shape: Shape{7}, Space: PinnedHost}} {
		got, err := ParseType(ty.String())
		if err != nil || !got.Equal(ty) {
			t.Fatalf("%v: parse gave %v, %v", ty, got, err)
		}
	}
	for _, bad := range []string{"f33[2]", "f32[2", "f32[-1]", "f32[2]{nowhere}", "f32"} {
		if _, err := ParseType(bad); err == nil {
			t.Fatalf("%q parsed", bad)
		}
	}
	for _, d := range AllDTypes {
		if p, err := ParseDType(d.LongName()); err != nil || p != d {
			t.Fatalf("long name %s", d.LongName())
		}
	}
}

func TestInferTypesErrors(t *testing.T) {
	f32 := TypeOf(Float32, 2, 3)
	cases := []struct {
		code  Code
		args  []Type
		attrs Attrs
		want  string
	}{
		{Add, []Type{f32, TypeOf(Float32, 3)}, nil, "shapes differ"},
		{Add, []Type{f32, TypeOf(Int32, 2, 3)}, nil, "dtypes differ"},
		{Exp, []Type{TypeOf(Int32, 2)}, nil, "needs a float dtype"},
		{Reshape, []Type{f32}, Attrs{"shape": []int{4}}, "cannot reshape"},
		{Transpose, []Type{f32}, Attrs{"perm": []int{0, 0}}, "not a permutation"},
		{ReduceSum, []Type{f32}, Attrs{"axes": []int{2}}, "bad axes"},
		{DotGeneral, []Type{f32, f32}, Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{1}}, ""},
		{DotGeneral, []Type{f32, f32}, Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}}, "contracting dim sizes differ"},
		{Slice, []Type{f32}, Attrs{"start": []int{0, 0}, "limit": []int{3, 3}, "strides": []int{1, 1}}, "bad range"},
		{Convert, []Type{f32}, Attrs{}, "missing attribute"},
		{Convert, []Type{f32}, Attrs{"dtype": Float64, "x": 1}, "unknown attribute"},
		{BroadcastInDim, []Type{TypeOf(Float32, 3)}, Attrs{"shape": []int{2, 4}, "dims": []int{1}}, "cannot broadcast"},
	}
	for _, c := range cases {
		out, err := InferTypes(c.code, c.args, c.attrs, nil)
		if c.want == "" {
			if err != nil || !out[0].Equal(TypeOf(Float32, 2, 2)) {
				t.Fatalf("%v: %v %v", c.code, out, err)
			}
			continue
		}
		if err == nil || !contains(err.Error(), c.want) {
			t.Fatalf("%v: error %v, want %q", c.code, err, c.want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

// TestTypeAppendText checks AppendText against String on random types.
func TestTypeAppendText(t *testing.T) {
	r := testseed.Rand(t, 5)
	for i := 0; i < 200; i++ {
		shape := make(Shape, r.IntN(5))
		for d := range shape {
			shape[d] = r.IntN(1000)
		}
		ty := Type{DType: AllDTypes[r.IntN(len(AllDTypes))], Shape: shape, Space: AllSpaces[r.IntN(len(AllSpaces))]}
		prefix := []byte("key:")
		if got := string(ty.AppendText(prefix)); got != "key:"+ty.String() {
			t.Fatalf("AppendText gave %q, want %q", got, "key:"+ty.String())
		}
	}
}
