package eval

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/big"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// ---- seeds ----

// newRand returns a generator seeded from the test's seed (internal/testkit/testseed:
// fresh, or $FERRY_TEST_SEED; printed when the test fails).
func newRand(t *testing.T) *rand.Rand {
	t.Helper()
	return testseed.Rand(t, 0x9e3779b97f4a7c15)
}

// ---- op coverage registry ----

var (
	testedMu sync.Mutex
	testedBy = map[string]map[ir.Code]bool{} // test name → codes it ran
)

func markTested(t *testing.T, f *ir.Func) {
	testedMu.Lock()
	defer testedMu.Unlock()
	m := testedBy[t.Name()]
	if m == nil {
		m = map[ir.Code]bool{}
		testedBy[t.Name()] = m
	}
	f.Body.Walk(func(op *ir.Op) { m[op.Code] = true })
}

func ranCode(t *testing.T, c ir.Code) bool {
	testedMu.Lock()
	defer testedMu.Unlock()
	return testedBy[t.Name()][c]
}

// ---- building and running ----

// runOp builds a one-op function over parameters of the given literals' types,
// runs it, checks the results, and returns them.
func runOp(t *testing.T, code ir.Code, args []*ir.Literal, attrs ir.Attrs) []*ir.Literal {
	t.Helper()
	f := ir.NewFunc(code.String())
	var ps []*ir.Value
	for _, a := range args {
		ps = append(ps, f.Body.AddParam(a.Type))
	}
	op, err := f.Body.AddOp(code, ps, attrs)
	require.NoError(t, err)
	op.Loc = "test.go:1"
	f.Body.Results = op.Results
	return runFunc(t, f, args)
}

// runFunc runs f, checks result types and that no result shares memory with
// an argument or another result, and records the codes of f as tested.
func runFunc(t *testing.T, f *ir.Func, args []*ir.Literal) []*ir.Literal {
	t.Helper()
	before := make([][]byte, len(args))
	for i, a := range args {
		before[i] = append([]byte(nil), a.Data...)
	}
	res, err := Run(f, args)
	require.NoError(t, err)
	require.Len(t, res, len(f.Body.Results))
	for i, r := range res {
		require.True(t, r.Type.EqualUnsharded(f.Body.Results[i].Type), "result %d is %v, want %v", i, r.Type, f.Body.Results[i].Type)
		require.Nil(t, r.Type.Sharding, "result %d: eval's literals carry no sharding", i)
		require.Equal(t, int(r.Type.Bytes()), len(r.Data))
		for j, a := range args {
			require.False(t, overlap(r.Data, a.Data), "result %d aliases argument %d", i, j)
		}
		for j := 0; j < i; j++ {
			require.False(t, overlap(r.Data, res[j].Data), "results %d and %d alias", j, i)
		}
	}
	for i, a := range args {
		require.True(t, bytes.Equal(before[i], a.Data), "argument %d was modified", i)
	}
	checkInto(t, f, args, res)
	markTested(t, f)
	return res
}

func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(&a[0]))
	b0 := uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// ---- float formats (independent of ir's conversions) ----

type floatFmt struct {
	ebits, mbits int // exponent and stored mantissa bits
	emin         int // exponent of the smallest normal
	maxFinite    float64
}

var (
	fmtF16  = floatFmt{5, 10, -14, 65504}
	fmtBF16 = floatFmt{8, 7, -126, 0x1.fep127}
	fmtF32  = floatFmt{8, 23, -126, math.MaxFloat32}
	fmtF64  = floatFmt{11, 52, -1022, math.MaxFloat64}
)

func formatOf(dt ir.DType) floatFmt {
	switch dt {
	case ir.Float16:
		return fmtF16
	case ir.BFloat16:
		return fmtBF16
	case ir.Float32:
		return fmtF32
	case ir.Float64:
		return fmtF64
	}
	panic("not a float dtype: " + dt.String())
}

