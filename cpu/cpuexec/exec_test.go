package cpuexec

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

func newRand() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }

func TestElementwiseChain(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16, ir.Int32} {
		f := ir.NewFunc("chain")
		ty := ir.TypeOf(dt, 7, 9)
		x, y := f.Body.AddParam(ty), f.Body.AddParam(ty)
		m := add1(t, f.Body, ir.Mul, nil, x, y)
		a := add1(t, f.Body, ir.Add, nil, m, x)
		n := add1(t, f.Body, ir.Neg, nil, a)
		mx := add1(t, f.Body, ir.Max, nil, n, y)
		f.Body.Results = []*ir.Value{mx, a, x, mx}
		runBoth(t, naivePlan(f, planOpts{}), randArgs(newRand(), f))
	}
}

// loopGroup builds gelu-like y = tanh(x*w + b) * 0.5 + iota-ish terms,
// with broadcasts of a row vector, a column vector, a scalar, a transpose and
// a slice, as one loop fusion with several results.
func loopGroup(t testing.TB, dt ir.DType, rows, cols int) *ir.Func {
	f := ir.NewFunc("loop")
	x := f.Body.AddParam(ir.TypeOf(dt, rows, cols))
	w := f.Body.AddParam(ir.TypeOf(dt, cols))
	b := f.Body.AddParam(ir.TypeOf(dt, rows))
	tt := f.Body.AddParam(ir.TypeOf(dt, cols, rows+2))
	op := fuse(t, f, f.Body, "loop", []*ir.Value{x, w, b, tt}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
		shape := []int{rows, cols}
		wb := bcast(t, rg, ps[1], shape, 1)
		bb := bcast(t, rg, ps[2], shape, 0)
		half := bcast(t, rg, constant(t, rg, 0.5), shape)
		half = add1(t, rg, ir.Convert, ir.Attrs{"dtype": dt}, half)
		sl := add1(t, rg, ir.Slice, ir.Attrs{"start": []int{0, 1}, "limit": []int{cols, rows + 1}, "strides": []int{1, 1}}, ps[3])
		tr := add1(t, rg, ir.Transpose, ir.Attrs{"perm": []int{1, 0}}, sl)
		io := add1(t, rg, ir.Iota, ir.Attrs{"dtype": dt, "shape": shape, "dim": 1})
		m := add1(t, rg, ir.Mul, nil, ps[0], wb)
		a := add1(t, rg, ir.Add, nil, m, bb)
		th := add1(t, rg, ir.Tanh, nil, a)
		y := add1(t, rg, ir.Mul, nil, th, half)
		y = add1(t, rg, ir.Add, nil, y, tr)
		z := add1(t, rg, ir.Sub, nil, io, add1(t, rg, ir.Reshape, ir.Attrs{"shape": shape}, add1(t, rg, ir.Reshape, ir.Attrs{"shape": []int{rows * cols}}, y)))
		c := add1(t, rg, ir.Gt, nil, y, z)
		s := add1(t, rg, ir.Select, nil, c, y, z)
		return []*ir.Value{s, c, ps[0], s, add1(t, rg, ir.Reshape, ir.Attrs{"shape": []int{cols, rows}}, z)}
	})
	f.Body.Results = append(op.Results, add1(t, f.Body, ir.Neg, nil, op.Results[0]))
	return f
}

func TestFusedLoop(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16} {
		for _, sz := range [][2]int{{1, 1}, {0, 4}, {3, 5}, {37, 29}, {300, 700}} {
			f := loopGroup(t, dt, sz[0], sz[1])
			p := naivePlan(f, planOpts{})
			e, err := New(p)
			require.NoError(t, err)
			require.Equal(t, modeLoop, e.body.steps[0].fused.mode, e.body.steps[0].fused.why)
			runBoth(t, p, randArgs(newRand(), f))
		}
	}
}

func TestFusedLoopInts(t *testing.T) {
	f := ir.NewFunc("ints")
	ty := ir.TypeOf(ir.Int32, 50, 40)
	x, y := f.Body.AddParam(ty), f.Body.AddParam(ir.TypeOf(ir.Int32, 40))
	op := fuse(t, f, f.Body, "loop", []*ir.Value{x, y}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
		yb := bcast(t, rg, ps[1], []int{50, 40}, 1)
		d := add1(t, rg, ir.Div, nil, ps[0], yb)
		r := add1(t, rg, ir.Rem, nil, ps[0], yb)
		sh := add1(t, rg, ir.ShiftLeft, nil, d, bcast(t, rg, constant(t, rg, int32(3)), []int{50, 40}))
		b := add1(t, rg, ir.Convert, ir.Attrs{"dtype": ir.Bool}, r)
		nb := add1(t, rg, ir.Not, nil, b)
		u8 := add1(t, rg, ir.Convert, ir.Attrs{"dtype": ir.Uint8}, sh)
		fl := add1(t, rg, ir.Convert, ir.Attrs{"dtype": ir.Float16}, sh)
		bc := add1(t, rg, ir.BitcastConvert, ir.Attrs{"dtype": ir.Float32}, sh)
		return []*ir.Value{sh, nb, u8, fl, bc}
	})
	f.Body.Results = op.Results
	runBoth(t, naivePlan(f, planOpts{}), randArgs(newRand(), f))
}

