package eval

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// ---- unary ----

type unaryCase struct {
	ref          func(float64) float64 // float reference in float64
	ulps, ulps64 float64               // tolerance for f16/bf16/f32 and for f64
	ulps32       float64               // tolerance for f32 when set (vmath's kernels: 2 ulp)
	dom          func(*rand.Rand) float64
	iref         func(dt ir.DType, x int64) int64
	bref         func(x int64) int64
}

// mostlyPositive draws from genFloat, made non-negative 80% of the time.
func mostlyPositive(r *rand.Rand) float64 {
	v := genFloat(r)
	if r.IntN(5) != 0 {
		v = math.Abs(v)
	}
	return v
}

func refSign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return x
}

func refLogistic(x float64) float64 {
	if x < 0 {
		e := math.Exp(x)
		return e / (1 + e)
	}
	return 1 / (1 + math.Exp(-x))
}

func isign(x int64) int64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

var unaryCases = map[ir.Code]unaryCase{
	ir.Neg: {ref: func(x float64) float64 { return -x },
		iref: func(dt ir.DType, x int64) int64 { return wrapTo(dt, -x) }},
	ir.Abs: {ref: math.Abs,
		iref: func(dt ir.DType, x int64) int64 {
			if x < 0 {
				x = -x
			}
			return wrapTo(dt, x)
		}},
	ir.Sign: {ref: refSign, iref: func(dt ir.DType, x int64) int64 { return wrapTo(dt, isign(x)) }},
	ir.Exp:  {ref: math.Exp, ulps: 1, ulps64: 2, ulps32: 2},
	ir.Log:  {ref: math.Log, ulps: 1, ulps64: 2, ulps32: 2, dom: mostlyPositive},
	ir.Log1p: {ref: func(x float64) float64 { return math.Log1p(x) }, ulps: 1, ulps64: 2,
		dom: func(r *rand.Rand) float64 { return mostlyPositive(r) - 0.5 }},
	ir.Expm1:    {ref: math.Expm1, ulps: 1, ulps64: 2},
	ir.Sqrt:     {ref: math.Sqrt, dom: mostlyPositive},
	ir.Rsqrt:    {ref: func(x float64) float64 { return 1 / math.Sqrt(x) }, ulps: 1, ulps64: 2, dom: mostlyPositive},
	ir.Tanh:     {ref: math.Tanh, ulps: 1, ulps64: 2, ulps32: 2},
	ir.Logistic: {ref: refLogistic, ulps: 1, ulps64: 2, ulps32: 2},
	ir.Sin:      {ref: math.Sin, ulps: 1, ulps64: 2},
	ir.Cos:      {ref: math.Cos, ulps: 1, ulps64: 2},
	ir.Erf:      {ref: math.Erf, ulps: 1, ulps64: 2, ulps32: 2},
	ir.Floor:    {ref: math.Floor},
	ir.Ceil:     {ref: math.Ceil},
	ir.Round: {ref: func(x float64) float64 {
		// half to even, computed from floor
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return x
		}
		f := math.Floor(x)
		d := x - f
		switch {
		case d > 0.5, d == 0.5 && math.Mod(f, 2) != 0:
			f++
		}
		if f == 0 && math.Signbit(x) {
			return math.Copysign(0, -1)
		}
		return f
	}},
	ir.Not: {iref: func(dt ir.DType, x int64) int64 { return wrapTo(dt, ^x) },
		bref: func(x int64) int64 { return 1 - x }},
}

func testUnary(t *testing.T, code ir.Code) {
	c, ok := unaryCases[code]
	require.True(t, ok, "no unary case for %v", code)
	r := newRand(t)
	dts := acceptedDTypes(code, func(dt ir.DType) ([]ir.Type, ir.Attrs) { return []ir.Type{ir.TypeOf(dt, 2)}, nil })
	require.NotEmpty(t, dts)
	for _, dt := range dts {
		for _, shape := range elemShapes {
			x := randLit(r, dt, shape, c.dom)
			res := runOp(t, code, []*ir.Literal{x}, nil)[0]
			for i := 0; i < shape.Size(); i++ {
				switch {
				case isFloat(dt):
					require.NotNil(t, c.ref, "%v accepts %v but the test has no float reference", code, dt)
					ulps := c.ulps
					if dt == ir.Float64 {
						ulps = c.ulps64
					}
					if dt == ir.Float32 && c.ulps32 > 0 {
						ulps = c.ulps32
					}
					in, got := getF(x, i), getF(res, i)
					want := refRound(c.ref(in), dt)
					require.True(t, closeTo(got, want, dt, ulps, true), "%v %v%v [%d]: %v(%g) = %g, want %g", code, dt, shape, i, code, in, got, want)
				case dt == ir.Bool:
					require.NotNil(t, c.bref, "%v accepts bool but the test has no bool reference", code)
					require.Equal(t, c.bref(getI(x, i)), getI(res, i), "%v bool [%d]", code, i)
				default:
					require.NotNil(t, c.iref, "%v accepts %v but the test has no integer reference", code, dt)
					in := getI(x, i)
					require.Equal(t, c.iref(dt, in), getI(res, i), "%v %v [%d]: input %d", code, dt, i, in)
				}
			}
		}
	}
}

