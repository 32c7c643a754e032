package randprog

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
)

var kitDTypes = []ir.DType{ir.Bool, ir.Uint8, ir.Int32, ir.Int64, ir.Uint32, ir.Float16, ir.BFloat16, ir.Float32, ir.Float64}

// intAt reads integer element i of l through a typed view.
func intAt(l *ir.Literal, i int) int64 {
	switch l.Type.DType {
	case ir.Int32:
		return int64(ir.View[int32](l)[i])
	case ir.Uint32:
		return int64(ir.View[uint32](l)[i])
	case ir.Int64:
		return ir.View[int64](l)[i]
	}
	return int64(l.Data[i]) // bool, u8
}

// Elements drawn from ranges lie in them, bools are 0/1, integers are
// integers; ByDType overrides the range of its dtype only.
func TestValuesRanges(t *testing.T) {
	rng := testseed.Rand(t, 1)
	v := Values{Float: Range{-3, 3}, Int: Range{-10, 11}, Uint: Range{0, 40}, ByDType: map[ir.DType]Range{ir.Uint8: {0, 256}}}
	want := map[ir.DType][2]float64{
		ir.Bool: {0, 1}, ir.Uint8: {0, 255}, ir.Uint32: {0, 39}, ir.Int32: {-10, 10}, ir.Int64: {-10, 10},
		ir.Float16: {-3, 3}, ir.BFloat16: {-3, 3}, ir.Float32: {-3, 3}, ir.Float64: {-3, 3},
	}
	for _, dt := range kitDTypes {
		l := v.Literal(rng, ir.TypeOf(dt, 4000))
		lo, hi := math.Inf(1), math.Inf(-1)
		for i := range l.Type.Size() {
			x := l.Float64At(i)
			if !dt.IsFloat() && x != float64(intAt(l, i)) {
				t.Fatalf("%v element %d: %v is not the stored integer %d", dt, i, x, intAt(l, i))
			}
			if !dt.IsFloat() && x != math.Trunc(x) {
				t.Fatalf("%v element %d: %v", dt, i, x)
			}
			lo, hi = min(lo, x), max(hi, x)
		}
		w := want[dt]
		if lo < w[0] || hi > w[1] {
			t.Errorf("%v: values in [%v, %v], want within [%v, %v]", dt, lo, hi, w[0], w[1])
		}
		if !dt.IsFloat() && (lo != w[0] || hi != w[1]) {
			t.Errorf("%v: values in [%v, %v] over 4000 draws, want both ends %v", dt, lo, hi, w)
		}
	}
}

// Special values: NaN, both infinities, both zeros, subnormal-range and
// huge floats; integer extremes stored exactly (never through float64).
func TestValuesSpecial(t *testing.T) {
	rng := testseed.Rand(t, 2)
	v := Values{Special: true}
	l := v.Literal(rng, ir.TypeOf(ir.Float64, 4000))
	seen := map[string]bool{}
	for i := range l.Type.Size() {
		x := l.Float64At(i)
		switch {
		case math.IsNaN(x):
			seen["nan"] = true
		case math.IsInf(x, 1):
			seen["+inf"] = true
		case math.IsInf(x, -1):
			seen["-inf"] = true
		case x == 0 && math.Signbit(x):
			seen["-0"] = true
		case x == 0:
			seen["+0"] = true
		case math.Abs(x) < 0x1p-100:
			seen["tiny"] = true
		case math.Abs(x) > 1e100:
			seen["huge"] = true
		}
	}
	for _, k := range []string{"nan", "+inf", "-inf", "-0", "+0", "tiny", "huge"} {
		if !seen[k] {
			t.Errorf("no %s among 4000 special floats", k)
		}
	}
	for _, dt := range []ir.DType{ir.Int64, ir.Int32, ir.Uint32, ir.Uint8} {
		l := v.Literal(rng, ir.TypeOf(dt, 4000))
		ext := map[int64]bool{}
		for i := range l.Type.Size() {
			ext[intAt(l, i)] = true
		}
		for _, want := range []int64{Wrap(dt, math.MaxInt64), Wrap(dt, math.MinInt64), Wrap(dt, math.MinInt32), Wrap(dt, -1)} {
			if !ext[want] {
				t.Errorf("%v: no %d among 4000 special integers", dt, want)
			}
		}
	}
}

// Default draws what RandomLiteral always drew: the same elements for the
// same seed as this independent transcription of its old body.
func TestDefaultUnchanged(t *testing.T) {
	seed := testseed.Uint64(t)
	for _, dt := range kitDTypes {
		typ := ir.TypeOf(dt, 300)
		got := RandomLiteral(rand.New(rand.NewPCG(seed, 3)), typ)
		rng := rand.New(rand.NewPCG(seed, 3))
		for i := range typ.Size() {
			var want float64
			switch {
			case dt == ir.Bool:
				want = float64(rng.IntN(2))
			case dt.IsUnsigned():
				want = float64(rng.IntN(11))
			case dt.IsInteger():
				want = float64(rng.IntN(11) - 5)
			case rng.IntN(4) == 0:
				want = float64(rng.IntN(5) - 2)
			default:
				want = rng.Float64()*4 - 2
			}
			w := ir.NewLiteral(ir.TypeOf(dt, 1))
			w.SetFloat64At(0, want)
			if g := got.Float64At(i); g != w.Float64At(0) {
				t.Fatalf("%v element %d: %v, want %v", dt, i, g, w.Float64At(0))
			}
		}
	}
}
