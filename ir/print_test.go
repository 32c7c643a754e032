package ir

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var txtUpdate = flag.Bool("update-fuzz-seeds", false, "rewrite the FuzzParse seed corpus under testdata/fuzz/FuzzParse from the round-trip corpus")

// txtBuilder appends ops to a region and fails the test on any error.
type txtBuilder struct {
	t testing.TB
	r *Region
}

func (b txtBuilder) ops(code Code, args []*Value, attrs Attrs, regions ...*Region) []*Value {
	b.t.Helper()
	op, err := b.r.AddOp(code, args, attrs, regions...)
	require.NoError(b.t, err, "building %v", code)
	return op.Results
}

func (b txtBuilder) op(code Code, args []*Value, attrs Attrs, regions ...*Region) *Value {
	b.t.Helper()
	res := b.ops(code, args, attrs, regions...)
	require.Len(b.t, res, 1, "%v results", code)
	return res[0]
}

func (b txtBuilder) opAt(loc string, code Code, args []*Value, attrs Attrs) *Value {
	b.t.Helper()
	v := b.op(code, args, attrs)
	v.Op.Loc = loc
	return v
}

func vs(v ...*Value) []*Value { return v }

func txtLiteral[T Native](t testing.TB, shape Shape, data ...T) *Literal {
	t.Helper()
	l, err := LiteralOf(shape, data)
	require.NoError(t, err)
	return l
}

// txtBitsLiteral builds a 16-bit float literal from raw bits.
func txtBitsLiteral[T F16 | BF16](t testing.TB, bits ...uint16) *Literal {
	data := make([]T, len(bits))
	for i, b := range bits {
		data[i] = T(b)
	}
	return txtLiteral(t, Shape{len(bits)}, data...)
}

// txtCorpus returns functions that together use every op code, every dtype in
// literals, every attribute kind the op table uses, nested regions, memory
// spaces, scalars and zero-size dimensions.
func txtCorpus(t testing.TB) map[string]*Func {
	return map[string]*Func{
		"elementwise": txtElementwise(t),
		"shapes":      txtShapes(t),
		"control":     txtControl(t),
		"scan":        txtScan(t),
		"literals":    txtLiterals(t),
		"empty":       NewFunc("empty"),
		"odd":         txtOdd(t),
		"fusion":      txtFusion(t),
		"remat":       txtRemat(t),
		"sharded":     txtSharded(t),
		"collectives": txtCollectives(t),
	}
}

// txtCollectives holds every collective op, as a ShardMap's per-device
// program or a Vmap's traced body would.
func txtCollectives(t testing.TB) *Func {
	f := NewFunc("collectives")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 4, 6))
	ax := func(more Attrs) Attrs {
		a := Attrs{"axis": "data parallel", "size": 2}
		for k, v := range more {
			a[k] = v
		}
		return a
	}
	s := b.op(AllReduce, vs(x), ax(Attrs{"reduction": "sum"}))
	m := b.op(AllReduce, vs(s), ax(Attrs{"reduction": "max"}))
	g := b.opAt("model.go:7", AllGather, vs(m), ax(Attrs{"dimension": 1}))
	gt := b.op(AllGather, vs(m), ax(Attrs{"dimension": 0, "tiled": true}))
	r := b.op(ReduceScatter, vs(g), ax(Attrs{"dimension": 1}))
	rt := b.op(ReduceScatter, vs(gt), ax(Attrs{"dimension": 0, "tiled": true}))
	a2a := b.op(AllToAll, vs(rt), ax(Attrs{"split_dimension": 1, "concat_dimension": 0}))
	p := b.op(CollectivePermute, vs(r), ax(Attrs{"pairs": []int{0, 1, 1, 0}}))
	i := b.op(AxisIndex, nil, ax(nil))
	f.Body.Results = vs(p, a2a, i)
	return f
}

