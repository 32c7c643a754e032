package eval

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

func addFunc(t testing.TB, ty ir.Type) *ir.Func {
	f := ir.NewFunc("add")
	a, b := f.Body.AddParam(ty), f.Body.AddParam(ty)
	op := addOp(t, f.Body, ir.Add, []*ir.Value{a, b}, nil)
	op.Loc = "model.go:42"
	f.Body.Results = op.Results
	return f
}

func TestRunArgumentErrors(t *testing.T) {
	ty := ir.TypeOf(ir.Float32, 2)
	f := addFunc(t, ty)
	good := f32Lit(t, ir.Shape{2}, []float32{1, 2})

	_, err := Run(f, []*ir.Literal{good})
	require.ErrorContains(t, err, "takes 2 arguments")

	_, err = Run(f, []*ir.Literal{good, f32Lit(t, ir.Shape{1, 2}, []float32{1, 2})})
	require.ErrorContains(t, err, "f32[1,2]")

	i32, _ := ir.LiteralOf(ir.Shape{2}, []int32{1, 2})
	_, err = Run(f, []*ir.Literal{good, i32})
	require.ErrorContains(t, err, "i32[2]")

	pinned := good.Clone()
	pinned.Type.Space = ir.PinnedHost
	_, err = Run(f, []*ir.Literal{good, pinned})
	require.ErrorContains(t, err, "pinned_host")

	short := &ir.Literal{Type: ty, Data: make([]byte, 4)}
	_, err = Run(f, []*ir.Literal{good, short})
	require.ErrorContains(t, err, "bytes")

	_, err = Run(f, []*ir.Literal{good, nil})
	require.Error(t, err)

	_, err = Run(nil, nil)
	require.Error(t, err)

	res, err := Run(f, []*ir.Literal{good, good})
	require.NoError(t, err)
	require.Equal(t, []float32{2, 4}, ir.View[float32](res[0]))
}

func TestEvalOpErrorsNameTheOp(t *testing.T) {
	ty := ir.TypeOf(ir.Float32, 2)
	f := addFunc(t, ty)
	op := f.Body.Ops[0]
	x := f32Lit(t, ir.Shape{2}, []float32{1, 2})

	// operand type mismatch
	_, err := EvalOp(op, []*ir.Literal{x, f32Lit(t, ir.Shape{3}, []float32{1, 2, 3})})
	require.ErrorContains(t, err, "add (model.go:42)")

	// attributes broken after construction
	g := ir.NewFunc("bcast")
	p := g.Body.AddParam(ty)
	bop := addOp(t, g.Body, ir.BroadcastInDim, []*ir.Value{p}, ir.Attrs{"shape": []int{3, 2}, "dims": []int{1}})
	bop.Loc = "layer.go:7"
	bop.Attrs["dims"] = []int{5}
	g.Body.Results = bop.Results
	_, err = Run(g, []*ir.Literal{x})
	require.ErrorContains(t, err, "broadcast_in_dim (layer.go:7)")

	// an internal panic (a malformed op) becomes an error naming the op
	bad := &ir.Op{Code: ir.Cond, Regions: []*ir.Region{nil, nil}, Loc: "here.go:3"}
	_, err = EvalOp(bad, []*ir.Literal{ir.Scalar(true)})
	require.ErrorContains(t, err, "cond (here.go:3)")

	// unknown code
	_, err = EvalOp(&ir.Op{Code: ir.Code(60000)}, nil)
	require.Error(t, err)

	// gather from an empty axis into a non-empty result is a run-time error
	h := ir.NewFunc("gather")
	ho := addOp(t, h.Body, ir.Gather, []*ir.Value{h.Body.AddParam(ir.TypeOf(ir.Float32, 0)), h.Body.AddParam(ir.TypeOf(ir.Int32, 2))}, ir.Attrs{"axis": 0})
	h.Body.Results = ho.Results
	_, err = Run(h, []*ir.Literal{lit(ir.TypeOf(ir.Float32, 0)), lit(ir.TypeOf(ir.Int32, 2))})
	require.ErrorContains(t, err, "empty axis")

	// a value used before it is defined
	u := ir.NewFunc("undef")
	up := u.Body.AddParam(ty)
	inner := ir.NewFunc("other")
	stray := inner.Body.AddParam(ty)
	uo := addOp(t, u.Body, ir.Add, []*ir.Value{up, stray}, nil)
	u.Body.Results = uo.Results
	_, err = Run(u, []*ir.Literal{x})
	require.ErrorContains(t, err, "not defined")
}

