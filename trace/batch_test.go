package trace_test

// Tests of Vmap the way JAX tests batching (tests/lax_vmap_test.py): every op
// is run through VmapFlat with random batch sizes (0 included), random batch
// axes per operand (negative ones and NotMapped too) and a random output axis,
// and the result must equal running the op once per example and stacking the
// results, bit for bit, in dtype, shape and memory space.

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/random"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// vtOperand is one per-example operand of a case: its type and how its
// elements are drawn (nil: vtGen of its dtype).
type vtOperand struct {
	typ ir.Type
	gen otGen
}

// vtInst is one instance of a case: per-example operands and the function of
// one example. tol is 0 when the batched result must equal the loop's bit for
// bit; else it is the relative tolerance of float results (only where the
// batched kernel may add in another order, as a batched matrix product does).
type vtInst struct {
	desc string
	ops  []vtOperand
	fn   func(a []*trace.Array) []*trace.Array
	tol  float64
}

// vtCase checks the batching rule of op code.
type vtCase struct {
	code ir.Code
	name string
	make func(r *rand.Rand) vtInst
}

func vtT(dt ir.DType, shape ...int) ir.Type { return ir.TypeOf(dt, shape...) }

func vtOps(types ...ir.Type) []vtOperand {
	out := make([]vtOperand, len(types))
	for i, t := range types {
		out[i] = vtOperand{typ: t}
	}
	return out
}

// vtGen draws elements of dtype dt: small integers, or floats with now and
// then a zero of either sign, an infinity or a NaN.
func vtGen(dt ir.DType) otGen {
	switch {
	case dt == ir.Bool:
		return otInts(0, 1)
	case dt == ir.Uint8:
		return otInts(0, 255)
	case dt == ir.Uint32:
		return otInts(0, 1000)
	case dt.IsInteger():
		return otInts(-50, 50)
	}
	return func(r *rand.Rand) float64 {
		switch r.IntN(20) {
		case 0:
			return 0
		case 1:
			return math.Copysign(0, -1)
		case 2:
			return math.Inf(1 - 2*r.IntN(2))
		case 3:
			return math.NaN()
		}
		return 3 * r.NormFloat64()
	}
}

func vtPick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

var (
	vtFloats = []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16}
	vtShapes = [][]int{{}, {3}, {2, 3}, {2, 1, 3}, {0, 2}}
)

// vtDTypes lists the dtypes rule k accepts.
func vtDTypes(k ir.DTypeRule) []ir.DType {
	var out []ir.DType
	for _, d := range ir.AllDTypes {
		if k.OK(d) {
			out = append(out, d)
		}
	}
	return out
}

// vtShapeOfRank draws a shape of rank at least lo (dimensions 1 to 4, now
// and then 0 when zero is true).
func vtShapeOfRank(r *rand.Rand, lo, hi int, zero bool) []int {
	s := make([]int, lo+r.IntN(hi-lo+1))
	for i := range s {
		s[i] = 1 + r.IntN(4)
		if zero && r.IntN(8) == 0 {
			s[i] = 0
		}
	}
	return s
}

func vtOne(x *trace.Array) []*trace.Array { return []*trace.Array{x} }

var vtUnary = map[ir.Code]func(*trace.Array) *trace.Array{
	ir.Neg: trace.Neg, ir.Abs: trace.Abs, ir.Sign: trace.Sign, ir.Exp: trace.Exp, ir.Log: trace.Log,
	ir.Log1p: trace.Log1p, ir.Expm1: trace.Expm1, ir.Sqrt: trace.Sqrt, ir.Rsqrt: trace.Rsqrt,
	ir.Tanh: trace.Tanh, ir.Logistic: trace.Logistic, ir.Sin: trace.Sin, ir.Cos: trace.Cos,
	ir.Erf: trace.Erf, ir.Floor: trace.Floor, ir.Ceil: trace.Ceil, ir.Round: trace.Round, ir.Not: trace.Not,
}

var vtBinary = map[ir.Code]func(x, y *trace.Array) *trace.Array{
	ir.Add: trace.Add, ir.Sub: trace.Sub, ir.Mul: trace.Mul, ir.Div: trace.Div, ir.Pow: trace.Pow,
	ir.Max: trace.Maximum, ir.Min: trace.Minimum, ir.Rem: trace.Rem, ir.And: trace.And, ir.Or: trace.Or,
	ir.Xor: trace.Xor, ir.ShiftLeft: trace.ShiftLeft, ir.ShiftRightLogical: trace.ShiftRightLogical,
	ir.ShiftRightArithmetic: trace.ShiftRightArithmetic,
	ir.Eq:                   trace.Equal, ir.Ne: trace.NotEqual, ir.Lt: trace.Less, ir.Le: trace.LessEqual,
	ir.Gt: trace.Greater, ir.Ge: trace.GreaterEqual,
}

// vtElementwiseCase is the case of a unary, binary or comparison op, with
// the dtypes its rule accepts; a binary op's second operand is now and then a
// scalar, which the op's public function broadcasts.
func vtElementwiseCase(code ir.Code) vtCase {
	info := code.Info()
	dts := vtDTypes(info.DTypes)
	if code == ir.Floor || code == ir.Ceil || code == ir.Round {
		dts = vtFloats // integers are returned unchanged, without the op
	}
	if code == ir.Max || code == ir.Min {
		dts = slices.DeleteFunc(slices.Clone(dts), func(d ir.DType) bool { return d == ir.Bool }) // and, or
	}
	return vtCase{code: code, name: code.String(), make: func(r *rand.Rand) vtInst {
		dt := vtPick(r, dts...)
		s := vtPick(r, vtShapes...)
		if info.NumArgs == 1 {
			f := vtUnary[code]
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(f(a[0])) }}
		}
		s2 := s
		if r.IntN(4) == 0 {
			s2 = nil
		}
		y := vtOperand{typ: vtT(dt, s2...)}
		switch {
		case (code == ir.Div || code == ir.Rem) && dt.IsInteger():
			y.gen = func(r *rand.Rand) float64 { return float64(1+r.IntN(9)) * float64(1-2*r.IntN(2)) }
		case code == ir.ShiftLeft || code == ir.ShiftRightLogical || code == ir.ShiftRightArithmetic:
			y.gen = otInts(0, 8*dt.Size()+1) // one past the width too
		case code == ir.Pow && dt.IsInteger():
			y.gen = otInts(0, 3)
		}
		f := vtBinary[code]
		return vtInst{desc: fmt.Sprint(dt), ops: []vtOperand{{typ: vtT(dt, s...)}, y},
			fn: func(a []*trace.Array) []*trace.Array { return vtOne(f(a[0], a[1])) }}
	}}
}

// vtFusionRegion builds by hand the region of a loop fusion computing
// max(x*y, x) and -y from operands of type t, as the compiler's fusion pass
// makes them, in the function being traced (or, eagerly, in one of its own).
func vtFusionRegion(t ir.Type) *ir.Region {
	var r *ir.Region
	if c := trace.Current(); c != nil {
		r = c.Func().NewRegion()
	} else {
		r = ir.NewFunc("fusion").Body
	}
	x, y := r.AddParam(t), r.AddParam(t)
	m, err := r.AddOp(ir.Mul, []*ir.Value{x, y}, nil)
	if err != nil {
		panic(err)
	}
	// Max, not Add: the CPU backend's fused kernel contracts x*y+x into a
	// fused multiply-add, which the batching rule (the region's ops inlined,
	// one by one) rounds differently.
	s, err := r.AddOp(ir.Max, []*ir.Value{m.Results[0], x}, nil)
	if err != nil {
		panic(err)
	}
	n, err := r.AddOp(ir.Neg, []*ir.Value{y}, nil)
	if err != nil {
		panic(err)
	}
	r.Results = []*ir.Value{s.Results[0], n.Results[0]}
	return r
}

// vtDotCase draws a dot_general: some batch dimensions, contracting
// dimensions and free dimensions on each side, every side's axes in a random
// order.
func vtDotCase(r *rand.Rand) vtInst {
	nb, nc, nl, nr := r.IntN(2), r.IntN(3), r.IntN(2), r.IntN(2)
	dim := func() int { return 1 + r.IntN(3) }
	bs, cs, ls, rs := make([]int, nb), make([]int, nc), make([]int, nl), make([]int, nr)
	for _, s := range [][]int{bs, cs, ls, rs} {
		for i := range s {
			s[i] = dim()
		}
	}
	// Place batch, contracting and free dims at random positions of a side.
	place := func(free []int) (shape []int, batch, contract []int) {
		n := nb + nc + len(free)
		perm := r.Perm(n)
		shape = make([]int, n)
		batch, contract = make([]int, nb), make([]int, nc)
		k := 0
		for i := range bs {
			batch[i], shape[perm[k]] = perm[k], bs[i]
			k++
		}
		for i := range cs {
			contract[i], shape[perm[k]] = perm[k], cs[i]
			k++
		}
		for i := range free {
			shape[perm[k]] = free[i]
			k++
		}
		return shape, batch, contract
	}
	lshape, lb, lc := place(ls)
	rshape, rb, rc := place(rs)
	dt := vtPick(r, ir.Float32, ir.Float64, ir.Int32)
	in := vtInst{
		desc: fmt.Sprintf("%v %v·%v batch %v/%v contract %v/%v", dt, lshape, rshape, lb, rb, lc, rc),
		ops:  vtOps(vtT(dt, lshape...), vtT(dt, rshape...)),
		fn: func(a []*trace.Array) []*trace.Array {
			return vtOne(trace.DotGeneral(a[0], a[1], lb, rb, lc, rc))
		},
	}
	if dt.IsFloat() {
		// A batched product may be blocked, and so summed, in another order.
		in.tol = 1e-5
		for i := range in.ops {
			in.ops[i].gen = otNormal
		}
	}
	return in
}