// inputGroup reduces exp(x)*w (and x) over axes, with an extra full-size
// result.
func inputGroup(t testing.TB, dt ir.DType, shape []int, axes []int, codes ...ir.Code) *ir.Func {
	f := ir.NewFunc("input")
	x := f.Body.AddParam(ir.TypeOf(dt, shape...))
	w := f.Body.AddParam(ir.TypeOf(dt, shape[len(shape)-1]))
	op := fuse(t, f, f.Body, "input", []*ir.Value{x, w}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
		wb := bcast(t, rg, ps[1], shape, len(shape)-1)
		v := ps[0]
		if dt.IsFloat() {
			v = add1(t, rg, ir.Exp, nil, v)
		}
		m := add1(t, rg, ir.Mul, nil, v, wb)
		var res []*ir.Value
		for _, c := range codes {
			res = append(res, add1(t, rg, c, ir.Attrs{"axes": axes}, m))
		}
		return append(res, m)
	})
	f.Body.Results = op.Results
	return f
}

func TestFusedInput(t *testing.T) {
	all := []ir.Code{ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd}
	cases := []struct {
		shape, axes []int
	}{
		{[]int{4, 5}, []int{1}},
		{[]int{4, 5}, []int{0}},
		{[]int{4, 5}, []int{0, 1}},
		{[]int{3, 1, 6, 7}, []int{2, 3}},
		{[]int{3, 4, 6}, []int{1}},
		{[]int{600, 333}, []int{1}},
		{[]int{333, 600}, []int{0}},
		{[]int{5, 0}, []int{1}},
		{[]int{0, 5}, []int{0}},
		{[]int{128, 2048}, []int{1}},
		{[]int{1 << 16, 2}, []int{1}},
	}
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16, ir.Int32, ir.Uint8} {
		for _, c := range cases {
			f := inputGroup(t, dt, c.shape, c.axes, all...)
			p := naivePlan(f, planOpts{})
			e, err := New(p)
			require.NoError(t, err)
			require.Equal(t, modeInput, e.body.steps[0].fused.mode, e.body.steps[0].fused.why)
			args := randArgs(newRand(), f)
			if dt.IsFloat() && c.shape[0] == 4 {
				args[0].SetFloat64At(3, nanF()) // NaN propagation in max/min
			}
			runBoth(t, p, args)
		}
	}
}

// TestFusedInputMixed runs groups that reduce one operand over its
// trailing axes and over others at once (a layer norm's statistics and the
// gradients of its scale): the group takes the general path, where the
// trailing float sums must still add in eval's lane order. Results equal
// eval's bit for bit, rows crossing block boundaries included.
func TestFusedInputMixed(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16} {
		for _, shape := range [][]int{{7, 333}, {3, 5, 130}, {64, 17}} {
			last := len(shape) - 1
			f := ir.NewFunc("mixed")
			x := f.Body.AddParam(ir.TypeOf(dt, shape...))
			op := fuse(t, f, f.Body, "input", []*ir.Value{x}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
				e := add1(t, rg, ir.Exp, nil, ps[0])
				lead := make([]int, last)
				for i := range lead {
					lead[i] = i
				}
				return []*ir.Value{
					add1(t, rg, ir.ReduceSum, ir.Attrs{"axes": []int{last}}, e),
					add1(t, rg, ir.ReduceSum, ir.Attrs{"axes": lead}, e),
					add1(t, rg, ir.ReduceMax, ir.Attrs{"axes": []int{last}}, ps[0]),
				}
			})
			f.Body.Results = op.Results
			p := naivePlan(f, planOpts{})
			e, err := New(p)
			require.NoError(t, err)
			require.Equal(t, modeInput, e.body.steps[0].fused.mode, e.body.steps[0].fused.why)
			runBoth(t, p, randArgs(newRand(), f))
		}
	}
}

func nanF() float64 { var z float64; return z / z }