// txtSharded uses shardings: on parameters, op results (set by hand, as the
// propagation pass does), region parameters and function results; meshes
// with default and permuted devices, of one, two and no axes; specs with one
// axis, several axes, replicated and trailing dimensions; with pinned_host.
func txtSharded(t testing.TB) *Func {
	f := NewFunc("sharded")
	b := txtBuilder{t, f.Body}
	m := mustMesh(t, []int{2, 4}, []string{"x", "y"})
	rev := mustMesh(t, []int{4}, []string{"data"}, 3, 2, 1, 0)
	scalar := mustMesh(t, nil, nil, 6)
	shard := func(v *Value, m *Mesh, spec PartitionSpec) *Value {
		v.Type = v.Type.WithSharding(mustSharding(t, m, spec))
		return v
	}
	x := shard(f.Body.AddParam(TypeOf(Float32, 8, 4)), m, P("x", "y"))
	w := shard(f.Body.AddParam(TypeOf(Float32, 4, 16)), m, PartitionSpec{nil, {"y", "x"}})
	h := shard(f.Body.AddParam(TypeOf(BFloat16, 4, 6).WithSpace(PinnedHost)), rev, P("data"))
	k := shard(f.Body.AddParam(TypeOf(Uint32, 2)), scalar, P())
	mm := shard(b.op(DotGeneral, vs(x, w), Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}}), m, P("x", ""))
	r := shard(b.op(ReduceSum, vs(mm), Attrs{"axes": []int{1}}), m, P())
	hd := shard(b.op(DevicePut, vs(h), Attrs{"space": Device}), rev, PartitionSpec{{"data"}, {}})
	ys := mustSharding(t, m, P("y"))
	c := shard(b.op(ShardingConstraint, vs(r), Attrs{"sharding": ys.String()}), m, P("y"))

	body := f.NewRegion()
	carry := shard(body.AddParam(TypeOf(Float32, 4)), m, P("y"))
	row := body.AddParam(TypeOf(Float32, 4))
	sum := shard(txtBuilder{t, body}.op(Add, vs(carry, row), nil), m, P("y"))
	body.Results = vs(sum, sum)
	init := b.op(Constant, nil, Attrs{"value": txtLiteral(t, Shape{4}, float32(0), 1, 2, 3)})
	sc := b.ops(Scan, vs(init, x), Attrs{"length": 8, "num_carry": 1, "num_consts": 0}, body)
	shard(sc[1], m, P("x"))
	f.Body.Results = vs(r, hd, sc[0], sc[1], k, c)
	return f
}

func txtRemat(t testing.TB) *Func {
	f := NewFunc("remat")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 2, 3))
	h := f.Body.AddParam(TypeOf(Float32, 3).WithSpace(PinnedHost))
	n := b.opAt("layer.go:3", CheckpointName, vs(x), Attrs{"name": "x \"in\""})
	bs := b.ops(OptimizationBarrier, vs(n, h), nil)
	d := b.op(DevicePut, vs(bs[1]), Attrs{"space": Device})
	f.Body.Results = vs(b.op(Exp, vs(bs[0]), nil), d)
	return f
}

func txtElementwise(t testing.TB) *Func {
	f := NewFunc("elementwise")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 2, 3))
	y := f.Body.AddParam(TypeOf(Float32, 2, 3))
	n := f.Body.AddParam(TypeOf(Int32, 4))
	h := f.Body.AddParam(TypeOf(Float16, 2, 3).WithSpace(PinnedHost))
	var outs []*Value
	// Every float unary and binary op of the op table (a new one is in the
	// corpus without an edit here).
	for _, c := range AllCodes() {
		switch info := c.Info(); {
		case info.Class == ClassUnary && info.DTypes.OK(Float32):
			outs = append(outs, b.op(c, vs(x), nil))
		case info.Class == ClassBinary && info.DTypes.OK(Float32):
			outs = append(outs, b.op(c, vs(x, y), nil))
		}
	}
	var preds []*Value
	for _, c := range []Code{Eq, Ne, Lt, Le, Gt, Ge} {
		preds = append(preds, b.op(c, vs(x, y), nil))
	}
	p := b.op(And, vs(preds[0], preds[1]), nil)
	p = b.op(Or, vs(p, preds[2]), nil)
	p = b.op(Xor, vs(p, preds[3]), nil)
	p = b.op(Not, vs(p), nil)
	outs = append(outs, b.op(Select, vs(p, x, y), nil))
	for _, c := range []Code{ShiftLeft, ShiftRightLogical, ShiftRightArithmetic, And, Or, Xor, Add, Rem, Div} {
		n = b.op(c, vs(n, n), nil)
	}
	n = b.op(Not, vs(n), nil)
	n = b.op(Neg, vs(n), nil)
	hd := b.opAt("model.go:7", DevicePut, vs(h), Attrs{"space": Device})
	hx := b.op(Convert, vs(hd), Attrs{"dtype": Float32})
	outs = append(outs, b.op(Mul, vs(hx, x), nil))
	bits := b.op(BitcastConvert, vs(x), Attrs{"dtype": Uint32})
	bf := b.op(Convert, vs(x), Attrs{"dtype": BFloat16})
	f.Body.Results = append(outs[len(outs)-3:], n, bits, bf, p)
	return f
}

