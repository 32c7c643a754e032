package passes

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// CheckPlan checks that a program's buffer plan is valid:
//
//   - every region that needs a plan has one (the body, and every region of
//     every scan, while and cond op, recursively; fusion regions none), and
//     every parameter and op result in it has a buffer of its exact byte size
//     and memory space; no other value has one;
//   - parameters are BufParam with their own index; BufOutput and BufAlias
//     appear only at the top level, for the first result position returning
//     the value; every result position that returns an op result for the
//     first time has one;
//   - an alias names a donated parameter of the same size and space, each
//     parameter at most once, and the parameter is dead when the result is
//     written (or read element for element by the op writing it);
//   - a BufSlice is a scan body's y result, defined by an op of the body,
//     returned only at its Index (≥ num_carry), of the size and space of one
//     slice of the op's ys result;
//   - temps and nested-arena blocks lie inside the arena of their space, at
//     aligned offsets, and two of them live at the same time never share a
//     byte — except a result written in place over an operand that dies at
//     its op (same offset and size; see Options.FusionInPlace for which ops);
//   - nested arenas fit in their parent's block, and analysis figures match.
func CheckPlan(p *Program) error {
	if p == nil || p.Plan == nil || p.Func == nil {
		return fmt.Errorf("check plan: no plan")
	}
	if p.Plan.Region != p.Func.Body {
		return fmt.Errorf("check plan: the top plan is not for the function body")
	}
	if err := checkRegionPlan(p.Plan, true, p.Donated, nil, "body"); err != nil {
		return fmt.Errorf("check plan: %w", err)
	}
	if p.Analysis != (MemoryAnalysis{}) && p.Analysis != Analyze(p.Plan) {
		return fmt.Errorf("check plan: analysis %+v does not match the plan (%+v)", p.Analysis, Analyze(p.Plan))
	}
	return nil
}