// vtCases returns a case per op code.
func vtCases() []vtCase {
	var cs []vtCase
	for _, code := range ir.AllCodes() {
		switch code.Info().Class {
		case ir.ClassUnary, ir.ClassBinary, ir.ClassCompare:
			cs = append(cs, vtElementwiseCase(code))
		}
	}
	cs = append(cs, vtCreateConvertCases()...)
	cs = append(cs, vtShapeCases()...)
	cs = append(cs, vtJoinIndexCases()...)
	cs = append(cs, vtReduceSortCases()...)
	cs = append(cs, vtControlCases()...)
	return cs
}

// vtAnyDT and vtNumDT pick a dtype: any, or numeric.
func vtAnyDT(r *rand.Rand) ir.DType { return vtPick(r, ir.AllDTypes...) }

func vtNumDT(r *rand.Rand) ir.DType { return vtPick(r, vtDTypes(ir.NumericDTypes)...) }

// vtCreateConvertCases are the cases of constant, iota, select and the conversions.
func vtCreateConvertCases() []vtCase {
	return []vtCase{
		vtCase{ir.Constant, "constant", func(r *rand.Rand) vtInst {
			dt, s, v := vtNumDT(r), vtPick(r, vtShapes...), float64(r.IntN(9)-4)
			return vtInst{desc: fmt.Sprint(dt, s, v), fn: func([]*trace.Array) []*trace.Array {
				return vtOne(trace.Full(s, v, dt))
			}}
		}},
		vtCase{ir.Constant, "constant_plus_operand", func(r *rand.Rand) vtInst {
			dt, s := vtNumDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(dt, s...)), fn: func(a []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Add(a[0], trace.Full(s, 2, dt)), trace.Full(s, 3, dt)}
			}}
		}},
		vtCase{ir.Iota, "iota", func(r *rand.Rand) vtInst {
			dt, s := vtNumDT(r), vtShapeOfRank(r, 1, 3, true)
			d := r.IntN(len(s))
			return vtInst{desc: fmt.Sprint(dt, s, d), fn: func([]*trace.Array) []*trace.Array {
				return vtOne(trace.Iota(dt, s, d))
			}}
		}},
		vtCase{ir.Select, "select", func(r *rand.Rand) vtInst {
			dt, s := vtAnyDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(ir.Bool, s...), vtT(dt, s...), vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Where(a[0], a[1], a[2])) }}
		}},
		vtCase{ir.Convert, "convert", func(r *rand.Rand) vtInst {
			from, to := vtAnyDT(r), vtAnyDT(r)
			for to == from {
				to = vtAnyDT(r)
			}
			return vtInst{desc: fmt.Sprint(from, "→", to), ops: vtOps(vtT(from, vtPick(r, vtShapes...)...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Convert(a[0], to)) }}
		}},
		vtCase{ir.BitcastConvert, "bitcast_convert", func(r *rand.Rand) vtInst {
			p := vtPick(r, [2]ir.DType{ir.Float32, ir.Int32}, [2]ir.DType{ir.Uint32, ir.Float32},
				[2]ir.DType{ir.Float64, ir.Int64}, [2]ir.DType{ir.Float16, ir.BFloat16})
			if r.IntN(2) == 0 {
				p[0], p[1] = p[1], p[0]
			}
			return vtInst{desc: fmt.Sprint(p), ops: vtOps(vtT(p[0], vtPick(r, vtShapes...)...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.BitcastConvert(a[0], p[1])) }}
		}},
	}
}

// vtShapeCases are the cases of the shape and slicing ops.
func vtShapeCases() []vtCase {
	return []vtCase{
		vtCase{ir.BroadcastInDim, "broadcast_in_dim", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 0, 3, false)
			for i := range s {
				if r.IntN(3) == 0 {
					s[i] = 1
				}
			}
			out := make([]int, len(s)+r.IntN(3))
			pos := r.Perm(len(out))[:len(s)]
			slices.Sort(pos)
			for i := range out {
				out[i] = 1 + r.IntN(3)
			}
			for i, p := range pos {
				if s[i] != 1 || r.IntN(2) == 0 {
					out[p] = s[i]
				}
			}
			dt := vtAnyDT(r)
			return vtInst{desc: fmt.Sprint(dt, s, "→", out, pos), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.BroadcastInDim(a[0], out, pos)) }}
		}},
		vtCase{ir.Reshape, "reshape", func(r *rand.Rand) vtInst {
			p := vtPick(r, [2][]int{{2, 3}, {3, 2}}, [2][]int{{2, 3}, {6}}, [2][]int{{2, 1, 3}, {1, 6, 1}},
				[2][]int{{}, {1, 1}}, [2][]int{{0, 2}, {2, 0, 1}}, [2][]int{{4}, {2, 2}})
			dt := vtAnyDT(r)
			return vtInst{desc: fmt.Sprint(dt, p), ops: vtOps(vtT(dt, p[0]...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Reshape(a[0], p[1]...)) }}
		}},
		vtCase{ir.Transpose, "transpose", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 2, 4, true)
			perm := r.Perm(len(s))
			for slices.IsSorted(perm) {
				perm = r.Perm(len(s))
			}
			dt := vtAnyDT(r)
			return vtInst{desc: fmt.Sprint(dt, s, perm), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Transpose(a[0], perm...)) }}
		}},
		vtCase{ir.Slice, "slice", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			start, limit, strides := make([]int, len(s)), make([]int, len(s)), make([]int, len(s))
			for i, d := range s {
				start[i] = r.IntN(d + 1)
				limit[i] = start[i] + r.IntN(d-start[i]+1)
				strides[i] = 1 + r.IntN(2)
			}
			dt := vtAnyDT(r)
			return vtInst{desc: fmt.Sprint(dt, s, start, limit, strides), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Slice(a[0], start, limit, strides)) }}
		}},
		vtCase{ir.DynamicSlice, "dynamic_slice", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			sizes := make([]int, len(s))
			ops := vtOps(vtT(vtAnyDT(r), s...))
			for i, d := range s {
				sizes[i] = r.IntN(d + 1)
				// Starts beyond the ends are clamped.
				ops = append(ops, vtOperand{typ: vtT(vtPick(r, ir.Int32, ir.Int64, ir.Uint32)), gen: otInts(0, d+1)})
			}
			return vtInst{desc: fmt.Sprint(ops[0].typ, sizes), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
				return vtOne(trace.DynamicSlice(a[0], a[1:], sizes))
			}}
		}},
		vtCase{ir.DynamicUpdateSlice, "dynamic_update_slice", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			dt := vtAnyDT(r)
			u := make([]int, len(s))
			for i, d := range s {
				u[i] = r.IntN(d + 1)
			}
			ops := vtOps(vtT(dt, s...), vtT(dt, u...))
			for _, d := range s {
				ops = append(ops, vtOperand{typ: vtT(vtPick(r, ir.Int32, ir.Int64)), gen: otInts(-1, d+1)})
			}
			return vtInst{desc: fmt.Sprint(ops[0].typ, ops[1].typ), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
				return vtOne(trace.DynamicUpdateSlice(a[0], a[1], a[2:]))
			}}
		}},
	}
}

// vtJoinIndexCases are the cases of concatenate, pad, gather and scatter.
func vtJoinIndexCases() []vtCase {
	return []vtCase{
		vtCase{ir.Concatenate, "concatenate", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			axis := r.IntN(len(s))
			dt := vtAnyDT(r)
			var ops []vtOperand
			for range 1 + r.IntN(3) {
				si := slices.Clone(s)
				si[axis] = r.IntN(3)
				ops = append(ops, vtOperand{typ: vtT(dt, si...)})
			}
			if len(ops) == 1 {
				// Concatenate of one array is the array: join it with itself.
				ops = append(ops, ops[0])
			}
			return vtInst{desc: fmt.Sprint(dt, len(ops), axis), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
				return vtOne(trace.Concatenate(axis, a...))
			}}
		}},
		vtCase{ir.Pad, "pad", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 0, 3, true)
			lo, hi, in := make([]int, len(s)), make([]int, len(s)), make([]int, len(s))
			for i, d := range s {
				lo[i], hi[i], in[i] = r.IntN(3), r.IntN(3), r.IntN(2)
				if d > 1 && r.IntN(3) == 0 {
					lo[i] = -1 // negative padding removes elements
				}
			}
			dt := vtAnyDT(r)
			return vtInst{desc: fmt.Sprint(dt, s, lo, hi, in), ops: vtOps(vtT(dt, s...), vtT(dt)), fn: func(a []*trace.Array) []*trace.Array {
				return vtOne(trace.Pad(a[0], a[1], lo, hi, in))
			}}
		}},
		vtCase{ir.Gather, "gather", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, false)
			axis := r.IntN(len(s))
			n := s[axis]
			is := vtPick(r, []int{}, []int{2}, []int{2, 3}, []int{0})
			return vtInst{desc: fmt.Sprint(s, axis, is),
				ops: []vtOperand{{typ: vtT(vtAnyDT(r), s...)}, {typ: vtT(vtPick(r, ir.Int32, ir.Int64, ir.Uint32), is...), gen: otInts(0, n)}},
				fn:  func(a []*trace.Array) []*trace.Array { return vtOne(trace.Take(a[0], a[1], axis)) }}
		}},
		vtCase{ir.ScatterAdd, "scatter_add", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, false)
			axis := r.IntN(len(s))
			n := s[axis]
			is := vtPick(r, []int{}, []int{2}, []int{2, 3}, []int{0})
			us := ir.GatherShape(s, is, axis)
			dt := vtPick(r, ir.Float32, ir.Float64, ir.Int32, ir.Int64)
			return vtInst{desc: fmt.Sprint(dt, s, axis, is),
				ops: []vtOperand{{typ: vtT(dt, s...)}, {typ: vtT(ir.Int32, is...), gen: otInts(-n-1, n)}, {typ: vtT(dt, us...), gen: otInts(-9, 9)}},
				fn:  func(a []*trace.Array) []*trace.Array { return vtOne(trace.ScatterAdd(a[0], a[1], a[2], axis)) }}
		}},
	}
}