func TestFusedOutput(t *testing.T) {
	for _, dt := range []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.Int32} {
		for _, mnk := range [][3]int{{1, 1, 1}, {5, 7, 3}, {64, 100, 48}, {130, 70, 257}} {
			m, k, n := mnk[0], mnk[1], mnk[2]
			f := ir.NewFunc("output")
			a, b := f.Body.AddParam(ir.TypeOf(dt, m, k)), f.Body.AddParam(ir.TypeOf(dt, k, n))
			bias := f.Body.AddParam(ir.TypeOf(dt, n))
			op := fuse(t, f, f.Body, "output", []*ir.Value{a, b, bias}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
				d := add1(t, rg, ir.DotGeneral, matmulAttrs(), ps[0], ps[1])
				s := add1(t, rg, ir.Add, nil, d, bcast(t, rg, ps[2], []int{m, n}, 1))
				z := bcast(t, rg, add1(t, rg, ir.Convert, ir.Attrs{"dtype": dt}, constant(t, rg, int32(0))), []int{m, n})
				return []*ir.Value{add1(t, rg, ir.Max, nil, s, z)}
			})
			// a dot alone, and a dot with a reshape, in groups too
			op2 := fuse(t, f, f.Body, "output", []*ir.Value{a, b}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
				d := add1(t, rg, ir.DotGeneral, matmulAttrs(), ps[0], ps[1])
				return []*ir.Value{add1(t, rg, ir.Reshape, ir.Attrs{"shape": []int{m * n}}, d)}
			})
			f.Body.Results = append(op.Results, op2.Results...)
			p := naivePlan(f, planOpts{})
			e, err := New(p)
			require.NoError(t, err)
			require.Equal(t, modeOutput, e.body.steps[0].fused.mode, e.body.steps[0].fused.why)
			require.Equal(t, modeOutput, e.body.steps[1].fused.mode, e.body.steps[1].fused.why)
			runBoth(t, p, randArgs(newRand(), f))
		}
	}
	// A batched product with a convert epilogue.
	f := ir.NewFunc("batched")
	a, b := f.Body.AddParam(ir.TypeOf(ir.Float32, 3, 4, 5)), f.Body.AddParam(ir.TypeOf(ir.Float32, 3, 5, 6))
	op := fuse(t, f, f.Body, "output", []*ir.Value{a, b}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
		d := add1(t, rg, ir.DotGeneral, ir.Attrs{"lhs_batch": []int{0}, "rhs_batch": []int{0}, "lhs_contract": []int{2}, "rhs_contract": []int{1}}, ps[0], ps[1])
		return []*ir.Value{add1(t, rg, ir.Convert, ir.Attrs{"dtype": ir.Int32}, add1(t, rg, ir.Mul, nil, d, d))}
	})
	f.Body.Results = op.Results
	runBoth(t, naivePlan(f, planOpts{}), randArgs(newRand(), f))
}

// TestFusedFallback runs groups the block compiler does not take (through
// eval) and groups whose buffers overlap at run time.
func TestFusedFallback(t *testing.T) {
	f := ir.NewFunc("fallback")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 6, 4))
	op := fuse(t, f, f.Body, "input", []*ir.Value{x}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
		s := add1(t, rg, ir.ReduceSum, ir.Attrs{"axes": []int{1}}, ps[0])
		mean := add1(t, rg, ir.Div, nil, s, bcast(t, rg, constant(t, rg, float32(4)), []int{6}))
		pd := add1(t, rg, ir.Pad, ir.Attrs{"low": []int{1}, "high": []int{0}, "interior": []int{0}}, mean, constant(t, rg, float32(0)))
		return []*ir.Value{pd}
	})
	f.Body.Results = op.Results
	p := naivePlan(f, planOpts{})
	e, err := New(p)
	require.NoError(t, err)
	require.Equal(t, modeFallback, e.body.steps[0].fused.mode)
	runBoth(t, p, randArgs(newRand(), f))
}

func TestReductionsAndDots(t *testing.T) {
	f := ir.NewFunc("plain")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 20, 30))
	y := f.Body.AddParam(ir.TypeOf(ir.Float32, 30, 10))
	s := add1(t, f.Body, ir.ReduceSum, ir.Attrs{"axes": []int{0}}, x)
	mx := add1(t, f.Body, ir.ArgMax, ir.Attrs{"axis": 1, "dtype": ir.Int32}, x)
	d := add1(t, f.Body, ir.DotGeneral, matmulAttrs(), x, y)
	tr := add1(t, f.Body, ir.Transpose, ir.Attrs{"perm": []int{1, 0}}, d)
	f.Body.Results = []*ir.Value{s, mx, tr}
	runBoth(t, naivePlan(f, planOpts{}), randArgs(newRand(), f))
}

