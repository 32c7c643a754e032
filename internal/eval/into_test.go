package eval

import (
	"bytes"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

// garbage returns a literal of type t whose bytes are not zero, so that a
// kernel relying on zeroed destinations shows.
func garbage(t ir.Type) *ir.Literal {
	l := ir.NewLiteral(t)
	for i := range l.Data {
		l.Data[i] = 0xa5 ^ byte(i)
	}
	return l
}

// reinterpret returns a literal of type t over l's memory.
func reinterpret(l *ir.Literal, t ir.Type) *ir.Literal { return &ir.Literal{Type: t, Data: l.Data} }

// checkInto re-runs f's body op by op through EvalOpInto and compares every
// result with want (the results of Run): into garbage-filled destinations,
// and, for elementwise ops and dynamic_update_slice, in place over a copy of
// each operand the aliasing rule allows.
func checkInto(t *testing.T, f *ir.Func, args, want []*ir.Literal) {
	t.Helper()
	env := map[*ir.Value]*ir.Literal{}
	for i, p := range f.Body.Params {
		env[p] = args[i]
	}
	for _, op := range f.Body.Ops {
		ins := make([]*ir.Literal, len(op.Args))
		for j, a := range op.Args {
			ins[j] = env[a]
		}
		ref, err := EvalOp(op, ins)
		require.NoError(t, err)
		outs := make([]*ir.Literal, len(op.Results))
		for j, v := range op.Results {
			outs[j] = garbage(v.Type)
		}
		require.NoError(t, EvalOpInto(op, ins, outs), "EvalOpInto %v", op.Code)
		for j := range outs {
			require.True(t, bytes.Equal(ref[j].Data, outs[j].Data), "EvalOpInto %v result %d differs from EvalOp", op.Code, j)
		}
		k, err := Prepare(op)
		require.NoError(t, err)
		for j, v := range op.Results {
			outs[j] = garbage(v.Type)
		}
		require.NoError(t, k.Into(ins, outs), "Kernel.Into %v", op.Code)
		for j := range outs {
			require.True(t, bytes.Equal(ref[j].Data, outs[j].Data), "Kernel.Into %v result %d differs from EvalOp", op.Code, j)
		}
		if len(op.Results) == 1 {
			rt := op.Results[0].Type
			for j, a := range ins {
				inPlace := op.Info().Elementwise || op.Code == ir.DynamicUpdateSlice && j == 0
				if !inPlace || int64(len(a.Data)) != rt.Bytes() || len(a.Data) == 0 {
					continue
				}
				// Alias operand j, and every other operand that is the same literal.
				c := a.Clone()
				in2 := append([]*ir.Literal(nil), ins...)
				for k := range in2 {
					if in2[k] == a {
						in2[k] = c
					}
				}
				before := append([]byte(nil), a.Data...)
				require.NoError(t, EvalOpInto(op, in2, []*ir.Literal{reinterpret(c, rt)}), "in-place %v over operand %d", op.Code, j)
				require.True(t, bytes.Equal(ref[0].Data, c.Data), "in-place %v over operand %d differs from EvalOp", op.Code, j)
				require.Equal(t, before, a.Data)
			}
		}
		for j, v := range op.Results {
			env[v] = ref[j]
		}
	}
	for i, v := range f.Body.Results {
		require.True(t, bytes.Equal(want[i].Data, env[v].Data), "result %d", i)
	}
}

func TestEvalOpIntoErrors(t *testing.T) {
	ty := ir.TypeOf(ir.Float32, 4)
	f := addFunc(t, ty)
	add := f.Body.Ops[0]
	x := f32Lit(t, ir.Shape{4}, []float32{1, 2, 3, 4})
	y := f32Lit(t, ir.Shape{4}, []float32{10, 20, 30, 40})

	require.ErrorContains(t, EvalOpInto(add, []*ir.Literal{x, y}, nil), "1 results, got 0 destinations")
	require.ErrorContains(t, EvalOpInto(add, []*ir.Literal{x, y}, []*ir.Literal{lit(ir.TypeOf(ir.Float32, 5))}), "destination 0 is f32[5]")
	require.ErrorContains(t, EvalOpInto(add, []*ir.Literal{x, y}, []*ir.Literal{lit(ty.WithSpace(ir.PinnedHost))}), "pinned_host")
	require.ErrorContains(t, EvalOpInto(add, []*ir.Literal{x, y}, []*ir.Literal{{Type: ty, Data: make([]byte, 8)}}), "has 8 bytes")
	require.ErrorContains(t, EvalOpInto(add, []*ir.Literal{x, y}, []*ir.Literal{nil}), "destination 0 is nil")

	// Partial overlap with an operand is refused, exact aliasing is fine.
	buf := lit(ir.TypeOf(ir.Float32, 8))
	copy(buf.Data, x.Data)
	xv := &ir.Literal{Type: ty, Data: buf.Data[:16]}
	shifted := &ir.Literal{Type: ty, Data: buf.Data[4:20]}
	require.ErrorContains(t, EvalOpInto(add, []*ir.Literal{xv, y}, []*ir.Literal{shifted}), "shares memory with operand 0")
	require.NoError(t, EvalOpInto(add, []*ir.Literal{xv, y}, []*ir.Literal{xv}))
	require.Equal(t, []float32{11, 22, 33, 44}, ir.View[float32](xv))

	// Non-elementwise ops never alias.
	g := ir.NewFunc("rev")
	p := g.Body.AddParam(ir.TypeOf(ir.Float32, 2, 2))
	tr := addOp(t, g.Body, ir.Transpose, []*ir.Value{p}, ir.Attrs{"perm": []int{1, 0}})
	m := f32Lit(t, ir.Shape{2, 2}, []float32{1, 2, 3, 4})
	err := EvalOpInto(tr, []*ir.Literal{m}, []*ir.Literal{m})
	require.ErrorContains(t, err, "transpose")
	require.ErrorContains(t, err, "shares memory")

	// A dynamic_update_slice result may alias only the operand, not the update.
	h := ir.NewFunc("dus")
	hp, hu, hi := h.Body.AddParam(ir.TypeOf(ir.Float32, 4)), h.Body.AddParam(ir.TypeOf(ir.Float32, 4)), h.Body.AddParam(ir.TypeOf(ir.Int32))
	dus := addOp(t, h.Body, ir.DynamicUpdateSlice, []*ir.Value{hp, hu, hi}, nil)
	o := x.Clone()
	require.ErrorContains(t, EvalOpInto(dus, []*ir.Literal{y, o, ir.Scalar(int32(0))}, []*ir.Literal{o}), "operand 1")

	// Region ops write into destinations too, and the error names the op.
	require.ErrorContains(t, EvalOpInto(&ir.Op{Code: ir.Cond, Regions: []*ir.Region{nil, nil}, Loc: "c.go:1"}, []*ir.Literal{ir.Scalar(true)}, nil), "cond (c.go:1)")
}

// TestEvalOpIntoInPlace checks the aliasing cases on hand-made examples: the
// in-place window update of dynamic_update_slice writes only the window, and
// elementwise ops over the same memory as every operand.
func TestEvalOpIntoInPlace(t *testing.T) {
	h := ir.NewFunc("dus")
	hp, hu := h.Body.AddParam(ir.TypeOf(ir.Float32, 3, 4)), h.Body.AddParam(ir.TypeOf(ir.Float32, 2, 2))
	hi, hj := h.Body.AddParam(ir.TypeOf(ir.Int32)), h.Body.AddParam(ir.TypeOf(ir.Int64))
	dus := addOp(t, h.Body, ir.DynamicUpdateSlice, []*ir.Value{hp, hu, hi, hj}, nil)
	op := lit(ir.TypeOf(ir.Float32, 3, 4))
	for i := range ir.View[float32](op) {
		ir.View[float32](op)[i] = float32(i)
	}
	upd := f32Lit(t, ir.Shape{2, 2}, []float32{-1, -2, -3, -4})
	require.NoError(t, EvalOpInto(dus, []*ir.Literal{op, upd, ir.Scalar(int32(1)), ir.Scalar(int64(5))}, []*ir.Literal{op}))
	require.Equal(t, []float32{0, 1, 2, 3, 4, 5, -1, -2, 8, 9, -3, -4}, ir.View[float32](op))

	// Unaligned in-place destination.
	buf := make([]byte, 3*4*4+1)
	un := &ir.Literal{Type: op.Type, Data: buf[1:]}
	copy(un.Data, op.Data)
	require.NoError(t, EvalOpInto(dus, []*ir.Literal{un, upd, ir.Scalar(int32(0)), ir.Scalar(int64(0))}, []*ir.Literal{un}))
	got := ir.NewLiteral(op.Type)
	copy(got.Data, un.Data)
	require.Equal(t, []float32{-1, -2, 2, 3, -3, -4, -1, -2, 8, 9, -3, -4}, ir.View[float32](got))

	// x*x in place, i32 → f32 convert in place, f16 exp in place, u8 compare in place.
	f := addFunc(t, ir.TypeOf(ir.Float32, 3))
	mul := f.Body.Ops[0]
	mul.Code = ir.Mul
	v := f32Lit(t, ir.Shape{3}, []float32{1, -2, 3})
	require.NoError(t, EvalOpInto(mul, []*ir.Literal{v, v}, []*ir.Literal{v}))
	require.Equal(t, []float32{1, 4, 9}, ir.View[float32](v))

	c := ir.NewFunc("convert")
	cp := c.Body.AddParam(ir.TypeOf(ir.Int32, 3))
	cv := addOp(t, c.Body, ir.Convert, []*ir.Value{cp}, ir.Attrs{"dtype": ir.Float32})
	iv, _ := ir.LiteralOf(ir.Shape{3}, []int32{7, -8, 1 << 30})
	require.NoError(t, EvalOpInto(cv, []*ir.Literal{iv}, []*ir.Literal{reinterpret(iv, ir.TypeOf(ir.Float32, 3))}))
	require.Equal(t, []float32{7, -8, 1 << 30}, ir.ViewBytes[float32](iv.Data))

	e := ir.NewFunc("exp")
	ep := e.Body.AddParam(ir.TypeOf(ir.Float16, 2))
	ex := addOp(t, e.Body, ir.Exp, []*ir.Value{ep}, nil)
	hv, _ := ir.LiteralOf(ir.Shape{2}, []ir.F16{ir.F16FromFloat64(0), ir.F16FromFloat64(1)})
	require.NoError(t, EvalOpInto(ex, []*ir.Literal{hv}, []*ir.Literal{hv}))
	require.Equal(t, []ir.F16{ir.F16FromFloat64(1), ir.F16FromFloat64(2.71875)}, ir.View[ir.F16](hv))

	q := ir.NewFunc("lt")
	qa, qb := q.Body.AddParam(ir.TypeOf(ir.Uint8, 3)), q.Body.AddParam(ir.TypeOf(ir.Uint8, 3))
	lt := addOp(t, q.Body, ir.Lt, []*ir.Value{qa, qb}, nil)
	ua, _ := ir.LiteralOf(ir.Shape{3}, []uint8{1, 5, 9})
	ub, _ := ir.LiteralOf(ir.Shape{3}, []uint8{2, 5, 3})
	require.NoError(t, EvalOpInto(lt, []*ir.Literal{ua, ub}, []*ir.Literal{reinterpret(ub, ir.TypeOf(ir.Bool, 3))}))
	require.Equal(t, []byte{1, 0, 0}, ub.Data)
}

func TestPrepare(t *testing.T) {
	ty := ir.TypeOf(ir.Float32, 2)
	f := addFunc(t, ty)
	op := f.Body.Ops[0]
	k, err := Prepare(op)
	require.NoError(t, err)
	require.Same(t, op, k.Op())
	x := f32Lit(t, ir.Shape{2}, []float32{1, 2})
	out := lit(ty)
	require.NoError(t, k.Into([]*ir.Literal{x, x}, []*ir.Literal{out}))
	require.Equal(t, []float32{2, 4}, ir.View[float32](out))
	require.ErrorContains(t, k.Into([]*ir.Literal{x, f32Lit(t, ir.Shape{3}, []float32{1, 2, 3})}, []*ir.Literal{out}), "add (model.go:42): operand 1")
	require.ErrorContains(t, k.Into([]*ir.Literal{x}, []*ir.Literal{out}), "2 operands")
	require.ErrorContains(t, k.Into([]*ir.Literal{x, x}, []*ir.Literal{lit(ir.TypeOf(ir.Int32, 2))}), "destination 0 is i32[2]")

	// Broken attributes are caught once, by Prepare.
	g := ir.NewFunc("bcast")
	p := g.Body.AddParam(ty)
	bop := addOp(t, g.Body, ir.BroadcastInDim, []*ir.Value{p}, ir.Attrs{"shape": []int{3, 2}, "dims": []int{1}})
	bop.Attrs["dims"] = []int{5}
	_, err = Prepare(bop)
	require.ErrorContains(t, err, "broadcast_in_dim")
	_, err = Prepare(nil)
	require.Error(t, err)
}
