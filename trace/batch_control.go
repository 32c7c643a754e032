package trace

import (
	"github.com/ferryml/ferry/ir"
)

// Batching rules of the region ops: scan, while, cond and fusion. Each
// rebuilds the op with the existing constructors (adScan, Cond, While), whose
// Go body functions interpret the op's regions batched with vmapRegion; the
// operands the regions close over are those of the op, passed to the bodies
// as closures with their batch dimensions. Whether a loop-carried value is
// batched is found before the body is traced, by a fixed point over batchDeps:
// a carry starts batched if its initial value is, and becomes batched if the
// body makes it depend on a batched value. The batchDeps* functions say which
// results each rule returns batched; batchDeps uses them for region ops
// nested in the region it looks at, so the two always agree.

// batchCheckUnbatched panics when a region result that batchDeps said does not
// depend on the batch came out batched (an inconsistency between batchDeps and
// a rule).
func batchCheckUnbatched(op ir.Code, d int) {
	if d >= 0 {
		panic(Errorf(op.String(), "vmap: internal error: a region result predicted unbatched is batched"))
	}
}

// batchFront returns x batched at axis 0 when batched is set (broadcasting it
// if it is not, d < 0), else x itself, which must not be batched.
func batchFront(code ir.Code, x *Array, d int, batched bool, size int) *Array {
	if !batched {
		batchCheckUnbatched(code, d)
		return x
	}
	return batchMove(batchMaterialize(x, d, size), max(d, 0), 0)
}

// batchFixedPoint returns which of a loop's n carried values, the body's
// parameters from lo on and its first n results, are batched: those whose
// initial value is (params says which parameters are, on entry), and those the
// body makes depend on a batched value, until nothing changes.
func batchFixedPoint(body *ir.Region, params []bool, lo, n int) []bool {
	ps := append([]bool(nil), params...)
	for {
		deps := batchDeps(body, ps)
		changed := false
		for j := 0; j < n; j++ {
			if deps[j] && !ps[lo+j] {
				ps[lo+j], changed = true, true
			}
		}
		if !changed {
			return ps[lo : lo+n]
		}
	}
}

// batchDepsScan says which results of a scan op are batched given which of
// its operands are: the carry by the fixed point, the ys by the body.
func batchDepsScan(op *ir.Op, args []bool) []bool {
	nc, nk := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
	body := op.Regions[0]
	carry := batchFixedPoint(body, args, nc, nk)
	ps := append(append(append([]bool(nil), args[:nc]...), carry...), args[nc+nk:]...)
	return append(carry, batchDeps(body, ps)[nk:]...)
}

// batchWhileState says which of a while op's state values are batched given
// which of its operands are, and whether its predicate is: then all are.
func batchWhileState(op *ir.Op, args []bool) (state []bool, pred bool) {
	nc := op.Attrs.Int("num_consts")
	condR, bodyR := op.Regions[0], op.Regions[1]
	state = batchFixedPoint(bodyR, args, nc, len(args)-nc)
	pred = batchDeps(condR, append(args[:nc:nc], state...))[0]
	if pred {
		for j := range state {
			state[j] = true
		}
	}
	return state, pred
}

// batchDepsWhile: the state, as batchWhileState says.
func batchDepsWhile(op *ir.Op, args []bool) []bool {
	state, _ := batchWhileState(op, args)
	return state
}

// batchDepsCond: every result is batched when the predicate is, else where
// either branch's is.
func batchDepsCond(op *ir.Op, args []bool) []bool {
	out := make([]bool, len(op.Results))
	for _, r := range op.Regions {
		for i, d := range batchDeps(r, args[1:]) {
			out[i] = out[i] || d || args[0]
		}
	}
	return out
}

// batchDepsFusion: the fused region's results.
func batchDepsFusion(op *ir.Op, args []bool) []bool { return batchDeps(op.Regions[0], args) }