// scanFunc: consts k; carries (c, n, a, b) with a, b swapped every
// iteration; xs x (f32[len,3]) and p (pinned); ys (c*c, p passed through,
// a).
func scanFunc(t testing.TB, length int, reverse bool, fused bool) *ir.Func {
	f := ir.NewFunc("scan")
	vT := ir.TypeOf(ir.Float32, 3)
	kT, nT := vT, ir.TypeOf(ir.Int32)
	xsT := ir.TypeOf(ir.Float32, length, 3)
	psT := ir.TypeOf(ir.Float32, length, 2).WithSpace(ir.PinnedHost)
	pk, pc, pn, pa, pb := f.Body.AddParam(kT), f.Body.AddParam(vT), f.Body.AddParam(nT), f.Body.AddParam(vT), f.Body.AddParam(vT)
	pxs, pps := f.Body.AddParam(xsT), f.Body.AddParam(psT)

	body := f.NewRegion()
	bk, bc, bn, ba, bb := body.AddParam(kT), body.AddParam(vT), body.AddParam(nT), body.AddParam(vT), body.AddParam(vT)
	bx, bp := body.AddParam(vT), body.AddParam(ir.TypeOf(ir.Float32, 2).WithSpace(ir.PinnedHost))
	var c2, y *ir.Value
	if fused {
		op := fuse(t, f, body, "loop", []*ir.Value{bc, bk, bx}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
			c := add1(t, rg, ir.Add, nil, add1(t, rg, ir.Mul, nil, ps[0], ps[1]), ps[2])
			return []*ir.Value{c, add1(t, rg, ir.Mul, nil, c, c)}
		})
		c2, y = op.Results[0], op.Results[1]
	} else {
		c2 = add1(t, body, ir.Add, nil, add1(t, body, ir.Mul, nil, bc, bk), bx)
		y = add1(t, body, ir.Mul, nil, c2, c2)
	}
	n2 := add1(t, body, ir.Add, nil, bn, constant(t, body, int32(1)))
	body.Results = []*ir.Value{c2, n2, bb, ba, y, bp, ba}
	attrs := ir.Attrs{"num_consts": 1, "num_carry": 4, "length": length, "reverse": reverse}
	op := addOp(t, f.Body, ir.Scan, []*ir.Value{pk, pc, pn, pa, pb, pxs, pps}, attrs, body)
	f.Body.Results = op.Results
	return f
}

func TestScan(t *testing.T) {
	for _, length := range []int{0, 1, 2, 5} {
		for _, reverse := range []bool{false, true} {
			for _, fused := range []bool{false, true} {
				f := scanFunc(t, length, reverse, fused)
				args := randArgs(newRand(), f)
				runBoth(t, naivePlan(f, planOpts{}), args)
			}
		}
	}
}

// TestScanInPlace plans a carry computed straight into its own carry
// parameter (dynamic_update_slice in place) and another into the other
// carry's parameter (which then needs the staging copy).
func TestScanInPlace(t *testing.T) {
	f := ir.NewFunc("dus")
	accT, vT := ir.TypeOf(ir.Float32, 4, 3), ir.TypeOf(ir.Float32, 3)
	pacc, pa, pb, pxs := f.Body.AddParam(accT), f.Body.AddParam(vT), f.Body.AddParam(vT), f.Body.AddParam(ir.TypeOf(ir.Float32, 4, 3))
	body := f.NewRegion()
	bacc, ba, bb, bx := body.AddParam(accT), body.AddParam(vT), body.AddParam(vT), body.AddParam(vT)
	row := add1(t, body, ir.Reshape, ir.Attrs{"shape": []int{1, 3}}, add1(t, body, ir.Add, nil, bx, ba))
	i0 := add1(t, body, ir.Convert, ir.Attrs{"dtype": ir.Int32}, add1(t, body, ir.ReduceSum, ir.Attrs{"axes": []int{0}}, bb))
	upd := add1(t, body, ir.DynamicUpdateSlice, nil, bacc, row, i0, constant(t, body, int32(0)))
	nb := add1(t, body, ir.Mul, nil, bb, bx) // computed in place over b, dead after it
	body.Results = []*ir.Value{upd, nb, ba}  // the new a lives in b's memory and vice versa
	op := addOp(t, f.Body, ir.Scan, []*ir.Value{pacc, pa, pb, pxs}, ir.Attrs{"num_consts": 0, "num_carry": 3, "length": 4}, body)
	f.Body.Results = op.Results
	p := naivePlan(f, planOpts{inPlace: map[*ir.Value]int{upd: 0, nb: 2}})
	args := randArgs(newRand(), f)
	for i := 0; i < 3; i++ {
		args[2].SetFloat64At(i, float64(i%2)) // b sums to a small index
	}
	runBoth(t, p, args)
}

