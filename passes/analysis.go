package passes

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// analyzeMemory fills Program.Analysis from the plan: argument bytes are the
// parameters, output bytes every result position (aliased ones included),
// alias bytes the donated parameters reused as results, temp bytes the arena
// (nested arenas included), each per memory space.
func analyzeMemory(st *State) error {
	p := st.Program
	if p == nil || p.Plan == nil {
		return fmt.Errorf("no buffer plan")
	}
	p.Analysis = Analyze(p.Plan)
	return nil
}

// Analyze computes the memory analysis of a top-level plan.
func Analyze(plan *RegionPlan) MemoryAnalysis {
	var arg, out, alias [2]int64
	r := plan.Region
	for _, v := range r.Params {
		arg[v.Type.Space] += bytesOf(v)
	}
	for _, v := range r.Results {
		out[v.Type.Space] += bytesOf(v)
	}
	for _, b := range plan.Values {
		if b.Kind == BufAlias {
			alias[b.Space] += b.Size
		}
	}
	return MemoryAnalysis{
		ArgumentBytes: arg[ir.Device], OutputBytes: out[ir.Device], AliasBytes: alias[ir.Device], TempBytes: plan.Arena[ir.Device],
		HostArgumentBytes: arg[ir.PinnedHost], HostOutputBytes: out[ir.PinnedHost], HostAliasBytes: alias[ir.PinnedHost], HostTempBytes: plan.Arena[ir.PinnedHost],
	}
}

// PlanString prints the buffer plan, one value a line in region order, nested
// plans indented under their op:
//
//	region: arena device 1310720 B, pinned_host 0 B
//	  %0 f32[256,256] param 0 device 262144 B
//	  %4 f32[256,1024] temp device @0 1048576 B
//	  %9 f32[] output 0 device 4 B
//	  %7, %8 = scan: nested arenas at device @1048576, pinned_host @0
//	    region 0: arena …
func (p *Program) PlanString() string {
	if p == nil || p.Plan == nil {
		return "<no plan>\n"
	}
	var b strings.Builder
	writePlan(&b, p.Plan, 0, "region")
	return b.String()
}

func writePlan(b *strings.Builder, p *RegionPlan, depth int, title string) {
	ind := strings.Repeat("  ", depth)
	fmt.Fprintf(b, "%s%s: arena device %d B, pinned_host %d B\n", ind, title, p.Arena[ir.Device], p.Arena[ir.PinnedHost])
	line := func(v *ir.Value) {
		buf, ok := p.Values[v]
		if !ok {
			fmt.Fprintf(b, "%s  %v %v <no buffer>\n", ind, v, v.Type)
			return
		}
		fmt.Fprintf(b, "%s  %v %v %s\n", ind, v, v.Type, bufString(buf))
	}
	r := p.Region
	for _, v := range r.Params {
		line(v)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			line(v)
		}
		if subs, ok := p.Sub[op]; ok {
			off := p.SubOffset[op]
			fmt.Fprintf(b, "%s  %s = %v: nested arenas at device @%d, pinned_host @%d\n", ind, valueList(op.Results), op.Code, off[ir.Device], off[ir.PinnedHost])
			for i, sp := range subs {
				writePlan(b, sp, depth+2, fmt.Sprintf("region %d", i))
			}
		}
	}
	if len(r.Results) > 0 {
		fmt.Fprintf(b, "%s  return %s\n", ind, valueList(r.Results))
	}
}

func valueList(vs []*ir.Value) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = v.String()
	}
	if len(s) == 0 {
		return "()"
	}
	return strings.Join(s, ", ")
}

func bufString(b Buffer) string {
	switch b.Kind {
	case BufParam:
		return fmt.Sprintf("param %d %v %d B", b.Index, b.Space, b.Size)
	case BufOutput:
		return fmt.Sprintf("output %d %v %d B", b.Index, b.Space, b.Size)
	case BufAlias:
		return fmt.Sprintf("alias %d = param %d %v %d B", b.Index, b.Param, b.Space, b.Size)
	case BufTemp:
		return fmt.Sprintf("temp %v @%d %d B", b.Space, b.Offset, b.Size)
	case BufSlice:
		return fmt.Sprintf("ys slice of result %d %v %d B", b.Index, b.Space, b.Size)
	}
	return fmt.Sprintf("%v %v %d B", b.Kind, b.Space, b.Size)
}