func txtShapes(t testing.TB) *Func {
	f := NewFunc("shapes")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 2, 3))
	v := f.Body.AddParam(TypeOf(Float32, 3))
	idx := f.Body.AddParam(TypeOf(Int32, 5))
	i0 := f.Body.AddParam(TypeOf(Int64))
	bc := b.opAt("quick.go:12", BroadcastInDim, vs(v), Attrs{"dims": []int{1}, "shape": []int{2, 3}})
	s := b.op(Add, vs(x, bc), nil)
	r := b.op(Reshape, vs(s), Attrs{"shape": []int{3, 2}})
	tr := b.op(Transpose, vs(r), Attrs{"perm": []int{1, 0}})
	sl := b.op(Slice, vs(tr), Attrs{"start": []int{0, 1}, "limit": []int{2, 3}, "strides": []int{1, 2}})
	ds := b.op(DynamicSlice, vs(x, i0, i0), Attrs{"sizes": []int{1, 2}})
	dus := b.op(DynamicUpdateSlice, vs(x, ds, i0, i0), nil)
	cat := b.op(Concatenate, vs(x, dus, x), Attrs{"axis": 0})
	zero := b.op(Constant, nil, Attrs{"value": Scalar[float32](0)})
	pad := b.op(Pad, vs(x, zero), Attrs{"low": []int{1, 0}, "high": []int{0, -1}, "interior": []int{1, 0}})
	g := b.op(Gather, vs(x, idx), Attrs{"axis": 1})
	sc := b.op(ScatterAdd, vs(x, idx, g), Attrs{"axis": 1})
	rs := b.op(ReduceSum, vs(sc), Attrs{"axes": []int{1}})
	rmax := b.op(ReduceMax, vs(cat), Attrs{"axes": []int{0, 1}})
	rmin := b.op(ReduceMin, vs(pad), Attrs{"axes": []int{}})
	rp := b.op(ReduceProd, vs(sl), Attrs{"axes": []int{0}})
	am := b.op(ArgMax, vs(x), Attrs{"axis": 1, "dtype": Int32})
	srt := b.ops(Sort, vs(x, x), Attrs{"dimension": 1, "num_keys": 1})
	an := b.op(ArgMin, vs(x), Attrs{"axis": 0, "dtype": Int64})
	dot := b.op(DotGeneral, vs(x, r), Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	bdot := b.op(DotGeneral, vs(cat, cat), Attrs{"lhs_batch": []int{1}, "rhs_batch": []int{1}, "lhs_contract": []int{0}, "rhs_contract": []int{0}})
	io := b.op(Iota, nil, Attrs{"dtype": Int32, "shape": []int{2, 0, 4}, "dim": 2})
	host := b.op(DevicePut, vs(dot), Attrs{"space": PinnedHost})
	back := b.op(DevicePut, vs(host), Attrs{"space": Device})
	empty := b.op(Slice, vs(x), Attrs{"start": []int{0, 0}, "limit": []int{0, 3}, "strides": []int{1, 1}})
	f.Body.Results = vs(rs, rmax, rmin, rp, am, an, bdot, io, host, back, empty, tr, srt[1])
	return f
}

// txtControl is cond(pred) { while { scan } } — a scan inside a while inside a cond.
func txtControl(t testing.TB) *Func {
	f := NewFunc("control")
	b := txtBuilder{t, f.Body}
	pred := f.Body.AddParam(TypeOf(Bool))
	x := f.Body.AddParam(TypeOf(Float32, 4))
	xs := f.Body.AddParam(TypeOf(Float32, 3, 4))

	// scan body: (consts: w f32[4]; carry: c f32[4]; xs: e f32[4]) -> (c', y f32[4])
	scanBody := f.NewRegion()
	w := scanBody.AddParam(TypeOf(Float32, 4))
	c := scanBody.AddParam(TypeOf(Float32, 4))
	e := scanBody.AddParam(TypeOf(Float32, 4))
	sb := txtBuilder{t, scanBody}
	nc := sb.op(Add, vs(sb.op(Mul, vs(c, w), nil), e), nil)
	scanBody.Results = vs(nc, sb.op(Tanh, vs(nc), nil))

	// while: consts (xs f32[3,4]), state (i i32[], s f32[4]).
	wcond := f.NewRegion()
	_ = wcond.AddParam(TypeOf(Float32, 3, 4))
	ci := wcond.AddParam(TypeOf(Int32))
	_ = wcond.AddParam(TypeOf(Float32, 4))
	cb := txtBuilder{t, wcond}
	lim := cb.op(Constant, nil, Attrs{"value": Scalar[int32](5)})
	wcond.Results = vs(cb.op(Lt, vs(ci, lim), nil))

	wbody := f.NewRegion()
	bxs := wbody.AddParam(TypeOf(Float32, 3, 4))
	bi := wbody.AddParam(TypeOf(Int32))
	bs := wbody.AddParam(TypeOf(Float32, 4))
	bb := txtBuilder{t, wbody}
	one := bb.op(Constant, nil, Attrs{"value": Scalar[int32](1)})
	scanned := bb.ops(Scan, vs(bs, bs, bxs), Attrs{"num_consts": 1, "num_carry": 1, "length": 3, "reverse": false}, scanBody)
	wbody.Results = vs(bb.op(Add, vs(bi, one), nil), scanned[0])

	// cond branches take (x, xs) and return f32[4].
	br0 := f.NewRegion()
	bx := br0.AddParam(TypeOf(Float32, 4))
	bxs0 := br0.AddParam(TypeOf(Float32, 3, 4))
	b0 := txtBuilder{t, br0}
	zero := b0.op(Constant, nil, Attrs{"value": Scalar[int32](0)})
	ws := b0.ops(While, vs(bxs0, zero, bx), Attrs{"num_consts": 1}, wcond, wbody)
	br0.Results = vs(ws[1])

	br1 := f.NewRegion()
	by := br1.AddParam(TypeOf(Float32, 4))
	_ = br1.AddParam(TypeOf(Float32, 3, 4))
	br1.Results = vs(txtBuilder{t, br1}.op(Neg, vs(by), nil))

	out := b.ops(Cond, vs(pred, x, xs), nil, br0, br1)
	out[0].Op.Loc = "train.go:42"

	// A cond and a while with no results at all.
	nb0, nb1 := f.NewRegion(), f.NewRegion()
	b.ops(Cond, vs(pred), nil, nb0, nb1)
	wc := f.NewRegion()
	wc.Results = vs(txtBuilder{t, wc}.op(Constant, nil, Attrs{"value": Scalar(false)}))
	b.ops(While, nil, Attrs{"num_consts": 0}, wc, f.NewRegion())
	f.Body.Results = vs(out[0])
	return f
}

