package passes

import (
	"github.com/ferryml/ferry/ir"
)

// dce removes ops none of whose results is used (every op is pure), and
// inside region ops the parts nobody needs: a scan's unused ys outputs (and the
// body computations that only fed them), a cond's unused results, a fusion's
// unused results, and the operands (scan consts and xs, while consts, cond
// operands, fusion operands) that the nested regions no longer read. A scan's
// carry and a while's state are kept.
func dce(st *State) error {
	dceRegion(st.Func.Body)
	return nil
}

func dceRegion(r *ir.Region) {
	used := make(map[*ir.Value]bool, len(r.Ops))
	for _, v := range r.Results {
		used[v] = true
	}
	keep := make([]bool, len(r.Ops))
	n := 0
	for i := len(r.Ops) - 1; i >= 0; i-- {
		op := r.Ops[i]
		live := false
		for _, v := range op.Results {
			live = live || used[v]
		}
		if !live {
			continue
		}
		if isRegionOp(op) {
			pruneRegionOp(op, used)
		}
		keep[i] = true
		n++
		for _, a := range op.Args {
			used[a] = true
		}
	}
	out := make([]*ir.Op, 0, n)
	for i, op := range r.Ops {
		if keep[i] {
			out = append(out, op)
		}
	}
	r.Ops = out
}

// pruneRegionOp drops the unused parts of a live region op; used tells which
// of its results the enclosing region uses.
func pruneRegionOp(op *ir.Op, used map[*ir.Value]bool) {
	switch op.Code {
	case ir.Scan:
		nc, nk := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
		body := op.Regions[0]
		dropResults(op, used, nk, body)
		dceRegion(body)
		op.Attrs["num_consts"] = dropParams(op, 0, func(i int) bool { return i < nc || i >= nc+nk }, regionReads(body), body)
	case ir.While:
		nc := op.Attrs.Int("num_consts")
		cond, body := op.Regions[0], op.Regions[1]
		dceRegion(cond)
		dceRegion(body)
		keep := or(regionReads(cond), regionReads(body))
		op.Attrs["num_consts"] = dropParams(op, 0, func(i int) bool { return i < nc }, keep, cond, body)
	case ir.Cond:
		dropResults(op, used, 0, op.Regions...)
		for _, r := range op.Regions {
			dceRegion(r)
		}
		keep := make([]bool, len(op.Regions[0].Params))
		for _, r := range op.Regions {
			keep = or(keep, regionReads(r))
		}
		dropParams(op, 1, func(int) bool { return true }, keep, op.Regions...)
	case ir.Fusion:
		body := op.Regions[0]
		dropResults(op, used, 0, body)
		dceRegion(body)
		dropParams(op, 0, func(int) bool { return true }, regionReads(body), body)
	default:
		for _, r := range op.Regions {
			dceRegion(r)
		}
	}
}

// dropResults removes the results of op from index from on that used does
// not contain, together with the matching results of every region rs.
func dropResults(op *ir.Op, used map[*ir.Value]bool, from int, rs ...*ir.Region) {
	var res []*ir.Value
	kept := []int{}
	for i, v := range op.Results {
		if i < from || used[v] {
			kept = append(kept, i)
		}
	}
	if len(kept) == len(op.Results) {
		return
	}
	for _, i := range kept {
		v := op.Results[i]
		v.Index = len(res)
		res = append(res, v)
	}
	op.Results = res
	for _, r := range rs {
		var rr []*ir.Value
		for _, i := range kept {
			rr = append(rr, r.Results[i])
		}
		r.Results = rr
	}
}

// regionReads reports, per parameter of r, whether r uses it.
func regionReads(r *ir.Region) []bool {
	idx := make(map[*ir.Value]int, len(r.Params))
	for i, p := range r.Params {
		idx[p] = i
	}
	out := make([]bool, len(r.Params))
	mark := func(v *ir.Value) {
		if i, ok := idx[v]; ok {
			out[i] = true
		}
	}
	for _, op := range r.Ops {
		for _, a := range op.Args {
			mark(a)
		}
	}
	for _, v := range r.Results {
		mark(v)
	}
	return out
}

func or(a, b []bool) []bool {
	out := make([]bool, len(a))
	for i := range a {
		out[i] = a[i] || (i < len(b) && b[i])
	}
	return out
}

// dropParams removes parameter i of every region rs, and operand argOff+i of
// op, when droppable(i) and !keep[i]. It returns how many of the parameters
// that were below the original num_consts (droppable and i < that count) are
// left, which callers use to update num_consts; for others it is ignored.
func dropParams(op *ir.Op, argOff int, droppable func(int) bool, keep []bool, rs ...*ir.Region) int {
	nc := op.Attrs.Int("num_consts")
	var kept []int
	newNC := 0
	for i := range keep {
		if keep[i] || !droppable(i) {
			kept = append(kept, i)
			if i < nc {
				newNC++
			}
		}
	}
	if len(kept) == len(keep) {
		return nc
	}
	args := append([]*ir.Value{}, op.Args[:argOff]...)
	for _, i := range kept {
		args = append(args, op.Args[argOff+i])
	}
	op.Args = args
	for _, r := range rs {
		var ps []*ir.Value
		for _, i := range kept {
			p := r.Params[i]
			p.Index = len(ps)
			ps = append(ps, p)
		}
		r.Params = ps
	}
	return newNC
}