// batchScan: consts stay where they are (closures of the new body); batched
// carries are at axis 0; a batched xs keeps its batch dimension off the
// scanned axis 0 (moved to axis 1 if it was there), so that each slice has it
// one axis lower. ys are stacked on axis 0, so a y batched at d per iteration
// comes out batched at d+1.
func batchScan(c *batchCall) ([]*Array, []int) {
	a := c.op.Attrs
	nc, nk, n, rev := a.Int("num_consts"), a.Int("num_carry"), a.Int("length"), a.Bool("reverse")
	body := c.op.Regions[0]
	consts, cdims := c.args[:nc], c.dims[:nc]
	nx := len(c.args) - nc - nk

	carryB := batchDepsScan(c.op, c.batched())[:nk]

	init := make([]*Array, nk)
	for j := range init {
		init[j] = batchFront(ir.Scan, c.args[nc+j], c.dims[nc+j], carryB[j], c.size)
	}
	xs := make([]*Array, nx)
	xdims := make([]int, nx) // the batch dimension of each slice
	for i := range xs {
		x, d := c.args[nc+nk+i], c.dims[nc+nk+i]
		switch {
		case d < 0:
			xs[i], xdims[i] = x, -1
		case d == 0:
			if x.Space() == ir.PinnedHost {
				panic(Errorf("Vmap", "a Scan's xs[%d] (%v) is mapped on axis 0, before the axis the scan steps over: pinned_host arrays are scanned over axis 0 only, one contiguous slice per step; store it with the steps first and the examples second, and map it on axis 1", i, x.Type()))
			}
			xs[i], xdims[i] = batchMove(x, 0, 1), 0
		default:
			xs[i], xdims[i] = x, d-1
		}
	}
	kdims := make([]int, nk)
	for j, b := range carryB {
		kdims[j] = -1
		if b {
			kdims[j] = 0
		}
	}

	var ydims []int
	opts := []ScanOption{ScanLength(n)}
	if rev {
		opts = append(opts, ScanReverse())
	}
	carry, ys := adScan("Scan", func(cs, xsl []*Array) ([]*Array, []*Array) {
		args := append(append(append([]*Array{}, consts...), cs...), xsl...)
		dims := append(append(append([]int{}, cdims...), kdims...), xdims...)
		outs, od := vmapRegion(body, args, dims, c.size, c.name)
		next := make([]*Array, nk)
		for j := range next {
			next[j] = batchFront(ir.Scan, outs[j], od[j], carryB[j], c.size)
		}
		ydims = od[nk:]
		return next, outs[nk:]
	}, init, xs, opts)

	outs := append(carry, ys...)
	dims := append([]int{}, kdims...)
	for _, d := range ydims {
		if d >= 0 {
			d++
		}
		dims = append(dims, d)
	}
	return outs, dims
}

// batchCond: an unbatched predicate keeps one cond whose branches are the
// batched regions, each result batched at axis 0 where either branch's may
// be. A batched predicate runs both branches and selects, per example, the
// results of the branch its predicate picks (jax's rule): every result is
// then batched at axis 0.
func batchCond(c *batchCall) ([]*Array, []int) {
	pred, pd := c.args[0], c.dims[0]
	ops, odims := c.args[1:], c.dims[1:]
	regs := c.op.Regions
	if pd >= 0 {
		var outs []*Array
		p := batchMove(pred, pd, 0) // bool[size]
		var branches [][]*Array
		for _, r := range regs {
			rs, rd := vmapRegion(r, ops, odims, c.size, c.name)
			for i := range rs {
				rs[i] = batchFront(ir.Cond, rs[i], rd[i], true, c.size)
			}
			branches = append(branches, rs)
		}
		for i := range branches[0] {
			t, f := branches[0][i], branches[1][i]
			outs = append(outs, adSelect(adBroadcast(p, t.typ.Shape, []int{0}), t, f))
		}
		return outs, dimsAll(len(outs), 0)
	}

	ob := batchDepsCond(c.op, c.batched())
	branch := func(r *ir.Region) func([]*Array) []*Array {
		return func(ps []*Array) []*Array {
			rs, rd := vmapRegion(r, ps, odims, c.size, c.name)
			for i := range rs {
				rs[i] = batchFront(ir.Cond, rs[i], rd[i], ob[i], c.size)
			}
			return rs
		}
	}
	outs := Cond(pred, branch(regs[0]), branch(regs[1]), ops...)
	dims := make([]int, len(outs))
	for i, b := range ob {
		dims[i] = -1
		if b {
			dims[i] = 0
		}
	}
	return outs, dims
}

