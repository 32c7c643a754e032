package trace

import (
	"github.com/ferryml/ferry/ir"
)

// VJP rules of the reductions, dot_general and device_put.

// adUnreduce broadcasts a reduction's result (or its cotangent) back to the
// operand's shape.
func adUnreduce(y *Array, x *Array, axes []int) *Array {
	return adBroadcast(y, x.typ.Shape, adKeptDims(x.Rank(), axes))
}

func vjpReduceSum(c *vjpCall) []*Array {
	return []*Array{adUnreduce(c.ct, c.args[0], c.op.Attrs.Ints("axes"))}
}

// vjpReduceMaxMin gives the cotangent to the elements equal to the result,
// split evenly among ties (as JAX).
func vjpReduceMaxMin(c *vjpCall) []*Array {
	x, axes := c.args[0], c.op.Attrs.Ints("axes")
	yb := adUnreduce(c.outs[0], x, axes)
	mask := adConvert(adBin(ir.Eq, x, yb), x.DType())
	cnt := adUnreduce(adReduceSum(mask, axes), x, axes)
	return []*Array{adMul(adUnreduce(c.ct, x, axes), adDiv(mask, cnt))}
}

// vjpReduceProd differentiates the product written as a tree of pairwise
// multiplications (JAX's approach): exact where inputs are zero, at every order
// (each element's cotangent is ct times the product of the other elements of its
// group, however many zeros there are), with O(n) work.
func vjpReduceProd(c *vjpCall) []*Array {
	axes := c.op.Attrs.Ints("axes")
	_, pb := VJP(func(a []*Array) []*Array { return []*Array{adProdTree(a[0], axes)} }, []*Array{c.args[0]})
	return pb([]*Array{c.ct})
}

// adProdTree computes reduce_prod(x, axes) with binary multiplications: the
// reduced axes are moved to the front and flattened, then the two halves are
// multiplied until one row is left (an odd row count is padded with a one).
func adProdTree(x *Array, axes []int) *Array {
	kept := adKeptDims(x.Rank(), axes)
	perm := append(append([]int{}, axes...), kept...)
	y := adTranspose(x, perm)
	n := 1
	for _, a := range axes {
		n *= x.typ.Shape[a]
	}
	rest := ir.Shape{}
	for _, k := range kept {
		rest = append(rest, x.typ.Shape[k])
	}
	if n == 0 {
		return adFull(x.DType(), rest, 1)
	}
	y = adReshape(y, append(ir.Shape{n}, rest...))
	r := y.Rank()
	for n > 1 {
		if n%2 == 1 {
			hi := make([]int, r)
			hi[0] = 1
			y = Apply1(ir.Pad, ir.Attrs{"low": make([]int, r), "high": hi, "interior": make([]int, r)}, y, adScalar(1, y.DType()))
			n++
		}
		start, mid, limit, strides := make([]int, r), make([]int, r), []int(y.typ.Shape.Clone()), make([]int, r)
		for i := range strides {
			strides[i] = 1
		}
		copy(mid, limit)
		mid[0] = n / 2
		start2 := make([]int, r)
		start2[0] = n / 2
		y = adMul(adSlice(y, start, mid, strides), adSlice(y, start2, limit, strides))
		n /= 2
	}
	return adReshape(y, rest)
}

// vjpDotGeneral transposes dot_general: each operand's cotangent is a
// dot_general of the result's cotangent with the other operand, contracting the
// other operand's free dimensions and batching the batch dimensions, followed
// by a transpose back to the operand's dimension order.
func vjpDotGeneral(c *vjpCall) []*Array {
	a := c.op.Attrs
	lb, rb, lc, rc := a.Ints("lhs_batch"), a.Ints("rhs_batch"), a.Ints("lhs_contract"), a.Ints("rhs_contract")
	L, R, G := c.args[0], c.args[1], c.ct
	lf := adKeptDims(L.Rank(), append(append([]int{}, lb...), lc...))
	rf := adKeptDims(R.Rank(), append(append([]int{}, rb...), rc...))
	nb := len(lb)
	gBatch := make([]int, nb)
	for i := range gBatch {
		gBatch[i] = i
	}
	gL := make([]int, len(lf)) // positions of lhs free dims in G
	for i := range gL {
		gL[i] = nb + i
	}
	gR := make([]int, len(rf)) // positions of rhs free dims in G
	for i := range gR {
		gR[i] = nb + len(lf) + i
	}
	out := []*Array{nil, nil}
	if c.act[0] {
		// G · R over R's free dims → [batch, lf, R's remaining (contracting) dims].
		d := adDot(G, R, gBatch, rb, gR, rf)
		src := append(append(append([]int{}, lb...), lf...), adPartner(R.Rank(), rb, rf, rc, lc)...)
		out[0] = adTranspose(d, adInversePerm(src))
	}
	if c.act[1] {
		// L · G over L's free dims → [batch, L's remaining (contracting) dims, rf]
		// (already R's layout for a plain matrix product).
		d := adDot(L, G, lb, gBatch, lf, gL)
		src := append(append(append([]int{}, rb...), adPartner(L.Rank(), lb, lf, lc, rc)...), rf...)
		out[1] = adTranspose(d, adInversePerm(src))
	}
	if c.ct.DType() != L.DType() {
		for i, o := range out {
			if o != nil {
				out[i] = adConvert(o, c.args[i].DType())
			}
		}
	}
	return out
}

// adPartner lists, for the dims of an operand of the given rank that are neither
// batch nor free (its contracting dims, in increasing order), the matching
// contracting dim of the other operand.
func adPartner(rank int, batch, free, contract, otherContract []int) []int {
	skip := map[int]bool{}
	for _, d := range batch {
		skip[d] = true
	}
	for _, d := range free {
		skip[d] = true
	}
	var out []int
	for d := 0; d < rank; d++ {
		if skip[d] {
			continue
		}
		for j, cd := range contract {
			if cd == d {
				out = append(out, otherContract[j])
			}
		}
	}
	return out
}

func adDot(l, r *Array, lb, rb, lc, rc []int) *Array {
	return Apply1(ir.DotGeneral, ir.Attrs{
		"lhs_batch": append([]int{}, lb...), "rhs_batch": append([]int{}, rb...),
		"lhs_contract": append([]int{}, lc...), "rhs_contract": append([]int{}, rc...),
	}, l, r)
}

// vjpDevicePut: the cotangent of a device_put stays on (or moves to) device.
// Cotangents always live in device memory: the gradient of a parameter kept in
// pinned_host is a device array (as XLA's memory analysis of host-offloaded
// training counts it), and an offloaded activation's cotangent is computed
// where the backward pass runs. Moving a gradient to host is the user's
// DevicePut (or an out-sharding of the jitted step).
func vjpDevicePut(c *vjpCall) []*Array {
	if c.ct.Space() == ir.Device {
		return []*Array{c.ct}
	}
	return []*Array{Apply1(ir.DevicePut, ir.Attrs{"space": ir.Device}, c.ct)}
}

// adCtType is the type of a cotangent of a value of type t: t's dtype and
// shape, in device memory.
func adCtType(t ir.Type) ir.Type { return t.WithSpace(ir.Device) }