// vtReduceSortCases are the cases of reductions, arg reductions, sort, products, and the ops that only mark values.
func vtReduceSortCases() []vtCase {
	return []vtCase{
		vtCase{ir.ReduceSum, "reduce_sum", vtReduceCase(trace.Sum, false)},
		vtCase{ir.ReduceMax, "reduce_max", vtReduceCase(trace.Max, true)},
		vtCase{ir.ReduceMin, "reduce_min", vtReduceCase(trace.Min, true)},
		vtCase{ir.ReduceProd, "reduce_prod", vtReduceCase(trace.Prod, false)},
		vtCase{ir.ArgMax, "argmax", vtArgCase(trace.ArgMax)},
		vtCase{ir.ArgMin, "argmin", vtArgCase(trace.ArgMin)},
		vtCase{ir.Sort, "sort", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			axis := r.IntN(len(s))
			n := 1 + r.IntN(3)
			keys := 1 + r.IntN(n)
			var ops []vtOperand
			for range n {
				dt := vtPick(r, vtDTypes(ir.NumericDTypes)...)
				// Few distinct keys, so that ties test stability.
				ops = append(ops, vtOperand{typ: vtT(dt, s...), gen: otInts(0, 3)})
			}
			if n == 1 && r.IntN(2) == 0 {
				ops[0].gen = nil
				return vtInst{desc: fmt.Sprint(ops[0].typ, axis), ops: ops,
					fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Sort(a[0], axis)) }}
			}
			return vtInst{desc: fmt.Sprint(n, keys, s, axis), ops: ops,
				fn: func(a []*trace.Array) []*trace.Array { return trace.SortMulti(a, axis, keys) }}
		}},
		vtCase{ir.DotGeneral, "dot_general", vtDotCase},
		vtCase{ir.DevicePut, "device_put", func(r *rand.Rand) vtInst {
			from := vtPick(r, ir.AllSpaces...)
			to := ir.Device
			if from == ir.Device {
				to = ir.PinnedHost
			}
			dt, s := vtAnyDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt, from, "→", to), ops: vtOps(vtT(dt, s...).WithSpace(from)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.DevicePut(a[0], to)) }}
		}},
		vtCase{ir.CheckpointName, "checkpoint_name", func(r *rand.Rand) vtInst {
			dt, s := vtAnyDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.CheckpointName(a[0], "x")) }}
		}},
		vtCase{ir.ShardingConstraint, "sharding_constraint", func(r *rand.Rand) vtInst {
			dt, s := vtAnyDT(r), vtPick(r, vtShapes...)
			mesh, err := ir.NewMesh([]int{1}, []string{"x"})
			if err != nil {
				panic(err)
			}
			spec := ir.P()
			if len(s) > 0 {
				spec = ir.P("x")
			}
			sh, err := ir.NewNamedSharding(mesh, spec)
			if err != nil {
				panic(err)
			}
			return vtInst{desc: fmt.Sprint(dt, sh), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.WithShardingConstraint(a[0], sh)) }}
		}},
		vtCase{ir.OptimizationBarrier, "optimization_barrier", func(r *rand.Rand) vtInst {
			ops := vtOps(vtT(vtAnyDT(r), vtPick(r, vtShapes...)...), vtT(vtAnyDT(r), vtPick(r, vtShapes...)...))
			return vtInst{desc: fmt.Sprint(ops[0].typ, ops[1].typ), ops: ops,
				fn: func(a []*trace.Array) []*trace.Array { return trace.Apply(ir.OptimizationBarrier, nil, nil, a...) }}
		}},
	}
}

// vtControlCases are the cases of the control-flow and fusion ops.
func vtControlCases() []vtCase {
	return []vtCase{
		vtCase{ir.Scan, "scan", vtScanCase},
		vtCase{ir.While, "while", func(r *rand.Rand) vtInst {
			// The number of iterations differs per example when n is mapped.
			dt, s := vtPick(r, vtFloats...), vtPick(r, vtShapes...)
			ops := []vtOperand{{typ: vtT(ir.Int32), gen: otInts(0, 3)}, {typ: vtT(dt, s...), gen: otInts(-4, 4)}, {typ: vtT(dt, s...), gen: otInts(-2, 2)}}
			return vtInst{desc: fmt.Sprint(dt, s), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
				n, x0, w := a[0], a[1], a[2]
				out := trace.While(func(st []*trace.Array) *trace.Array { return trace.Less(st[0], n) },
					func(st []*trace.Array) []*trace.Array {
						return []*trace.Array{trace.Add(st[0], trace.ScalarAs(1, ir.Int32)), trace.Add(trace.Mul(st[1], trace.ScalarAs(0.5, dt)), w)}
					}, trace.ScalarAs(0, ir.Int32), x0)
				return out
			}}
		}},
		vtCase{ir.Cond, "cond", func(r *rand.Rand) vtInst {
			dt, s := vtPick(r, ir.Float32, ir.Float64, ir.Int32), vtPick(r, vtShapes...)
			ops := vtOps(vtT(ir.Bool), vtT(dt, s...), vtT(dt, s...))
			return vtInst{desc: fmt.Sprint(dt, s), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
				return trace.Cond(a[0],
					func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Add(o[0], o[1]), o[0]} },
					func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Mul(o[0], o[1]), trace.Neg(o[1])} },
					a[1], a[2])
			}}
		}},
		vtCase{ir.Fusion, "fusion", func(r *rand.Rand) vtInst {
			dt, s := vtPick(r, ir.Float32, ir.Float64, ir.Int32), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt, s), ops: vtOps(vtT(dt, s...), vtT(dt, s...)), fn: func(a []*trace.Array) []*trace.Array {
				return trace.Apply(ir.Fusion, ir.Attrs{"kind": "loop"}, []*ir.Region{vtFusionRegion(a[0].Type())}, a...)
			}}
		}},
	}
}

// vtReduceCase reduces a random subset of the axes (all of them now and then).
func vtReduceCase(f func(*trace.Array, ...int) *trace.Array, minmax bool) func(r *rand.Rand) vtInst {
	return func(r *rand.Rand) vtInst {
		s := vtShapeOfRank(r, 1, 3, !minmax)
		var axes []int
		for i := range s {
			if r.IntN(2) == 0 {
				axes = append(axes, i-len(s)*r.IntN(2))
			}
		}
		if len(axes) == 0 {
			axes = []int{r.IntN(len(s))}
		}
		dt := vtPick(r, vtDTypes(ir.NumericDTypes)...)
		in := vtInst{desc: fmt.Sprint(dt, s, axes), ops: vtOps(vtT(dt, s...)),
			fn: func(a []*trace.Array) []*trace.Array { return vtOne(f(a[0], axes...)) }}
		return in
	}
}

func vtArgCase(f func(*trace.Array, int) *trace.Array) func(r *rand.Rand) vtInst {
	return func(r *rand.Rand) vtInst {
		s := vtShapeOfRank(r, 1, 3, false)
		axis := r.IntN(len(s)) - len(s)*r.IntN(2)
		dt := vtPick(r, vtDTypes(ir.NumericDTypes)...)
		return vtInst{desc: fmt.Sprint(dt, s, axis), ops: []vtOperand{{typ: vtT(dt, s...), gen: otInts(0, 4)}},
			fn: func(a []*trace.Array) []*trace.Array { return vtOne(f(a[0], axis)) }}
	}
}

