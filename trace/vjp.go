package trace

import (
	"math"

	"github.com/ferryml/ferry/ir"
)

// This file holds the table of VJP (vector-Jacobian product) rules used by
// reverse-mode differentiation, the small IR-level helpers the rules are built
// from, and the rules of the elementwise ops. Shape ops are in vjp_shape.go,
// reductions, dot_general and device_put in vjp_reduce.go, and the region ops
// (scan, cond) in vjp_control.go.
//
// A rule receives the op, its replayed primal operands and results (arrays of
// the context the differentiation runs in: concrete in eager mode, tracers of
// the enclosing trace otherwise) and the cotangent of its result, and returns one
// cotangent per operand (nil for a zero cotangent or an operand that is not
// differentiated). Rules are built only from Apply, so their ops are recorded
// like any other: this is what makes grad of grad work.

// vjpCall is the input of a VJP rule.
type vjpCall struct {
	op   *ir.Op
	args []*Array // primal operands
	outs []*Array // primal results
	ct   *Array   // cotangent of result 0 (never nil when a rule runs, except for multi-result ops)
	cts  []*Array // cotangents of every result (nil entries are zero)
	act  []bool   // act[i]: operand i needs a cotangent
}

// vjpRule maps the cotangent of an op's result to its operands' cotangents.
type vjpRule func(c *vjpCall) []*Array

var vjpRules map[ir.Code]vjpRule

// The vmap batching rules sit beside these, in batch*.go.

// hasVJP reports whether code has a reverse-mode rule (scan and cond are handled
// by the linearizer itself).
func hasVJP(code ir.Code) bool {
	if code == ir.Scan || code == ir.Cond {
		return true
	}
	_, ok := vjpRules[code]
	return ok
}

func init() {
	vjpRules = map[ir.Code]vjpRule{
		ir.Neg:      func(c *vjpCall) []*Array { return []*Array{adNeg(c.ct)} },
		ir.Abs:      vjpAbs,
		ir.Sign:     vjpZero,
		ir.Floor:    vjpZero,
		ir.Ceil:     vjpZero,
		ir.Round:    vjpZero,
		ir.Exp:      func(c *vjpCall) []*Array { return []*Array{adMul(c.ct, c.outs[0])} },
		ir.Log:      func(c *vjpCall) []*Array { return []*Array{adDiv(c.ct, c.args[0])} },
		ir.Log1p:    func(c *vjpCall) []*Array { return []*Array{adDiv(c.ct, adAdd(c.args[0], adFullLike(c.args[0], 1)))} },
		ir.Expm1:    func(c *vjpCall) []*Array { return []*Array{adMul(c.ct, adAdd(c.outs[0], adFullLike(c.outs[0], 1)))} },
		ir.Sqrt:     func(c *vjpCall) []*Array { return []*Array{adMul(c.ct, adDiv(adFullLike(c.outs[0], 0.5), c.outs[0]))} },
		ir.Rsqrt:    vjpRsqrt,
		ir.Tanh:     vjpTanh,
		ir.Logistic: vjpLogistic,
		ir.Sin:      func(c *vjpCall) []*Array { return []*Array{adMul(c.ct, adUn(ir.Cos, c.args[0]))} },
		ir.Cos:      func(c *vjpCall) []*Array { return []*Array{adNeg(adMul(c.ct, adUn(ir.Sin, c.args[0])))} },
		ir.Erf:      vjpErf,

		ir.Add: func(c *vjpCall) []*Array { return []*Array{c.ct, c.ct} },
		ir.Sub: func(c *vjpCall) []*Array { return []*Array{c.ct, adIf(c.act[1], func() *Array { return adNeg(c.ct) })} },
		ir.Mul: vjpMul,
		ir.Div: vjpDiv,
		ir.Pow: vjpPow,
		ir.Max: vjpMaxMin,
		ir.Min: vjpMaxMin,
		ir.Rem: vjpRem,

		ir.Select:  vjpSelect,
		ir.Convert: vjpConvert,

		ir.BroadcastInDim:     vjpBroadcastInDim,
		ir.Reshape:            vjpReshape,
		ir.Transpose:          vjpTranspose,
		ir.Slice:              vjpSlice,
		ir.DynamicSlice:       vjpDynamicSlice,
		ir.DynamicUpdateSlice: vjpDynamicUpdateSlice,
		ir.Concatenate:        vjpConcatenate,
		ir.Pad:                vjpPad,
		ir.Gather:             vjpGather,
		ir.ScatterAdd:         vjpScatterAdd,
		ir.Sort:               vjpSort,

		ir.ReduceSum:  vjpReduceSum,
		ir.ReduceMax:  vjpReduceMaxMin,
		ir.ReduceMin:  vjpReduceMaxMin,
		ir.ReduceProd: vjpReduceProd,
		ir.DotGeneral: vjpDotGeneral,
		ir.DevicePut:  vjpDevicePut,

		ir.CheckpointName:      func(c *vjpCall) []*Array { return []*Array{c.ct} },
		ir.OptimizationBarrier: func(c *vjpCall) []*Array { return append([]*Array(nil), c.cts...) },
		ir.ShardingConstraint:  vjpShardingConstraint,
	}
}