func TestEvalOpDirect(t *testing.T) {
	f := addFunc(t, ir.TypeOf(ir.Int32, 3))
	a, _ := ir.LiteralOf(ir.Shape{3}, []int32{1, 2, math.MaxInt32})
	res, err := EvalOp(f.Body.Ops[0], []*ir.Literal{a, a})
	require.NoError(t, err)
	require.Equal(t, []int32{2, 4, -2}, ir.View[int32](res[0]))
	require.False(t, overlap(res[0].Data, a.Data))
}

func TestResultsNeverAlias(t *testing.T) {
	ty := ir.TypeOf(ir.Float32, 2)
	f := ir.NewFunc("pass")
	p := f.Body.AddParam(ty)
	n := addOp(t, f.Body, ir.Neg, []*ir.Value{p}, nil).Result()
	f.Body.Results = []*ir.Value{p, p, n, n}
	x := f32Lit(t, ir.Shape{2}, []float32{1, 2})
	res := runFunc(t, f, []*ir.Literal{x})
	require.Equal(t, []float32{1, 2}, ir.View[float32](res[0]))
	require.Equal(t, []float32{-1, -2}, ir.View[float32](res[3]))
	// the identity-like ops copy too
	for _, code := range []ir.Code{ir.Reshape, ir.DevicePut, ir.BitcastConvert, ir.Convert} {
		attrs := map[ir.Code]ir.Attrs{ir.Reshape: {"shape": []int{2}}, ir.DevicePut: {"space": ir.Device}, ir.BitcastConvert: {"dtype": ir.Float32}, ir.Convert: {"dtype": ir.Float32}}[code]
		runOp(t, code, []*ir.Literal{x}, attrs)
	}
}

func TestUnalignedArguments(t *testing.T) {
	buf := make([]byte, 8*4+1)
	un := &ir.Literal{Type: ir.TypeOf(ir.Float64, 4), Data: buf[1:]}
	for i := 0; i < 4; i++ {
		setF(un, i, float64(i)+0.5)
	}
	f := addFunc(t, un.Type)
	res, err := Run(f, []*ir.Literal{un, un})
	require.NoError(t, err)
	require.Equal(t, []float64{1, 3, 5, 7}, ir.View[float64](res[0]))
}

func evalOne(t *testing.T, code ir.Code, args ...*ir.Literal) *ir.Literal {
	return runOp(t, code, args, nil)[0]
}

