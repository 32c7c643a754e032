package ir

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVerifyCorpus(t *testing.T) {
	for name, f := range txtCorpus(t) {
		require.NoError(t, Verify(f), name)
	}
}

// txtVerifyBase builds
//
//	func @v(%0: f32[3], %1: bool[]) {
//	  %2 = exp(%0) loc("v.go:1")
//	  %3 = neg(%2)
//	  %7 = cond(%1, %3) (^(%4) { %5 = tanh(%4); return %5 }, ^(%6) { return %6 })
//	  return %7
//	}
func txtVerifyBase(t *testing.T) (*Func, map[string]*Value) {
	f := NewFunc("v")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 3))
	p := f.Body.AddParam(TypeOf(Bool))
	e := b.opAt("v.go:1", Exp, vs(x), nil)
	n := b.op(Neg, vs(e), nil)
	r0 := f.NewRegion()
	a := r0.AddParam(TypeOf(Float32, 3))
	th := txtBuilder{t, r0}.op(Tanh, vs(a), nil)
	r0.Results = vs(th)
	r1 := f.NewRegion()
	c := r1.AddParam(TypeOf(Float32, 3))
	r1.Results = vs(c)
	out := b.op(Cond, vs(p, n), nil, r0, r1)
	f.Body.Results = vs(out)
	require.NoError(t, Verify(f))
	return f, map[string]*Value{"x": x, "p": p, "exp": e, "neg": n, "a": a, "tanh": th, "c": c, "cond": out}
}