// txtScan is a scan with consts, two carries and two xs, run in reverse.
func txtScan(t testing.TB) *Func {
	f := NewFunc("scan_multi")
	b := txtBuilder{t, f.Body}
	k := f.Body.AddParam(TypeOf(Float64))
	c0 := f.Body.AddParam(TypeOf(Float64, 2))
	c1 := f.Body.AddParam(TypeOf(Int64))
	x0 := f.Body.AddParam(TypeOf(Float64, 10, 2).WithSpace(PinnedHost))
	x1 := f.Body.AddParam(TypeOf(Uint8, 10))

	body := f.NewRegion()
	bk := body.AddParam(TypeOf(Float64))
	bc0 := body.AddParam(TypeOf(Float64, 2))
	bc1 := body.AddParam(TypeOf(Int64))
	bx0 := body.AddParam(TypeOf(Float64, 2).WithSpace(PinnedHost))
	bx1 := body.AddParam(TypeOf(Uint8))
	rb := txtBuilder{t, body}
	kk := rb.op(BroadcastInDim, vs(bk), Attrs{"shape": []int{2}, "dims": []int{}})
	xd := rb.op(DevicePut, vs(bx0), Attrs{"space": Device})
	nc0 := rb.op(Add, vs(rb.op(Mul, vs(bc0, kk), nil), xd), nil)
	inc := rb.op(Convert, vs(bx1), Attrs{"dtype": Int64})
	nc1 := rb.op(Add, vs(bc1, inc), nil)
	body.Results = vs(nc0, nc1, nc0, bx1, bk)
	out := b.ops(Scan, vs(k, c0, c1, x0, x1), Attrs{"num_consts": 1, "num_carry": 2, "length": 10, "reverse": true}, body)
	out[0].Op.Loc = `layers.go:99 "quoted" ünïcode`
	zb := f.NewRegion()
	zc := zb.AddParam(TypeOf(Float32))
	zb.Results = vs(zc)
	zero := b.op(Constant, nil, Attrs{"value": Scalar[float32](1)})
	// A scan of length 0 without the optional reverse attribute.
	z := b.ops(Scan, vs(zero), Attrs{"num_consts": 0, "num_carry": 1, "length": 0}, zb)
	f.Body.Results = append(out, z...)
	return f
}

func txtLiterals(t testing.TB) *Func {
	f := NewFunc("literals")
	b := txtBuilder{t, f.Body}
	big := make([]float32, 20)
	for i := range big {
		big[i] = float32(i) / 3
	}
	oddBool := txtLiteral(t, Shape{3}, true, false, true)
	oddBool.Data[1] = 2
	pinned := txtLiteral(t, Shape{2}, int32(1), int32(2))
	pinned.Type.Space = PinnedHost
	lits := []*Literal{
		txtLiteral(t, Shape{3}, true, false, true),
		oddBool,
		txtLiteral(t, Shape{3}, uint8(0), 255, 7),
		txtLiteral(t, Shape{2, 2}, int32(math.MinInt32), -1, 0, math.MaxInt32),
		txtLiteral(t, Shape{3}, int64(math.MinInt64), math.MaxInt64, -5),
		txtLiteral(t, Shape{2}, uint32(0), math.MaxUint32),
		txtBitsLiteral[F16](t, 0x7e00, 0x7e01, 0xfe00, 0x7c01, 0x8000, 0x7c00, 0xfc00, 0x0001, 0x03ff, 0x7bff, 0x3c00, 0x2e66, 0x0000, 0xbc00),
		txtBitsLiteral[BF16](t, 0x7fc0, 0x7f81, 0xffc0, 0x8000, 0x7f80, 0xff80, 0x0001, 0x3dcd, 0x7f7f, 0x4780),
		txtLiteral(t, Shape{10}, float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc00000),
			float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(1), math.MaxFloat32, 0.1, 1e10),
		txtLiteral(t, Shape{10}, math.NaN(), math.Float64frombits(0x7ff8000000000000), math.Float64frombits(0xfff0000000000001),
			math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.SmallestNonzeroFloat64, math.MaxFloat64, 0.1, 1e300),
		txtLiteral(t, Shape{4, 5}, big...),
		txtLiteral(t, Shape{0, 3}, []float32{}...),
		txtLiteral(t, Shape{}, 2.5),
		txtLiteral(t, Shape{1, 1}, BF16(0x3f80)),
		Scalar(F16(0x0200)),
		pinned,
	}
	for _, l := range lits {
		f.Body.Results = append(f.Body.Results, b.op(Constant, nil, Attrs{"value": l}))
	}
	return f
}