func TestSpecialValues(t *testing.T) {
	negZero := math.Copysign(0, -1)
	nan := math.NaN()
	for _, dt := range []ir.DType{ir.Float16, ir.BFloat16, ir.Float32, ir.Float64} {
		x := lit(ir.TypeOf(dt, 5))
		for i, v := range []float64{nan, negZero, 0, -3, 2} {
			setF(x, i, v)
		}
		s := evalOne(t, ir.Sign, x)
		require.True(t, math.IsNaN(getF(s, 0)), "sign(NaN) %v", dt)
		require.True(t, math.Signbit(getF(s, 1)) && getF(s, 1) == 0, "sign(-0) %v", dt)
		require.False(t, math.Signbit(getF(s, 2)), "sign(+0) %v", dt)
		require.Equal(t, -1.0, getF(s, 3))
		require.Equal(t, 1.0, getF(s, 4))

		y := lit(ir.TypeOf(dt, 5))
		for i, v := range []float64{1, nan, nan, 5, -1} {
			setF(y, i, v)
		}
		mx, mn := evalOne(t, ir.Max, x, y), evalOne(t, ir.Min, x, y)
		for i := 0; i < 3; i++ {
			require.True(t, math.IsNaN(getF(mx, i)) && math.IsNaN(getF(mn, i)), "max/min NaN %v [%d]", dt, i)
		}
		require.Equal(t, 5.0, getF(mx, 3))
		require.Equal(t, -3.0, getF(mn, 3))

		// logistic is stable for large |x|
		z := lit(ir.TypeOf(dt, 4))
		for i, v := range []float64{-1000, 1000, -30, 30} {
			setF(z, i, v)
		}
		lg := evalOne(t, ir.Logistic, z)
		require.Equal(t, 0.0, getF(lg, 0))
		require.Equal(t, 1.0, getF(lg, 1))
		require.True(t, closeTo(getF(lg, 2), refRound(math.Exp(-30)/(1+math.Exp(-30)), dt), dt, 1, false), "logistic(-30) %v = %g", dt, getF(lg, 2))
	}
	// logistic(-700) in f64 keeps full relative precision
	z := lit(ir.TypeOf(ir.Float64, 1))
	setF(z, 0, -700)
	require.InEpsilon(t, math.Exp(-700), getF(evalOne(t, ir.Logistic, z), 0), 1e-15)
	setF(z, 0, -720) // exp(720) overflows: the naive 1/(1+exp(-x)) gives 0
	require.Equal(t, math.Exp(-720), getF(evalOne(t, ir.Logistic, z), 0))

	// integer division and remainder corner cases
	a, _ := ir.LiteralOf(ir.Shape{4}, []int32{7, -7, math.MinInt32, 5})
	b, _ := ir.LiteralOf(ir.Shape{4}, []int32{0, 2, -1, -3})
	require.Equal(t, []int32{-1, -3, math.MinInt32, -1}, ir.View[int32](evalOne(t, ir.Div, a, b)))
	require.Equal(t, []int32{7, -1, 0, 2}, ir.View[int32](evalOne(t, ir.Rem, a, b)))
	ua, _ := ir.LiteralOf(ir.Shape{2}, []uint8{7, 200})
	ub, _ := ir.LiteralOf(ir.Shape{2}, []uint8{0, 7})
	require.Equal(t, []uint8{255, 28}, ir.View[uint8](evalOne(t, ir.Div, ua, ub)))
	require.Equal(t, []uint8{7, 4}, ir.View[uint8](evalOne(t, ir.Rem, ua, ub)))

	// shifts by the bit width or more
	sa, _ := ir.LiteralOf(ir.Shape{4}, []int32{-8, -8, -8, 8})
	sb, _ := ir.LiteralOf(ir.Shape{4}, []int32{32, 1, -1, 40})
	require.Equal(t, []int32{0, -16, 0, 0}, ir.View[int32](evalOne(t, ir.ShiftLeft, sa, sb)))
	require.Equal(t, []int32{0, 0x7ffffffc, 0, 0}, ir.View[int32](evalOne(t, ir.ShiftRightLogical, sa, sb)))
	require.Equal(t, []int32{-1, -4, -1, 0}, ir.View[int32](evalOne(t, ir.ShiftRightArithmetic, sa, sb)))
	u8a, _ := ir.LiteralOf(ir.Shape{2}, []uint8{0x80, 0x40})
	u8b, _ := ir.LiteralOf(ir.Shape{2}, []uint8{1, 9})
	require.Equal(t, []uint8{0xc0, 0}, ir.View[uint8](evalOne(t, ir.ShiftRightArithmetic, u8a, u8b)))

	// float → int saturation and NaN
	fx, _ := ir.LiteralOf(ir.Shape{5}, []float64{nan, 1e20, -1e20, -2.9, 2.9})
	c := runOp(t, ir.Convert, []*ir.Literal{fx}, ir.Attrs{"dtype": ir.Int32})[0]
	require.Equal(t, []int32{0, math.MaxInt32, math.MinInt32, -2, 2}, ir.View[int32](c))
	cu := runOp(t, ir.Convert, []*ir.Literal{fx}, ir.Attrs{"dtype": ir.Uint8})[0]
	require.Equal(t, []uint8{0, 255, 0, 0, 2}, ir.View[uint8](cu))
	cb := runOp(t, ir.Convert, []*ir.Literal{fx}, ir.Attrs{"dtype": ir.Bool})[0]
	require.Equal(t, []byte{1, 1, 1, 1, 1}, cb.Data)

	// empty reductions
	e := lit(ir.TypeOf(ir.Float32, 0, 2))
	require.Equal(t, []float32{0, 0}, ir.View[float32](runOp(t, ir.ReduceSum, []*ir.Literal{e}, ir.Attrs{"axes": []int{0}})[0]))
	require.Equal(t, []float32{1, 1}, ir.View[float32](runOp(t, ir.ReduceProd, []*ir.Literal{e}, ir.Attrs{"axes": []int{0}})[0]))
	require.True(t, math.IsInf(float64(ir.View[float32](runOp(t, ir.ReduceMax, []*ir.Literal{e}, ir.Attrs{"axes": []int{0}})[0])[0]), -1))
	ei := lit(ir.TypeOf(ir.Int32, 0))
	require.Equal(t, []int32{math.MaxInt32}, ir.View[int32](runOp(t, ir.ReduceMin, []*ir.Literal{ei}, ir.Attrs{"axes": []int{0}})[0]))
}

