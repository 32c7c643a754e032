package trace_test

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

func otFill(v float64, shape ...int) otTensor {
	t := otNew(shape...)
	for i := range t.data {
		t.data[i] = v
	}
	return t
}

func TestOpsCreate(t *testing.T) {
	for _, dt := range ir.AllDTypes {
		for _, s := range otShapes {
			name := func(op string) string { return otName(op, dt, ir.Shape(s)) }
			otCheck(t, name("Full"), trace.Full(ir.Shape(s), 2.5, dt), dt, otFill(2.5, s...), 0)
			otCheck(t, name("Zeros"), trace.Zeros(ir.Shape(s), dt), dt, otFill(0, s...), 0)
			otCheck(t, name("Ones"), trace.Ones(ir.Shape(s), dt), dt, otFill(1, s...), 0)
			like := trace.Full(ir.Shape(s), 7, dt)
			otCheck(t, name("ZerosLike"), trace.ZerosLike(like), dt, otFill(0, s...), 0)
			otCheck(t, name("OnesLike"), trace.OnesLike(like), dt, otFill(1, s...), 0)
			otCheck(t, name("FullLike"), trace.FullLike(like, -3), dt, otFill(-3, s...), 0)
		}
		otCheck(t, otName("ScalarAs", dt), trace.ScalarAs(3.25, dt), dt, otFill(3.25), 0)
		eye := otNew(3, 3)
		for i := 0; i < 3; i++ {
			eye.data[i*3+i] = 1
		}
		otCheck(t, otName("Eye", dt), trace.Eye(3, dt), dt, eye, 0)
		if dt == ir.Bool {
			continue
		}
		for _, s := range [][]int{{4}, {2, 3}, {3, 0, 2}} {
			for dim := -len(s); dim < len(s); dim++ {
				want := otNew(s...)
				d := (dim + len(s)) % len(s)
				for i := range want.data {
					want.data[i] = float64(otUnravel(i, s)[d])
				}
				otCheck(t, otName("Iota", dt, ir.Shape(s), dim), trace.Iota(dt, ir.Shape(s), dim), dt, want, 0)
			}
		}
		ar := otNew(6)
		for i := range ar.data {
			ar.data[i] = float64(i)
		}
		otCheck(t, otName("Arange", dt), trace.Arange(6, dt), dt, ar, 0)
	}
	otCheck(t, "Eye/0", trace.Eye(0, ir.Float32), ir.Float32, otNew(0, 0), 0)
	otCheck(t, "Const", trace.Const([]int32{1, 2, 3, 4, 5, 6}, 2, 3), ir.Int32, otTensor{[]int{2, 3}, []float64{1, 2, 3, 4, 5, 6}}, 0)
	otCheck(t, "Const/1d", trace.Const([]float64{0.5, 1}), ir.Float64, otTensor{[]int{2}, []float64{0.5, 1}}, 0)
	otCheck(t, "Const/bf16", trace.Const([]ir.BF16{ir.BF16FromFloat64(1.5)}), ir.BFloat16, otTensor{[]int{1}, []float64{1.5}}, 0)
	otCheck(t, "Const/scalar", trace.Const([]bool{true}, []int{}...), ir.Bool, otTensor{[]int{}, []float64{1}}, 0)
	if s := trace.Scalar(1.5); s.Item() != 1.5 || s.DType() != ir.Float32 || s.Rank() != 0 {
		t.Errorf("Scalar(1.5) = %v", s)
	}

	otExpectError(t, "Const", func() { trace.Const([]float32{1, 2, 3}, 2, 2) }, "holds 4 elements, got 3")
	otExpectError(t, "Full", func() { trace.Full(ir.Shape{2, -1}, 0, ir.Float32) }, "negative dimension")
	otExpectError(t, "Iota", func() { trace.Iota(ir.Int32, ir.Shape{2, 3}, 2) }, "dim 2 out of range")
	otExpectError(t, "Iota", func() { trace.Iota(ir.Bool, ir.Shape{2}, 0) }, "numeric")
	otExpectError(t, "Arange", func() { trace.Arange(-1, ir.Int32) }, "negative")
}

// TestOpsCreateTraced checks that Zeros and friends inside a trace record a
// scalar constant and a broadcast, never a large literal.
func TestOpsCreateTraced(t *testing.T) {
	ops, out := otTrace(func(a ...*trace.Array) *trace.Array {
		z := trace.Zeros(ir.Shape{1024, 1024}, ir.Float32)
		o := trace.OnesLike(a[0])
		e := trace.Eye(4, ir.Float32)
		i := trace.Iota(ir.Int32, ir.Shape{4, 4}, 1)
		return trace.Add(trace.Add(trace.Sum(z), trace.Sum(o)), trace.Sum(trace.Add(e, i)))
	}, ir.TypeOf(ir.Float32, 512, 512))
	if !out.IsTraced() {
		t.Fatalf("result %v is not traced", out)
	}
	codes := otCodes(ops)
	if codes[ir.Constant] < 2 || codes[ir.BroadcastInDim] < 2 || codes[ir.Iota] < 3 {
		t.Errorf("recorded %v", codes)
	}
	for _, op := range ops {
		if op.Code == ir.Constant && op.Attrs.Literal("value").Type.Size() > 1 {
			t.Errorf("constant of %v: Zeros/Ones must not build large literals", op.Attrs.Literal("value").Type)
		}
	}
}