// txtFusion has fused groups of each kind, as the fusion pass makes them: a
// matrix product with a bias and tanh epilogue ("output"), an elementwise
// producer feeding a reduction with two results ("input"), and an elementwise
// loop with a scalar constant broadcast inside it ("loop").
func txtFusion(t testing.TB) *Func {
	f := NewFunc("fused")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 2, 3))
	w := f.Body.AddParam(TypeOf(Float32, 3, 4))
	bias := f.Body.AddParam(TypeOf(Float32, 4))

	out := f.NewRegion()
	ox, ow, ob := out.AddParam(TypeOf(Float32, 2, 3)), out.AddParam(TypeOf(Float32, 3, 4)), out.AddParam(TypeOf(Float32, 4))
	ib := txtBuilder{t, out}
	d := ib.op(DotGeneral, vs(ox, ow), Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{1}, "rhs_contract": []int{0}})
	bb := ib.op(BroadcastInDim, vs(ob), Attrs{"shape": []int{2, 4}, "dims": []int{1}})
	out.Results = vs(ib.op(Tanh, vs(ib.op(Add, vs(d, bb), nil)), nil))
	h := b.op(Fusion, vs(x, w, bias), Attrs{"kind": "output"}, out)

	in := f.NewRegion()
	ih := in.AddParam(TypeOf(Float32, 2, 4))
	nb := txtBuilder{t, in}
	e := nb.op(Exp, vs(ih), nil)
	in.Results = vs(nb.op(ReduceSum, vs(e), Attrs{"axes": []int{1}}), e)
	sums := b.ops(Fusion, vs(h), Attrs{"kind": "input"}, in)

	loop := f.NewRegion()
	le, ls := loop.AddParam(TypeOf(Float32, 2, 4)), loop.AddParam(TypeOf(Float32, 2))
	lb := txtBuilder{t, loop}
	two := lb.op(Constant, nil, Attrs{"value": Scalar[float32](2)})
	twos := lb.op(BroadcastInDim, vs(two), Attrs{"shape": []int{2, 4}, "dims": []int{}})
	sb := lb.op(BroadcastInDim, vs(ls), Attrs{"shape": []int{2, 4}, "dims": []int{0}})
	loop.Results = vs(lb.op(Mul, vs(lb.op(Div, vs(le, sb), nil), twos), nil))
	sm := b.op(Fusion, vs(sums[1], sums[0]), Attrs{"kind": "loop"}, loop)
	sm.Op.Loc = "softmax.go:3"
	f.Body.Results = vs(sm, sums[0])
	return f
}

// txtOdd has a name that needs quoting and values with large, sparse IDs.
func txtOdd(t testing.TB) *Func {
	f := NewFunc(`my func "v2"`)
	a := f.NewValueWithID(100, TypeOf(Float32, 2), nil, 0)
	f.Body.Params = vs(a)
	op := &Op{Code: Exp, Args: vs(a), Attrs: Attrs{}, Loc: "\x00\n\t"}
	op.Results = vs(f.NewValueWithID(7, TypeOf(Float32, 2), op, 0))
	f.Body.Ops = append(f.Body.Ops, op)
	f.Body.Results = vs(op.Results[0], a, op.Results[0])
	return f
}

// txtEqualAttr compares attribute values, with float64 compared by bits and
// nil and empty int lists equal.
func txtEqualAttr(a, b any) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case []int:
		y, ok := b.([]int)
		return ok && Shape(x).Equal(y)
	case *Literal:
		y, ok := b.(*Literal)
		return ok && x.Type.Equal(y.Type) && bytes.Equal(x.Data, y.Data)
	}
	return a == b
}

