package eval

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/ir"
)

// TestOpTableReference is the CPU meta-test of the op table: every float
// elementwise op (one whose dtype rule accepts floats) has a reference
// function, and eval computes it: exactly in float64, and in float32 within
// 2 ulp of the reference rounded to float32 (vmath's bound), on fresh
// random operands in (0.05, 3), inside every op's domain.
func TestOpTableReference(t *testing.T) {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const n = 257
	for _, code := range ir.AllCodes() {
		info := code.Info()
		if (info.Class != ir.ClassUnary && info.Class != ir.ClassBinary) || !info.DTypes.OK(ir.Float64) {
			continue
		}
		if (info.NumArgs == 1) != (info.Ref1 != nil) || (info.NumArgs == 2) != (info.Ref2 != nil) {
			t.Errorf("%v: float elementwise op without its reference function (Ref1 or Ref2) in the op table", code)
			continue
		}
		xs := make([][]float64, info.NumArgs)
		for i := range xs {
			xs[i] = make([]float64, n)
			for j := range xs[i] {
				xs[i][j] = 0.05 + 2.95*rng.Float64()
				if j%7 == 0 {
					xs[i][j] = -xs[i][j] // negative operands where the domain allows
				}
			}
		}
		for _, dt := range []ir.DType{ir.Float64, ir.Float32} {
			f := ir.NewFunc("ref")
			var args []*ir.Value
			var lits []*ir.Literal
			for i := range xs {
				args = append(args, f.Body.AddParam(ir.TypeOf(dt, n)))
				l := ir.NewLiteral(ir.TypeOf(dt, n))
				for j, v := range xs[i] {
					if dt == ir.Float32 {
						ir.View[float32](l)[j] = float32(v)
					} else {
						ir.View[float64](l)[j] = v
					}
				}
				lits = append(lits, l)
			}
			op, err := f.Body.AddOp(code, args, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := EvalOp(op, lits)
			if err != nil {
				t.Errorf("%v on %v: %v", code, dt, err)
				continue
			}
			for j := 0; j < n; j++ {
				arg := func(i int) float64 { return lits[i].Float64At(j) }
				var want float64
				if info.NumArgs == 1 {
					want = info.Ref1(arg(0))
				} else {
					want = info.Ref2(arg(0), arg(1))
				}
				got := res[0].Float64At(j)
				if math.IsNaN(want) && math.IsNaN(got) {
					continue
				}
				tol := 0.0
				if dt == ir.Float32 {
					w32 := float32(want)
					want = float64(w32)
					tol = 2 * float64(math.Nextafter32(float32(math.Abs(float64(w32))), float32(math.Inf(1)))-float32(math.Abs(float64(w32))))
				}
				if math.Abs(got-want) > tol {
					t.Errorf("%v on %v at %v: got %v, reference %v", code, dt, []float64{arg(0), arg(len(lits) - 1)}, got, want)
					break
				}
			}
		}
	}
}

// TestOpTableLowerings fails when the op table names a vmath kernel
// (Lowering.VMath) that vmath lacks or whose arity differs from the op's.
func TestOpTableLowerings(t *testing.T) {
	for _, code := range ir.AllCodes() {
		name := code.Info().Lower.VMath
		if name == "" {
			continue
		}
		op := vmath.OpByName(name)
		if op == 0 || VMathOp(code) != op {
			t.Errorf("%v: the op table names vmath op %q, which vmath lacks", code, name)
			continue
		}
		u, b := F32Kernels(code)
		if (u != nil) != (code.Info().NumArgs == 1) || (b != nil) != (code.Info().NumArgs == 2) {
			t.Errorf("%v: vmath op %q has the wrong arity", code, name)
		}
	}
}
