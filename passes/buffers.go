package passes

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Alignment is the byte alignment of every temp offset in an arena.
const Alignment = 64

// assignBuffers makes the buffer plan of the body and, recursively, of every
// nested region of scan, while and cond ops:
//
//   - parameters are BufParam;
//   - at the top level, result position i gets BufOutput{Index: i} for the
//     first position that returns a value defined by an op, or BufAlias when a
//     donated parameter of the same size and memory space is dead by then
//     (see the package doc);
//   - every other value is a temp, packed with the nested arenas of region
//     ops into one arena per memory space (packArena).
func assignBuffers(st *State) error {
	if st.Liveness == nil {
		if err := liveness(st); err != nil {
			return err
		}
	}
	lv := func(r *ir.Region) *Liveness {
		if l, ok := st.Liveness[r]; ok {
			return l
		}
		return ComputeLiveness(r)
	}
	plan := planRegion(st.Func.Body, true, st.Options.Donated, st.Options.FusionInPlace, lv)
	st.Program = &Program{Func: st.Func, Plan: plan, Donated: st.Options.Donated}
	return nil
}

// planRegion plans r; top marks the function body, whose results are outputs.
func planRegion(r *ir.Region, top bool, donated []bool, fusionInPlace bool, lv func(*ir.Region) *Liveness) *RegionPlan {
	return planRegionYs(r, top, -1, donated, fusionInPlace, lv)
}

// planRegionYs is planRegion where ysFrom ≥ 0 marks a scan body whose
// results from position ysFrom on are ys (see assignSlices).
func planRegionYs(r *ir.Region, top bool, ysFrom int, donated []bool, fusionInPlace bool, lv func(*ir.Region) *Liveness) *RegionPlan {
	l := lv(r)
	p := &RegionPlan{Region: r, Values: map[*ir.Value]Buffer{}, Sub: map[*ir.Op][]*RegionPlan{}, SubOffset: map[*ir.Op][2]int64{}}
	for i, v := range r.Params {
		p.Values[v] = Buffer{Kind: BufParam, Space: v.Type.Space, Size: bytesOf(v), Index: i}
	}
	for _, op := range r.Ops {
		if op.Code == ir.Fusion || len(op.Regions) == 0 {
			continue
		}
		subs := make([]*RegionPlan, len(op.Regions))
		ys := -1
		if op.Code == ir.Scan {
			ys = op.Attrs.Int("num_carry")
		}
		for i, sub := range op.Regions {
			subs[i] = planRegionYs(sub, false, ys, nil, fusionInPlace, lv)
		}
		p.Sub[op] = subs
	}
	if top {
		assignOutputs(p, l, donated, fusionInPlace)
	}
	if ysFrom >= 0 {
		assignSlices(p, ysFrom)
	}
	packArena(p, l, fusionInPlace)
	return p
}

// assignOutputs gives every top-level result position its output buffer, or a
// donated parameter's. Positions are visited in the order their values are
// defined (a donated parameter free for one result stays free for every
// later one, so this order matches the most), and a result takes, among the
// donated parameters of its size and memory space that are still free, the
// one its defining op overwrites in place if there is one, else the first
// that is dead by then. Parameters of the result's own type go first (a
// first round matches only those, as JAX matches donations by shape and
// dtype), so that a scalar loss does not take the buffer of an optimizer's
// step count when the new count could have it.
func assignOutputs(p *RegionPlan, l *Liveness, donated []bool, fusionInPlace bool) {
	r := p.Region
	var order []int
	for j, v := range r.Results {
		if _, ok := p.Values[v]; ok {
			continue // a parameter: the executor copies
		}
		if slices.ContainsFunc(order, func(i int) bool { return r.Results[i] == v }) {
			continue // returned before: the executor copies
		}
		order = append(order, j)
	}
	slices.SortStableFunc(order, func(a, b int) int { return defPos(l, r.Results[a]) - defPos(l, r.Results[b]) })
	used := map[int]bool{}
	bufs := make(map[int]Buffer, len(order))
	for _, sameType := range []bool{true, false} {
		for _, j := range order {
			v := r.Results[j]
			b, ok := bufs[j]
			if !ok {
				b = Buffer{Kind: BufOutput, Space: v.Type.Space, Size: bytesOf(v), Index: j}
			}
			if v.Op != nil && b.Kind == BufOutput {
				if i := aliasFor(r, l, v, b, donated, used, fusionInPlace, sameType); i >= 0 {
					used[i] = true
					b.Kind, b.Param = BufAlias, i
				}
			}
			bufs[j] = b
		}
	}
	for _, j := range order {
		p.Values[r.Results[j]] = bufs[j]
	}
}