// txtEqualRegion checks that two regions have the same structure, IDs, types,
// attributes (bit for bit) and locations.
func txtEqualRegion(t *testing.T, a, b *Region) {
	t.Helper()
	eqVals := func(what string, x, y []*Value) {
		t.Helper()
		require.Equal(t, len(x), len(y), what)
		for i := range x {
			require.Equal(t, x[i].ID, y[i].ID, what)
			require.True(t, x[i].Type.Equal(y[i].Type), "%s %d: %v vs %v", what, i, x[i].Type, y[i].Type)
			require.Equal(t, x[i].Index, y[i].Index, what)
		}
	}
	eqVals("params", a.Params, b.Params)
	require.Equal(t, len(a.Ops), len(b.Ops))
	for i, oa := range a.Ops {
		ob := b.Ops[i]
		require.Equal(t, oa.Code, ob.Code)
		require.Equal(t, oa.Loc, ob.Loc)
		eqVals("args", oa.Args, ob.Args)
		eqVals("results", oa.Results, ob.Results)
		require.Equal(t, oa.Attrs.Keys(), ob.Attrs.Keys())
		for _, k := range oa.Attrs.Keys() {
			require.True(t, txtEqualAttr(oa.Attrs[k], ob.Attrs[k]), "%v attr %s: %v vs %v", oa.Code, k, oa.Attrs[k], ob.Attrs[k])
		}
		require.Equal(t, len(oa.Regions), len(ob.Regions))
		for j := range oa.Regions {
			txtEqualRegion(t, oa.Regions[j], ob.Regions[j])
		}
	}
	eqVals("region results", a.Results, b.Results)
}

// txtRoundTrip prints f, parses it back and checks that the parsed function
// equals f and prints identically.
func txtRoundTrip(t *testing.T, f *Func) string {
	t.Helper()
	require.NoError(t, Verify(f))
	s := f.String()
	var buf bytes.Buffer
	require.NoError(t, Print(&buf, f))
	require.Equal(t, s, buf.String())
	g, err := Parse(s)
	require.NoError(t, err, "parsing:\n%s", s)
	require.NoError(t, Verify(g))
	require.Equal(t, s, g.String())
	require.Equal(t, f.Name, g.Name)
	txtEqualRegion(t, f.Body, g.Body)
	return s
}

func TestPrintRoundTripCorpus(t *testing.T) {
	for name, f := range txtCorpus(t) {
		t.Run(name, func(t *testing.T) { txtRoundTrip(t, f) })
	}
}

// TestRoundTripCoversAllOps fails when an op code is missing from the
// round-trip corpus: add it there when adding an op.
func TestRoundTripCoversAllOps(t *testing.T) {
	seen := map[Code]bool{}
	for _, f := range txtCorpus(t) {
		f.Body.Walk(func(op *Op) { seen[op.Code] = true })
	}
	for _, c := range AllCodes() {
		require.True(t, seen[c], "op %v is not in the round-trip corpus (txtCorpus in print_test.go)", c)
	}
}

// TestRoundTripCoversAllDTypes checks that literals of every dtype are in the corpus.
func TestRoundTripCoversAllDTypes(t *testing.T) {
	seen := map[DType]bool{}
	txtLiterals(t).Body.Walk(func(op *Op) { seen[op.Attrs.Literal("value").Type.DType] = true })
	for _, d := range AllDTypes {
		require.True(t, seen[d], "no %v literal in txtLiterals", d)
	}
}

func TestPrintGolden(t *testing.T) {
	f := NewFunc("main")
	b := txtBuilder{t, f.Body}
	x := f.Body.AddParam(TypeOf(Float32, 2, 3))
	v := f.Body.AddParam(TypeOf(Float32, 3))
	bc := b.opAt("quick.go:12", BroadcastInDim, vs(v), Attrs{"shape": []int{2, 3}, "dims": []int{1}})
	s := b.op(Add, vs(x, bc), nil)
	c := b.op(Constant, nil, Attrs{"value": txtLiteral(t, Shape{2}, F16FromFloat64(1), F16FromFloat64(math.NaN()))})
	h := b.op(DevicePut, vs(c), Attrs{"space": PinnedHost})

	body := f.NewRegion()
	carry := body.AddParam(TypeOf(Float32, 3))
	row := body.AddParam(TypeOf(Float32, 3))
	bb := txtBuilder{t, body}
	sum := bb.op(Add, vs(carry, row), nil)
	body.Results = vs(sum, bb.op(Exp, vs(sum), nil))
	sc := b.ops(Scan, vs(v, x), Attrs{"length": 2, "num_carry": 1, "num_consts": 0, "reverse": false}, body)
	f.Body.Results = vs(s, h, sc[1])

	want := `func @main(%0: f32[2,3], %1: f32[3]) -> (f32[2,3], f16[2]{pinned_host}, f32[2,3]) {
  %2 = broadcast_in_dim(%1) {dims=[1], shape=[2,3]} : f32[2,3] loc("quick.go:12")
  %3 = add(%0, %2) : f32[2,3]
  %4 = constant() {value=dense<f16[2], [1, nan]>} : f16[2]
  %5 = device_put(%4) {space=#pinned_host} : f16[2]{pinned_host}
  %10, %11 = scan(%1, %0) {length=2, num_carry=1, num_consts=0, reverse=false} (
    ^(%6: f32[3], %7: f32[3]) {
      %8 = add(%6, %7) : f32[3]
      %9 = exp(%8) : f32[3]
      return %8, %9
    }) : f32[3], f32[2,3]
  return %3, %5, %11
}
`
	require.Equal(t, want, f.String())
	require.Equal(t, `%3 = add(%0, %2) : f32[2,3]`, s.Op.String())
	require.Equal(t, "%10, %11 = scan(%1, %0) {length=2, num_carry=1, num_consts=0, reverse=false} (\n  ^(%6: f32[3], %7: f32[3]) {\n    %8 = add(%6, %7) : f32[3]\n    %9 = exp(%8) : f32[3]\n    return %8, %9\n  }) : f32[3], f32[2,3]", sc[0].Op.String())
	txtRoundTrip(t, f)
}