// ---- binary ----

type binaryCase struct {
	ref          func(a, b float64) float64
	ulps, ulps64 float64
	noZeroSign   bool
	domA, domB   func(*rand.Rand) float64
	iref         func(dt ir.DType, a, b int64) int64
	bref         func(a, b int64) int64
	shiftAmounts bool
}

func width(dt ir.DType) int64 { return int64(dt.Size() * 8) }

// unsignedBits returns the bit pattern of v in dt as an unsigned number.
func unsignedBits(dt ir.DType, v int64) uint64 {
	return uint64(v) & (^uint64(0) >> (64 - uint(width(dt))))
}

// signedBits returns the bit pattern of v in dt read as a signed number.
func signedBits(dt ir.DType, v int64) int64 {
	switch dt.Size() {
	case 1:
		return int64(int8(v))
	case 4:
		return int64(int32(v))
	}
	return v
}

func refMaxMin(isMax bool) func(a, b float64) float64 {
	return func(a, b float64) float64 {
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		if (a > b) == isMax {
			return a
		}
		return b
	}
}

var binaryCases = map[ir.Code]binaryCase{
	ir.Add: {ref: func(a, b float64) float64 { return a + b }, iref: func(dt ir.DType, a, b int64) int64 { return wrapTo(dt, a+b) }},
	ir.Sub: {ref: func(a, b float64) float64 { return a - b }, iref: func(dt ir.DType, a, b int64) int64 { return wrapTo(dt, a-b) }},
	ir.Mul: {ref: func(a, b float64) float64 { return a * b }, iref: func(dt ir.DType, a, b int64) int64 { return wrapTo(dt, a*b) }},
	ir.Div: {ref: func(a, b float64) float64 { return a / b }, iref: func(dt ir.DType, a, b int64) int64 {
		if b == 0 {
			if dt.IsSigned() {
				return -1
			}
			return wrapTo(dt, math.MaxInt64) // all ones
		}
		if dt == ir.Int64 && a == math.MinInt64 && b == -1 {
			return math.MinInt64
		}
		return wrapTo(dt, a/b)
	}},
	ir.Pow: {ref: math.Pow, ulps: 1, ulps64: 2, domA: mostlyPositive,
		domB: func(r *rand.Rand) float64 {
			if r.IntN(10) == 0 {
				return genFloat(r)
			}
			return float64(r.IntN(13)-6) * 0.5
		}},
	ir.Max: {ref: refMaxMin(true), noZeroSign: true, iref: func(dt ir.DType, a, b int64) int64 { return max(a, b) }},
	ir.Min: {ref: refMaxMin(false), noZeroSign: true, iref: func(dt ir.DType, a, b int64) int64 { return min(a, b) }},
	ir.Rem: {ref: math.Mod, iref: func(dt ir.DType, a, b int64) int64 {
		if b == 0 {
			return a
		}
		if b == -1 {
			return 0
		}
		return a % b
	}},
	ir.And: {iref: func(dt ir.DType, a, b int64) int64 { return a & b }, bref: func(a, b int64) int64 { return a & b }},
	ir.Or:  {iref: func(dt ir.DType, a, b int64) int64 { return a | b }, bref: func(a, b int64) int64 { return a | b }},
	ir.Xor: {iref: func(dt ir.DType, a, b int64) int64 { return a ^ b }, bref: func(a, b int64) int64 { return a ^ b }},
	ir.ShiftLeft: {shiftAmounts: true, iref: func(dt ir.DType, a, b int64) int64 {
		s := unsignedBits(dt, b)
		if s >= uint64(width(dt)) {
			return 0
		}
		return wrapTo(dt, a<<s)
	}},
	ir.ShiftRightLogical: {shiftAmounts: true, iref: func(dt ir.DType, a, b int64) int64 {
		s := unsignedBits(dt, b)
		if s >= uint64(width(dt)) {
			return 0
		}
		return wrapTo(dt, int64(unsignedBits(dt, a)>>s))
	}},
	ir.ShiftRightArithmetic: {shiftAmounts: true, iref: func(dt ir.DType, a, b int64) int64 {
		s := unsignedBits(dt, b)
		if s >= uint64(width(dt)) {
			if signedBits(dt, a) < 0 {
				return wrapTo(dt, -1)
			}
			return 0
		}
		return wrapTo(dt, signedBits(dt, a)>>s)
	}},
}