// defPos is the position of the op defining v, or -1 for a value defined
// outside the region's ops.
func defPos(l *Liveness, v *ir.Value) int {
	if k, ok := l.Def[v]; ok && v.Op != nil {
		return k
	}
	return -1
}

// aliasFor returns the donated parameter result v (buffer b) may be written
// into, or -1: one of b's size and space (with sameType, of v's type too),
// not used yet, that v's op writes in place, or else the first that is dead
// by the op.
func aliasFor(r *ir.Region, l *Liveness, v *ir.Value, b Buffer, donated []bool, used map[int]bool, fusionInPlace, sameType bool) int {
	k := l.Def[v]
	first := -1
	for i, pv := range r.Params {
		if i >= len(donated) || !donated[i] || used[i] || bytesOf(pv) != b.Size || pv.Type.Space != b.Space ||
			sameType && !pv.Type.EqualUnsharded(v.Type) {
			continue
		}
		switch last := l.Last[pv]; {
		case last == k && (inPlace(v.Op, pv, v, fusionInPlace) || fusionInPlace && updatesInPlace(v.Op, pv, v)):
			return i
		case last < k && first < 0:
			first = i
		}
	}
	return first
}

// assignSlices plans every y result of a scan body (position ≥ ysFrom) that
// an op of the body defines and that the body returns only there as
// BufSlice: the executor points it at the iteration's slice of the op's ys
// buffer, so it needs no arena space and no copy. (The slice is memory of
// its own for the whole iteration, so the body may read the value after
// defining it.)
func assignSlices(p *RegionPlan, ysFrom int) {
	r := p.Region
	count := map[*ir.Value]int{}
	for _, v := range r.Results {
		count[v]++
	}
	for j := ysFrom; j < len(r.Results); j++ {
		v := r.Results[j]
		if _, ok := p.Values[v]; ok || v.Op == nil || count[v] != 1 {
			continue
		}
		p.Values[v] = Buffer{Kind: BufSlice, Space: v.Type.Space, Size: bytesOf(v), Index: j}
	}
}

// inPlace reports whether op may write its result res over operand v (of
// the same size in bytes) while it runs: res has as many elements as v (so
// that, of the same size, its element k lies where v's does), and op is
// elementwise, a dynamic_update_slice and v its operand 0 (and no other
// operand), or — when fusion is set — a loop fusion that reads v only
// element for element (pointwiseOperand). A fusion's result of v's bytes
// but other elements (u8[4,10] over f32[10]) would overwrite elements of v
// that the fusion has still to read.
func inPlace(op *ir.Op, v, res *ir.Value, fusion bool) bool {
	if res.Type.Size() != v.Type.Size() {
		return false
	}
	switch {
	case op.Info().Elementwise:
		return true
	case op.Code == ir.DynamicUpdateSlice:
		return op.Args[0] == v && !hasArg(&ir.Op{Args: op.Args[1:]}, v)
	case op.Code == ir.Fusion:
		return fusion && pointwiseOperand(op, v)
	}
	return false
}

// pointwiseOperand reports whether op computes every result element k from
// element k of operand v only where it reads v (so that a result may
// overwrite v in place): op is elementwise, or a loop fusion whose region
// reaches v's parameters only through elementwise ops and reshapes.
func pointwiseOperand(op *ir.Op, v *ir.Value) bool {
	if op.Info().Elementwise {
		return true
	}
	if op.Code != ir.Fusion || op.Attrs.String("kind") != FusionLoop {
		return false
	}
	body := op.Regions[0]
	var params []*ir.Value
	for i, a := range op.Args {
		if a == v {
			params = append(params, body.Params[i])
		}
	}
	return pointwiseFrom(body.Ops, params...)
}

// updatesInPlace reports whether input fusion op may write its result res
// over operand v while it runs: res has v's element count, and the fusion's
// body reaches v's parameters only through elementwise ops and reshapes
// (pointwiseFrom), so no reduction of the fusion reads v, and every result
// element k is computed from element k of v where it reads v. This is the
// optimizer update fused with the loss (or a gradient norm) that computes
// new moments from old ones: the new moments take the donated old ones'
// buffers. A backend computes each element's results before it stores
// them, and its reductions read no value of v.
func updatesInPlace(op *ir.Op, v, res *ir.Value) bool {
	if op.Code != ir.Fusion || op.Attrs.String("kind") != FusionInput || res.Type.Size() != v.Type.Size() {
		return false
	}
	body := op.Regions[0]
	var params []*ir.Value
	for i, a := range op.Args {
		if a == v {
			params = append(params, body.Params[i])
		}
	}
	return pointwiseFrom(body.Ops, params...)
}