// vtScanCase scans a linear recurrence carry' = carry*w + x over xs (reversed
// now and then), with w closed over.
func vtScanCase(r *rand.Rand) vtInst {
	dt, s := vtPick(r, ir.Float32, ir.Float64, ir.Int32), vtPick(r, [][]int{{}, {3}, {2, 2}}...)
	n := r.IntN(4)
	xs := append([]int{n}, s...)
	var opts []trace.ScanOption
	if r.IntN(2) == 0 {
		opts = append(opts, trace.ScanReverse())
	}
	if n == 0 {
		opts = append(opts, trace.ScanLength(0))
	}
	ops := []vtOperand{{typ: vtT(dt, s...), gen: otInts(-3, 3)}, {typ: vtT(dt, xs...), gen: otInts(-3, 3)}, {typ: vtT(dt, s...), gen: otInts(-2, 2)}}
	return vtInst{desc: fmt.Sprint(dt, xs, len(opts)), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
		w := a[2]
		c, ys := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			nc := trace.Add(trace.Mul(c[0], w), x[0])
			return []*trace.Array{nc}, []*trace.Array{trace.Neg(nc)}
		}, a[:1], a[1:2], opts...)
		return append(c, ys...)
	}}
}

// vtArray returns a concrete array of type t with elements from gen.
func vtArray(r *rand.Rand, t ir.Type, gen otGen) *trace.Array {
	l := ir.NewLiteral(t)
	for i := range t.Shape.Size() {
		l.SetFloat64At(i, gen(r))
	}
	return trace.FromLiteral(l)
}

// vtOnDevice runs f on x's values on device and puts the result back in x's
// memory space (ops compute on device arrays only).
func vtOnDevice(x *trace.Array, f func(*trace.Array) *trace.Array) *trace.Array {
	if x.Space() == ir.Device {
		return f(x)
	}
	return trace.DevicePut(f(trace.DevicePut(x, ir.Device)), x.Space())
}

// vtExample returns example i of x mapped at axis ax (NotMapped: x itself).
func vtExample(x *trace.Array, ax, i int) *trace.Array {
	if ax == trace.NotMapped {
		return x
	}
	return vtOnDevice(x, func(x *trace.Array) *trace.Array {
		perm := []int{ax}
		for d := range x.Rank() {
			if d != ax {
				perm = append(perm, d)
			}
		}
		return trace.Index(trace.Transpose(x, perm...), i)
	})
}

// vtStack stacks the examples' results along axis.
func vtStack(axis int, xs []*trace.Array) *trace.Array {
	space := xs[0].Space()
	dev := make([]*trace.Array, len(xs))
	for i, x := range xs {
		dev[i] = x
		if space != ir.Device {
			dev[i] = trace.DevicePut(x, ir.Device)
		}
	}
	out := trace.Stack(axis, dev...)
	if space != ir.Device {
		out = trace.DevicePut(out, space)
	}
	return out
}

// vtCompare returns what differs between got and want (want's values are
// not read when it has none).
func vtCompare(got *trace.Array, want ir.Type, wantVals *trace.Array, tol float64) string {
	switch {
	case got == nil:
		return "got a nil array"
	case got.DType() != want.DType:
		return fmt.Sprintf("dtype %v, want %v", got.DType(), want.DType)
	case !got.Shape().Equal(want.Shape):
		return fmt.Sprintf("shape %v, want %v", got.Shape(), want.Shape)
	case got.Space() != want.Space:
		return fmt.Sprintf("memory space %v, want %v", got.Space(), want.Space)
	case wantVals == nil:
		return ""
	}
	gl, err := got.Literal()
	if err != nil {
		return fmt.Sprintf("reading the result: %v", err)
	}
	wl, err := wantVals.Literal()
	if err != nil {
		return fmt.Sprintf("reading the expected values: %v", err)
	}
	if bytes.Equal(gl.Data, wl.Data) {
		return ""
	}
	g, w := gl.Float64s(), wl.Float64s()
	var bad []string
	for i := range g {
		same := math.Float64bits(g[i]) == math.Float64bits(w[i]) || (math.IsNaN(g[i]) && math.IsNaN(w[i]))
		if tol > 0 {
			same = otClose(g[i], w[i], tol)
		}
		if !same && len(bad) < 4 {
			bad = append(bad, fmt.Sprintf("element %v = %v, want %v", otUnravel(i, want.Shape), g[i], w[i]))
		}
	}
	if len(bad) == 0 {
		if tol > 0 {
			return ""
		}
		return "the bits differ (NaN payloads?)"
	}
	return strings.Join(bad, "; ")
}

// vtTrial is one random batching of a case's instance.
type vtTrial struct {
	inst      vtInst
	size      int
	inAxes    []int // as given to InAxes (NotMapped or an axis, maybe negative)
	outAxes   []int
	withSize  bool
	args      []*trace.Array
	want      []*trace.Array // nil values when size is 0
	wantTypes []ir.Type
	axisNorm  []int
}

func (tr *vtTrial) String() string {
	ax := make([]string, len(tr.inAxes))
	for i, a := range tr.inAxes {
		ax[i] = fmt.Sprint(a)
		if a == trace.NotMapped {
			ax[i] = "NotMapped"
		}
	}
	types := make([]string, len(tr.args))
	for i, a := range tr.args {
		types[i] = a.Type().String()
	}
	return fmt.Sprintf("%s: size %d, InAxes(%s), OutAxes%v, AxisSize given %v, batched operands %v",
		tr.inst.desc, tr.size, strings.Join(ax, ", "), tr.outAxes, tr.withSize, types)
}

// newVtTrial draws the batch size, the axes and the operands, and computes
// the expected results by a loop over the examples.
func newVtTrial(r *rand.Rand, c vtCase) *vtTrial {
	tr := &vtTrial{inst: c.make(r), size: vtPick(r, 0, 1, 3)}
	n := len(tr.inst.ops)
	tr.inAxes, tr.axisNorm = make([]int, n), make([]int, n)
	mapped := 0
	for i, o := range tr.inst.ops {
		tr.inAxes[i], tr.axisNorm[i] = trace.NotMapped, trace.NotMapped
		if r.IntN(5) < 3 {
			rank := len(o.typ.Shape) + 1
			tr.axisNorm[i] = r.IntN(rank)
			tr.inAxes[i] = tr.axisNorm[i] - rank*r.IntN(2)
			mapped++
		}
	}
	if n > 0 && mapped == 0 && r.IntN(4) != 0 {
		i := r.IntN(n)
		tr.axisNorm[i] = r.IntN(len(tr.inst.ops[i].typ.Shape) + 1)
		tr.inAxes[i] = tr.axisNorm[i]
		mapped++
	}
	tr.withSize = mapped == 0 || r.IntN(3) == 0
	tr.args = make([]*trace.Array, n)
	for i, o := range tr.inst.ops {
		gen := o.gen
		if gen == nil {
			gen = vtGen(o.typ.DType)
		}
		t := o.typ
		if a := tr.axisNorm[i]; a != trace.NotMapped {
			t = t.WithShape(slices.Insert(t.Shape.Clone(), a, tr.size))
		}
		tr.args[i] = vtArray(r, t, gen)
	}
	// The expected results: op(x_i) stacked; with no example, the type
	// of the results of an example of fresh operands.
	var outs [][]*trace.Array
	if tr.size == 0 {
		ex := make([]*trace.Array, n)
		for i, o := range tr.inst.ops {
			ex[i] = vtArray(r, o.typ, vtGen(o.typ.DType))
			if o.gen != nil {
				ex[i] = vtArray(r, o.typ, o.gen)
			}
		}
		outs = append(outs, tr.inst.fn(ex))
	}
	for k := range tr.size {
		ex := make([]*trace.Array, n)
		for i, a := range tr.args {
			ex[i] = vtExample(a, tr.axisNorm[i], k)
		}
		outs = append(outs, tr.inst.fn(ex))
	}
	m := len(outs[0])
	tr.outAxes, tr.want, tr.wantTypes = make([]int, m), make([]*trace.Array, m), make([]ir.Type, m)
	for j := range m {
		rank := outs[0][j].Rank() + 1
		a := r.IntN(rank)
		tr.outAxes[j] = a - rank*r.IntN(2)
		t := outs[0][j].Type()
		tr.wantTypes[j] = t.WithShape(slices.Insert(t.Shape.Clone(), a, tr.size))
		if tr.size > 0 {
			col := make([]*trace.Array, tr.size)
			for k := range col {
				col[k] = outs[k][j]
			}
			tr.want[j] = vtStack(a, col)
		}
	}
	return tr
}

// opts returns the Vmap options of the trial.
func (tr *vtTrial) opts() []trace.VmapOption {
	o := []trace.VmapOption{trace.InAxes(tr.inAxes...), trace.OutAxes(tr.outAxes...)}
	if tr.withSize {
		o = append(o, trace.AxisSize(tr.size))
	}
	return o
}

// check compares VmapFlat's results with the loop's.
func (tr *vtTrial) check(got []*trace.Array) string {
	if len(got) != len(tr.want) {
		return fmt.Sprintf("%d results, want %d", len(got), len(tr.want))
	}
	for j := range got {
		if d := vtCompare(got[j], tr.wantTypes[j], tr.want[j], tr.inst.tol); d != "" {
			return fmt.Sprintf("result %d: %s", j, d)
		}
	}
	return ""
}

// vtRecover runs f and returns the panic it raised, as text.
func vtRecover(f func()) (msg string) {
	defer func() {
		if e := recover(); e != nil {
			msg = fmt.Sprintf("panic: %v", e)
		}
	}()
	f()
	return ""
}