func TestPrintEmptyAndZeroResultOps(t *testing.T) {
	require.Equal(t, "func @empty() -> () {\n  return\n}\n", NewFunc("empty").String())
	s := txtRoundTrip(t, txtControl(t))
	require.Contains(t, s, "\n  cond(%0) (\n    ^() {\n      return\n    },\n    ^() {\n      return\n    })\n")
}

func TestPrintLiteralForms(t *testing.T) {
	s := txtLiterals(t).String()
	for _, want := range []string{
		"dense<bool[3], [true, false, true]>",
		"dense<bool[3], 0x010201>",
		"dense<u8[3], [0, 255, 7]>",
		"dense<i32[2,2], [-2147483648, -1, 0, 2147483647]>",
		"dense<u32[2], [0, 4294967295]>",
		"dense<f16[14], [nan, nan(0x7e01), nan(0xfe00), nan(0x7c01), -0, inf, -inf, 6e-08, 6.1e-05, 65500, 1, 0.1, 0, -1]>",
		"dense<bf16[10], [nan, nan(0x7f81), nan(0xffc0), -0, inf, -inf, 9e-41, 0.1, 3.39e+38, 65500]>",
		"dense<f32[10], [nan, nan(0x7f800001), nan(0xffc00000), -0, inf, -inf, 1e-45, 3.4028235e+38, 0.1, 1e+10]>",
		"dense<f64[10], [nan, nan(0x7ff8000000000000), nan(0xfff0000000000001), -0, inf, -inf, 5e-324, 1.7976931348623157e+308, 0.1, 1e+300]>",
		"dense<f32[4,5], 0x0000000",
		"dense<f32[0,3], []>",
		"dense<f64[], 2.5>",
		"dense<bf16[1,1], [1]>",
		"dense<f16[], 3.05e-05>",
		"dense<i32[2]{pinned_host}, [1, 2]>",
	} {
		require.Contains(t, s, want)
	}
}

// TestLiteralBitsRoundTrip checks the literal bytes, not only the text.
func TestLiteralBitsRoundTrip(t *testing.T) {
	f := txtLiterals(t)
	g, err := Parse(f.String())
	require.NoError(t, err)
	for i, op := range f.Body.Ops {
		a, b := op.Attrs.Literal("value"), g.Body.Ops[i].Attrs.Literal("value")
		require.True(t, a.Type.Equal(b.Type))
		require.Equal(t, a.Data, b.Data, "literal %d (%v)", i, a.Type)
	}
}

// TestSmallFloatsAllBits prints and parses every f16 and bf16 bit pattern.
func TestSmallFloatsAllBits(t *testing.T) {
	for _, dt := range []DType{Float16, BFloat16} {
		for hi := 0; hi < 1<<16; hi += 16 {
			l := NewLiteral(TypeOf(dt, 16))
			for j := range 16 {
				l.Data[2*j] = byte(hi + j)
				l.Data[2*j+1] = byte((hi + j) >> 8)
			}
			var b strings.Builder
			require.NoError(t, appendLiteral(&b, l))
			p := &parser{lx: lexer{src: b.String()[len("dense"):], line: 1}, ids: map[int]*Value{}}
			var got *Literal
			require.NotPanics(t, func() { p.next(); got = p.parseLiteral() }, b.String())
			require.Equal(t, l.Data, got.Data, b.String())
		}
	}
}

// TestWideFloatsRandomBits prints and parses random f32 and f64 bit patterns,
// NaNs with payloads and subnormals included.
func TestWideFloatsRandomBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []DType{Float32, Float64} {
		for range 500 {
			l := NewLiteral(TypeOf(dt, 16))
			for i := range l.Data {
				l.Data[i] = byte(rng.Uint32())
			}
			if rng.IntN(2) == 0 { // exponent all ones (inf/NaN) or all zeros (subnormal)
				top := len(l.Data)/16 - 1
				for j := range 16 {
					if rng.IntN(2) == 0 {
						l.Data[j*(top+1)+top] |= 0x7f
						l.Data[j*(top+1)+top-1] |= 0xf0
					} else {
						l.Data[j*(top+1)+top] &= 0x80
						l.Data[j*(top+1)+top-1] &= 0x0f
					}
				}
			}
			var b strings.Builder
			require.NoError(t, appendLiteral(&b, l))
			p := &parser{lx: lexer{src: b.String()[len("dense"):], line: 1}, ids: map[int]*Value{}}
			var got *Literal
			require.NotPanics(t, func() { p.next(); got = p.parseLiteral() }, b.String())
			require.Equal(t, l.Data, got.Data, b.String())
		}
	}
}