// whileCondFunc is a while loop whose body holds a cond: nested frames two
// levels deep. Its arguments are (limit, inc, i, acc, z); the loop runs
// while i < limit.
func whileCondFunc(t testing.TB) *ir.Func {
	f := ir.NewFunc("while")
	iT, vT := ir.TypeOf(ir.Int32), ir.TypeOf(ir.Float32, 2)
	pl, pinc, pi, pacc, pz := f.Body.AddParam(iT), f.Body.AddParam(vT), f.Body.AddParam(iT), f.Body.AddParam(vT), f.Body.AddParam(vT)

	condR := f.NewRegion()
	cl, _, ci, _, _ := condR.AddParam(iT), condR.AddParam(vT), condR.AddParam(iT), condR.AddParam(vT), condR.AddParam(vT)
	condR.Results = []*ir.Value{add1(t, condR, ir.Lt, nil, ci, cl)}

	body := f.NewRegion()
	_, binc, bi, bacc, bz := body.AddParam(iT), body.AddParam(vT), body.AddParam(iT), body.AddParam(vT), body.AddParam(vT)
	i2 := add1(t, body, ir.Add, nil, bi, constant(t, body, int32(1)))
	odd := add1(t, body, ir.Eq, nil, add1(t, body, ir.Rem, nil, i2, constant(t, body, int32(2))), constant(t, body, int32(1)))
	tb := f.NewRegion()
	ta, tinc := tb.AddParam(vT), tb.AddParam(vT)
	tb.Results = []*ir.Value{add1(t, tb, ir.Add, nil, add1(t, tb, ir.Mul, nil, ta, tinc), tinc), ta}
	fb := f.NewRegion()
	fa, finc := fb.AddParam(vT), fb.AddParam(vT)
	fb.Results = []*ir.Value{add1(t, fb, ir.Sub, nil, fa, finc), finc}
	cop := addOp(t, body, ir.Cond, []*ir.Value{odd, bacc, binc}, nil, tb, fb)
	body.Results = []*ir.Value{i2, cop.Results[0], bacc} // z = previous acc
	_ = bz

	op := addOp(t, f.Body, ir.While, []*ir.Value{pl, pinc, pi, pacc, pz}, ir.Attrs{"num_consts": 2}, condR, body)
	f.Body.Results = op.Results
	return f
}

func TestWhileCond(t *testing.T) {
	for _, limit := range []int32{0, 1, 6} {
		f := whileCondFunc(t)
		args := randArgs(newRand(), f)
		args[0] = ir.Scalar(limit)
		args[2] = ir.Scalar(int32(0))
		runBoth(t, naivePlan(f, planOpts{}), args)
	}
}

func TestCondTopLevel(t *testing.T) {
	for _, pred := range []bool{true, false} {
		f := ir.NewFunc("cond")
		vT := ir.TypeOf(ir.Float64, 2, 2)
		pp, pa, pb := f.Body.AddParam(ir.TypeOf(ir.Bool)), f.Body.AddParam(vT), f.Body.AddParam(vT)
		tb := f.NewRegion()
		ta, tbb := tb.AddParam(vT), tb.AddParam(vT)
		tb.Results = []*ir.Value{add1(t, tb, ir.Add, nil, ta, tbb), ta}
		fb := f.NewRegion()
		fa, fbb := fb.AddParam(vT), fb.AddParam(vT)
		fb.Results = []*ir.Value{fbb, add1(t, fb, ir.Sub, nil, fa, fbb)}
		op := addOp(t, f.Body, ir.Cond, []*ir.Value{pp, pa, pb}, nil, tb, fb)
		f.Body.Results = op.Results
		args := randArgs(newRand(), f)
		args[0] = ir.Scalar(pred)
		runBoth(t, naivePlan(f, planOpts{}), args)
	}
}