// vtEmits reports whether fn, traced on the case's operands, records op code
// (so that each case checks the op it is named for).
func vtEmits(in vtInst, code ir.Code) bool {
	tr := trace.NewFuncTracer("emits")
	params := make([]*trace.Array, len(in.ops))
	for i, o := range in.ops {
		params[i] = tr.Param(o.typ)
	}
	tr.Push()
	defer tr.Close()
	defer tr.Pop()
	in.fn(params)
	found := false
	tr.Func().Body.Walk(func(op *ir.Op) { found = found || op.Code == code })
	return found
}

// TestVmapOps checks the batching rule of every op against a loop over the
// examples: random batch sizes (0, 1, 3), a random batch axis per operand
// (negative, or NotMapped), a random output axis; eagerly, and under rt.Jit
// every other trial. FERRY_TEST_SEED repeats a run.
func TestVmapOps(t *testing.T) {
	seed := otRand(t).Uint64()
	cases := vtCases()
	covered := map[ir.Code]bool{}
	for _, c := range cases {
		covered[c.code] = true
	}
	for _, code := range ir.AllCodes() {
		if code.IsCollective() {
			// The loop reference runs the op once per example, where a
			// collective's axis is unbound: TestVmapCollectives checks
			// every collective against float64 loops (and fails on one
			// without a case).
			continue
		}
		if !covered[code] {
			t.Errorf("op %v has no case in vtCases", code)
		}
	}
	const trials = 16
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(ci)))
			if in := c.make(r); !vtEmits(in, c.code) {
				t.Fatalf("the case's function does not record a %v op (%s)", c.code, in.desc)
			}
			for k := range trials {
				var tr *vtTrial
				if msg := vtRecover(func() { tr = newVtTrial(r, c) }); msg != "" {
					t.Fatalf("trial %d: computing the expected results: %s", k, msg)
				}
				var got []*trace.Array
				msg := vtRecover(func() { got = trace.VmapFlat(tr.inst.fn, tr.args, tr.opts()...) })
				if msg == "" {
					msg = tr.check(got)
				}
				if msg != "" {
					t.Fatalf("trial %d, eager: %s\n%v", k, msg, tr)
				}
				if k%2 == 1 {
					f := rt.Jit(func(a []*trace.Array) []*trace.Array { return trace.VmapFlat(tr.inst.fn, a, tr.opts()...) })
					msg := vtRecover(func() { got = f(tr.args) })
					if msg == "" {
						msg = tr.check(got)
					}
					if msg != "" {
						t.Fatalf("trial %d, jit: %s\n%v", k, msg, tr)
					}
				}
			}
		})
	}
}

// vtStackLoop runs per on every example (axis 0 of each of xs) and stacks
// the results on axis 0: the loop a Vmap must equal.
func vtStackLoop(n int, per func(i int) *trace.Array) *trace.Array {
	outs := make([]*trace.Array, n)
	for i := range outs {
		outs[i] = per(i)
	}
	return trace.Stack(0, outs...)
}

// vtExample2 is one training example of the MLP.
type vtExample2 struct{ X, Y *trace.Array }

// TestVmapPerExampleGradients computes the gradient of a small MLP's loss for
// every example of a batch at once, Vmap of Grad with the parameters not
// mapped (a tree of InAxes), and checks it against a Go loop that
// differentiates each example on its own, eagerly and under rt.Jit.
func TestVmapPerExampleGradients(t *testing.T) {
	const B, D, H, O = 5, 4, 6, 3
	r := otRand(t)
	p := gtMLP{W1: gtRand(r, -0.7, 0.7, D, H), B1: gtRand(r, -0.2, 0.2, H),
		W2: gtRand(r, -0.7, 0.7, H, O), B2: gtRand(r, -0.2, 0.2, O), Name: "mlp"}
	batch := vtExample2{X: gtRand(r, -1, 1, B, D), Y: gtRand(r, -1, 1, B, O)}

	grad := func(p gtMLP, ex vtExample2) gtMLP {
		return trace.Grad(func(p gtMLP) *trace.Array { return gtMLPLoss(p, ex.X, ex.Y) })(p)
	}
	nm := trace.NotMapped
	perEx := trace.Vmap(grad, trace.InAxes(nm, nm, nm, nm, 0, 0))

	// The loop: one gradient per example, stacked.
	var loop []gtMLP
	for i := range B {
		loop = append(loop, grad(p, vtExample2{X: trace.Index(batch.X, i), Y: trace.Index(batch.Y, i)}))
	}
	leaf := func(g gtMLP, k int) *trace.Array { return []*trace.Array{g.W1, g.B1, g.W2, g.B2}[k] }
	names := []string{"W1", "B1", "W2", "B2"}
	check := func(what string, got gtMLP) {
		t.Helper()
		if got.Name != "mlp" {
			t.Errorf("%s: static field Name = %q, want it kept", what, got.Name)
		}
		for k, name := range names {
			want := vtStackLoop(B, func(i int) *trace.Array { return leaf(loop[i], k) })
			g := leaf(got, k)
			if !g.Shape().Equal(want.Shape()) {
				t.Errorf("%s: d%s has shape %v, want %v", what, name, g.Shape(), want.Shape())
				continue
			}
			gtExpectClose(t, what+" d"+name, g.Float64s(), want.Float64s(), 1e-12)
		}
	}
	check("eager", perEx(p, batch))
	check("jit", rt.Jit(perEx)(p, batch))

	// The mean of the per-example gradients is the batch loss's gradient
	// divided by B (the loss is a sum over examples).
	full := trace.Grad(func(p gtMLP) *trace.Array { return gtMLPLoss(p, batch.X, batch.Y) })(p)
	pe := perEx(p, batch)
	for k, name := range names {
		gtExpectClose(t, "sum over examples of d"+name, trace.Sum(leaf(pe, k), 0).Float64s(), leaf(full, k).Float64s(), 1e-12)
	}
}

// TestVmapNested maps a dot product over rows and then over columns, the two
// Vmaps taking their inputs at different axes, and checks it against float64
// loops.
func TestVmapNested(t *testing.T) {
	const N, M, K = 3, 4, 5
	r := otRand(t)
	a, at := otMake(r, ir.Float64, otNormal, N, M, K)
	b, bt := otMake(r, ir.Float64, otNormal, M, K)
	dot := func(x, y *trace.Array) *trace.Array { return trace.Sum(trace.Mul(x, y)) }
	inner := trace.Vmap(dot, trace.InAxes(0, trace.NotMapped)) // rows i of a[:, j, :], one y
	outer := trace.Vmap(inner, trace.InAxes(1, 0))             // columns j of a and rows j of b
	want := otNew(M, N)
	for j := range M {
		for i := range N {
			s := 0.0
			for k := range K {
				s += at.at(i, j, k) * bt.at(j, k)
			}
			want.data[j*N+i] = s
		}
	}
	otCheck(t, "Vmap of Vmap", outer(a, b), ir.Float64, want, 1e-12)
	otCheck(t, "jit of Vmap of Vmap", rt.Jit(outer)(a, b), ir.Float64, want, 1e-12)
	// The inner Vmap puts its mapped axis last; the outer one then at 0.
	outer2 := trace.Vmap(trace.Vmap(dot, trace.InAxes(0, trace.NotMapped), trace.OutAxes(-1)), trace.InAxes(1, 0), trace.OutAxes(1))
	wantT := otNew(N, M)
	for j := range M {
		for i := range N {
			wantT.data[i*M+j] = want.data[j*N+i]
		}
	}
	otCheck(t, "Vmap of Vmap with OutAxes", outer2(a, b), ir.Float64, wantT, 1e-12)
	// The inner function closes over the outer one's example: an outer
	// product, the inner Vmap mapping an array closed over by neither.
	op := trace.Vmap(func(ai *trace.Array) *trace.Array {
		return trace.Vmap(func(bj *trace.Array) *trace.Array { return trace.Mul(ai, bj) })(trace.Index(b, 0))
	})
	wantO := otNew(N, K, M, K) // [i, j, m, k] = a[i, m, k] b[0, j]
	for i := range N {
		for j := range K {
			for m := range M {
				for k := range K {
					wantO.data[otRavel([]int{i, j, m, k}, wantO.shape)] = at.at(i, m, k) * bt.at(0, j)
				}
			}
		}
	}
	otCheck(t, "Vmap closing over the outer Vmap's example", op(a), ir.Float64, wantO, 0)
}

