package trace_test

import (
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// otPromotionTable is JAX's type promotion table (jax.numpy.promote_types with
// 64-bit types enabled) restricted to Ferry's dtypes; row and column order as
// otPromotionOrder.
var otPromotionOrder = []ir.DType{ir.Bool, ir.Uint8, ir.Uint32, ir.Int32, ir.Int64, ir.Float16, ir.BFloat16, ir.Float32, ir.Float64}

var otPromotionTable = []string{
	//       bool  u8    u32   i32   i64   f16   bf16  f32   f64
	/*bool*/ "bool  u8    u32   i32   i64   f16   bf16  f32   f64",
	/*u8  */ "u8    u8    u32   i32   i64   f16   bf16  f32   f64",
	/*u32 */ "u32   u32   u32   i64   i64   f16   bf16  f32   f64",
	/*i32 */ "i32   i32   i64   i32   i64   f16   bf16  f32   f64",
	/*i64 */ "i64   i64   i64   i64   i64   f16   bf16  f32   f64",
	/*f16 */ "f16   f16   f16   f16   f16   f16   f32   f32   f64",
	/*bf16*/ "bf16  bf16  bf16  bf16  bf16  f32   bf16  f32   f64",
	/*f32 */ "f32   f32   f32   f32   f32   f32   f32   f32   f64",
	/*f64 */ "f64   f64   f64   f64   f64   f64   f64   f64   f64",
}

func TestOpsPromoteDTypes(t *testing.T) {
	for i, row := range otPromotionTable {
		fields := strings.Fields(row)
		if len(fields) != len(otPromotionOrder) {
			t.Fatalf("row %d has %d entries", i, len(fields))
		}
		for j, f := range fields {
			want, err := ir.ParseDType(f)
			if err != nil {
				t.Fatal(err)
			}
			a, b := otPromotionOrder[i], otPromotionOrder[j]
			if got := trace.PromoteDTypes(a, b); got != want {
				t.Errorf("PromoteDTypes(%v, %v) = %v, want %v", a, b, got, want)
			}
		}
	}
}

func TestOpsWeakPromotion(t *testing.T) {
	arr := func(dt ir.DType) *trace.Array { return otFrom(dt, []float64{1, 2}, 2) }
	wf, wi := trace.Scalar(1.5), trace.ScalarInt(3)
	if !wf.IsWeak() || !wi.IsWeak() || wf.DType() != ir.Float32 || wi.DType() != ir.Int32 {
		t.Fatalf("Scalar/ScalarInt: %v weak=%v, %v weak=%v", wf.Type(), wf.IsWeak(), wi.Type(), wi.IsWeak())
	}
	if trace.ScalarAs(1, ir.Float32).IsWeak() {
		t.Errorf("ScalarAs is weak")
	}
	cases := []struct {
		x, y *trace.Array
		want ir.DType
	}{
		{arr(ir.BFloat16), wf, ir.BFloat16},
		{arr(ir.Float16), wf, ir.Float16},
		{arr(ir.Float64), wf, ir.Float64},
		{arr(ir.Int32), wf, ir.Float32},
		{arr(ir.Uint8), wf, ir.Float32},
		{arr(ir.Int64), wf, ir.Float32},
		{arr(ir.Bool), wf, ir.Float32},
		{arr(ir.Uint8), wi, ir.Uint8},
		{arr(ir.Int64), wi, ir.Int64},
		{arr(ir.BFloat16), wi, ir.BFloat16},
		{arr(ir.Bool), wi, ir.Int32},
		{wf, wi, ir.Float32},
		{wi, wi, ir.Int32},
		{arr(ir.Int32), trace.ScalarAs(1, ir.Float16), ir.Float16}, // strong scalar: the lattice
		{arr(ir.Uint32), arr(ir.Int32), ir.Int64},
	}
	for _, c := range cases {
		if got := trace.ResultDType(c.x, c.y); got != c.want {
			t.Errorf("ResultDType(%v weak=%v, %v weak=%v) = %v, want %v", c.x.Type(), c.x.IsWeak(), c.y.Type(), c.y.IsWeak(), got, c.want)
		}
		if got := trace.ResultDType(c.y, c.x); got != c.want {
			t.Errorf("ResultDType is not symmetric for %v, %v", c.x.Type(), c.y.Type())
		}
		if c.want == ir.Bool {
			continue
		}
		sum := trace.Add(c.x, c.y)
		if sum.DType() != c.want {
			t.Errorf("Add(%v, %v) has dtype %v, want %v", c.x.Type(), c.y.Type(), sum.DType(), c.want)
		}
		if sum.IsWeak() != (c.x.IsWeak() && c.y.IsWeak()) {
			t.Errorf("Add(%v weak=%v, %v weak=%v) weak=%v", c.x.Type(), c.x.IsWeak(), c.y.Type(), c.y.IsWeak(), sum.IsWeak())
		}
	}
	// Values: a weak float meets an f64 array as its exact float64 value.
	got := trace.Add(otFrom(ir.Float64, []float64{1, 2}, 2), trace.Scalar(0.1)).Float64s()
	if got[0] != 1+0.1 || got[1] != 2+0.1 {
		t.Errorf("f64 + Scalar(0.1) = %v, want [1.1 2.1] exactly", got)
	}
	if v := trace.Convert(trace.Scalar(0.1), ir.Float64).Item(); v != 0.1 {
		t.Errorf("Convert(Scalar(0.1), f64) = %v, want 0.1 exactly", v)
	}
	if c := trace.Convert(trace.Scalar(2), ir.Float32); c.IsWeak() || c.Item() != 2 {
		t.Errorf("Convert(Scalar(2), f32) = %v weak=%v, want strong 2", c, c.IsWeak())
	}
	// Weak results of weak operands.
	if w := trace.Neg(trace.Scalar(2)); !w.IsWeak() || w.Item() != -2 {
		t.Errorf("Neg(Scalar(2)) = %v weak=%v", w, w.IsWeak())
	}
	if w := trace.Mul(trace.Scalar(2), trace.Scalar(3)); !w.IsWeak() || w.Item() != 6 {
		t.Errorf("Mul(Scalar(2), Scalar(3)) = %v weak=%v", w, w.IsWeak())
	}
	// Integer array and weak float: the array is promoted to f32.
	got = trace.Mul(otFrom(ir.Int32, []float64{1, 3}, 2), trace.Scalar(0.5)).Float64s()
	if got[0] != 0.5 || got[1] != 1.5 {
		t.Errorf("i32 * Scalar(0.5) = %v", got)
	}
	otExpectError(t, "Add", func() { trace.Add(arr(ir.Uint8), trace.ScalarInt(300)) }, "overflows u8")
	otExpectError(t, "ScalarInt", func() { trace.ScalarInt(1 << 40) }, "does not fit")
}

// TestOpsWeakTraced checks weak scalars under tracing: a concrete weak scalar
// becomes a constant of the other operand's dtype, a traced weak value is
// converted by an op.
func TestOpsWeakTraced(t *testing.T) {
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		return trace.Add(a[0], trace.Scalar(0.1))
	}, ir.TypeOf(ir.Float64, 3))
	codes := otCodes(ops)
	if out.DType() != ir.Float64 || codes[ir.Convert] != 0 || codes[ir.Constant] != 1 {
		t.Fatalf("f64 + Scalar(0.1) traced %v, result %v", codes, out.Type())
	}
	for _, op := range ops {
		if op.Code == ir.Constant {
			l := op.Attrs.Literal("value")
			if l.Type.DType != ir.Float64 || l.Float64At(0) != 0.1 {
				t.Errorf("constant %v %v, want f64 0.1", l.Type, l.Float64At(0))
			}
		}
	}
	ops, out = otTrace(func(a ...*trace.Array) *trace.Array {
		w := trace.Neg(trace.Scalar(2)) // traced and weak
		if !w.IsTraced() || !w.IsWeak() {
			t.Errorf("Neg(Scalar(2)) in a trace: traced=%v weak=%v", w.IsTraced(), w.IsWeak())
		}
		return trace.Add(a[0], w)
	}, ir.TypeOf(ir.BFloat16, 3))
	if codes := otCodes(ops); out.DType() != ir.BFloat16 || codes[ir.Convert] != 1 {
		t.Errorf("bf16 + traced weak scalar recorded %v, result %v", codes, out.Type())
	}
}
