package trace

import (
	"math"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Batching rules of the indexing ops: gather, scatter_add, dynamic_slice and
// dynamic_update_slice.
//
// When the indices (or starts) differ between examples, the batch and the
// indexed axis of the operand are flattened into one axis of size B*N and
// every example's indices are offset by b*N (b its position in the batch),
// so that one gather or scatter serves the whole batch. The per-example
// semantics are kept exactly: gather indices are clamped into [0, N) before
// the offset, and scatter indices outside [0, N) are sent below 0, where the
// scatter drops them, never into another example's rows. Dynamic slices with
// batched starts become gathers of the clamped windows, and dynamic updates
// with batched starts a select between the operand and the update spread
// over the operand's shape by gathers.

// batchIndexDType returns the integer dtype in which index arithmetic on
// indices of dtype dt is exact for values up to limit (in magnitude): i32
// when both fit, else i64.
func batchIndexDType(dt ir.DType, limit int) ir.DType {
	if (dt == ir.Int32 || dt == ir.Uint8) && limit < math.MaxInt32 {
		return ir.Int32
	}
	return ir.Int64
}

// batchIota returns an iota of dtype dt and the given shape along dim.
func batchIota(dt ir.DType, shape ir.Shape, dim int) *Array {
	return Apply1(ir.Iota, ir.Attrs{"dtype": dt, "shape": []int(shape.Clone()), "dim": dim})
}

// batchClamp returns the integer array x clamped into [lo, hi] (hi >= lo),
// as max(lo, min(x, hi)).
func batchClamp(x *Array, lo, hi int) *Array {
	dt, s := x.DType(), x.typ.Shape
	return adBin(ir.Max, adBin(ir.Min, x, adFull(dt, s, float64(hi))), adFull(dt, s, float64(lo)))
}

// batchOffsets returns b*n for every element of an array of the given shape
// whose axis 0 is the batch (b the position along it), in dtype dt.
func batchOffsets(dt ir.DType, shape ir.Shape, n int) *Array {
	return adMul(batchIota(dt, shape, 0), adFull(dt, shape, float64(n)))
}

// batchFlatten returns x (batched at axis 0) with per-example axis `axis`
// moved next to the batch and merged with it: [B*N, rest...], rest being the
// other per-example axes in order. It also returns N and the shape before
// merging ([B, N, rest...]).
func batchFlatten(x *Array, axis, size int) (*Array, int, ir.Shape) {
	x = batchMove(x, axis+1, 1)
	shape := x.typ.Shape.Clone()
	return adReshape(x, append(ir.Shape{size * shape[1]}, shape[2:]...)), shape[1], shape
}

// batchIndexFirst returns the permutation that takes an array laid out as
// [B, pre (p axes), I (k axes), post...] to [B, I, pre, post] (front true), or
// back (front false).
func batchIndexFirst(rank, p, k int, front bool) []int {
	perm := []int{0}
	if front {
		for j := 0; j < k; j++ {
			perm = append(perm, 1+p+j)
		}
		for j := 0; j < p; j++ {
			perm = append(perm, 1+j)
		}
	} else {
		for j := 0; j < p; j++ {
			perm = append(perm, 1+k+j)
		}
		for j := 0; j < k; j++ {
			perm = append(perm, 1+j)
		}
	}
	for j := 1 + p + k; j < rank; j++ {
		perm = append(perm, j)
	}
	return perm
}

// batchGather gathers along per-example axis `axis` of x (batched at xd, -1
// if not) at idx (batched at id, -1 if not), and returns the result with its
// batch dimension. With clamp false the caller guarantees every index is in
// range already.
func batchGather(x *Array, xd int, idx *Array, id, axis, size int, clamp bool) (*Array, int) {
	gather := func(x, idx *Array, axis int) *Array {
		return Apply1(ir.Gather, ir.Attrs{"axis": axis}, x, idx)
	}
	switch {
	case xd < 0 && id < 0:
		return gather(x, idx, axis), -1
	case xd < 0:
		// The result's index axes start at axis.
		return gather(x, idx, axis), axis + id
	case id < 0:
		out := gather(x, idx, batchAxis(axis, xd))
		if xd <= axis {
			return out, xd
		}
		return out, xd - 1 + idx.Rank()
	}
	// Both batched: gather rows b*N + clamp(idx) of the flattened operand.
	xf, n, _ := batchFlatten(batchMove(x, xd, 0), axis, size)
	idx = batchMove(idx, id, 0)
	w := batchIndexDType(idx.DType(), size*n)
	idx = adConvert(idx, w)
	if clamp {
		idx = batchClamp(idx, 0, max(n-1, 0))
	}
	idx = adAdd(idx, batchOffsets(w, idx.typ.Shape, n))
	out := gather(xf, idx, 0) // [B, I, pre, post]
	return adTranspose(out, batchIndexFirst(out.Rank(), axis, idx.Rank()-1, false)), 0
}

func batchGatherRule(c *batchCall) ([]*Array, []int) {
	out, d := batchGather(c.args[0], c.dims[0], c.args[1], c.dims[1], c.op.Attrs.Int("axis"), c.size, true)
	return []*Array{out}, []int{d}
}

// batchScatterAdd: with the same indices for every example, the scatter
// runs on the operand batched (broadcast if it is not) with the updates
// batched where the operand's batch axis lands in them. With batched
// indices, the operand is flattened as for gather and indices outside
// [0, N) are sent below 0, so that they stay dropped.
func batchScatterAdd(c *batchCall) ([]*Array, []int) {
	axis := c.op.Attrs.Int("axis")
	x, idx := c.args[0], c.args[1]
	dx, di, du := c.dims[0], c.dims[1], c.dims[2]
	scatter := func(x, idx, u *Array, axis int) *Array {
		return Apply1(ir.ScatterAdd, ir.Attrs{"axis": axis}, x, idx, u)
	}
	if di < 0 {
		if dx < 0 {
			x, dx = batchMaterialize(x, -1, c.size), 0
		}
		pos := dx
		if dx > axis {
			pos = dx - 1 + idx.Rank()
		}
		u := batchMove(batchMaterialize(c.args[2], du, c.size), max(du, 0), pos)
		return []*Array{scatter(x, idx, u, batchAxis(axis, dx))}, []int{dx}
	}
	xf, n, shape := batchFlatten(c.front(0), axis, c.size)
	idx = batchMove(idx, di, 0)
	w := batchIndexDType(idx.DType(), c.size*n+1)
	idx = adConvert(idx, w)
	s := idx.typ.Shape
	in := adBin(ir.And, adBin(ir.Ge, idx, adFull(w, s, 0)), adBin(ir.Lt, idx, adFull(w, s, float64(n))))
	// Out of range: -B*N-1 + b*N is below 0 for every b < B.
	idx = adSelect(in, idx, adFull(w, s, float64(-c.size*n-1)))
	idx = adAdd(idx, batchOffsets(w, s, n))
	u := c.front(2) // [B, pre, I, post]
	u = adTranspose(u, batchIndexFirst(u.Rank(), axis, idx.Rank()-1, true))
	out := adReshape(scatter(xf, idx, u, 0), shape) // [B, N, rest]
	return []*Array{batchMove(out, 1, axis+1)}, []int{0}
}

// batchShape returns the per-example shape of x batched at d.
func batchShape(x *Array, d int) ir.Shape {
	s := x.typ.Shape.Clone()
	if d >= 0 {
		s = slices.Delete(s, d, d+1)
	}
	return s
}

// batchStart returns a batched start index (a [B] array) converted to an
// index dtype and clamped into [0, hi].
func batchStart(s *Array, hi int) *Array {
	s = adConvert(s, batchIndexDType(s.DType(), hi+1))
	return batchClamp(s, 0, hi)
}

// batchDynamicSlice slices the dims whose start is the same for every
// example with one dynamic_slice (the batch axis whole), and then, per dim
// with batched starts, gathers the window clamp(start, 0, N-size) + iota.
func batchDynamicSlice(c *batchCall) ([]*Array, []int) {
	x, dx := c.args[0], c.dims[0]
	sizes := c.op.Attrs.Ints("sizes")
	starts, sdims := c.args[1:], c.dims[1:]
	shape := batchShape(x, dx)
	static := false // some dim with an unbatched start is cut
	for i := range starts {
		static = static || (sdims[i] < 0 && sizes[i] < shape[i])
	}
	y, dy := x, dx
	if static {
		zero := adScalar(0, ir.Int32)
		st, sz := make([]*Array, len(starts)), slices.Clone(sizes)
		for i, s := range starts {
			st[i] = s
			if sdims[i] >= 0 {
				st[i], sz[i] = zero, shape[i]
			}
		}
		if dx >= 0 {
			st, sz = slices.Insert(st, dx, zero), slices.Insert(sz, dx, c.size)
		}
		y = Apply1(ir.DynamicSlice, ir.Attrs{"sizes": sz}, append([]*Array{y}, st...)...)
	}
	for i, s := range starts {
		if sdims[i] < 0 || sizes[i] == shape[i] {
			continue
		}
		s = batchStart(s, shape[i]-sizes[i])
		ws := ir.Shape{c.size, sizes[i]}
		idx := adAdd(adBroadcast(s, ws, []int{0}), batchIota(s.DType(), ws, 1))
		y, dy = batchGather(y, dy, idx, 0, i, c.size, false)
	}
	return []*Array{y}, []int{dy}
}

// batchDynamicUpdateSlice: with the same starts for every example, one
// dynamic_update_slice on operand and update batched at the same axis (zero
// start there). With batched starts, the update is spread over the
// operand's shape by gathers at clamp(p - start, 0, U-1) along each dim, and
// selected where p - start lies in [0, U) on every dim.
func batchDynamicUpdateSlice(c *batchCall) ([]*Array, []int) {
	x, u := c.args[0], c.args[1]
	dx, du := c.dims[0], c.dims[1]
	starts, sdims := c.args[2:], c.dims[2:]
	shape, ushape := batchShape(x, dx), batchShape(u, du)
	if ushape.Size() == 0 {
		// An empty update leaves the operand as it is.
		return []*Array{x}, []int{dx}
	}
	if !slices.ContainsFunc(sdims, func(d int) bool { return d >= 0 }) {
		d := dx
		switch {
		case du < 0:
			u = batchMove(batchMaterialize(u, -1, c.size), 0, d)
		case dx != du:
			x, u, d = c.front(0), c.front(1), 0
		}
		st := slices.Insert(slices.Clone(starts), d, adScalar(0, ir.Int32))
		return []*Array{Apply1(ir.DynamicUpdateSlice, nil, append([]*Array{x, u}, st...)...)}, []int{d}
	}
	var mask *Array
	full := append(ir.Shape{c.size}, shape...)
	for i, s := range starts {
		if ushape[i] == shape[i] {
			continue // the start clamps to 0 and the update covers the dim
		}
		s = batchStart(s, shape[i]-ushape[i])
		w := s.DType()
		ps := ir.Shape{shape[i]}
		var pos *Array
		sd := -1
		if sdims[i] >= 0 {
			ps, sd = ir.Shape{c.size, shape[i]}, 0
			pos = adSub(batchIota(w, ps, 1), adBroadcast(s, ps, []int{0}))
		} else {
			pos = adSub(batchIota(w, ps, 0), adBroadcast(s, ps, nil))
		}
		in := adBin(ir.And, adBin(ir.Ge, pos, adFull(w, ps, 0)), adBin(ir.Lt, pos, adFull(w, ps, float64(ushape[i]))))
		u, du = batchGather(u, du, batchClamp(pos, 0, ushape[i]-1), sd, i, c.size, false)
		dims := []int{1 + i}
		if sd >= 0 {
			dims = []int{0, 1 + i}
		}
		in = adBroadcast(in, full, dims)
		if mask == nil {
			mask = in
		} else {
			mask = adBin(ir.And, mask, in)
		}
	}
	if mask == nil {
		// The update covers the whole operand.
		return []*Array{u}, []int{du}
	}
	u = batchMove(batchMaterialize(u, du, c.size), max(du, 0), 0)
	return []*Array{adSelect(mask, u, c.front(0))}, []int{0}
}

func init() {
	batchRules[ir.Gather] = batchGatherRule
	batchRules[ir.ScatterAdd] = batchScatterAdd
	batchRules[ir.DynamicSlice] = batchDynamicSlice
	batchRules[ir.DynamicUpdateSlice] = batchDynamicUpdateSlice
}
