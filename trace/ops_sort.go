package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Sort returns x sorted in ascending order along axis, like jnp.sort. The sort
// is stable; floats are ordered with every NaN last and -0 equal to +0 (so
// they keep their relative order). It is differentiable: the cotangent of each
// sorted element flows back to the element it came from.
func Sort(x *Array, axis int) *Array {
	return sortMulti("Sort", []*Array{x}, axis, 1)[0]
}

// Argsort returns the int32 indices that sort x along axis (stably, in the
// order of Sort), like jnp.argsort(x, axis, stable=True).
func Argsort(x *Array, axis int) *Array {
	const op = "Argsort"
	needArrays(op, x)
	if x.Rank() == 0 {
		panic(Errorf(op, "cannot sort a scalar %v", x.typ))
	}
	a := normAxis(op, x, axis)
	if x.typ.Shape[a] > 1<<31-1 {
		panic(Errorf(op, "axis %d has %d elements, more than int32 indices reach", a, x.typ.Shape[a]))
	}
	idx := Iota(ir.Int32, x.typ.Shape, a)
	return sortMulti(op, []*Array{StopGradient(x), idx}, a, 1)[1]
}

// SortMulti sorts operands of one shape together along axis, ordered by the
// first numKeys of them lexicographically, like lax.sort(operands, dimension,
// is_stable=True, num_keys). Every operand is permuted the same way; the
// results are the sorted operands in order.
func SortMulti(operands []*Array, axis, numKeys int) []*Array {
	return sortMulti("SortMulti", operands, axis, numKeys)
}

func sortMulti(op string, operands []*Array, axis, numKeys int) []*Array {
	if len(operands) == 0 {
		panic(Errorf(op, "no operands"))
	}
	needArrays(op, operands...)
	x := operands[0]
	if x.Rank() == 0 {
		panic(Errorf(op, "cannot sort a scalar %v", x.typ))
	}
	a := normAxis(op, x, axis)
	if numKeys < 1 || numKeys > len(operands) {
		panic(Errorf(op, "numKeys %d out of range for %d operands", numKeys, len(operands)))
	}
	for i, o := range operands[1:] {
		if !o.typ.Shape.Equal(x.typ.Shape) {
			panic(Errorf(op, "operand %d is %v, operand 0 is %v: all operands need one shape", i+1, o.typ, x.typ))
		}
	}
	return Apply(ir.Sort, ir.Attrs{"dimension": a, "num_keys": numKeys}, nil, operands...)
}

// vjpSort sends each result's cotangent back to the position its element came
// from. The permutation is recomputed by sorting the keys with an iota, then
// the cotangents are scattered through it (a flat scatter-add over the lines).
func vjpSort(c *vjpCall) []*Array {
	dim, nk := c.op.Attrs.Int("dimension"), c.op.Attrs.Int("num_keys")
	x := c.args[0]
	shape := x.typ.Shape
	n := shape[dim]
	out := make([]*Array, len(c.args))
	need := false
	for i := range c.args {
		if c.act[i] && c.cts[i] != nil {
			need = true
		}
	}
	if !need || shape.Size() == 0 {
		return out
	}
	keys := slices.Clone(c.args[:nk])
	iota := Iota(ir.Int32, shape, dim)
	perm := Apply(ir.Sort, ir.Attrs{"dimension": dim, "num_keys": nk}, nil, append(keys, iota)...)[nk]

	// Move dim last and flatten to lines of n: flat = perm + n·line.
	tperm := make([]int, 0, len(shape))
	for d := range shape {
		if d != dim {
			tperm = append(tperm, d)
		}
	}
	tperm = append(tperm, dim)
	inv := make([]int, len(tperm))
	for i, p := range tperm {
		inv[p] = i
	}
	tshape := make([]int, len(tperm))
	for i, p := range tperm {
		tshape[i] = shape[p]
	}
	lines := shape.Size() / n
	flat := Apply1(ir.Reshape, ir.Attrs{"shape": []int{lines, n}}, Apply1(ir.Transpose, ir.Attrs{"perm": tperm}, perm))
	base := adMul(Iota(ir.Int32, ir.Shape{lines, n}, 0), adFull(ir.Int32, ir.Shape{lines, n}, float64(n)))
	flat = Apply1(ir.Reshape, ir.Attrs{"shape": []int{lines * n}}, adAdd(flat, base))
	for i, a := range c.args {
		ct := c.cts[i]
		if !c.act[i] || ct == nil {
			continue
		}
		g := Apply1(ir.Reshape, ir.Attrs{"shape": []int{lines * n}}, Apply1(ir.Transpose, ir.Attrs{"perm": tperm}, ct))
		z := adFull(a.DType(), ir.Shape{lines * n}, 0)
		g = Apply1(ir.ScatterAdd, ir.Attrs{"axis": 0}, z, flat, g)
		out[i] = Apply1(ir.Transpose, ir.Attrs{"perm": inv}, Apply1(ir.Reshape, ir.Attrs{"shape": tshape}, g))
	}
	return out
}
