package budget

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// The residuals of the top level: values the function computes outside
// its scans (a Transformer's embeddings and their norm before the layers,
// an input projection, a head) and reads again after a scan (the backward
// pass of a gradient, after the backward scan). The trace does not plan
// them when the function differentiated at the top level has scans of its
// own (a checkpoint around it would recompute the whole forward scan), so
// the planner rewrites the traced top level itself: a value kept is left
// alone; an offloaded one is copied to pinned_host after its last read
// before the scan and back before its first read after it; a recomputed
// one is computed again, before its first read after the scan, from the
// function's parameters by the ops between them (its segment: no scan, no
// copy between spaces, no collective), behind an optimization barrier so
// that CSE does not merge the copy with the original.
//
// User annotations win: nothing is planned when the top level holds a
// user's checkpoint (optimization barriers there), whose policy decides.
// (A name given with CheckpointName outside any checkpoint has no policy
// to follow.)

// planTopLevel turns the planning of the top level on (tests turn it off
// to compare).
var planTopLevel = true

// minTopFraction: a top-level residual under 1/minTopFraction of the
// largest one is kept.
const minTopFraction = 64

// maxSegment bounds the ops of a recomputed top-level segment.
const maxSegment = 12

// topCand is a residual of the top level of a traced function.
type topCand struct {
	v     *ir.Value
	last  int // the index of the last op reading v before the scan (its own op when none)
	next  int // the index of the first op reading v after the scan
	seg   []*ir.Op
	param []*ir.Value // the parameters seg reads
	dot   float64     // the FLOPs of seg: matrix products
	elem  float64     // and the rest (at least one per element written)
}

// topCands returns the residuals of f's top level, in op order.
func topCands(f *ir.Func) []*topCand {
	body := f.Body
	results := map[*ir.Value]bool{}
	for _, r := range body.Results {
		results[r] = true
	}
	uses := map[*ir.Value][]int{}
	for i, op := range body.Ops {
		if op.Code == ir.OptimizationBarrier {
			return nil // a user's checkpoint: its policy decides
		}
		for _, a := range op.Args {
			if n := len(uses[a]); n == 0 || uses[a][n-1] != i {
				uses[a] = append(uses[a], i)
			}
		}
	}
	// loops[i] counts the region ops among the first i ops.
	loops := make([]int, len(body.Ops)+1)
	for i, op := range body.Ops {
		loops[i+1] = loops[i]
		if len(op.Regions) > 0 {
			loops[i+1]++
		}
	}
	var out []*topCand
	largest := int64(0)
	for d, op := range body.Ops {
		if len(op.Regions) > 0 || op.Code == ir.DevicePut || op.Code == ir.CheckpointName || op.Code.IsCollective() {
			continue
		}
		for _, v := range op.Results {
			if v.Type.Space != ir.Device || results[v] || v.Type.Bytes() == 0 {
				continue
			}
			// The widest gap between reads with a scan (or other loop)
			// in it.
			prev, best := d, 0
			c := &topCand{v: v}
			for _, u := range uses[v] {
				if n := loops[u] - loops[prev+1]; n > 0 && u-prev > best {
					best, c.last, c.next = u-prev, prev, u
				}
				prev = u
			}
			if best == 0 {
				continue
			}
			c.segment(body, d)
			out = append(out, c)
			largest = max(largest, v.Type.Bytes())
		}
	}
	// Values far smaller than the largest (indices, row statistics) are
	// not worth a copy or a decision.
	return slices.DeleteFunc(out, func(c *topCand) bool { return c.v.Type.Bytes()*minTopFraction < largest })
}

// segment finds the ops that compute c.v (defined by op d of body) from
// the function's parameters, when they are few and may run again.
func (c *topCand) segment(body *ir.Region, d int) {
	index := map[*ir.Op]int{}
	for i, op := range body.Ops {
		index[op] = i
	}
	in := map[*ir.Op]bool{}
	params := map[*ir.Value]bool{}
	var visit func(v *ir.Value) bool
	visit = func(v *ir.Value) bool {
		op := v.Op
		if op == nil {
			params[v] = true
			return true
		}
		if in[op] {
			return true
		}
		if len(op.Regions) > 0 || op.Code == ir.DevicePut || op.Code.IsCollective() || len(in) == maxSegment {
			return false
		}
		if _, ok := index[op]; !ok {
			return false
		}
		in[op] = true
		for _, a := range op.Args {
			if !visit(a) {
				return false
			}
		}
		return true
	}
	if !visit(body.Ops[d].Results[c.v.Index]) || len(params) == 0 {
		return // (with no parameter to read, CSE would merge the copy)
	}
	for _, op := range body.Ops {
		if in[op] {
			c.seg = append(c.seg, op)
			cost := passes.OpCost(op)
			elems := 0
			for _, r := range op.Results {
				elems += r.Type.Size()
			}
			c.dot += cost.DotFlops
			c.elem += max(cost.Flops-cost.DotFlops+cost.Transcendentals, float64(elems))
		}
	}
	for _, p := range body.Params {
		if params[p] {
			c.param = append(c.param, p)
		}
	}
}

