package eval

import (
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/stretchr/testify/require"
)

func addOp(t testing.TB, r *ir.Region, code ir.Code, args []*ir.Value, attrs ir.Attrs, regions ...*ir.Region) *ir.Op {
	t.Helper()
	op, err := r.AddOp(code, args, attrs, regions...)
	require.NoError(t, err)
	return op
}

func constOp[T ir.Native](t *testing.T, r *ir.Region, v T) *ir.Value {
	return addOp(t, r, ir.Constant, nil, ir.Attrs{"value": ir.Scalar(v)}).Result()
}

func f32Lit(t *testing.T, shape ir.Shape, v []float32) *ir.Literal {
	l, err := ir.LiteralOf(shape, v)
	require.NoError(t, err)
	return l
}

// testScan runs c' = c*k + x, n' = n+1, ys = (c'*c', x) with the x passed
// straight through, forward and reversed, for several lengths.
func testScan(t *testing.T) {
	r := newRand(t)
	for _, length := range []int{0, 1, 5} {
		for _, reverse := range []bool{false, true} {
			f := ir.NewFunc("scan")
			kT, cT, nT, xsT := ir.TypeOf(ir.Float32, 3), ir.TypeOf(ir.Float32, 3), ir.TypeOf(ir.Int32), ir.TypeOf(ir.Float32, length, 3)
			pk, pc, pn, pxs := f.Body.AddParam(kT), f.Body.AddParam(cT), f.Body.AddParam(nT), f.Body.AddParam(xsT)
			xsPinned := ir.TypeOf(ir.Float32, length, 2).WithSpace(ir.PinnedHost)
			pxs2 := f.Body.AddParam(xsPinned)

			body := f.NewRegion()
			bk, bc, bn := body.AddParam(kT), body.AddParam(cT), body.AddParam(nT)
			bx, bx2 := body.AddParam(ir.TypeOf(ir.Float32, 3)), body.AddParam(ir.TypeOf(ir.Float32, 2).WithSpace(ir.PinnedHost))
			c2 := addOp(t, body, ir.Add, []*ir.Value{addOp(t, body, ir.Mul, []*ir.Value{bc, bk}, nil).Result(), bx}, nil).Result()
			n2 := addOp(t, body, ir.Add, []*ir.Value{bn, constOp(t, body, int32(1))}, nil).Result()
			y := addOp(t, body, ir.Mul, []*ir.Value{c2, c2}, nil).Result()
			body.Results = []*ir.Value{c2, n2, y, bx2}

			attrs := ir.Attrs{"num_consts": 1, "num_carry": 2, "length": length}
			if reverse || r.IntN(2) == 0 {
				attrs["reverse"] = reverse
			}
			op := addOp(t, f.Body, ir.Scan, []*ir.Value{pk, pc, pn, pxs, pxs2}, attrs, body)
			f.Body.Results = op.Results

			k := randLit(r, ir.Float32, kT.Shape, nil)
			c := randLit(r, ir.Float32, cT.Shape, nil)
			n := randLit(r, ir.Int32, nil, nil)
			xs := randLit(r, ir.Float32, xsT.Shape, nil)
			xs2 := randLit(r, ir.Float32, xsPinned.Shape, nil)
			xs2.Type.Space = ir.PinnedHost
			res := runFunc(t, f, []*ir.Literal{k, c, n, xs, xs2})

			// reference
			cv := ir.View[float32](c.Clone())
			ys := make([]float32, length*3)
			for it := 0; it < length; it++ {
				i := it
				if reverse {
					i = length - 1 - it
				}
				for j := 0; j < 3; j++ {
					cv[j] = float32(cv[j]*ir.View[float32](k)[j]) + ir.View[float32](xs)[i*3+j]
					ys[i*3+j] = cv[j] * cv[j]
				}
			}
			requireF32(t, cv, res[0], "carry")
			require.Equal(t, wrapTo(ir.Int32, getI(n, 0)+int64(length)), getI(res[1], 0))
			requireF32(t, ys, res[2], "ys")
			require.Equal(t, xs2.Data, res[3].Data)
			require.Equal(t, ir.PinnedHost, res[3].Type.Space)
			require.Equal(t, ir.Shape{length, 2}, res[3].Type.Shape)
		}
	}
}

func requireF32(t *testing.T, want []float32, got *ir.Literal, what string) {
	t.Helper()
	g := ir.View[float32](got)
	require.Len(t, g, len(want))
	for i := range want {
		require.True(t, closeTo(float64(g[i]), float64(want[i]), ir.Float32, 0, false), "%s[%d]: got %g want %g", what, i, g[i], want[i])
	}
}