func vjpZero(c *vjpCall) []*Array { return make([]*Array, len(c.args)) }

// adIf returns f() when cond holds, else nil (a zero cotangent).
func adIf(cond bool, f func() *Array) *Array {
	if !cond {
		return nil
	}
	return f()
}

// vjpAbs is select(x >= 0, ct, -ct), as jax.lax.abs: the derivative at ±0
// is 1 (sign(x) would make it 0).
func vjpAbs(c *vjpCall) []*Array {
	x := c.args[0]
	return []*Array{adSelect(adBin(ir.Ge, x, adFullLike(x, 0)), c.ct, adNeg(c.ct))}
}

func vjpRsqrt(c *vjpCall) []*Array {
	// d/dx x^-1/2 = -1/2 · y / x
	x, y := c.args[0], c.outs[0]
	return []*Array{adMul(c.ct, adMul(adFullLike(y, -0.5), adDiv(y, x)))}
}

func vjpTanh(c *vjpCall) []*Array {
	// (1 - y²) written as (1 + y)(1 - y), as JAX does.
	y := c.outs[0]
	one := adFullLike(y, 1)
	return []*Array{adMul(c.ct, adMul(adAdd(one, y), adSub(one, y)))}
}

func vjpLogistic(c *vjpCall) []*Array {
	y := c.outs[0]
	return []*Array{adMul(c.ct, adMul(y, adSub(adFullLike(y, 1), y)))}
}

func vjpErf(c *vjpCall) []*Array {
	x := c.args[0]
	d := adMul(adFullLike(x, 2/math.Sqrt(math.Pi)), adUn(ir.Exp, adNeg(adMul(x, x))))
	return []*Array{adMul(c.ct, d)}
}

func vjpMul(c *vjpCall) []*Array {
	a, b := c.args[0], c.args[1]
	return []*Array{
		adIf(c.act[0], func() *Array { return adMul(c.ct, b) }),
		adIf(c.act[1], func() *Array { return adMul(c.ct, a) }),
	}
}

func vjpDiv(c *vjpCall) []*Array {
	// d(a/b) = da/b - (a/b)·db/b.
	b, y := c.args[1], c.outs[0]
	ga := adDiv(c.ct, b)
	return []*Array{ga, adIf(c.act[1], func() *Array { return adNeg(adMul(ga, y)) })}
}

func vjpPow(c *vjpCall) []*Array {
	x, y, out := c.args[0], c.args[1], c.outs[0]
	var gx, gy *Array
	if c.act[0] {
		// y · x^(y-1), defined as 0 where y == 0 (x^0 is constant). JAX
		// does this only for integer exponents: for float ones it gives
		// 0·0^-1 = NaN at x = 0 (a documented difference in conformance).
		zero := adFullLike(y, 0)
		d := adMul(y, adBin(ir.Pow, x, adSub(y, adFullLike(y, 1))))
		gx = adMul(c.ct, adSelect(adBin(ir.Eq, y, zero), zero, d))
	}
	if c.act[1] {
		// log(x) · x^y, with log(0) replaced by 0 (as JAX).
		zero := adFullLike(x, 0)
		safe := adSelect(adBin(ir.Eq, x, zero), adFullLike(x, 1), x)
		gy = adMul(c.ct, adMul(adUn(ir.Log, safe), out))
	}
	return []*Array{gx, gy}
}

// vjpMaxMin gives the cotangent to the operand equal to the result, split in
// half between the two where they tie (JAX's balanced rule).
func vjpMaxMin(c *vjpCall) []*Array {
	x, y, z := c.args[0], c.args[1], c.outs[0]
	half, one, zero := adFullLike(z, 0.5), adFullLike(z, 1), adFullLike(z, 0)
	side := func(a, b *Array) *Array {
		w := adSelect(adBin(ir.Eq, a, z), adSelect(adBin(ir.Eq, b, z), half, one), zero)
		return adMul(c.ct, w)
	}
	return []*Array{
		adIf(c.act[0], func() *Array { return side(x, y) }),
		adIf(c.act[1], func() *Array { return side(y, x) }),
	}
}

func vjpRem(c *vjpCall) []*Array {
	// rem(x, y) = x - y·trunc(x/y): d/dy = -trunc(x/y).
	x, y := c.args[0], c.args[1]
	return []*Array{c.ct, adIf(c.act[1], func() *Array {
		q := adDiv(x, y)
		tr := adMul(adUn(ir.Sign, q), adUn(ir.Floor, adUn(ir.Abs, q)))
		return adNeg(adMul(c.ct, tr))
	})}
}