// info describes c to the search as a candidate.
func (c *topCand) info() *candInfo {
	op := c.v.Op
	ci := &candInfo{op: op.Code.String(), typ: c.v.Type.String(), loc: op.Loc, bytes: c.v.Type.Bytes(), iters: 1,
		device: true, needed: true, top: true, noRecompute: c.seg == nil, segDot: c.dot, segElem: c.elem}
	cost := passes.OpCost(op)
	ci.dot, ci.elem = cost.DotFlops, max(cost.Flops-cost.DotFlops+cost.Transcendentals, float64(c.v.Type.Size()))
	if ci.reread = c.seg != nil && rereadable(op); ci.reread {
		// A view of the arguments: taken again, never offloaded.
		ci.dot, ci.elem, ci.segDot, ci.segElem = 0, 0, 0, 0
	}
	return ci
}

// planTop records the top-level residuals of the trace tr in pt, as the
// candidates of one more scope after the scan bodies', and rewrites tr's
// function as pt's decisions say.
func planTop(tr Trace, pt *planTrace) error {
	if !planTopLevel {
		return nil
	}
	f := tr.Func()
	cands := topCands(f)
	if len(cands) == 0 {
		return nil
	}
	scope := 0
	for _, k := range pt.order {
		scope = max(scope, k.scope+1)
	}
	dec := map[*topCand]trace.RematAction{}
	for i, c := range cands {
		k := candKey{scope, i}
		ci := c.info()
		if r, ok := pt.ref[k]; ok && (r.op != ci.op || r.typ != ci.typ) {
			// The top level changed with the scans' plan: decide
			// nothing there.
			dec = map[*topCand]trace.RematAction{}
			break
		}
		pt.cands[k] = ci
		pt.order = append(pt.order, k)
		if a, ok := pt.decide[k]; ok && (a == trace.Offload || a == trace.Recompute && c.seg != nil) {
			dec[c] = a
		}
	}
	return rewriteTop(f, cands, dec)
}

// rewriteTop rewrites f's top level as dec decides for its residuals cands.
func rewriteTop(f *ir.Func, cands []*topCand, dec map[*topCand]trace.RematAction) error {
	if len(dec) == 0 {
		return nil
	}
	body := f.Body
	after := map[int][]*ir.Op{}  // ops to insert after op i
	before := map[int][]*ir.Op{} // ops to insert before op i
	repl := map[int][]*topCand{} // the residuals replaced from op i on
	with := map[*topCand]*ir.Value{}
	for _, c := range cands {
		a, ok := dec[c]
		if !ok {
			continue
		}
		switch a {
		case trace.Offload:
			out, err := f.NewOp(ir.DevicePut, []*ir.Value{c.v}, ir.Attrs{"space": ir.PinnedHost})
			if err != nil {
				return err
			}
			back, err := f.NewOp(ir.DevicePut, out.Results, ir.Attrs{"space": ir.Device})
			if err != nil {
				return err
			}
			out.Loc, back.Loc = c.v.Op.Loc, c.v.Op.Loc
			after[c.last] = append(after[c.last], out)
			before[c.next] = append(before[c.next], back)
			with[c] = back.Results[0]
		case trace.Recompute:
			ops, v, err := cloneSegment(f, c)
			if err != nil {
				return err
			}
			before[c.next] = append(before[c.next], ops...)
			with[c] = v
		}
		repl[c.next] = append(repl[c.next], c)
	}
	sub := map[*ir.Value]*ir.Value{}
	apply := func(op *ir.Op) {
		for i, a := range op.Args {
			if r, ok := sub[a]; ok {
				op.Args[i] = r
			}
		}
	}
	var ops []*ir.Op
	for i, op := range body.Ops {
		for _, o := range before[i] {
			apply(o)
			ops = append(ops, o)
		}
		for _, c := range repl[i] {
			sub[c.v] = with[c]
		}
		apply(op)
		ops = append(ops, op)
		ops = append(ops, after[i]...)
	}
	body.Ops = ops
	return nil
}

// cloneSegment returns the ops that compute c.v again (its segment, reading
// its parameters through an optimization barrier) and the value they
// compute.
func cloneSegment(f *ir.Func, c *topCand) ([]*ir.Op, *ir.Value, error) {
	bar, err := f.NewOp(ir.OptimizationBarrier, c.param, nil)
	if err != nil {
		return nil, nil, err
	}
	m := map[*ir.Value]*ir.Value{}
	for i, p := range c.param {
		m[p] = bar.Results[i]
	}
	ops := []*ir.Op{bar}
	for _, op := range c.seg {
		args := make([]*ir.Value, len(op.Args))
		for i, a := range op.Args {
			if args[i] = m[a]; args[i] == nil {
				return nil, nil, fmt.Errorf("recomputing %s: operand %v of %s is not in its segment", c.v, a, op.Describe())
			}
		}
		cp, err := f.NewOp(op.Code, args, ir.CloneAttrs(op.Attrs), op.Regions...)
		if err != nil {
			return nil, nil, err
		}
		cp.Loc = op.Loc
		for i, r := range op.Results {
			m[r] = cp.Results[i]
		}
		ops = append(ops, cp)
	}
	if slices.Contains(c.param, c.v) {
		return nil, nil, fmt.Errorf("recomputing %s: a parameter", c.v)
	}
	return ops, m[c.v], nil
}