func TestBoolDataNormalised(t *testing.T) {
	// Bool literals holding bytes other than 0/1 read as true.
	p := lit(ir.TypeOf(ir.Bool, 3))
	copy(p.Data, []byte{0, 2, 255})
	q := lit(ir.TypeOf(ir.Bool, 3))
	copy(q.Data, []byte{1, 1, 0})
	require.Equal(t, []byte{1, 0, 0}, evalOne(t, ir.Not, p).Data)
	require.Equal(t, []byte{0, 1, 0}, evalOne(t, ir.And, p, q).Data)
	require.Equal(t, []byte{0, 1, 0}, evalOne(t, ir.Eq, p, q).Data)
	require.Equal(t, []byte{0, 1, 1}, runOp(t, ir.Convert, []*ir.Literal{p}, ir.Attrs{"dtype": ir.Bool})[0].Data)
}

func BenchmarkDotF32_512(b *testing.B) {
	f := ir.NewFunc("matmul")
	ty := ir.TypeOf(ir.Float32, 512, 512)
	x, y := f.Body.AddParam(ty), f.Body.AddParam(ty)
	op, err := f.Body.AddOp(ir.DotGeneral, []*ir.Value{x, y}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	require.NoError(b, err)
	f.Body.Results = op.Results
	a := lit(ty)
	for i, v := range ir.View[float32](a) {
		ir.View[float32](a)[i] = float32(i%7) - 3 + v
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := Run(f, []*ir.Literal{a, a}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(2*512*512*512*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func benchElementwise(b *testing.B, code ir.Code, dt ir.DType) {
	f := addFunc(b, ir.TypeOf(dt, 1<<20))
	f.Body.Ops[0].Code = code
	a := lit(ir.TypeOf(dt, 1<<20))
	b.SetBytes(int64(len(a.Data)))
	for b.Loop() {
		if _, err := Run(f, []*ir.Literal{a, a}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAddF32_1M(b *testing.B) { benchElementwise(b, ir.Add, ir.Float32) }
func BenchmarkAddF16_1M(b *testing.B) { benchElementwise(b, ir.Add, ir.Float16) }
func BenchmarkMulI64_1M(b *testing.B) { benchElementwise(b, ir.Mul, ir.Int64) }

// BenchmarkDotAttention runs the f32 products of a Transformer's attention
// (batch 32, 4 heads of 32, sequence 64, width 128) in the layouts the
// training step gives them: head axes that do not merge with the batch,
// transposed operands, the head merge folded into the output projection.
func BenchmarkDotAttention(b *testing.B) {
	for _, c := range []struct {
		name           string
		lhs, rhs       []int
		lb, rb, lc, rc []int
	}{
		{"scores", []int{32, 64, 4, 32}, []int{32, 64, 4, 32}, []int{0, 2}, []int{0, 2}, []int{3}, []int{3}},
		{"probs×v", []int{32, 4, 64, 64}, []int{32, 64, 4, 32}, []int{0, 1}, []int{0, 2}, []int{3}, []int{1}},
		{"dprobsᵀ×q", []int{32, 64, 4, 32}, []int{32, 4, 64, 64}, []int{0, 2}, []int{0, 1}, []int{1}, []int{2}},
		{"head merge", []int{32, 4, 64, 32}, []int{4, 32, 128}, nil, nil, []int{1, 3}, []int{0, 1}},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := ir.NewFunc("dot")
			tx, ty := ir.TypeOf(ir.Float32, c.lhs...), ir.TypeOf(ir.Float32, c.rhs...)
			x, y := f.Body.AddParam(tx), f.Body.AddParam(ty)
			op, err := f.Body.AddOp(ir.DotGeneral, []*ir.Value{x, y}, ir.Attrs{"lhs_batch": nz(c.lb), "rhs_batch": nz(c.rb), "lhs_contract": c.lc, "rhs_contract": c.rc})
			require.NoError(b, err)
			f.Body.Results = op.Results
			r := rand.New(rand.NewPCG(1, 2))
			args := []*ir.Literal{randLit(r, ir.Float32, c.lhs, dotValues), randLit(r, ir.Float32, c.rhs, dotValues)}
			for b.Loop() {
				if _, err := Run(f, args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