// TestVmapUnderGradAndJVP differentiates through a Vmap: Grad of a sum over
// a Vmap, and JVP of a Vmap, against derivatives written by hand in float64.
func TestVmapUnderGradAndJVP(t *testing.T) {
	const N, K = 4, 3
	r := otRand(t)
	x, xt := otMake(r, ir.Float64, otNormal, N, K)
	w, wt := otMake(r, ir.Float64, otNormal, K)
	// f(w) = Σ_i tanh(x_i · w), with w closed over by the mapped function.
	loss := func(w *trace.Array) *trace.Array {
		per := trace.Vmap(func(xi *trace.Array) *trace.Array { return trace.Tanh(trace.Sum(trace.Mul(xi, w))) })
		return trace.Sum(per(x))
	}
	want := otNew(K)
	for i := range N {
		s := 0.0
		for k := range K {
			s += xt.at(i, k) * wt.data[k]
		}
		d := 1 - math.Tanh(s)*math.Tanh(s)
		for k := range K {
			want.data[k] += d * xt.at(i, k)
		}
	}
	otCheck(t, "Grad of Vmap", trace.Grad(loss)(w), ir.Float64, want, 1e-12)
	otCheck(t, "jit of Grad of Vmap", rt.Jit(trace.Grad(loss))(w), ir.Float64, want, 1e-12)

	// JVP of y_i = sin(x_i * w) (x mapped, w not) with tangents tx, tw:
	// cos(x_i w) (tx_i w + x_i tw).
	tx, txt := otMake(r, ir.Float64, otNormal, N, K)
	tw, twt := otMake(r, ir.Float64, otNormal, K)
	f := func(p []*trace.Array) []*trace.Array {
		return trace.VmapFlat(func(a []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.Sin(trace.Mul(a[0], a[1]))}
		}, p, trace.InAxes(0, trace.NotMapped))
	}
	outs, tans := trace.JVP(f, []*trace.Array{x, w}, []*trace.Array{tx, tw})
	wantY, wantT := otNew(N, K), otNew(N, K)
	for i := range N {
		for k := range K {
			v := xt.at(i, k) * wt.data[k]
			wantY.data[i*K+k] = math.Sin(v)
			wantT.data[i*K+k] = math.Cos(v) * (txt.at(i, k)*wt.data[k] + xt.at(i, k)*twt.data[k])
		}
	}
	otCheck(t, "JVP of Vmap: outputs", outs[0], ir.Float64, wantY, 1e-12)
	otCheck(t, "JVP of Vmap: tangents", tans[0], ir.Float64, wantT, 1e-12)
	// And Vmap of Grad of Vmap: the gradient per row block.
	gOf := trace.Vmap(func(xb, w *trace.Array) *trace.Array {
		return trace.Grad(func(w *trace.Array) *trace.Array {
			return trace.Sum(trace.Vmap(func(xi *trace.Array) *trace.Array { return trace.Tanh(trace.Sum(trace.Mul(xi, w))) })(xb))
		})(w)
	}, trace.InAxes(0, trace.NotMapped))
	xb := trace.Reshape(x, 2, N/2, K)
	got := gOf(xb, w)
	for blk := range 2 {
		wantB := otNew(K)
		for i := blk * N / 2; i < (blk+1)*N/2; i++ {
			s := 0.0
			for k := range K {
				s += xt.at(i, k) * wt.data[k]
			}
			for k := range K {
				wantB.data[k] += (1 - math.Tanh(s)*math.Tanh(s)) * xt.at(i, k)
			}
		}
		otCheck(t, fmt.Sprintf("Vmap of Grad of Vmap, block %d", blk), trace.Index(got, blk), ir.Float64, wantB, 1e-12)
	}
}

// vtPair and vtOut are trees of arrays for TestVmapTrees.
type vtPair struct {
	A, B *trace.Array
	Tag  string
}

type vtOut struct {
	Sum, Scaled *trace.Array
	Parts       []*trace.Array
}

// TestVmapTrees maps a function over structs and slices with an InAxes
// entry per leaf and places each output leaf with OutAxes.
func TestVmapTrees(t *testing.T) {
	r := otRand(t)
	const N = 3
	a, at := otMake(r, ir.Float64, otNormal, 2, N) // mapped at axis 1
	b, bt := otMake(r, ir.Float64, otNormal, 2, N) // mapped at axis -1
	s, st := otMake(r, ir.Float64, otNormal)       // not mapped
	c, ct := otMake(r, ir.Float64, otNormal, N, 4) // mapped at axis 0
	fn := func(p vtPair, scale *trace.Array, cs []*trace.Array) vtOut {
		if p.Tag != "pair" {
			panic("static field lost")
		}
		return vtOut{
			Sum:    trace.Add(p.A, p.B),                 // [2] per example → OutAxes -1
			Scaled: trace.Mul(scale, trace.Scalar(2)),   // not mapped → NotMapped
			Parts:  []*trace.Array{trace.Sum(cs[0], 0)}, // scalar per example → 0
		}
	}
	v := trace.Vmap(fn, trace.InAxes(1, -1, trace.NotMapped, 0), trace.OutAxes(-1, trace.NotMapped, 0))
	for _, mode := range []string{"eager", "jit"} {
		g := v
		if mode == "jit" {
			g = rt.Jit(v)
		}
		got := g(vtPair{A: a, B: b, Tag: "pair"}, s, []*trace.Array{c})
		sum := otNew(2, N)
		for i := range sum.data {
			sum.data[i] = at.data[i] + bt.data[i]
		}
		otCheck(t, mode+" Sum", got.Sum, ir.Float64, sum, 0)
		otCheck(t, mode+" Scaled", got.Scaled, ir.Float64, otTensor{data: []float64{2 * st.data[0]}}, 0)
		part := otNew(N)
		for i := range N {
			for j := range 4 {
				part.data[i] += ct.at(i, j)
			}
		}
		otCheck(t, mode+" Parts[0]", got.Parts[0], ir.Float64, part, 1e-12)
	}
	// One InAxes value applies to every leaf; map inputs work too.
	m := trace.Vmap(func(d map[string]*trace.Array) *trace.Array { return trace.Sub(d["x"], d["y"]) }, trace.InAxes(1))
	want := otNew(N, 2)
	for i := range 2 {
		for j := range N {
			want.data[j*2+i] = at.at(i, j) - bt.at(i, j)
		}
	}
	otCheck(t, "map tree", m(map[string]*trace.Array{"x": a, "y": b}), ir.Float64, want, 0)
}

// TestVmapAxisSize maps a function none of whose inputs is mapped: every
// example is the same, repeated AxisSize times (0 too).
func TestVmapAxisSize(t *testing.T) {
	r := otRand(t)
	x, xt := otMake(r, ir.Float32, otNormal, 2)
	for _, n := range []int{0, 1, 4} {
		f := trace.Vmap(func(x *trace.Array) *trace.Array { return trace.Mul(x, x) }, trace.InAxes(trace.NotMapped), trace.AxisSize(n), trace.OutAxes(1))
		want := otNew(2, n)
		for i := range 2 {
			for j := range n {
				want.data[i*n+j] = otRound(xt.data[i]*xt.data[i], ir.Float32)
			}
		}
		otCheck(t, fmt.Sprintf("AxisSize(%d)", n), f(x), ir.Float32, want, 0)
		otCheck(t, fmt.Sprintf("jit AxisSize(%d)", n), rt.Jit(f)(x), ir.Float32, want, 0)
	}
	// No input at all.
	g := trace.Vmap(func() *trace.Array { return trace.Arange(3, ir.Int32) }, trace.AxisSize(2))
	otCheck(t, "no inputs", g(), ir.Int32, otTensor{shape: []int{2, 3}, data: []float64{0, 1, 2, 0, 1, 2}}, 0)
}

// TestVmapAxisIndex reads the example's index with AxisIndex, in nested
// named Vmaps and under rt.Jit.
func TestVmapAxisIndex(t *testing.T) {
	x := rt.FromSlice([]int32{0, 0, 0, 0, 0, 0}, 2, 3)
	f := trace.Vmap(trace.Vmap(func(x *trace.Array) *trace.Array {
		return trace.Add(x, trace.Add(trace.Mul(trace.AxisIndex("row"), trace.ScalarAs(10, ir.Int32)), trace.AxisIndex("col")))
	}, trace.AxisName("col")), trace.AxisName("row"))
	want := []int32{0, 1, 2, 10, 11, 12}
	if got := f(x).Int32s(); !slices.Equal(got, want) {
		t.Errorf("nested AxisIndex: %v, want %v", got, want)
	}
	if got := rt.Jit(f)(x).Int32s(); !slices.Equal(got, want) {
		t.Errorf("jit nested AxisIndex: %v, want %v", got, want)
	}
	// The inner name shadows an outer Vmap of the same name.
	g := trace.Vmap(trace.Vmap(func(x *trace.Array) *trace.Array { return trace.Add(x, trace.AxisIndex("i")) },
		trace.AxisName("i")), trace.AxisName("i"))
	if got, want := g(x).Int32s(), []int32{0, 1, 2, 0, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("shadowed AxisIndex: %v, want %v", got, want)
	}
	// An AxisSize-only Vmap has an index too.
	h := trace.Vmap(func() *trace.Array { return trace.AxisIndex("k") }, trace.AxisSize(4), trace.AxisName("k"))
	if got, want := h().Int32s(), []int32{0, 1, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("AxisIndex with AxisSize: %v, want %v", got, want)
	}
	// Under Grad: d/dw Σ_i x_i·w·i = Σ_i i·x_i.
	xs := rt.FromSlice([]float64{1, 2, 3}, 3)
	gr := trace.Grad(func(w *trace.Array) *trace.Array {
		return trace.Sum(trace.Vmap(func(x *trace.Array) *trace.Array {
			return trace.Mul(trace.Mul(x, w), trace.Convert(trace.AxisIndex("i"), ir.Float64))
		}, trace.AxisName("i"))(xs))
	})
	w := rt.FromSlice([]float64{1.5})
	if got := gr(w).Float64s(); !slices.Equal(got, []float64{8}) {
		t.Errorf("Grad through AxisIndex: %v, want [8]", got)
	}
	if got := rt.Jit(gr)(w).Float64s(); !slices.Equal(got, []float64{8}) {
		t.Errorf("jit Grad through AxisIndex: %v, want [8]", got)
	}
	err, line := otCatchLine(func() { trace.AxisIndex("nowhere") })
	vtCheckError(t, err, line, "AxisIndex", `no Vmap with AxisName("nowhere")`)
	err, line = otCatchLine(func() {
		trace.Vmap(func(x *trace.Array) *trace.Array { return trace.AxisIndex("j") }, trace.AxisName("i"))(x)
	})
	vtCheckError(t, err, line+1, "AxisIndex", `no Vmap with AxisName("j")`)
}

