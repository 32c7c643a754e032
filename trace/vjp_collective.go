package trace

import (
	"maps"

	"github.com/ferryml/ferry/ir"
)

// VJP rules of the collectives. Each member's cotangent flows back to the
// members whose values made its result, so the transpose of a collective is
// a collective over the same axis (jax's transpose rules in lax/parallel.py):
// psum's is psum (every member's result holds every member's operand),
// all_gather's is psum_scatter and back, all_to_all's swaps its split and
// concat dimensions, ppermute's inverts its pairs. pmax and pmin send the
// summed cotangent to the members holding the extremum, split evenly among
// ties, like reduce_max. Under a Vmap these become, through the batching
// rules, the batch-wise ops whose VJPs they are.

func vjpCollective(c *vjpCall) []*Array {
	a := maps.Clone(c.op.Attrs)
	emit := func(code ir.Code, attrs ir.Attrs, x *Array) *Array { return Apply1(code, attrs, x) }
	switch c.op.Code {
	case ir.AllReduce:
		sum := maps.Clone(a)
		sum["reduction"] = "sum"
		ct := emit(ir.AllReduce, sum, c.ct)
		if a.String("reduction") == "sum" {
			return []*Array{ct}
		}
		x := c.args[0]
		mask := adConvert(adBin(ir.Eq, x, c.outs[0]), x.DType())
		cnt := emit(ir.AllReduce, sum, mask)
		return []*Array{adMul(ct, adDiv(mask, cnt))}
	case ir.AllGather:
		return []*Array{emit(ir.ReduceScatter, a, c.ct)}
	case ir.ReduceScatter:
		return []*Array{emit(ir.AllGather, a, c.ct)}
	case ir.AllToAll:
		a["split_dimension"], a["concat_dimension"] = a["concat_dimension"], a["split_dimension"]
		return []*Array{emit(ir.AllToAll, a, c.ct)}
	case ir.CollectivePermute:
		a["pairs"] = invertPairs(a.Ints("pairs"))
		return []*Array{emit(ir.CollectivePermute, a, c.ct)}
	}
	return make([]*Array, len(c.args))
}

func init() {
	for _, code := range ir.AllCodes() {
		if code.IsCollective() && code.Info().Differentiable {
			vjpRules[code] = vjpCollective
		}
	}
}