func vjpSelect(c *vjpCall) []*Array {
	p := c.args[0]
	zero := adFullLike(c.ct, 0)
	return []*Array{nil,
		adIf(c.act[1], func() *Array { return adSelect(p, c.ct, zero) }),
		adIf(c.act[2], func() *Array { return adSelect(p, zero, c.ct) }),
	}
}

func vjpConvert(c *vjpCall) []*Array {
	from := c.args[0].DType()
	if !from.IsFloat() || !c.ct.DType().IsFloat() {
		return []*Array{nil}
	}
	return []*Array{adConvert(c.ct, from)}
}

// ---- IR-level helpers (unexported, built on Apply; named ad* so as not to clash
// with the user-facing ops of the package).

func adFloat(dt ir.DType) bool { return dt.IsFloat() }

func adUn(code ir.Code, x *Array) *Array { return Apply1(code, nil, x) }

func adBin(code ir.Code, x, y *Array) *Array { return Apply1(code, nil, x, y) }

func adNeg(x *Array) *Array { return adUn(ir.Neg, x) }

func adAdd(x, y *Array) *Array { return adBin(ir.Add, x, y) }

func adSub(x, y *Array) *Array { return adBin(ir.Sub, x, y) }

func adMul(x, y *Array) *Array { return adBin(ir.Mul, x, y) }

func adDiv(x, y *Array) *Array { return adBin(ir.Div, x, y) }

func adSelect(p, a, b *Array) *Array { return Apply1(ir.Select, nil, p, a, b) }

func adConvert(x *Array, dt ir.DType) *Array {
	if x.DType() == dt {
		return x
	}
	return Apply1(ir.Convert, ir.Attrs{"dtype": dt}, x)
}

// adScalar returns a scalar constant of dtype dt.
func adScalar(v float64, dt ir.DType) *Array {
	l := ir.NewLiteral(ir.TypeOf(dt))
	l.SetFloat64At(0, v)
	return Apply1(ir.Constant, ir.Attrs{"value": l})
}

// adFull returns a device array of the given dtype and shape filled with v.
func adFull(dt ir.DType, shape ir.Shape, v float64) *Array {
	s := adScalar(v, dt)
	if len(shape) == 0 {
		return s
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape.Clone()), "dims": []int{}}, s)
}

// adFullLike returns v in x's dtype and shape (on device).
func adFullLike(x *Array, v float64) *Array { return adFull(x.DType(), x.typ.Shape, v) }

// adZeros returns zeros of exactly type t (memory space included).
func adZeros(t ir.Type) *Array {
	z := adFull(t.DType, t.Shape, 0)
	if t.Space != z.Space() {
		z = Apply1(ir.DevicePut, ir.Attrs{"space": t.Space}, z)
	}
	return z
}

// adCastLike returns x with exactly type t: x must have t's shape; its dtype is
// converted and its memory space moved when they differ.
func adCastLike(x *Array, t ir.Type) *Array {
	if !x.typ.Shape.Equal(t.Shape) {
		panic(Errorf("grad", "internal error: cotangent of shape %v for a value of type %v", x.typ.Shape, t))
	}
	x = adConvert(x, t.DType)
	if x.Space() != t.Space {
		x = Apply1(ir.DevicePut, ir.Attrs{"space": t.Space}, x)
	}
	return x
}

// adAccum adds cotangent b to a (either may be nil).
func adAccum(a, b *Array) *Array {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	if b.DType() != a.DType() {
		b = adConvert(b, a.DType())
	}
	return adAdd(a, b)
}

func adReduceSum(x *Array, axes []int) *Array {
	if len(axes) == 0 {
		return x
	}
	return Apply1(ir.ReduceSum, ir.Attrs{"axes": append([]int{}, axes...)}, x)
}

func adReshape(x *Array, shape ir.Shape) *Array {
	if x.typ.Shape.Equal(shape) {
		return x
	}
	return Apply1(ir.Reshape, ir.Attrs{"shape": []int(shape.Clone())}, x)
}

func adTranspose(x *Array, perm []int) *Array {
	id := true
	for i, p := range perm {
		if p != i {
			id = false
		}
	}
	if id {
		return x
	}
	return Apply1(ir.Transpose, ir.Attrs{"perm": append([]int{}, perm...)}, x)
}

// adBroadcast broadcasts x to shape, operand dim i going to result dim dims[i].
func adBroadcast(x *Array, shape ir.Shape, dims []int) *Array {
	if x.typ.Shape.Equal(shape) {
		return x
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape.Clone()), "dims": append([]int{}, dims...)}, x)
}

// adKeptDims returns the dimensions of a rank-n shape that are not in axes.
func adKeptDims(n int, axes []int) []int {
	drop := map[int]bool{}
	for _, a := range axes {
		drop[a] = true
	}
	var kept []int
	for i := 0; i < n; i++ {
		if !drop[i] {
			kept = append(kept, i)
		}
	}
	return kept
}

// adInversePerm returns q with q[p[i]] = i.
func adInversePerm(p []int) []int {
	q := make([]int, len(p))
	for i, x := range p {
		q[x] = i
	}
	return q
}