// vtCheckError checks that err is an *Error of op located at the test's
// line whose message contains every fragment.
func vtCheckError(t *testing.T, err *trace.Error, line int, op string, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("no error, want %s: %q", op, fragments)
		return
	}
	if err.Op != op {
		t.Errorf("error %v: op %q, want %q", err, err.Op, op)
	}
	if err.Line != line || !strings.HasSuffix(err.File, "batch_test.go") {
		t.Errorf("error %v at %s:%d, want batch_test.go:%d (the caller's line)", err, err.File, err.Line, line)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Msg, f) {
			t.Errorf("error %q does not say %q", err.Msg, f)
		}
	}
}

// TestVmapErrors checks the errors of bad Vmap input: a *trace.Error naming
// the problem, located at the caller's line.
func TestVmapErrors(t *testing.T) {
	x := rt.FromSlice(make([]float32, 6), 2, 3)
	y := rt.FromSlice(make([]float32, 12), 4, 3)
	add := func(a, b *trace.Array) *trace.Array { return trace.Add(a, b) }
	nm := trace.NotMapped

	err, line := otCatchLine(func() { trace.Vmap(add, trace.InAxes(0, 0, 0))(x, x) })
	vtCheckError(t, err, line, "Vmap", "InAxes has 3 entries for 2 arguments (with 1, 1 leaves)")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.InAxes(0, 2))(x, x) })
	vtCheckError(t, err, line, "Vmap", "axis 2 is out of range", "input leaf 1", "f32[2,3]")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.InAxes(-3, 0))(x, x) })
	vtCheckError(t, err, line, "Vmap", "axis -3 is out of range", "input leaf 0")
	err, line = otCatchLine(func() { trace.Vmap(add)(x, y) })
	vtCheckError(t, err, line, "Vmap", "different sizes", "leaf 1 (f32[4,3]) has 4 on axis 0", "leaf 0 has 2 on axis 0")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.InAxes(0, 1), trace.AxisSize(2))(x, x) })
	vtCheckError(t, err, line, "Vmap", "input leaf 1 (f32[2,3]) has 3 examples on axis 1", "AxisSize is 2")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.InAxes(nm))(x, x) })
	vtCheckError(t, err, line, "Vmap", "no input is mapped", "AxisSize")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.InAxes(nm), trace.AxisSize(-1))(x, x) })
	vtCheckError(t, err, line, "Vmap", "negative AxisSize -1")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.OutAxes(nm))(x, x) })
	vtCheckError(t, err, line, "Vmap", "output leaf 0", "depends on the mapped inputs", "NotMapped")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.OutAxes(2))(x, x) })
	vtCheckError(t, err, line, "Vmap", "OutAxes: axis 2 is out of range for output leaf 0 of rank 1")
	err, line = otCatchLine(func() { trace.Vmap(add, trace.OutAxes(0, 0))(x, x) })
	vtCheckError(t, err, line, "Vmap", "OutAxes has 2 entries for 1 results (with 1 leaves)")
	err, line = otCatchLine(func() { trace.VmapFlat(nil, []*trace.Array{x}) })
	vtCheckError(t, err, line, "VmapFlat", "nil function")
	err, line = otCatchLine(func() { trace.VmapFlat(func(a []*trace.Array) []*trace.Array { return a }, []*trace.Array{x, nil}) })
	vtCheckError(t, err, line, "VmapFlat", "input leaf 1 is nil")
	// An error inside the mapped function names its line, with the shapes
	// of one example.
	err, line = otCatchLine(func() {
		trace.Vmap(func(a *trace.Array) *trace.Array { return trace.Reshape(a, 4) })(x)
	})
	vtCheckError(t, err, line+1, "Reshape", "f32[3]")
	// And rt.Jit's error-returning entry point returns it.
	j := rt.NewJitted(trace.Vmap(add, trace.InAxes(0, 2)))
	if _, e := j.Call(x, x); e == nil || !strings.Contains(e.Error(), "out of range") {
		t.Errorf("jitted Vmap with a bad axis: error %v, want one saying out of range", e)
	}
}

// vtCountOps counts the ops of f by code, nested regions included.
func vtCountOps(f *ir.Func) map[ir.Code]int {
	n := map[ir.Code]int{}
	f.Body.Walk(func(op *ir.Op) { n[op.Code]++ })
	return n
}

