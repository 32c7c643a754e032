package passes

import (
	"math"

	"github.com/ferryml/ferry/ir"
)

// canonicalize applies rewrites that keep every result bit for bit:
//
//	x + 0 → x (integers)             x + (-0.0) → x, x - (+0.0) → x (floats)
//	x - 0 → x (integers)             x * 1 → x, 1 * x → x, x / 1 → x
//	neg(neg(x)) → x                  select(p, x, x) → x
//	convert, bitcast_convert, device_put to what x already is → x
//	checkpoint_name(x) → x (the name only matters while tracing)
//	reshape(reshape(x)) → reshape(x) reshape(broadcast(scalar)) → broadcast(scalar)
//	transpose(transpose(x)) → one transpose (or x)
//	broadcast_in_dim(broadcast_in_dim(x)) → one broadcast
//	identity reshape, transpose, broadcast_in_dim and full-range slice → x
//
// x + 0.0 is not rewritten for floats: it turns -0.0 into +0.0.
func canonicalize(st *State) error {
	return rewriteOps(st.Func, func(f *ir.Func, op *ir.Op) ([]*ir.Value, []*ir.Op) {
		if rep, extra := simplify(f, op); rep != nil {
			return []*ir.Value{rep}, extra
		}
		return nil, nil
	})
}

// simplify returns a value equal to op's only result (and new ops that must be
// inserted before op's position to define it), or nil.
func simplify(f *ir.Func, op *ir.Op) (*ir.Value, []*ir.Op) {
	if len(op.Results) != 1 || isRegionOp(op) {
		return nil, nil
	}
	res := op.Result()
	same := func(v *ir.Value) *ir.Value {
		if v.Type.Equal(res.Type) {
			return v
		}
		return nil
	}
	// build makes a new op, simplifying it again.
	build := func(code ir.Code, arg *ir.Value, attrs ir.Attrs) (*ir.Value, []*ir.Op) {
		nop, err := f.NewOp(code, []*ir.Value{arg}, attrs)
		if err != nil || !nop.Result().Type.Equal(res.Type) {
			return nil, nil
		}
		nop.Loc = op.Loc
		if v, extra := simplify(f, nop); v != nil {
			return v, extra
		}
		return nop.Result(), []*ir.Op{nop}
	}
	dt := res.Type.DType
	a := op.Args
	switch op.Code {
	case ir.Add:
		if isAddIdentity(a[1], dt) {
			return same(a[0]), nil
		}
		if isAddIdentity(a[0], dt) {
			return same(a[1]), nil
		}
	case ir.Sub:
		if isSubIdentity(a[1], dt) {
			return same(a[0]), nil
		}
	case ir.Mul:
		if isSplatOf(a[1], 1) {
			return same(a[0]), nil
		}
		if isSplatOf(a[0], 1) {
			return same(a[1]), nil
		}
	case ir.Div:
		if isSplatOf(a[1], 1) {
			return same(a[0]), nil
		}
	case ir.Neg:
		if p := a[0].Op; p != nil && p.Code == ir.Neg {
			return same(p.Args[0]), nil
		}
	case ir.Select:
		if a[1] == a[2] {
			return same(a[1]), nil
		}
	case ir.Convert, ir.BitcastConvert, ir.DevicePut, ir.CheckpointName:
		return same(a[0]), nil
	case ir.ShardingConstraint:
		// A program compiled for one device has no use for the layout
		// (partitioned programs never reach here with one).
		if a[0].Type.EqualUnsharded(res.Type) {
			return a[0], nil
		}
	case ir.Reshape:
		if v := same(a[0]); v != nil {
			return v, nil
		}
		if p := a[0].Op; p != nil {
			switch {
			case p.Code == ir.Reshape:
				return build(ir.Reshape, p.Args[0], ir.Attrs{"shape": []int(res.Type.Shape.Clone())})
			case p.Code == ir.BroadcastInDim && p.Args[0].Type.Rank() == 0:
				return build(ir.BroadcastInDim, p.Args[0], ir.Attrs{"shape": []int(res.Type.Shape.Clone()), "dims": []int{}})
			}
		}
	case ir.Transpose:
		perm := op.Attrs.Ints("perm")
		if identityPerm(perm) {
			return same(a[0]), nil
		}
		if p := a[0].Op; p != nil && p.Code == ir.Transpose {
			inner := p.Attrs.Ints("perm")
			q := make([]int, len(perm))
			for i := range perm {
				q[i] = inner[perm[i]]
			}
			if identityPerm(q) {
				return same(p.Args[0]), nil
			}
			return build(ir.Transpose, p.Args[0], ir.Attrs{"perm": q})
		}
	case ir.BroadcastInDim:
		dims := op.Attrs.Ints("dims")
		if len(dims) == res.Type.Rank() && identityPerm(dims) {
			if v := same(a[0]); v != nil {
				return v, nil
			}
		}
		if p := a[0].Op; p != nil && p.Code == ir.BroadcastInDim {
			inner := p.Attrs.Ints("dims")
			q := make([]int, len(inner))
			for i, d := range inner {
				q[i] = dims[d]
			}
			return build(ir.BroadcastInDim, p.Args[0], ir.Attrs{"shape": []int(res.Type.Shape.Clone()), "dims": q})
		}
	case ir.Slice:
		start, limit, strides := op.Attrs.Ints("start"), op.Attrs.Ints("limit"), op.Attrs.Ints("strides")
		full := true
		for i, d := range a[0].Type.Shape {
			full = full && start[i] == 0 && limit[i] == d && strides[i] == 1
		}
		if full {
			return same(a[0]), nil
		}
	}
	return nil, nil
}

// isSplatOf reports whether v is a constant splat equal to x (as a number).
func isSplatOf(v *ir.Value, x float64) bool {
	l, ok := splat(v)
	return ok && l.Type.DType != ir.Bool && l.Float64At(0) == x
}

// isAddIdentity reports whether adding v leaves every value of dtype dt as it
// is: 0 for integers, -0.0 for floats.
func isAddIdentity(v *ir.Value, dt ir.DType) bool {
	l, ok := splat(v)
	if !ok || l.Type.DType != dt {
		return false
	}
	x := l.Float64At(0)
	if dt.IsFloat() {
		return x == 0 && math.Signbit(x)
	}
	return dt.IsInteger() && x == 0
}

// isSubIdentity reports whether subtracting v leaves every value as it is:
// 0 for integers, +0.0 for floats.
func isSubIdentity(v *ir.Value, dt ir.DType) bool {
	l, ok := splat(v)
	if !ok || l.Type.DType != dt {
		return false
	}
	x := l.Float64At(0)
	if dt.IsFloat() {
		return x == 0 && !math.Signbit(x)
	}
	return dt.IsInteger() && x == 0
}