// batchWhile: the state that is or becomes batched (a fixed point over the
// body) is at axis 0. If the predicate then does not depend on the batch, one
// while runs as before. If it does, every lane's state is batched and the
// loop runs while any lane's predicate holds; each step computes the
// predicate per lane again and keeps the old state of the lanes whose
// predicate is false, so every lane ends with the state its own loop would.
func batchWhile(c *batchCall) ([]*Array, []int) {
	nc := c.op.Attrs.Int("num_consts")
	condR, bodyR := c.op.Regions[0], c.op.Regions[1]
	consts, cdims := c.args[:nc], c.dims[:nc]
	ns := len(c.args) - nc

	sb, predB := batchWhileState(c.op, c.batched())
	sdims := make([]int, ns)
	init := make([]*Array, ns)
	for j := range init {
		sdims[j] = -1
		if sb[j] {
			sdims[j] = 0
		}
		init[j] = batchFront(ir.While, c.args[nc+j], c.dims[nc+j], sb[j], c.size)
	}
	region := func(r *ir.Region, st []*Array) ([]*Array, []int) {
		args := append(append([]*Array{}, consts...), st...)
		dims := append(append([]int{}, cdims...), sdims...)
		return vmapRegion(r, args, dims, c.size, c.name)
	}
	// lanes returns the predicate of every lane: bool[size].
	lanes := func(st []*Array) *Array {
		p, pd := region(condR, st)
		return batchFront(ir.While, p[0], pd[0], true, c.size)
	}
	var outs []*Array
	if !predB {
		outs = While(func(st []*Array) *Array {
			p, pd := region(condR, st)
			batchCheckUnbatched(ir.While, pd[0])
			return p[0]
		}, func(st []*Array) []*Array {
			rs, rd := region(bodyR, st)
			for j := range rs {
				rs[j] = batchFront(ir.While, rs[j], rd[j], sb[j], c.size)
			}
			return rs
		}, init...)
	} else {
		outs = While(func(st []*Array) *Array {
			return Any(lanes(st))
		}, func(st []*Array) []*Array {
			p := lanes(st)
			rs, rd := region(bodyR, st)
			for j := range rs {
				r := batchFront(ir.While, rs[j], rd[j], true, c.size)
				rs[j] = adSelect(adBroadcast(p, r.typ.Shape, []int{0}), r, st[j])
			}
			return rs
		}, init...)
	}
	return outs, sdims
}

// batchFusion interprets a fused group's region batched, inline: the
// compiler fuses the batched ops again.
func batchFusion(c *batchCall) ([]*Array, []int) {
	return vmapRegion(c.op.Regions[0], c.args, c.dims, c.size, c.name)
}

func init() {
	batchRules[ir.Scan] = batchScan
	batchRules[ir.Cond] = batchCond
	batchRules[ir.While] = batchWhile
	batchRules[ir.Fusion] = batchFusion
	batchRegionDeps[ir.Scan] = batchDepsScan
	batchRegionDeps[ir.Cond] = batchDepsCond
	batchRegionDeps[ir.While] = batchDepsWhile
	batchRegionDeps[ir.Fusion] = batchDepsFusion
}