// TestVmapIsHandWritten lowers Vmap of a matrix-vector product and of a
// matrix product under rt.Jit: the batched program holds exactly one
// dot_general and no loop, like the hand-written batched product.
func TestVmapIsHandWritten(t *testing.T) {
	r := otRand(t)
	w, _ := otMake(r, ir.Float32, otNormal, 5, 4)
	xs, _ := otMake(r, ir.Float32, otNormal, 8, 4)
	ms, _ := otMake(r, ir.Float32, otNormal, 8, 4, 3)
	ws, _ := otMake(r, ir.Float32, otNormal, 8, 5, 4)
	matvec := func(w, x *trace.Array) *trace.Array { return trace.MatMul(w, x) }
	matmul := func(w, m *trace.Array) *trace.Array { return trace.Tanh(trace.MatMul(w, m)) }
	cases := []struct {
		name string
		fn   func(w, x *trace.Array) *trace.Array
		args []any
		opts []trace.VmapOption
		hand func(w, x *trace.Array) *trace.Array
		// transposes is the number of transposes the compiled program may
		// keep (-1: any).
		transposes int
	}{
		{"matvec, weights not mapped", matvec, []any{w, xs}, []trace.VmapOption{trace.InAxes(trace.NotMapped, 0)},
			func(w, x *trace.Array) *trace.Array { return trace.MatMul(x, trace.Transpose(w, 1, 0)) }, 0},
		{"matvec, batch on axis 1", matvec, []any{w, trace.Transpose(xs, 1, 0)}, []trace.VmapOption{trace.InAxes(trace.NotMapped, 1)},
			func(w, x *trace.Array) *trace.Array { return trace.Transpose(trace.MatMul(w, x), 1, 0) }, 0},
		{"matmul, weights not mapped", matmul, []any{w, ms}, []trace.VmapOption{trace.InAxes(trace.NotMapped, 0)},
			func(w, m *trace.Array) *trace.Array { return trace.Tanh(trace.Einsum("ij,bjk->bik", w, m)) }, -1},
		{"matmul, both mapped", matmul, []any{ws, ms}, nil,
			func(w, m *trace.Array) *trace.Array { return trace.Tanh(trace.MatMul(w, m)) }, 0},
	}
	for _, c := range cases {
		f := trace.Vmap(c.fn, c.opts...)
		l, err := rt.NewJitted(f).Lower(c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		n := vtCountOps(l.Func)
		if n[ir.DotGeneral] != 1 || n[ir.Scan] != 0 || n[ir.While] != 0 {
			t.Errorf("%s: the batched program has %d dot_general, %d scan, %d while; want one dot_general and no loop:\n%s",
				c.name, n[ir.DotGeneral], n[ir.Scan], n[ir.While], l.IR())
		}
		// The compiled program too (the product may sit in a fusion).
		comp, err := l.Compile()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n := vtCountOps(comp.Program().Func); n[ir.DotGeneral] != 1 || n[ir.Scan] != 0 || n[ir.While] != 0 {
			t.Errorf("%s: the compiled program has %d dot_general, %d scan, %d while; want one dot_general and no loop:\n%s",
				c.name, n[ir.DotGeneral], n[ir.Scan], n[ir.While], comp.OptimizedIR())
		}
		if n := vtCountOps(comp.Program().Func); c.transposes >= 0 && n[ir.Transpose] > c.transposes {
			t.Errorf("%s: the compiled program has %d transposes, want at most %d:\n%s", c.name, n[ir.Transpose], c.transposes, comp.OptimizedIR())
		}
		// The same values as the hand-written batched program.
		got := rt.Jit(f)(c.args[0].(*trace.Array), c.args[1].(*trace.Array))
		want := c.hand(c.args[0].(*trace.Array), c.args[1].(*trace.Array))
		otCheck(t, c.name, got, ir.Float32, otTensor{shape: want.Shape(), data: want.Float64s()}, 1e-5)
	}
}

// vtLoopCheck compares got with fn run on each example of the inputs
// (mapped on axis 0, or NotMapped) stacked on axis 0, bit for bit.
func vtLoopCheck(t *testing.T, what string, got *trace.Array, fn func(a []*trace.Array) *trace.Array, args []*trace.Array, axes []int) {
	t.Helper()
	n := -1
	for i, a := range args {
		if axes[i] != trace.NotMapped {
			n = a.Shape()[0]
		}
	}
	want := vtStackLoop(n, func(k int) *trace.Array {
		ex := make([]*trace.Array, len(args))
		for i, a := range args {
			ex[i] = vtExample(a, axes[i], k)
		}
		return fn(ex)
	})
	if d := vtCompare(got, want.Type(), want, 0); d != "" {
		t.Errorf("%s: %s", what, d)
	}
}

// TestVmapRandom maps samplers over a batch of PRNG keys: each example's
// stream is bit for bit the one of calling the sampler with its key.
func TestVmapRandom(t *testing.T) {
	keys := random.Split(random.NewKey(uint64(otRand(t).Uint32())), 4)
	samplers := map[string]func(k *trace.Array) *trace.Array{
		"Normal":      func(k *trace.Array) *trace.Array { return random.Normal(k, ir.Float32, ir.Shape{2, 3}) },
		"Uniform":     func(k *trace.Array) *trace.Array { return random.Uniform(k, ir.Float64, ir.Shape{5}, -1, 2) },
		"Bernoulli":   func(k *trace.Array) *trace.Array { return random.Bernoulli(k, 0.3, ir.Shape{6}) },
		"Split":       func(k *trace.Array) *trace.Array { return random.Split(k, 3) },
		"FoldIn":      func(k *trace.Array) *trace.Array { return random.FoldIn(k, 7) },
		"Permutation": func(k *trace.Array) *trace.Array { return random.Permutation(k, 5) },
	}
	for name, f := range samplers {
		one := func(a []*trace.Array) *trace.Array { return f(a[0]) }
		vtLoopCheck(t, name, trace.Vmap(f)(keys), one, []*trace.Array{keys}, []int{0})
		vtLoopCheck(t, name+" (jit)", rt.Jit(trace.Vmap(f))(keys), one, []*trace.Array{keys}, []int{0})
	}
}

// TestVmapComposesCustomVJP maps a function with a custom derivative (scaled by 3,
// so that its use shows): under Vmap of Grad the backward function runs per
// example, and under Grad of Vmap the cotangent of an input that is not
// mapped is summed over the examples.
func TestVmapComposesCustomVJP(t *testing.T) {
	r := otRand(t)
	const N, K = 3, 4
	x, xt := otMake(r, ir.Float64, otNormal, N, K)
	w, wt := otMake(r, ir.Float64, otNormal, K)
	// mul3(x, w) = x*w, with derivative 3w for x and 3x for w.
	mul3 := trace.CustomVJP(func(a []*trace.Array) ([]*trace.Array, []*trace.Array) {
		return []*trace.Array{trace.Mul(a[0], a[1])}, []*trace.Array{a[0], a[1]}
	}, func(res, ct []*trace.Array) []*trace.Array {
		three := trace.ScalarAs(3, ir.Float64)
		return []*trace.Array{trace.Mul(trace.Mul(ct[0], res[1]), three), trace.Mul(trace.Mul(ct[0], res[0]), three)}
	})
	loss := func(x, w *trace.Array) *trace.Array { return trace.Sum(trace.Sin(mul3(x, w)[0])) }
	// d/dw Σ_k sin(x_k w_k) through the custom rule: 3 x_k cos(x_k w_k).
	perEx := otNew(N, K)
	total := otNew(K)
	for i := range N {
		for k := range K {
			g := 3 * xt.at(i, k) * math.Cos(xt.at(i, k)*wt.data[k])
			perEx.data[i*K+k] = g
			total.data[k] += g
		}
	}
	vg := trace.Vmap(func(x, w *trace.Array) *trace.Array {
		return trace.Grad(func(w *trace.Array) *trace.Array { return loss(x, w) })(w)
	}, trace.InAxes(0, trace.NotMapped))
	otCheck(t, "Vmap of Grad", vg(x, w), ir.Float64, perEx, 1e-12)
	otCheck(t, "jit Vmap of Grad", rt.Jit(vg)(x, w), ir.Float64, perEx, 1e-12)
	gv := trace.Grad(func(w *trace.Array) *trace.Array {
		return trace.Sum(trace.Vmap(loss, trace.InAxes(0, trace.NotMapped))(x, w))
	})
	otCheck(t, "Grad of Vmap", gv(w), ir.Float64, total, 1e-12)
	otCheck(t, "jit Grad of Vmap", rt.Jit(gv)(w), ir.Float64, total, 1e-12)
}

// TestVmapComposesRemat maps a rematerialised function and differentiates through
// it: the values equal the loop's, the gradients the float64 ones.
func TestVmapComposesRemat(t *testing.T) {
	r := otRand(t)
	const N, K = 3, 4
	x, xt := otMake(r, ir.Float64, otNormal, N, K)
	w, wt := otMake(r, ir.Float64, otNormal, K)
	layer := trace.Remat(func(x, w *trace.Array) *trace.Array {
		return trace.Tanh(trace.Mul(trace.CheckpointName(trace.Sin(x), "s"), w))
	}, trace.SaveOnlyTheseNames("s"))
	v := trace.Vmap(layer, trace.InAxes(0, trace.NotMapped))
	one := func(a []*trace.Array) *trace.Array { return layer(a[0], a[1]) }
	vtLoopCheck(t, "Vmap of Remat", v(x, w), one, []*trace.Array{x, w}, []int{0, trace.NotMapped})
	g := trace.Grad(func(w *trace.Array) *trace.Array { return trace.Sum(v(x, w)) })
	want := otNew(K)
	for i := range N {
		for k := range K {
			y := math.Tanh(math.Sin(xt.at(i, k)) * wt.data[k])
			want.data[k] += (1 - y*y) * math.Sin(xt.at(i, k))
		}
	}
	otCheck(t, "Grad of Vmap of Remat", g(w), ir.Float64, want, 1e-12)
	otCheck(t, "jit Grad of Vmap of Remat", rt.Jit(g)(w), ir.Float64, want, 1e-12)
}

// TestVmapPassThrough returns inputs, closed-over arrays and constants
// unchanged: mapped ones keep their examples (at the OutAxes axis), the
// others are repeated for every example.
func TestVmapPassThrough(t *testing.T) {
	r := otRand(t)
	x, _ := otMake(r, ir.Float32, otNormal, 2, 3)
	c, _ := otMake(r, ir.Int32, otInts(-5, 5), 4)
	fn := func(a []*trace.Array) []*trace.Array {
		return []*trace.Array{a[0], a[1], a[0], c, trace.ScalarAs(7, ir.Int64)}
	}
	args := []*trace.Array{x, c}
	for _, jit := range []bool{false, true} {
		opts := []trace.VmapOption{trace.InAxes(1, trace.NotMapped), trace.OutAxes(0, 1, -1, 0, 0)}
		got := trace.VmapFlat(fn, args, opts...)
		if jit {
			got = rt.Jit(func(a []*trace.Array) []*trace.Array { return trace.VmapFlat(fn, a, opts...) })(args)
		}
		xt := trace.Transpose(x, 1, 0)
		want := []*trace.Array{xt, trace.Stack(1, c, c, c), x, trace.Stack(0, c, c, c), trace.Stack(0, trace.ScalarAs(7, ir.Int64), trace.ScalarAs(7, ir.Int64), trace.ScalarAs(7, ir.Int64))}
		for i := range want {
			if d := vtCompare(got[i], want[i].Type(), want[i], 0); d != "" {
				t.Errorf("jit %v, output %d: %s", jit, i, d)
			}
		}
	}
}

// TestVmapInsideTransforms uses Vmap inside a jitted function whose mapped
// function closes over the jit's traced arguments, on a jitted function, and
// inside a Scan body.
func TestVmapInsideTransforms(t *testing.T) {
	r := otRand(t)
	x, _ := otMake(r, ir.Float32, otNormal, 3, 4)
	b, _ := otMake(r, ir.Float32, otNormal, 4)
	f := rt.Jit(func(x, b *trace.Array) *trace.Array {
		return trace.Vmap(func(xi *trace.Array) *trace.Array { return trace.Max(trace.Add(xi, b)) })(x)
	})
	vtLoopCheck(t, "Vmap closing over jit arguments", f(x, b),
		func(a []*trace.Array) *trace.Array { return trace.Max(trace.Add(a[0], b)) }, []*trace.Array{x}, []int{0})
	// Vmap of a jitted function (rt.Jit inlines into the Vmap's trace).
	jf := rt.Jit(func(a *trace.Array) *trace.Array { return trace.Sum(trace.Exp(a)) })
	vtLoopCheck(t, "Vmap of a jitted function", trace.Vmap(jf)(x),
		func(a []*trace.Array) *trace.Array { return jf(a[0]) }, []*trace.Array{x}, []int{0})
	// Scan over the rows of x, mapping over each row's elements.
	_, ys := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
		y := trace.Vmap(func(e *trace.Array) *trace.Array { return trace.Mul(e, c[0]) })(xs[0])
		return []*trace.Array{trace.Add(c[0], trace.Scalar(1))}, []*trace.Array{y}
	}, []*trace.Array{trace.ScalarAs(1, ir.Float32)}, []*trace.Array{x})
	want := vtStackLoop(3, func(i int) *trace.Array {
		return trace.Mul(trace.Index(x, i), trace.ScalarAs(float64(i+1), ir.Float32))
	})
	if d := vtCompare(ys[0], want.Type(), want, 0); d != "" {
		t.Errorf("Vmap in a Scan body: %s", d)
	}
}