// txtParseAttr parses one attribute value with the parser's attribute syntax.
func txtParseAttr(s string) (v any, err error) {
	f, err := Parse("func @f() -> () {\n  return\n}")
	if err != nil {
		return nil, err
	}
	p := &parser{lx: lexer{src: s, line: 1}, ids: map[int]*Value{}, f: f}
	defer func() {
		if r := recover(); r != nil {
			err = r.(*ParseError)
		}
	}()
	p.next()
	v = p.parseAttrValue()
	if p.tok.kind != tEOF {
		p.expected("end of input")
	}
	return v, nil
}

// TestAttrKindsRoundTrip covers the attribute kinds no op uses yet (float64,
// string) along with the others, bit for bit and kind for kind.
func TestAttrKindsRoundTrip(t *testing.T) {
	values := []any{
		0, 5, -3, math.MaxInt64, math.MinInt64,
		[]int{}, []int{1, 2}, []int{-1, 0, 1 << 40},
		0.0, 1.0, -2.5, 1e21, 1e-300, 5e-324, math.Copysign(0, -1), math.Inf(1), math.Inf(-1),
		math.NaN(), math.Float64frombits(0x7ff8000000000000), math.Float64frombits(0xfff0000000000001), 123456789.0,
		true, false,
		"", "plain", "with \"quotes\" and \\ and \n", "ünïcode ✓", "\xff\xfe invalid utf-8",
		Bool, Uint8, Int32, Int64, Uint32, Float16, BFloat16, Float32, Float64,
		Device, PinnedHost,
		Scalar[float32](1.5), txtLiteral(t, Shape{2}, int64(1), -2),
	}
	for _, v := range values {
		var b strings.Builder
		require.NoError(t, appendAttr(&b, v))
		got, err := txtParseAttr(b.String())
		require.NoError(t, err, b.String())
		require.IsType(t, v, got, b.String())
		require.True(t, txtEqualAttr(v, got), "%s: %#v vs %#v", b.String(), v, got)
		var b2 strings.Builder
		require.NoError(t, appendAttr(&b2, got))
		require.Equal(t, b.String(), b2.String())
	}
	for s, want := range map[string]string{"1.0": "float64", "1": "int", "1e3": "float64", "[1]": "[]int", "nan": "float64", "f32": "ir.DType", "#device": "ir.MemorySpace", `"1"`: "string"} {
		got, err := txtParseAttr(s)
		require.NoError(t, err, s)
		require.Equal(t, want, fmt.Sprintf("%T", got), s)
	}
	var b strings.Builder
	require.Error(t, appendAttr(&b, int64(3)))
	require.Error(t, appendAttr(&b, (*Literal)(nil)))
	require.Error(t, appendAttr(&b, DType(200)))
}

func TestPrintReportsUnprintable(t *testing.T) {
	f := NewFunc("bad")
	x := f.Body.AddParam(TypeOf(Float32))
	op := &Op{Code: Neg, Args: vs(x, nil), Attrs: Attrs{"weird": int64(3)}}
	op.Results = vs(f.NewValueWithID(1, TypeOf(Float32), op, 0))
	f.Body.Ops = append(f.Body.Ops, op, nil)
	f.Body.Results = vs(nil)
	var buf bytes.Buffer
	err := Print(&buf, f)
	require.Error(t, err)
	require.Contains(t, buf.String(), "%<nil>")
	require.NotPanics(t, func() { _ = f.String() })
	require.NotPanics(t, func() { _ = (*Func)(nil).String() })
	require.Error(t, Print(&buf, nil))
	require.Error(t, Print(&buf, &Func{Name: "x"}))

	// A region that contains itself is cut, not printed forever.
	g := NewFunc("cycle")
	r := g.NewRegion()
	cop := &Op{Code: Cond, Regions: []*Region{r, r}}
	r.Ops = append(r.Ops, cop)
	g.Body.Ops = append(g.Body.Ops, cop)
	require.Error(t, Print(&buf, g))
	require.Contains(t, g.String(), "^<cycle>")
}

type txtFailWriter struct{}

func (txtFailWriter) Write([]byte) (int, error) { return 0, fmt.Errorf("disk full") }

func TestPrintWriteError(t *testing.T) {
	require.EqualError(t, Print(txtFailWriter{}, NewFunc("f")), "disk full")
}

// TestWriteFuzzSeeds rewrites the committed FuzzParse seeds from the corpus when
// run with -update-fuzz-seeds.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*txtUpdate {
		t.Skip("run with -update-fuzz-seeds to rewrite testdata/fuzz/FuzzParse")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, f := range txtCorpus(t) {
		data := "go test fuzz v1\nstring(" + strconv.Quote(f.String()) + ")\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(data), 0o644))
	}
}