func genShift(r *rand.Rand, dt ir.DType) int64 {
	if r.IntN(4) == 0 {
		return genInt(r, dt)
	}
	return wrapTo(dt, int64(r.IntN(int(width(dt))+3)))
}

func testBinary(t *testing.T, code ir.Code) {
	c, ok := binaryCases[code]
	require.True(t, ok, "no binary case for %v", code)
	r := newRand(t)
	dts := acceptedDTypes(code, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return []ir.Type{ir.TypeOf(dt, 2), ir.TypeOf(dt, 2)}, nil
	})
	require.NotEmpty(t, dts)
	for _, dt := range dts {
		for _, shape := range elemShapes {
			a := randLit(r, dt, shape, c.domA)
			b := randLit(r, dt, shape, c.domB)
			if c.shiftAmounts {
				for i := 0; i < shape.Size(); i++ {
					setI(b, i, genShift(r, dt))
				}
			}
			res := runOp(t, code, []*ir.Literal{a, b}, nil)[0]
			for i := 0; i < shape.Size(); i++ {
				switch {
				case isFloat(dt):
					require.NotNil(t, c.ref, "%v accepts %v but the test has no float reference", code, dt)
					ulps := c.ulps
					if dt == ir.Float64 {
						ulps = c.ulps64
					}
					x, y, got := getF(a, i), getF(b, i), getF(res, i)
					want := refRound(c.ref(x, y), dt)
					require.True(t, closeTo(got, want, dt, ulps, !c.noZeroSign), "%v %v%v [%d]: %v(%g, %g) = %g, want %g", code, dt, shape, i, code, x, y, got, want)
				case dt == ir.Bool:
					require.NotNil(t, c.bref, "%v accepts bool but the test has no bool reference", code)
					require.Equal(t, c.bref(getI(a, i), getI(b, i)), getI(res, i), "%v bool [%d]", code, i)
				default:
					require.NotNil(t, c.iref, "%v accepts %v but the test has no integer reference", code, dt)
					x, y := getI(a, i), getI(b, i)
					require.Equal(t, c.iref(dt, x, y), getI(res, i), "%v %v [%d]: %v(%d, %d)", code, dt, i, code, x, y)
				}
			}
		}
	}
}

// ---- comparisons ----

var compareRefs = map[ir.Code]func(a, b float64) bool{
	ir.Eq: func(a, b float64) bool { return a == b },
	ir.Ne: func(a, b float64) bool { return a != b },
	ir.Lt: func(a, b float64) bool { return a < b },
	ir.Le: func(a, b float64) bool { return a <= b },
	ir.Gt: func(a, b float64) bool { return a > b },
	ir.Ge: func(a, b float64) bool { return a >= b },
}

var compareIntRefs = map[ir.Code]func(a, b int64) bool{
	ir.Eq: func(a, b int64) bool { return a == b },
	ir.Ne: func(a, b int64) bool { return a != b },
	ir.Lt: func(a, b int64) bool { return a < b },
	ir.Le: func(a, b int64) bool { return a <= b },
	ir.Gt: func(a, b int64) bool { return a > b },
	ir.Ge: func(a, b int64) bool { return a >= b },
}

