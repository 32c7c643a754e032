package trace

import (
	"maps"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Batching rules of the collectives. Over the Vmap's own axis (c.name) the
// members are the examples, so a rule computes the collective over the batch
// dimension with ordinary ops (jax's batching rules in lax/parallel.py do the
// same); these rules run even when no operand is batched (see vmapRegion),
// since a collective over the own axis can make an unbatched value batched
// (axis_index, ppermute) or scale it (psum). Over another axis (an enclosing
// Vmap's, later a ShardMap's) the op is kept with the batch dimension passed
// through, as one more dimension of the member's value.

func batchCollective(c *batchCall) ([]*Array, []int) {
	if c.op.Attrs.String("axis") == c.name && c.name != "" {
		out, d := batchOwnCollective(c)
		return []*Array{out}, []int{d}
	}
	return batchOtherCollective(c)
}

// batchOwnCollective computes the collective over the batch dimension.
func batchOwnCollective(c *batchCall) (*Array, int) {
	a, n := c.op.Attrs, c.size
	if c.op.Code == ir.AxisIndex {
		return Apply1(ir.Iota, ir.Attrs{"dtype": ir.Int32, "shape": []int{n}, "dim": 0}), 0
	}
	x, d := c.args[0], c.dims[0]
	switch c.op.Code {
	case ir.AllReduce:
		if d < 0 {
			if a.String("reduction") == "sum" {
				return adMul(x, adFullLike(x, float64(n))), -1
			}
			return x, -1
		}
		code := map[string]ir.Code{"sum": ir.ReduceSum, "max": ir.ReduceMax, "min": ir.ReduceMin}[a.String("reduction")]
		return Apply1(code, ir.Attrs{"axes": []int{d}}, x), -1

	case ir.AllGather:
		// The batch, moved to the gathered position, is every example's
		// result.
		g := a.Int("dimension")
		y := batchMove(c.front(0), 0, g)
		if a.Bool("tiled") {
			s := slices.Clone(y.typ.Shape)
			s = slices.Replace(s, g, g+2, s[g]*s[g+1])
			y = adReshape(y, s)
		}
		return y, -1

	case ir.ReduceScatter:
		// Example i's result is block i of the sum: the sum with its
		// scattered dimension (split into blocks) as the batch dimension.
		g := a.Int("dimension")
		var s *Array
		if d < 0 {
			s = adMul(x, adFullLike(x, float64(n)))
		} else {
			s = adReduceSum(x, []int{d})
		}
		if a.Bool("tiled") {
			sh := slices.Clone(s.typ.Shape)
			sh = slices.Replace(sh, g, g+1, n, sh[g]/n)
			s = adReshape(s, sh)
		}
		return s, g

	case ir.AllToAll:
		return batchAllToAll(c.front(0), a.Int("split_dimension"), a.Int("concat_dimension"), n), 0

	case ir.CollectivePermute:
		// Example t takes example s's value for each pair (s, t): a gather
		// along the batch, zeros where no pair targets t.
		p := a.Ints("pairs")
		src := ir.NewLiteral(ir.TypeOf(ir.Int32, n))
		idx := ir.View[int32](src)
		for i := range idx {
			idx[i] = -1
		}
		for i := 0; i < len(p); i += 2 {
			idx[p[i+1]] = int32(p[i])
		}
		xs := c.front(0)
		iv := Apply1(ir.Constant, ir.Attrs{"value": src})
		y := Apply1(ir.Gather, ir.Attrs{"axis": 0}, xs, iv)
		if len(p)/2 < n {
			hit := adBin(ir.Ge, iv, adFull(ir.Int32, ir.Shape{n}, 0))
			hit = adBroadcast(hit, xs.typ.Shape, []int{0})
			y = adSelect(hit, y, adFullLike(y, 0))
		}
		return y, 0
	}
	panic(Errorf(c.op.Code.String(), "vmap: internal error: no rule for collective %v", c.op.Code))
}

// batchAllToAll is all_to_all over the batch of x (batched at axis 0):
// example i's result concatenates, along concat in example order, block i
// (along split) of every example's value.
func batchAllToAll(x *Array, split, concat, n int) *Array {
	p := x.typ.Shape[1:] // per-example shape
	r := len(p)
	// Cut split into (block index i, block) and label the axes: 0 is the
	// example j the block comes from, s+1 the block index i.
	cut := slices.Concat(ir.Shape{n}, p[:split], ir.Shape{n, p[split] / n}, p[split+1:])
	y := adReshape(x, cut)
	pos := func(k int) int {
		switch {
		case k < split:
			return k + 1
		case k == split:
			return split + 2
		}
		return k + 2
	}
	perm := []int{split + 1}
	for k := 0; k < r; k++ {
		if k == concat {
			perm = append(perm, 0) // the source example, before the blocks it concatenates
		}
		perm = append(perm, pos(k))
	}
	y = adTranspose(y, perm)
	q := slices.Clone(p)
	q[split] /= n
	q[concat] *= n
	return adReshape(y, slices.Concat(ir.Shape{n}, q))
}

// batchOtherCollective keeps a collective over another axis, the batch
// dimension being one more dimension of the member's value.
func batchOtherCollective(c *batchCall) ([]*Array, []int) {
	attrs := maps.Clone(c.op.Attrs)
	switch c.op.Code {
	case ir.AxisIndex:
		return adReplay(c.op, c.args), []int{-1}
	case ir.AllReduce, ir.CollectivePermute:
		return c.apply(attrs, c.args[0]), []int{c.dims[0]}
	case ir.AllGather, ir.ReduceScatter:
		attrs["dimension"] = attrs.Int("dimension") + 1
	case ir.AllToAll:
		attrs["split_dimension"] = attrs.Int("split_dimension") + 1
		attrs["concat_dimension"] = attrs.Int("concat_dimension") + 1
	}
	return c.apply(attrs, c.front(0)), []int{0}
}

func init() {
	for _, code := range ir.AllCodes() {
		if code.IsCollective() {
			batchRules[code] = batchCollective
		}
	}
}