// block is a range of an arena that one or more values (an in-place chain) or
// a region op's nested arenas occupy while live.
type block struct {
	vals       []*ir.Value // nil for a nested arena
	op         *ir.Op      // the region op whose nested arenas this is
	space      ir.MemorySpace
	size       int64
	start, end int // live op positions, inclusive
	order      int // creation order, for ties
	offset     int64
}

// packArena gives every value of r that has no buffer yet a temp in r's arena
// of its memory space, and every region op a block for its nested arenas.
//
// Temps live from their defining op to their last use. The result of an
// elementwise op, a dynamic_update_slice or (with Options.FusionInPlace) a
// loop fusion reuses an operand's block (in place, see inPlace) when the
// operand is a temp that dies at that op and has the same size and space. Blocks are then placed largest first (ties: earlier
// start, then creation order), each at the lowest offset, aligned to
// Alignment, where it overlaps no placed block live at the same time.
func packArena(p *RegionPlan, l *Liveness, fusionInPlace bool) {
	r := p.Region
	var blocks []*block
	owner := map[*ir.Value]*block{}
	for k, op := range r.Ops {
		for _, v := range op.Results {
			if _, ok := p.Values[v]; ok {
				continue
			}
			var b *block
			for _, a := range op.Args {
				ab := owner[a]
				if ab == nil || ab.vals[len(ab.vals)-1] != a || l.Last[a] != k || ab.size != bytesOf(v) ||
					ab.space != v.Type.Space || !inPlace(op, a, v, fusionInPlace) {
					continue
				}
				b = ab
				b.vals = append(b.vals, v)
				b.end = l.Last[v]
				break
			}
			if b == nil {
				b = &block{vals: []*ir.Value{v}, space: v.Type.Space, size: bytesOf(v), start: k, end: l.Last[v], order: len(blocks)}
				blocks = append(blocks, b)
			}
			owner[v] = b
		}
		if subs, ok := p.Sub[op]; ok {
			for _, s := range ir.AllSpaces {
				var size int64
				for _, sp := range subs {
					size = max(size, sp.Arena[s])
				}
				if size > 0 {
					blocks = append(blocks, &block{op: op, space: s, size: size, start: k, end: k, order: len(blocks)})
				}
			}
		}
	}
	sorted := append([]*block{}, blocks...)
	slices.SortStableFunc(sorted, func(a, b *block) int {
		switch {
		case a.size != b.size:
			if a.size > b.size {
				return -1
			}
			return 1
		case a.start != b.start:
			return a.start - b.start
		}
		return a.order - b.order
	})
	var placed []*block
	for _, b := range sorted {
		b.offset = place(b, placed)
		placed = append(placed, b)
		if end := b.offset + b.size; end > p.Arena[b.space] {
			p.Arena[b.space] = end
		}
	}
	for _, b := range blocks {
		if b.op != nil {
			o := p.SubOffset[b.op]
			o[b.space] = b.offset
			p.SubOffset[b.op] = o
			continue
		}
		for _, v := range b.vals {
			p.Values[v] = Buffer{Kind: BufTemp, Space: b.space, Offset: b.offset, Size: b.size}
		}
	}
	for op := range p.Sub {
		if _, ok := p.SubOffset[op]; !ok {
			p.SubOffset[op] = [2]int64{}
		}
	}
}

// place returns the lowest aligned offset where b overlaps no block of placed
// that is in the same space and live at the same time.
func place(b *block, placed []*block) int64 {
	if b.size == 0 {
		return 0
	}
	type rng struct{ lo, hi int64 }
	var busy []rng
	for _, o := range placed {
		if o.space == b.space && o.size > 0 && o.start <= b.end && b.start <= o.end {
			busy = append(busy, rng{o.offset, o.offset + o.size})
		}
	}
	slices.SortFunc(busy, func(x, y rng) int {
		if x.lo < y.lo {
			return -1
		}
		if x.lo > y.lo {
			return 1
		}
		return 0
	})
	var off int64
	for _, r := range busy {
		if off+b.size <= r.lo {
			break
		}
		if r.hi > off {
			off = alignUp(r.hi)
		}
	}
	return off
}

func alignUp(n int64) int64 { return (n + Alignment - 1) / Alignment * Alignment }