func testCompare(t *testing.T, code ir.Code) {
	fref, iref := compareRefs[code], compareIntRefs[code]
	r := newRand(t)
	dts := acceptedDTypes(code, func(dt ir.DType) ([]ir.Type, ir.Attrs) {
		return []ir.Type{ir.TypeOf(dt, 2), ir.TypeOf(dt, 2)}, nil
	})
	require.Len(t, dts, len(ir.AllDTypes))
	for _, dt := range dts {
		for _, shape := range elemShapes {
			a := randLit(r, dt, shape, nil)
			b := randLit(r, dt, shape, nil)
			// make some pairs equal
			for i := 0; i < shape.Size(); i += 3 {
				copy(elem(b, i), elem(a, i))
			}
			res := runOp(t, code, []*ir.Literal{a, b}, nil)[0]
			require.Equal(t, ir.Bool, res.Type.DType)
			for i := 0; i < shape.Size(); i++ {
				var want bool
				if isFloat(dt) {
					want = fref(getF(a, i), getF(b, i))
				} else {
					want = iref(getI(a, i), getI(b, i))
				}
				require.Equal(t, b2i(want), getI(res, i), "%v %v [%d]: %v vs %v", code, dt, i, getV(a, i), getV(b, i))
			}
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// ---- select ----

func testSelect(t *testing.T) {
	r := newRand(t)
	for _, dt := range ir.AllDTypes {
		for _, shape := range elemShapes {
			p := randLit(r, ir.Bool, shape, nil)
			a := randLit(r, dt, shape, nil)
			b := randLit(r, dt, shape, nil)
			res := runOp(t, ir.Select, []*ir.Literal{p, a, b}, nil)[0]
			for i := 0; i < shape.Size(); i++ {
				want := elem(b, i)
				if p.Data[i] != 0 {
					want = elem(a, i)
				}
				require.Equal(t, want, elem(res, i), "select %v [%d]", dt, i)
			}
		}
	}
}

// ---- convert ----

// genConvert draws values that exercise conversions: genFloat plus large
// magnitudes around integer limits.
func genConvert(r *rand.Rand) float64 {
	if r.IntN(4) == 0 {
		v := math.Exp2(r.Float64() * 70)
		if r.IntN(2) == 0 {
			v = -v
		}
		if r.IntN(2) == 0 {
			v = math.Trunc(v)
		}
		return v
	}
	return genFloat(r)
}

var intBounds = map[ir.DType][2]float64{
	ir.Uint8:  {0, math.MaxUint8},
	ir.Int32:  {math.MinInt32, math.MaxInt32},
	ir.Int64:  {math.MinInt64, math.MaxInt64},
	ir.Uint32: {0, math.MaxUint32},
}

// refFloatToInt truncates toward zero, saturates and maps NaN to 0.
func refFloatToInt(v float64, dt ir.DType) int64 {
	if math.IsNaN(v) {
		return 0
	}
	b := intBounds[dt]
	tr := math.Trunc(v)
	switch {
	case tr <= b[0]:
		return int64(b[0])
	case tr >= b[1]: // float64(MaxInt64) is 2^63
		if dt == ir.Int64 {
			return math.MaxInt64
		}
		return int64(b[1])
	}
	return int64(tr)
}

func testConvert(t *testing.T) {
	r := newRand(t)
	shapes := []ir.Shape{{}, {0}, {1, 1}, {3, 0}, {200}, {7, 9}}
	for _, sd := range ir.AllDTypes {
		for _, dd := range ir.AllDTypes {
			for _, shape := range shapes {
				x := randLit(r, sd, shape, genConvert)
				res := runOp(t, ir.Convert, []*ir.Literal{x}, ir.Attrs{"dtype": dd})[0]
				require.Equal(t, dd, res.Type.DType)
				for i := 0; i < shape.Size(); i++ {
					checkConverted(t, x, res, i)
				}
			}
		}
	}
}

// checkConverted compares element i of res with the reference conversion of
// element i of x, exactly.
func checkConverted(t *testing.T, x, res *ir.Literal, i int) {
	t.Helper()
	sd, dd := x.Type.DType, res.Type.DType
	if isFloat(sd) {
		v := getF(x, i)
		switch {
		case isFloat(dd):
			want := refRound(v, dd)
			got := getF(res, i)
			require.True(t, closeTo(got, want, dd, 0, true), "convert %v→%v of %g: got %g want %g", sd, dd, v, got, want)
		case dd == ir.Bool:
			require.Equal(t, b2i(v != 0), getI(res, i), "convert %v→bool of %g", sd, v)
		default:
			require.Equal(t, refFloatToInt(v, dd), getI(res, i), "convert %v→%v of %g", sd, dd, v)
		}
		return
	}
	v := getI(x, i)
	switch {
	case isFloat(dd):
		want := roundBig(new(big.Float).SetInt64(v), formatOf(dd))
		got := getF(res, i)
		require.True(t, closeTo(got, want, dd, 0, true), "convert %v→%v of %d: got %g want %g", sd, dd, v, got, want)
	case dd == ir.Bool:
		require.Equal(t, b2i(v != 0), getI(res, i), "convert %v→bool of %d", sd, v)
	default:
		require.Equal(t, wrapTo(dd, v), getI(res, i), "convert %v→%v of %d", sd, dd, v)
	}
}

// ---- bitcast_convert ----

func testBitcast(t *testing.T) {
	r := newRand(t)
	n := 0
	for _, sd := range ir.AllDTypes {
		for _, dd := range ir.AllDTypes {
			if _, err := ir.InferTypes(ir.BitcastConvert, []ir.Type{ir.TypeOf(sd, 3)}, ir.Attrs{"dtype": dd}, nil); err != nil {
				require.True(t, sd == ir.Bool || dd == ir.Bool || sd.Size() != dd.Size(), "%v→%v rejected", sd, dd)
				continue
			}
			n++
			for _, shape := range elemShapes {
				x := randLit(r, sd, shape, nil)
				res := runOp(t, ir.BitcastConvert, []*ir.Literal{x}, ir.Attrs{"dtype": dd})[0]
				require.Equal(t, dd, res.Type.DType)
				require.Equal(t, x.Data, res.Data)
			}
		}
	}
	require.Greater(t, n, 8)
}