func TestDonation(t *testing.T) {
	f := ir.NewFunc("donate")
	ty := ir.TypeOf(ir.Float32, 1000)
	x, y := f.Body.AddParam(ty), f.Body.AddParam(ty)
	d := add1(t, f.Body, ir.Add, nil, add1(t, f.Body, ir.Mul, nil, x, y), y)
	f.Body.Results = []*ir.Value{d, y}
	p := naivePlan(f, planOpts{donated: []bool{true, false}, alias: map[int]int{0: 0}})
	args := randArgs(newRand(), f)
	want := cloneAll(args)
	// the product is computed into x too (in place, elementwise).
	p.Plan.Values[f.Body.Ops[0].Result()] = passes.Buffer{Kind: passes.BufAlias, Space: ir.Device, Index: 0, Param: 0, Size: ty.Bytes()}
	_, err := New(p)
	require.Error(t, err, "a non-result value cannot be an alias")
	p.Plan.Values[f.Body.Ops[0].Result()] = passes.Buffer{Kind: passes.BufParam, Space: ir.Device, Index: 0, Size: ty.Bytes()}
	e, err := New(p)
	require.NoError(t, err)
	a := &countAlloc{}
	got, rel, err := e.Execute(args, a)
	require.NoError(t, err)
	require.Same(t, &args[0].Data[0], &got[0].Data[0], "result 0 reuses the donated argument")
	ref := naivePlan(f, planOpts{})
	wantRes := runBoth(t, ref, want)
	require.Equal(t, wantRes[0].Data, got[0].Data)
	require.Equal(t, wantRes[1].Data, got[1].Data)
	checkAllocs(t, p, a)
	for _, r := range rel {
		r()
	}
	a.requireReleased(t, true)

	// Aliasing a parameter that is not donated is refused.
	p2 := naivePlan(f, planOpts{alias: map[int]int{0: 0}})
	_, err = New(p2)
	require.ErrorContains(t, err, "not donated")
}

func TestReleaseOnError(t *testing.T) {
	f := loopGroup(t, ir.Float32, 10, 10)
	p := naivePlan(f, planOpts{})
	e, err := New(p)
	require.NoError(t, err)
	args := randArgs(newRand(), f)
	f.Body.Results = append(f.Body.Results[:5], add1(t, f.Body, ir.Exp, nil, f.Body.Results[5]))
	p = naivePlan(f, planOpts{})
	require.NotZero(t, p.Plan.Arena[ir.Device])
	e, err = New(p)
	require.NoError(t, err)
	total := len(f.Body.Results) + 1
	for fail := 1; fail <= total; fail++ {
		a := &countAlloc{failAt: fail}
		_, _, err := e.Execute(args, a)
		require.ErrorContains(t, err, "out of memory (test)")
		a.requireReleased(t, true)
	}
	// A run-time error in an op releases everything too.
	g := ir.NewFunc("gather")
	op := addOp(t, g.Body, ir.Gather, []*ir.Value{g.Body.AddParam(ir.TypeOf(ir.Float32, 0)), g.Body.AddParam(ir.TypeOf(ir.Int32, 2))}, ir.Attrs{"axis": 0})
	g.Body.Results = []*ir.Value{add1(t, g.Body, ir.Neg, nil, op.Result())}
	e, err = New(naivePlan(g, planOpts{}))
	require.NoError(t, err)
	a := &countAlloc{}
	_, _, err = e.Execute([]*ir.Literal{ir.NewLiteral(ir.TypeOf(ir.Float32, 0)), ir.NewLiteral(ir.TypeOf(ir.Int32, 2))}, a)
	require.ErrorContains(t, err, "empty axis")
	require.Len(t, a.recs, 2) // the output and the arena
	require.Equal(t, "temp arena", a.recs[1].what)
	a.requireReleased(t, true)
	// Misaligned memory from the allocator is an error.
	a = &countAlloc{misal: true}
	_, _, err = e.Execute([]*ir.Literal{ir.NewLiteral(ir.TypeOf(ir.Float32, 0)), ir.NewLiteral(ir.TypeOf(ir.Int32, 2))}, a)
	require.ErrorContains(t, err, "aligned")
	a.requireReleased(t, true)
	// Argument checks.
	_, _, err = e.Execute(nil, &countAlloc{})
	require.ErrorContains(t, err, "takes 2 arguments")
	_, _, err = e.Execute([]*ir.Literal{ir.NewLiteral(ir.TypeOf(ir.Float32, 1)), ir.NewLiteral(ir.TypeOf(ir.Int32, 2))}, &countAlloc{})
	require.ErrorContains(t, err, "f32[1]")
}

func TestPlanErrors(t *testing.T) {
	f := loopGroup(t, ir.Float32, 3, 3)
	f.Body.Results = append(f.Body.Results[:5], add1(t, f.Body, ir.Exp, nil, f.Body.Results[5]))
	p := naivePlan(f, planOpts{})
	delete(p.Plan.Values, f.Body.Ops[1].Result())
	_, err := New(p)
	require.ErrorContains(t, err, "has no buffer")

	p = naivePlan(f, planOpts{})
	p.Plan.Arena[ir.Device] = 8
	_, err = New(p)
	require.ErrorContains(t, err, "outside")

	g := scanFunc(t, 3, false, false)
	p = naivePlan(g, planOpts{})
	p.Plan.Sub[g.Body.Ops[0]] = nil
	_, err = New(p)
	require.ErrorContains(t, err, "nested plans")
}