// LiveValue is one value live at a region's peak, with where it lives.
type LiveValue struct {
	Value  *ir.Value
	Buffer Buffer
	// Path names the region: "body", then "scan %7 region 0" and so on.
	Path string
}

// Peak describes the moment of a plan where the most arena bytes of a memory
// space are in use: the op running (Path, Op), the temps live then, and the
// bytes in use.
type Peak struct {
	Space ir.MemorySpace
	Bytes int64
	Path  string
	Op    *ir.Op
	Live  []LiveValue
}

// String lists the peak's live set, largest first.
func (pk Peak) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "peak %v: %d B (%.2f MiB) at %s, op %s\n", pk.Space, pk.Bytes, float64(pk.Bytes)/(1<<20), pk.Path, opLabel(pk.Op))
	for _, lv := range pk.Live {
		what := "parameter"
		if lv.Value.Op != nil {
			what = opLabel(lv.Value.Op)
		}
		fmt.Fprintf(&b, "  %-24s %s, from %s, in %s\n", lv.Value.String()+" "+lv.Value.Type.String(), bufString(lv.Buffer), what, lv.Path)
	}
	return b.String()
}

func opLabel(op *ir.Op) string {
	if op == nil {
		return "-"
	}
	s := valueList(op.Results) + " = " + op.Code.String()
	if op.Code == ir.Fusion {
		s += "[" + op.Attrs.String("kind") + "]"
	}
	if op.Loc != "" {
		s += " (" + op.Loc + ")"
	}
	return s
}

// PeakLive finds the peak of the plan's arena of space: the op, nested
// regions included, at which the temps live (whose bytes the arena holds at
// that moment) add up to the most bytes, and lists them. Temps of enclosing
// regions live across a region op count at every op of its nested regions.
func PeakLive(p *Program, space ir.MemorySpace) Peak {
	var best Peak
	best.Space = space
	var walk func(rp *RegionPlan, path string, outer []LiveValue, outerBytes int64)
	walk = func(rp *RegionPlan, path string, outer []LiveValue, outerBytes int64) {
		l := ComputeLiveness(rp.Region)
		n := len(rp.Region.Ops)
		for k := 0; k <= n; k++ {
			var live []LiveValue
			var bytes int64
			seen := map[int64]bool{} // in-place chains share one block
			vals := temps(rp)
			for _, v := range vals {
				buf := rp.Values[v]
				if buf.Space != space || !l.Live(v, k) || seen[buf.Offset] && buf.Size > 0 {
					continue
				}
				seen[buf.Offset] = true
				live = append(live, LiveValue{Value: v, Buffer: buf, Path: path})
				bytes += buf.Size
			}
			var op *ir.Op
			if k < n {
				op = rp.Region.Ops[k]
			}
			total := outerBytes + bytes
			if total > best.Bytes {
				best = Peak{Space: space, Bytes: total, Path: path, Op: op, Live: append(append([]LiveValue{}, outer...), live...)}
			}
			if subs, ok := rp.Sub[op]; ok && op != nil {
				for i, sp := range subs {
					walk(sp, fmt.Sprintf("%s / %s %v region %d", path, op.Code, valueList(op.Results), i), append(append([]LiveValue{}, outer...), live...), total)
				}
			}
		}
	}
	if p != nil && p.Plan != nil {
		walk(p.Plan, "body", nil, 0)
	}
	slices.SortStableFunc(best.Live, func(a, b LiveValue) int {
		if a.Buffer.Size != b.Buffer.Size {
			if a.Buffer.Size > b.Buffer.Size {
				return -1
			}
			return 1
		}
		return 0
	})
	return best
}

// temps lists the temps of a plan in region order.
func temps(rp *RegionPlan) []*ir.Value {
	var out []*ir.Value
	for _, op := range rp.Region.Ops {
		for _, v := range op.Results {
			if rp.Values[v].Kind == BufTemp {
				out = append(out, v)
			}
		}
	}
	return out
}