// checkRegionPlan checks one region's plan; encl is the region op whose
// region it is (nil for the function body).
func checkRegionPlan(rp *RegionPlan, top bool, donated []bool, encl *ir.Op, where string) error {
	r := rp.Region
	if r == nil {
		return fmt.Errorf("%s: plan without a region", where)
	}
	// Independent liveness: definition and last use positions.
	def, last := map[*ir.Value]int{}, map[*ir.Value]int{}
	for _, v := range r.Params {
		def[v], last[v] = -1, -1
	}
	for k, op := range r.Ops {
		for _, a := range op.Args {
			if k > last[a] {
				last[a] = k
			}
		}
		for _, v := range op.Results {
			def[v], last[v] = k, k
		}
	}
	for _, v := range r.Results {
		last[v] = len(r.Ops)
	}
	if len(rp.Values) != len(def) {
		return fmt.Errorf("%s: %d buffers for %d values", where, len(rp.Values), len(def))
	}
	for v := range def {
		b, ok := rp.Values[v]
		if !ok {
			return fmt.Errorf("%s: %v has no buffer", where, v)
		}
		if b.Size != bytesOf(v) || b.Space != v.Type.Space {
			return fmt.Errorf("%s: %v %v has buffer %s, want %d B in %v", where, v, v.Type, bufString(b), bytesOf(v), v.Type.Space)
		}
	}
	for i, v := range r.Params {
		if b := rp.Values[v]; b.Kind != BufParam || b.Index != i {
			return fmt.Errorf("%s: parameter %d %v has buffer %s", where, i, v, bufString(b))
		}
	}
	// Outputs and aliases.
	first, returned := map[*ir.Value]int{}, map[*ir.Value]int{}
	for j, v := range r.Results {
		if _, ok := first[v]; !ok {
			first[v] = j
		}
		returned[v]++
	}
	aliased := map[int]bool{}
	for k, op := range r.Ops {
		for _, v := range op.Results {
			b := rp.Values[v]
			switch b.Kind {
			case BufOutput, BufAlias:
				if !top {
					return fmt.Errorf("%s: %v is an output in a nested region", where, v)
				}
				j, ok := first[v]
				if !ok || j != b.Index {
					return fmt.Errorf("%s: %v has %s, but is first returned at %d (returned: %t)", where, v, bufString(b), j, ok)
				}
				if b.Kind == BufAlias {
					i := b.Param
					if i < 0 || i >= len(r.Params) || i >= len(donated) || !donated[i] {
						return fmt.Errorf("%s: %v aliases parameter %d, which is not donated", where, v, i)
					}
					pv := r.Params[i]
					if aliased[i] {
						return fmt.Errorf("%s: parameter %d is aliased twice", where, i)
					}
					aliased[i] = true
					if bytesOf(pv) != b.Size || pv.Type.Space != b.Space {
						return fmt.Errorf("%s: %v aliases parameter %d of another size or space", where, v, i)
					}
					if last[pv] > k || last[pv] == k && !inPlace(op, pv, v, true) {
						return fmt.Errorf("%s: %v aliases parameter %d, which is read later (at op %d)", where, v, i, last[pv])
					}
				}
			case BufSlice:
				if encl == nil || encl.Code != ir.Scan {
					return fmt.Errorf("%s: %v is a ys slice outside a scan body", where, v)
				}
				j := b.Index
				if j < encl.Attrs.Int("num_carry") || j >= len(r.Results) || j >= len(encl.Results) || r.Results[j] != v || returned[v] != 1 {
					return fmt.Errorf("%s: %v has %s, but is not the only y returned there", where, v, bufString(b))
				}
				if ys := encl.Results[j].Type; ys.Space != b.Space || ys.Bytes() != b.Size*int64(encl.Attrs.Int("length")) {
					return fmt.Errorf("%s: %v has %s, which is not a slice of ys %v", where, v, bufString(b), ys)
				}
			case BufTemp:
				if top {
					if _, ok := first[v]; ok {
						return fmt.Errorf("%s: result %v is a temp", where, v)
					}
				}
			default:
				return fmt.Errorf("%s: op result %v has buffer %s", where, v, bufString(b))
			}
		}
	}
	// Arena blocks: temps and nested arenas.
	type blk struct {
		v          *ir.Value
		op         *ir.Op
		space      ir.MemorySpace
		off, size  int64
		start, end int
	}
	var blocks []blk
	for k, op := range r.Ops {
		for _, v := range op.Results {
			if b := rp.Values[v]; b.Kind == BufTemp {
				blocks = append(blocks, blk{v: v, space: b.Space, off: b.Offset, size: b.Size, start: k, end: last[v]})
			}
		}
		if op.Code == ir.Fusion || len(op.Regions) == 0 {
			if _, ok := rp.Sub[op]; ok {
				return fmt.Errorf("%s: %v op has nested plans", where, op.Code)
			}
			continue
		}
		subs, ok := rp.Sub[op]
		if !ok || len(subs) != len(op.Regions) {
			return fmt.Errorf("%s: %v op has %d nested plans for %d regions", where, op.Code, len(subs), len(op.Regions))
		}
		off := rp.SubOffset[op]
		for _, s := range ir.AllSpaces {
			var size int64
			for i, sp := range subs {
				if sp == nil || sp.Region != op.Regions[i] {
					return fmt.Errorf("%s: %v op: nested plan %d is not for its region %d", where, op.Code, i, i)
				}
				size = max(size, sp.Arena[s])
			}
			if size > 0 {
				blocks = append(blocks, blk{op: op, space: s, off: off[s], size: size, start: k, end: k})
			}
		}
		for i, sp := range subs {
			if err := checkRegionPlan(sp, false, nil, op, fmt.Sprintf("%s / %v %s region %d", where, op.Code, valueList(op.Results), i)); err != nil {
				return err
			}
		}
	}
	if len(rp.Sub) != countRegionOps(r) {
		return fmt.Errorf("%s: %d nested plan entries for %d region ops", where, len(rp.Sub), countRegionOps(r))
	}
	label := func(b blk) string {
		if b.v != nil {
			return b.v.String()
		}
		return "the nested arenas of " + opLabel(b.op)
	}
	for _, b := range blocks {
		if b.off < 0 || b.size > 0 && b.off%Alignment != 0 || b.off+b.size > rp.Arena[b.space] {
			return fmt.Errorf("%s: %s at %d+%d is misaligned or outside the %v arena of %d B", where, label(b), b.off, b.size, b.space, rp.Arena[b.space])
		}
	}
	for i := range blocks {
		for j := i + 1; j < len(blocks); j++ {
			a, b := blocks[i], blocks[j]
			if a.space != b.space || a.size == 0 || b.size == 0 || a.end < b.start || b.end < a.start ||
				a.off+a.size <= b.off || b.off+b.size <= a.off {
				continue
			}
			// In place: b's op overwrites a where a dies (or the reverse).
			over := func(x, y blk) bool {
				return x.v != nil && y.v != nil && x.off == y.off && x.size == y.size && x.end == y.start &&
					y.v.Op != nil && hasArg(y.v.Op, x.v) && inPlace(y.v.Op, x.v, y.v, true)
			}
			if over(a, b) || over(b, a) {
				continue
			}
			return fmt.Errorf("%s: %s (ops %d to %d) and %s (ops %d to %d) are live together and share bytes (%v @%d+%d and @%d+%d)",
				where, label(a), a.start, a.end, label(b), b.start, b.end, a.space, a.off, a.size, b.off, b.size)
		}
	}
	return nil
}

func hasArg(op *ir.Op, v *ir.Value) bool {
	for _, a := range op.Args {
		if a == v {
			return true
		}
	}
	return false
}

func countRegionOps(r *ir.Region) int {
	n := 0
	for _, op := range r.Ops {
		if op.Code != ir.Fusion && len(op.Regions) > 0 {
			n++
		}
	}
	return n
}