// testWhile runs i, acc = 0, acc0; while i < limit: i += 1; acc = cond(i is
// odd, acc*inc + inc, acc - inc), with the cond nested in the body.
func testWhile(t *testing.T) {
	r := newRand(t)
	for _, limit := range []int32{0, 1, 6} {
		f := ir.NewFunc("while")
		iT, vT := ir.TypeOf(ir.Int32), ir.TypeOf(ir.Float32, 2)
		pl, pinc, pi, pacc := f.Body.AddParam(iT), f.Body.AddParam(vT), f.Body.AddParam(iT), f.Body.AddParam(vT)

		condR := f.NewRegion()
		cl, _, ci, _ := condR.AddParam(iT), condR.AddParam(vT), condR.AddParam(iT), condR.AddParam(vT)
		condR.Results = []*ir.Value{addOp(t, condR, ir.Lt, []*ir.Value{ci, cl}, nil).Result()}

		body := f.NewRegion()
		_, binc, bi, bacc := body.AddParam(iT), body.AddParam(vT), body.AddParam(iT), body.AddParam(vT)
		i2 := addOp(t, body, ir.Add, []*ir.Value{bi, constOp(t, body, int32(1))}, nil).Result()
		odd := addOp(t, body, ir.Eq, []*ir.Value{addOp(t, body, ir.Rem, []*ir.Value{i2, constOp(t, body, int32(2))}, nil).Result(), constOp(t, body, int32(1))}, nil).Result()
		tb := f.NewRegion()
		ta, tinc := tb.AddParam(vT), tb.AddParam(vT)
		tb.Results = []*ir.Value{addOp(t, tb, ir.Add, []*ir.Value{addOp(t, tb, ir.Mul, []*ir.Value{ta, tinc}, nil).Result(), tinc}, nil).Result()}
		fb := f.NewRegion()
		fa, finc := fb.AddParam(vT), fb.AddParam(vT)
		fb.Results = []*ir.Value{addOp(t, fb, ir.Sub, []*ir.Value{fa, finc}, nil).Result()}
		acc2 := addOp(t, body, ir.Cond, []*ir.Value{odd, bacc, binc}, nil, tb, fb).Result()
		body.Results = []*ir.Value{i2, acc2}

		op := addOp(t, f.Body, ir.While, []*ir.Value{pl, pinc, pi, pacc}, ir.Attrs{"num_consts": 2}, condR, body)
		f.Body.Results = op.Results

		inc := randLit(r, ir.Float32, vT.Shape, nil)
		acc := randLit(r, ir.Float32, vT.Shape, nil)
		res := runFunc(t, f, []*ir.Literal{ir.Scalar(limit), inc, ir.Scalar(int32(0)), acc})

		av := append([]float32(nil), ir.View[float32](acc)...)
		iv := ir.View[float32](inc)
		var i int32
		for i < limit {
			i++
			for j := range av {
				if i%2 == 1 {
					av[j] = float32(av[j]*iv[j]) + iv[j]
				} else {
					av[j] = av[j] - iv[j]
				}
			}
		}
		require.Equal(t, int64(max(limit, 0)), getI(res[0], 0))
		requireF32(t, av, res[1], "acc")
	}
}

func testCond(t *testing.T) {
	r := newRand(t)
	for _, pred := range []bool{true, false} {
		f := ir.NewFunc("cond")
		vT := ir.TypeOf(ir.Float64, 2, 2)
		pp, pa, pb := f.Body.AddParam(ir.TypeOf(ir.Bool)), f.Body.AddParam(vT), f.Body.AddParam(vT)
		tb := f.NewRegion()
		ta, tbb := tb.AddParam(vT), tb.AddParam(vT)
		tb.Results = []*ir.Value{addOp(t, tb, ir.Add, []*ir.Value{ta, tbb}, nil).Result(), ta}
		fb := f.NewRegion()
		fa, fbb := fb.AddParam(vT), fb.AddParam(vT)
		fb.Results = []*ir.Value{fbb, addOp(t, fb, ir.Sub, []*ir.Value{fa, fbb}, nil).Result()}
		op := addOp(t, f.Body, ir.Cond, []*ir.Value{pp, pa, pb}, nil, tb, fb)
		f.Body.Results = op.Results

		a := randLit(r, ir.Float64, vT.Shape, nil)
		b := randLit(r, ir.Float64, vT.Shape, nil)
		res := runFunc(t, f, []*ir.Literal{ir.Scalar(pred), a, b})
		for i := 0; i < 4; i++ {
			x, y := getF(a, i), getF(b, i)
			w0, w1 := y, x-y
			if pred {
				w0, w1 = x+y, x
			}
			require.True(t, closeTo(getF(res[0], i), w0, ir.Float64, 0, false), "cond %v [%d]", pred, i)
			require.True(t, closeTo(getF(res[1], i), w1, ir.Float64, 0, false), "cond %v [%d]", pred, i)
		}
	}
}