// TestFusionInPlace plans a loop group's first result over an operand that
// dies at the group (passes.Options.FusionInPlace). The second result reads
// the operand after the first is computed, so a program storing results
// before the whole block is computed would be wrong. When the operand is
// also read through a transpose the group must fall back (and still be
// right).
func TestFusionInPlace(t *testing.T) {
	for _, transposed := range []bool{false, true} {
		for _, n := range []int{8, 300} {
			f := ir.NewFunc("inplace")
			x, w := f.Body.AddParam(ir.TypeOf(ir.Float32, n, n)), f.Body.AddParam(ir.TypeOf(ir.Float32, n))
			tv := add1(t, f.Body, ir.Neg, nil, x)
			op := fuse(t, f, f.Body, "loop", []*ir.Value{tv, w}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
				a := add1(t, rg, ir.Mul, nil, ps[0], bcast(t, rg, ps[1], []int{n, n}, 1))
				b := add1(t, rg, ir.Add, nil, ps[0], a)
				if transposed {
					b = add1(t, rg, ir.Add, nil, b, add1(t, rg, ir.Transpose, ir.Attrs{"perm": []int{1, 0}}, ps[0]))
				}
				return []*ir.Value{a, b}
			})
			f.Body.Results = []*ir.Value{add1(t, f.Body, ir.Exp, nil, op.Results[0]), op.Results[1]}
			p := naivePlan(f, planOpts{})
			tb := p.Plan.Values[tv]
			ub := p.Plan.Values[op.Results[0]]
			ub.Offset = tb.Offset
			p.Plan.Values[op.Results[0]] = ub
			e, err := New(p)
			require.NoError(t, err)
			k := e.body.steps[1].fused
			require.Equal(t, !transposed, k.elemOnly[0])
			runBoth(t, p, randArgs(newRand(), f))
		}
	}
}

// TestInputFusionInPlace plans an input group's first result over an
// operand that dies at the group, as passes does for an optimizer update
// fused with a loss: the group's reductions read another operand (over
// every axis, the inner one or the outer one), the second result reads the
// overwritten operand after the first is computed. The block programs must
// run in place (not fall back) and give the reference's bits.
func TestInputFusionInPlace(t *testing.T) {
	for _, axes := range [][]int{{0, 1}, {1}, {0}} {
		for _, n := range []int{8, 300} {
			f := ir.NewFunc("inplace_input")
			x, z := f.Body.AddParam(ir.TypeOf(ir.Float32, n, n)), f.Body.AddParam(ir.TypeOf(ir.Float32, n, n))
			tv := add1(t, f.Body, ir.Neg, nil, x)
			op := fuse(t, f, f.Body, "input", []*ir.Value{tv, z}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
				a := add1(t, rg, ir.Mul, nil, ps[0], ps[1])
				b := add1(t, rg, ir.Add, nil, ps[0], a)
				r := add1(t, rg, ir.ReduceSum, ir.Attrs{"axes": axes}, add1(t, rg, ir.Mul, nil, ps[1], ps[1]))
				return []*ir.Value{a, b, r}
			})
			f.Body.Results = []*ir.Value{add1(t, f.Body, ir.Exp, nil, op.Results[0]), op.Results[1], op.Results[2]}
			p := naivePlan(f, planOpts{})
			tb := p.Plan.Values[tv]
			ub := p.Plan.Values[op.Results[0]]
			ub.Offset = tb.Offset
			p.Plan.Values[op.Results[0]] = ub
			e, err := New(p)
			require.NoError(t, err)
			k := e.body.steps[1].fused
			require.Equal(t, modeInput, k.mode)
			require.True(t, k.elemOnly[0])
			shared := make([]byte, tv.Type.Bytes())
			lit := func(v *ir.Value, data []byte) *ir.Literal {
				if data == nil {
					data = make([]byte, v.Type.Bytes())
				}
				return &ir.Literal{Type: v.Type, Data: data}
			}
			ok, inPlace := k.buffersOK([]*ir.Literal{lit(tv, shared), lit(z, nil)},
				[]*ir.Literal{lit(op.Results[0], shared), lit(op.Results[1], nil), lit(op.Results[2], nil)})
			require.True(t, ok && inPlace, "the block programs run the group in place")
			runBoth(t, p, randArgs(newRand(), f))
		}
	}
}