func TestVerifyCatches(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(f *Func, v map[string]*Value)
		want   string
	}{
		{"nil operand", func(f *Func, v map[string]*Value) { v["neg"].Op.Args[0] = nil }, "op neg: operand 0 is nil"},
		{"use before def", func(f *Func, v map[string]*Value) {
			f.Body.Ops[0], f.Body.Ops[1] = f.Body.Ops[1], f.Body.Ops[0]
		}, "op neg: operand 0 %2 is used before its definition"},
		{"undefined value", func(f *Func, v map[string]*Value) {
			v["neg"].Op.Args[0] = f.NewValueWithID(50, TypeOf(Float32, 3), nil, 0)
		}, "op neg: operand 0 %50 is used before its definition or not defined"},
		{"outer value in region", func(f *Func, v map[string]*Value) { v["tanh"].Op.Args[0] = v["x"] },
			"op cond: region 0: op tanh: operand 0 %0 is defined outside this region (regions are isolated from above)"},
		{"region result not visible", func(f *Func, v map[string]*Value) { v["c"].Op = nil; f.Body.Ops[2].Regions[1].Results[0] = v["neg"] },
			"op cond: region 1: result 0 %3 is defined outside this region"},
		{"function result undefined", func(f *Func, v map[string]*Value) { f.Body.Results[0] = v["tanh"] },
			"function body: result 0 %5 is defined outside this region"},
		{"nil result value", func(f *Func, v map[string]*Value) { f.Body.Results[0] = nil }, "function body: result 0 is nil"},
		{"defined twice", func(f *Func, v map[string]*Value) {
			op := v["neg"].Op
			f.Body.Ops = append(f.Body.Ops[:2], &Op{Code: Neg, Args: vs(v["exp"]), Attrs: Attrs{}, Results: vs(op.Results[0])}, f.Body.Ops[2])
		}, "op neg: result 0: value %3 is defined twice"},
		{"same op twice", func(f *Func, v map[string]*Value) { f.Body.Ops = append(f.Body.Ops, f.Body.Ops[0]) }, "op exp (v.go:1) appears twice"},
		{"duplicate ID", func(f *Func, v map[string]*Value) { v["tanh"].ID = v["neg"].ID; v["neg"].ID = 2; v["exp"].ID = 3 },
			"value ID %3 is used by two different values"},
		{"ID beyond NextID", func(f *Func, v map[string]*Value) { v["neg"].ID = 1000 }, "op neg: result 0: value ID %1000 is outside [0, NextID=8)"},
		{"negative ID", func(f *Func, v map[string]*Value) { v["x"].ID = -1 }, "function body: parameter 0: value ID %-1 is outside"},
		{"result type", func(f *Func, v map[string]*Value) { v["neg"].Type = TypeOf(Float32, 4) },
			"op neg: result 0 (%3) has type f32[4], its shape rule gives f32[3]"},
		{"result count", func(f *Func, v map[string]*Value) {
			op := v["neg"].Op
			op.Results = append(op.Results, f.NewValueWithID(60, TypeOf(Float32, 3), op, 1))
		}, "op neg: has 2 results, its shape rule gives 1"},
		{"shape rule", func(f *Func, v map[string]*Value) { v["neg"].Op.Args = vs(v["x"], v["x"]) }, "op neg: neg takes 1 operands, got 2"},
		{"region contract", func(f *Func, v map[string]*Value) { v["a"].Type = TypeOf(Float32, 4) },
			"op cond: region 0: op tanh: result 0 (%5) has type f32[3], its shape rule gives f32[4]"},
		{"region signature", func(f *Func, v map[string]*Value) {
			r := f.Body.Ops[2].Regions[1]
			r.Params = append(r.Params, f.NewValueWithID(70, TypeOf(Int32), nil, 1))
		}, "op cond: cond: branch 1 parameters (f32[3], i32[]), want (f32[3])"},
		{"Op back-pointer", func(f *Func, v map[string]*Value) { v["neg"].Op = v["exp"].Op }, "op neg: result 0: value %3 does not point back at its defining op"},
		{"Index back-pointer", func(f *Func, v map[string]*Value) { v["neg"].Index = 1 }, "op neg: result 0: value %3 has Index 1, want 0"},
		{"param Index", func(f *Func, v map[string]*Value) { v["p"].Index = 0 }, "function body: parameter 1: value %1 has Index 0, want 1"},
		{"param with op", func(f *Func, v map[string]*Value) { v["a"].Op = v["exp"].Op }, "op cond: region 0: parameter 0: parameter %4 has a defining op (exp)"},
		{"nil op", func(f *Func, v map[string]*Value) { f.Body.Ops = append(f.Body.Ops, nil) }, "function body: nil op"},
		{"nil region", func(f *Func, v map[string]*Value) { f.Body.Ops[2].Regions[1] = nil }, "op cond: region 1 is nil"},
		{"region twice", func(f *Func, v map[string]*Value) { f.Body.Ops[2].Regions[1] = f.Body.Ops[2].Regions[0] }, "op cond: region 1: region appears twice"},
		{"unknown code", func(f *Func, v map[string]*Value) { v["neg"].Op.Code = Code(9999) }, "op op(9999): unknown op code 9999"},
		{"bad param type", func(f *Func, v map[string]*Value) { v["x"].Type = Type{DType: Float32, Shape: Shape{-1}} },
			"function body: parameter 0: value %0: type f32[-1] has a negative dimension"},
		{"bad dtype", func(f *Func, v map[string]*Value) { v["x"].Type.DType = DType(77) }, "type dtype(77)[3] has an invalid dtype"},
		{"bad space", func(f *Func, v map[string]*Value) { v["x"].Type.Space = MemorySpace(9) }, "type f32[3]{space(9)} has an invalid memory space"},
		{"attr kind", func(f *Func, v map[string]*Value) { v["neg"].Op.Attrs["k"] = int64(1) }, `op neg: attribute "k": unsupported value of type int64`},
		{"nil literal", func(f *Func, v map[string]*Value) { v["neg"].Op.Attrs["k"] = (*Literal)(nil) }, `op neg: attribute "k": nil literal`},
		{"literal size", func(f *Func, v map[string]*Value) { v["neg"].Op.Attrs["k"] = &Literal{Type: TypeOf(Float32, 2)} },
			`op neg: attribute "k": literal of type f32[2] has 0 bytes, want 8`},
		{"unknown attr", func(f *Func, v map[string]*Value) { v["neg"].Op.Attrs["k"] = 1 }, `op neg: neg: unknown attribute "k"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, v := txtVerifyBase(t)
			tc.break_(f, v)
			err := Verify(f)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "verify @v: ")
			require.NotPanics(t, func() { _ = f.String() })
		})
	}
	require.EqualError(t, Verify(nil), "verify: nil function")
	require.EqualError(t, Verify(&Func{Name: "x"}), "verify @x: nil body")
}

func TestVerifyNamesLoc(t *testing.T) {
	f, v := txtVerifyBase(t)
	v["exp"].Type = TypeOf(Float64, 3)
	require.ErrorContains(t, Verify(f), "op exp (v.go:1): result 0 (%2) has type f64[3], its shape rule gives f32[3]")
}

func TestVerifyConstantWithBadLiteral(t *testing.T) {
	f := NewFunc("c")
	_, err := f.Body.AddOp(Constant, nil, Attrs{"value": &Literal{Type: Type{DType: DType(0)}, Data: []byte{}}})
	require.ErrorContains(t, err, "constant: invalid dtype") // the shape rule rejects it
	// An op built by hand past the shape rule is caught by the verifier.
	op := &Op{Code: Constant, Attrs: Attrs{"value": &Literal{Type: Type{DType: DType(0)}, Data: []byte{}}}}
	op.Results = []*Value{f.NewValueWithID(0, Type{DType: Float32, Shape: Shape{}}, op, 0)}
	f.Body.Ops = append(f.Body.Ops, op)
	f.Body.Results = op.Results
	require.ErrorContains(t, Verify(f), `op constant: attribute "value": literal: type invalid[] has an invalid dtype`)
}

func TestVerifyScanPanicGuard(t *testing.T) {
	f := NewFunc("s")
	x := f.Body.AddParam(TypeOf(Float32, 2))
	op := &Op{Code: Scan, Args: vs(x), Attrs: Attrs{"num_consts": 1 << 62, "num_carry": 1 << 62, "length": 1}, Regions: []*Region{f.NewRegion()}}
	f.Body.Ops = append(f.Body.Ops, op)
	require.NotPanics(t, func() { require.ErrorContains(t, Verify(f), "bad num_consts") })
}