// roundBig rounds x to the format with a single round-to-nearest-even, using
// math/big: a precision of mbits+1 in the normal range, a fixed quantum of
// 2^(emin-mbits) below it, and ±Inf beyond the largest finite value.
func roundBig(x *big.Float, f floatFmt) float64 {
	if x.IsInf() {
		v, _ := x.Float64()
		return v
	}
	if x.Sign() == 0 {
		if x.Signbit() {
			return math.Copysign(0, -1)
		}
		return 0
	}
	neg := x.Signbit()
	exp := x.MantExp(nil) - 1 // x = 1.f × 2^exp
	var r *big.Float
	if exp >= f.emin {
		r = new(big.Float).SetPrec(uint(f.mbits + 1)).SetMode(big.ToNearestEven).Set(x)
	} else {
		q := f.emin - f.mbits
		scaled := new(big.Float).SetPrec(0).SetMantExp(x, -q) // exact
		scaled.Abs(scaled)
		ip, _ := scaled.Int(nil) // truncates
		frac := new(big.Float).Sub(scaled, new(big.Float).SetInt(ip))
		switch c := frac.Cmp(big.NewFloat(0.5)); {
		case c > 0, c == 0 && ip.Bit(0) == 1:
			ip.Add(ip, big.NewInt(1))
		}
		r = new(big.Float).SetMantExp(new(big.Float).SetInt(ip), q)
		if neg {
			r.Neg(r)
		}
	}
	v, _ := r.Float64()
	if math.Abs(v) > f.maxFinite {
		if neg {
			return math.Inf(-1)
		}
		return math.Inf(1)
	}
	if v == 0 && neg {
		return math.Copysign(0, -1)
	}
	return v
}

// refRound rounds a float64 to dt's format (identity for f64), NaN staying NaN.
func refRound(v float64, dt ir.DType) float64 {
	if dt == ir.Float64 || math.IsNaN(v) {
		return v
	}
	return roundBig(new(big.Float).SetFloat64(v), formatOf(dt))
}

// encodeSmall returns the bits of an exactly representable value v in a 16-bit
// format, computed with integer scaling.
func encodeSmall(v float64, f floatFmt) uint16 {
	var sign uint16
	if math.Signbit(v) {
		sign = 1 << (f.ebits + f.mbits)
	}
	expAll := uint16(1<<f.ebits-1) << f.mbits
	switch {
	case math.IsNaN(v):
		return sign | expAll | 1<<(f.mbits-1)
	case math.IsInf(v, 0):
		return sign | expAll
	case v == 0:
		return sign
	}
	a := math.Abs(v)
	_, e := math.Frexp(a)
	exp := e - 1
	bias := 1<<(f.ebits-1) - 1
	if exp < f.emin {
		m := math.Ldexp(a, f.mbits-f.emin)
		if m != math.Trunc(m) {
			panic(fmt.Sprintf("encodeSmall: %g not representable", v))
		}
		return sign | uint16(m)
	}
	m := math.Ldexp(a, f.mbits-exp)
	if m != math.Trunc(m) {
		panic(fmt.Sprintf("encodeSmall: %g not representable", v))
	}
	return sign | uint16(exp+bias)<<f.mbits | (uint16(m) - 1<<f.mbits)
}

// decodeSmall returns the value of the bits h in a 16-bit format.
func decodeSmall(h uint16, f floatFmt) float64 {
	sign := 1.0
	if h>>(f.ebits+f.mbits) != 0 {
		sign = -1
	}
	ex := int(h>>f.mbits) & (1<<f.ebits - 1)
	m := float64(h & (1<<f.mbits - 1))
	bias := 1<<(f.ebits-1) - 1
	switch ex {
	case 0:
		return sign * m * math.Pow(2, float64(f.emin-f.mbits))
	case 1<<f.ebits - 1:
		if m != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + m/math.Pow(2, float64(f.mbits))) * math.Pow(2, float64(ex-bias))
}

// ---- literal encode / decode (independent of ir's views) ----

func isFloat(dt ir.DType) bool { return dt.IsFloat() }

// setF stores an exactly representable float value (already rounded) at i.
func setF(l *ir.Literal, i int, v float64) {
	b := l.Data
	switch l.Type.DType {
	case ir.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], encodeSmall(v, fmtF16))
	case ir.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], encodeSmall(v, fmtBF16))
	case ir.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case ir.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	default:
		panic("setF on " + l.Type.DType.String())
	}
}