// TestConcurrentExecute runs one Executable from several goroutines.
func TestConcurrentExecute(t *testing.T) {
	f := loopGroup(t, ir.Float32, 200, 300)
	g := inputGroup(t, ir.Float32, []int{300, 200}, []int{1}, ir.ReduceSum, ir.ReduceMax)
	for _, fn := range []*ir.Func{f, g, scanFunc(t, 6, true, true)} {
		p := naivePlan(fn, planOpts{})
		e, err := New(p)
		require.NoError(t, err)
		args := randArgs(newRand(), fn)
		want, err := eval.Run(fn, args)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 3 {
					got, _, err := e.Execute(args, &countAlloc{})
					if err != nil {
						errs <- err
						return
					}
					for i := range want {
						if !bytes.Equal(got[i].Data, want[i].Data) {
							errs <- fmt.Errorf("%s: result %d differs", fn.Name, i)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

// TestMemorySpaces moves a value to pinned_host and back: one arena per
// space, outputs allocated in their result's space.
func TestMemorySpaces(t *testing.T) {
	f := ir.NewFunc("spaces")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 300))
	h := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, x)
	h2 := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.PinnedHost}, add1(t, f.Body, ir.Exp, nil, x))
	d := add1(t, f.Body, ir.DevicePut, ir.Attrs{"space": ir.Device}, h)
	f.Body.Results = []*ir.Value{add1(t, f.Body, ir.Add, nil, d, x), h2}
	p := naivePlan(f, planOpts{})
	require.NotZero(t, p.Plan.Arena[ir.Device])
	require.NotZero(t, p.Plan.Arena[ir.PinnedHost])
	runBoth(t, p, randArgs(newRand(), f))
}

// TestOutputLaterOccurrence: a value returned twice whose output buffer is
// the second position; the first gets a copy.
func TestOutputLaterOccurrence(t *testing.T) {
	f := ir.NewFunc("twice")
	x := f.Body.AddParam(ir.TypeOf(ir.Float32, 5))
	n := add1(t, f.Body, ir.Neg, nil, x)
	f.Body.Results = []*ir.Value{n, n}
	p := naivePlan(f, planOpts{})
	p.Plan.Values[n] = passes.Buffer{Kind: passes.BufOutput, Space: ir.Device, Index: 1, Size: 20}
	runBoth(t, p, randArgs(newRand(), f))
}

// TestFusionInPlaceOperandResult is a loop group computed in place over its
// operand that also returns the operand itself (reshaped: a leaf read
// straight from the operand's memory, not copied into a block): the leaf
// result must be the operand's values from before the group, not the other
// result stored over them. With two operands each overwritten by the
// other's pass-through no store order is right: the leaves must be read
// first. (The random-program test found it: reshape chains stay in the
// group when the canonicaliser is off.)
func TestFusionInPlaceOperandResult(t *testing.T) {
	for _, n := range []int{6, 3000} {
		for _, swapped := range []bool{false, true} {
			f := ir.NewFunc("inplace_leaf")
			x, y := f.Body.AddParam(ir.TypeOf(ir.Float32, n)), f.Body.AddParam(ir.TypeOf(ir.Float32, n))
			tx := add1(t, f.Body, ir.Neg, nil, x)
			ty := add1(t, f.Body, ir.Neg, nil, y)
			op := fuse(t, f, f.Body, "loop", []*ir.Value{tx, ty}, func(rg *ir.Region, ps []*ir.Value) []*ir.Value {
				r0 := add1(t, rg, ir.Reshape, ir.Attrs{"shape": []int{n, 1}}, ps[0])
				if !swapped {
					s := add1(t, rg, ir.Sign, nil, add1(t, rg, ir.Round, nil, add1(t, rg, ir.Add, nil, ps[0], ps[1])))
					return []*ir.Value{s, r0}
				}
				// Result 0 (over operand 1) passes operand 0 through,
				// result 1 (over operand 0) operand 1.
				return []*ir.Value{r0, add1(t, rg, ir.Reshape, ir.Attrs{"shape": []int{n, 1}}, ps[1])}
			})
			f.Body.Results = []*ir.Value{add1(t, f.Body, ir.Abs, nil, op.Results[0]), add1(t, f.Body, ir.Abs, nil, op.Results[1])}
			p := naivePlan(f, planOpts{})
			// The results in the operands' memory, as FusionInPlace plans
			// them.
			over := []*ir.Value{tx, ty}
			if swapped {
				over[0], over[1] = ty, tx
			}
			for i, o := range over {
				ub := p.Plan.Values[op.Results[i]]
				ub.Offset = p.Plan.Values[o].Offset
				p.Plan.Values[op.Results[i]] = ub
			}
			e, err := New(p)
			require.NoError(t, err)
			k := e.body.steps[2].fused
			require.NotEqual(t, modeFallback, k.mode, k.why)
			runBoth(t, p, randArgs(newRand(), f))
		}
	}
}
