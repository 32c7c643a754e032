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

// vtFusionRegion builds by hand the region of a loop fusion of x*y+x over
// operands of type t, in the function being traced (or a function of its
// own, eagerly), as the compiler's fusion pass makes them.
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
	s, err := r.AddOp(ir.Add, []*ir.Value{m.Results[0], x}, nil)
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
	anyDT := func(r *rand.Rand) ir.DType { return vtPick(r, ir.AllDTypes...) }
	numDT := func(r *rand.Rand) ir.DType { return vtPick(r, vtDTypes(ir.NumericDTypes)...) }
	cs = append(cs,
		vtCase{ir.Constant, "constant", func(r *rand.Rand) vtInst {
			dt, s, v := numDT(r), vtPick(r, vtShapes...), float64(r.IntN(9)-4)
			return vtInst{desc: fmt.Sprint(dt, s, v), fn: func([]*trace.Array) []*trace.Array {
				return vtOne(trace.Full(s, v, dt))
			}}
		}},
		vtCase{ir.Constant, "constant_plus_operand", func(r *rand.Rand) vtInst {
			dt, s := numDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(dt, s...)), fn: func(a []*trace.Array) []*trace.Array {
				return []*trace.Array{trace.Add(a[0], trace.Full(s, 2, dt)), trace.Full(s, 3, dt)}
			}}
		}},
		vtCase{ir.Iota, "iota", func(r *rand.Rand) vtInst {
			dt, s := numDT(r), vtShapeOfRank(r, 1, 3, true)
			d := r.IntN(len(s))
			return vtInst{desc: fmt.Sprint(dt, s, d), fn: func([]*trace.Array) []*trace.Array {
				return vtOne(trace.Iota(dt, s, d))
			}}
		}},
		vtCase{ir.Select, "select", func(r *rand.Rand) vtInst {
			dt, s := anyDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(ir.Bool, s...), vtT(dt, s...), vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Where(a[0], a[1], a[2])) }}
		}},
		vtCase{ir.Convert, "convert", func(r *rand.Rand) vtInst {
			from, to := anyDT(r), anyDT(r)
			for to == from {
				to = anyDT(r)
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
			dt := anyDT(r)
			return vtInst{desc: fmt.Sprint(dt, s, "→", out, pos), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.BroadcastInDim(a[0], out, pos)) }}
		}},
		vtCase{ir.Reshape, "reshape", func(r *rand.Rand) vtInst {
			p := vtPick(r, [2][]int{{2, 3}, {3, 2}}, [2][]int{{2, 3}, {6}}, [2][]int{{2, 1, 3}, {1, 6, 1}},
				[2][]int{{}, {1, 1}}, [2][]int{{0, 2}, {2, 0, 1}}, [2][]int{{4}, {2, 2}})
			dt := anyDT(r)
			return vtInst{desc: fmt.Sprint(dt, p), ops: vtOps(vtT(dt, p[0]...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Reshape(a[0], p[1]...)) }}
		}},
		vtCase{ir.Transpose, "transpose", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 2, 4, true)
			perm := r.Perm(len(s))
			for slices.IsSorted(perm) {
				perm = r.Perm(len(s))
			}
			dt := anyDT(r)
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
			dt := anyDT(r)
			return vtInst{desc: fmt.Sprint(dt, s, start, limit, strides), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.Slice(a[0], start, limit, strides)) }}
		}},
		vtCase{ir.DynamicSlice, "dynamic_slice", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			sizes := make([]int, len(s))
			ops := vtOps(vtT(anyDT(r), s...))
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
			dt := anyDT(r)
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
		vtCase{ir.Concatenate, "concatenate", func(r *rand.Rand) vtInst {
			s := vtShapeOfRank(r, 1, 3, true)
			axis := r.IntN(len(s))
			dt := anyDT(r)
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
			dt := anyDT(r)
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
				ops: []vtOperand{{typ: vtT(anyDT(r), s...)}, {typ: vtT(vtPick(r, ir.Int32, ir.Int64, ir.Uint32), is...), gen: otInts(0, n)}},
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
			dt, s := anyDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt, from, "→", to), ops: vtOps(vtT(dt, s...).WithSpace(from)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.DevicePut(a[0], to)) }}
		}},
		vtCase{ir.CheckpointName, "checkpoint_name", func(r *rand.Rand) vtInst {
			dt, s := anyDT(r), vtPick(r, vtShapes...)
			return vtInst{desc: fmt.Sprint(dt), ops: vtOps(vtT(dt, s...)),
				fn: func(a []*trace.Array) []*trace.Array { return vtOne(trace.CheckpointName(a[0], "x")) }}
		}},
		vtCase{ir.OptimizationBarrier, "optimization_barrier", func(r *rand.Rand) vtInst {
			ops := vtOps(vtT(anyDT(r), vtPick(r, vtShapes...)...), vtT(anyDT(r), vtPick(r, vtShapes...)...))
			return vtInst{desc: fmt.Sprint(ops[0].typ, ops[1].typ), ops: ops,
				fn: func(a []*trace.Array) []*trace.Array { return trace.Apply(ir.OptimizationBarrier, nil, nil, a...) }}
		}},
		vtCase{ir.Scan, "scan", vtScanCase},
		vtCase{ir.While, "while", func(r *rand.Rand) vtInst {
			// The number of iterations differs per example when n is mapped.
			dt, s := vtPick(r, vtFloats...), vtPick(r, vtShapes...)
			ops := []vtOperand{{typ: vtT(ir.Int32), gen: otInts(0, 3)}, {typ: vtT(dt, s...), gen: otInts(-4, 4)}, {typ: vtT(dt, s...), gen: otInts(-2, 2)}}
			return vtInst{desc: fmt.Sprint(dt, s), ops: ops, fn: func(a []*trace.Array) []*trace.Array {
				n, x0, w := a[0], a[1], a[2]
				out := trace.While(func(st []*trace.Array) *trace.Array { return trace.Less(st[0], n) },
					func(st []*trace.Array) []*trace.Array {
						return []*trace.Array{trace.Add(st[0], trace.ScalarOf(1, ir.Int32)), trace.Add(trace.Mul(st[1], trace.ScalarOf(0.5, dt)), w)}
					}, trace.ScalarOf(0, ir.Int32), x0)
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
	)
	return cs
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
		if !covered[code] {
			t.Errorf("op %v has no case in vtCases", code)
		}
	}
	const trials = 10
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