// getF returns the exact value of float element i.
func getF(l *ir.Literal, i int) float64 {
	b := l.Data
	switch l.Type.DType {
	case ir.Float16:
		return decodeSmall(binary.LittleEndian.Uint16(b[2*i:]), fmtF16)
	case ir.BFloat16:
		return decodeSmall(binary.LittleEndian.Uint16(b[2*i:]), fmtBF16)
	case ir.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case ir.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	panic("getF on " + l.Type.DType.String())
}

// wrapTo reduces v modulo 2^width into dt's range (two's complement).
func wrapTo(dt ir.DType, v int64) int64 { return randprog.Wrap(dt, v) }

func setI(l *ir.Literal, i int, v int64) {
	b := l.Data
	switch l.Type.DType {
	case ir.Bool:
		b[i] = uint8(wrapTo(ir.Bool, v))
	case ir.Uint8:
		b[i] = uint8(v)
	case ir.Int32, ir.Uint32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case ir.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	default:
		panic("setI on " + l.Type.DType.String())
	}
}

func getI(l *ir.Literal, i int) int64 {
	b := l.Data
	switch l.Type.DType {
	case ir.Bool, ir.Uint8:
		return int64(b[i])
	case ir.Int32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case ir.Uint32:
		return int64(binary.LittleEndian.Uint32(b[4*i:]))
	case ir.Int64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	panic("getI on " + l.Type.DType.String())
}

// getV returns element i as float64 (floats exactly, integers converted).
func getV(l *ir.Literal, i int) float64 {
	if isFloat(l.Type.DType) {
		return getF(l, i)
	}
	return float64(getI(l, i))
}

// elem returns the raw bytes of element i.
func elem(l *ir.Literal, i int) []byte {
	s := l.Type.DType.Size()
	return l.Data[i*s : (i+1)*s]
}

func lit(t ir.Type) *ir.Literal { return ir.NewLiteral(t) }

// ---- random values ----

// genFloat draws a float64 from a mix of ordinary values, integers and
// halves (rounding ties), wide magnitudes and special values
// (randprog.SpecialFloat).
func genFloat(r *rand.Rand) float64 { return randprog.SpecialFloat(r) }

// genInt draws an integer of dt: small values, random bit patterns and
// extremes (randprog.SpecialInt).
func genInt(r *rand.Rand, dt ir.DType) int64 { return randprog.SpecialInt(r, dt) }

// randLit fills a literal of dt and shape with random values: floats drawn
// from fgen (nil: genFloat) and rounded to dt by refRound, integers from
// genInt, bools 0/1.
func randLit(r *rand.Rand, dt ir.DType, shape ir.Shape, fgen func(*rand.Rand) float64) *ir.Literal {
	if fgen == nil {
		fgen = genFloat
	}
	v := randprog.Values{Special: true, FloatFunc: func(r *rand.Rand) float64 { return refRound(fgen(r), dt) }}
	return v.Literal(r, ir.Type{DType: dt, Shape: shape})
}

// ---- comparison ----

func ulpOf(v float64, f floatFmt) float64 {
	e := f.emin
	if a := math.Abs(v); a != 0 && !math.IsInf(a, 0) {
		_, fe := math.Frexp(a)
		e = max(fe-1, f.emin)
	}
	return math.Ldexp(1, e-f.mbits)
}

// closeTo reports whether got is within ulps units in the last place of dt
// from want (exact equality, zero sign included, when ulps is 0 and
// zeroSign). NaN matches NaN; the largest finite value is one ulp from Inf.
func closeTo(got, want float64, dt ir.DType, ulps float64, zeroSign bool) bool {
	if math.IsNaN(want) || math.IsNaN(got) {
		return math.IsNaN(want) && math.IsNaN(got)
	}
	f := formatOf(dt)
	if math.IsInf(want, 0) || math.IsInf(got, 0) {
		if got == want {
			return true
		}
		if ulps >= 1 && math.Signbit(got) == math.Signbit(want) {
			fin := want
			if math.IsInf(want, 0) {
				fin = got
			}
			return math.Abs(fin) == f.maxFinite
		}
		return false
	}
	if ulps == 0 {
		return got == want && (!zeroSign || want != 0 || math.Signbit(got) == math.Signbit(want))
	}
	return math.Abs(got-want) <= ulps*ulpOf(want, f)
}

// shapes used by elementwise tests: scalar, size-1, empty and ordinary.
var elemShapes = []ir.Shape{{}, {1}, {0}, {5}, {3, 1, 4}, {2, 0, 3}, {1, 1}, {17, 19}}

// acceptedDTypes returns the dtypes for which the op's shape rule accepts
// operands built by mk.
func acceptedDTypes(code ir.Code, mk func(dt ir.DType) ([]ir.Type, ir.Attrs)) []ir.DType {
	var out []ir.DType
	for _, dt := range ir.AllDTypes {
		ts, attrs := mk(dt)
		if _, err := ir.InferTypes(code, ts, attrs, nil); err == nil {
			out = append(out, dt)
		}
	}
	return out
}

// unravel returns the multi-index of flat index i in shape.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// ravel returns the flat index of multi-index idx in shape.
func ravel(idx []int, shape []int) int {
	f := 0
	for d := range shape {
		f = f*shape[d] + idx[d]
	}
	return f
}
