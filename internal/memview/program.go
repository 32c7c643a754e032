// Package memview builds the memory viewer's pages: a compiled program's
// buffers over its schedule (Build, WriteProgramPage) and the live memory
// pools (LivePools, WriteLivePage), as self-contained HTML files whose data
// is embedded as JSON in a <script type="application/json"
// id="ferry-memory-data"> block. Package runtime exposes them as
// Compiled.WriteMemoryReport and WriteLiveMemoryReport.
package memview

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Buffer kinds of the picture (Buffer.Kind).
const (
	KindArgument   = "argument"   // a parameter of the program
	KindOutput     = "output"     // a result buffer
	KindTemp       = "temp"       // a value in the arena
	KindDonated    = "donated"    // a donated parameter, or a result written over one
	KindOffloaded  = "offloaded"  // a value in pinned_host made from device memory
	KindPrefetched = "prefetched" // a copy from pinned_host into device memory
)

// MaxUnrolledSteps bounds the steps a scan's iterations may take in the
// picture: a scan whose iterations would take more shows its first
// iteration only (Step.Iter says which of how many).
const MaxUnrolledSteps = 600

// Program is the data of one compiled program's page.
type Program struct {
	Name string `json:"name"`
	// Title is Name with the program's memory budget: "main_gradFn —
	// budget 48 MiB", or "main_gradFn — no budget" for a program compiled
	// without one, so that a budgeted program and its baseline differ.
	Title string `json:"title"`
	// Budget is the memory budget's plan when the program was compiled
	// under one (rt.MemoryBudget), else nil.
	Budget *Budget `json:"budget,omitempty"`
	// Analysis is the program's memory analysis (passes.MemoryAnalysis).
	Analysis Analysis `json:"analysis"`
	// Steps are the columns of the picture: the ops of the schedule in
	// execution order, the ops of nested regions (scan bodies, per
	// iteration) after the op that runs them.
	Steps []Step `json:"steps"`
	// Spaces has one entry per memory space that holds bytes.
	Spaces []Space `json:"spaces"`
	// Baseline is the program to compare with, if any (WithBaseline).
	Baseline *Program `json:"baseline,omitempty"`
}

// Analysis is passes.MemoryAnalysis with JSON names and its totals.
type Analysis struct {
	ArgumentBytes     int64 `json:"argument_bytes"`
	OutputBytes       int64 `json:"output_bytes"`
	AliasBytes        int64 `json:"alias_bytes"`
	TempBytes         int64 `json:"temp_bytes"`
	TotalBytes        int64 `json:"total_bytes"`
	HostArgumentBytes int64 `json:"host_argument_bytes"`
	HostOutputBytes   int64 `json:"host_output_bytes"`
	HostAliasBytes    int64 `json:"host_alias_bytes"`
	HostTempBytes     int64 `json:"host_temp_bytes"`
	HostTotalBytes    int64 `json:"host_total_bytes"`
}

// Step is one column of the picture.
type Step struct {
	Op   string `json:"op"`             // "%8 = dot_general"
	Loc  string `json:"loc,omitempty"`  // the user's Go file:line
	Path string `json:"path"`           // "body", "body / scan %30, %31 region 0"
	Iter string `json:"iter,omitempty"` // "iteration 3 of 10" inside a scan
}

// Space is the picture of one memory space. Its y axis is a byte address:
// the arguments stacked from 0, then the result buffers that are not
// donated parameters, then the arena at ArenaBase, so that its top is the
// analysis's total.
type Space struct {
	Space         string `json:"space"`
	ArgumentBytes int64  `json:"argument_bytes"`
	OutputBytes   int64  `json:"output_bytes"`
	AliasBytes    int64  `json:"alias_bytes"`
	TempBytes     int64  `json:"temp_bytes"`
	TotalBytes    int64  `json:"total_bytes"`
	ArenaBase     int64  `json:"arena_base"`
	// Live is, per step, the bytes in use: arguments + outputs − aliases
	// and the temps live at that step (values of an in-place chain once).
	Live []int64 `json:"live"`
	// PeakStep is the first step where Live is largest, PeakBytes that
	// value and PeakTempBytes its temps.
	PeakStep      int      `json:"peak_step"`
	PeakBytes     int64    `json:"peak_bytes"`
	PeakTempBytes int64    `json:"peak_temp_bytes"`
	Buffers       []Buffer `json:"buffers"`
}

// Buffer is one value of the buffer plan with the bars it is drawn as.
type Buffer struct {
	ID     string `json:"id"`     // unique in the program: region path and value
	Value  string `json:"value"`  // "%8"
	Region string `json:"region"` // the region path
	Kind   string `json:"kind"`   // KindArgument, ...
	Plan   string `json:"plan"`   // the plan's kind: param, output, alias, temp, slice
	Type   string `json:"type"`   // "f32[256,1024]"
	DType  string `json:"dtype"`
	Shape  []int  `json:"shape"`
	Bytes  int64  `json:"bytes"`
	Op     string `json:"op"`            // the op that makes it, or "argument N"
	Loc    string `json:"loc,omitempty"` // the user's Go file:line of that op
	// Offset is the plan's offset in its region's arena (temps).
	Offset int64 `json:"offset"`
	// FirstUse and LastUse describe the op that defines it and the last op
	// that reads it (or "returned").
	FirstUse string `json:"first_use"`
	LastUse  string `json:"last_use"`
	// Of is, for a slice of a scan's stacked result, that result's ID.
	Of string `json:"of,omitempty"`
	// DoubleBuffered marks a scan body's copy of a pinned_host slice whose
	// buffer is kept for the whole iteration, so that the next slice's copy
	// runs into it while the iteration computes.
	DoubleBuffered bool `json:"double_buffered,omitempty"`
	// Spans are the bars: one per time the value is live (once per shown
	// iteration inside a scan body).
	Spans []Span `json:"spans"`
}

// Span is one bar: steps Start..End (inclusive) at byte address Y.
type Span struct {
	Start int   `json:"start"`
	End   int   `json:"end"`
	Y     int64 `json:"y"`
	// Reserved is the step after which the bytes are only reserved (a
	// double-buffered copy after its last reader), or -1.
	Reserved int `json:"reserved"`
}

// Bars counts the bars a page draws for p (its baseline's not included).
func (p *Program) Bars() int {
	n := 0
	for _, s := range p.Spaces {
		for _, b := range s.Buffers {
			n += len(b.Spans)
		}
	}
	return n
}

// Build makes the picture of a compiled program.
func Build(p *passes.Program) (*Program, error) {
	if p == nil || p.Plan == nil || p.Func == nil {
		return nil, fmt.Errorf("memview: the program has no buffer plan")
	}
	m := p.Analysis
	out := &Program{Name: p.Func.Name, Analysis: Analysis{
		ArgumentBytes: m.ArgumentBytes, OutputBytes: m.OutputBytes, AliasBytes: m.AliasBytes, TempBytes: m.TempBytes, TotalBytes: m.TotalBytes(),
		HostArgumentBytes: m.HostArgumentBytes, HostOutputBytes: m.HostOutputBytes, HostAliasBytes: m.HostAliasBytes, HostTempBytes: m.HostTempBytes,
		HostTotalBytes: m.HostTotalBytes(),
	}, Budget: budgetOf(m.Plan)}
	out.Title = out.title()
	w := &walker{prog: p, bufs: map[bufKey]*entry{}, aliased: map[*ir.Value]bool{}, byID: map[string]*entry{}}
	var sp [2]*Space
	for _, s := range ir.AllSpaces {
		sp[s] = &Space{Space: s.String()}
	}
	sp[ir.Device].ArgumentBytes, sp[ir.Device].OutputBytes, sp[ir.Device].AliasBytes, sp[ir.Device].TempBytes =
		m.ArgumentBytes, m.OutputBytes, m.AliasBytes, m.TempBytes
	sp[ir.PinnedHost].ArgumentBytes, sp[ir.PinnedHost].OutputBytes, sp[ir.PinnedHost].AliasBytes, sp[ir.PinnedHost].TempBytes =
		m.HostArgumentBytes, m.HostOutputBytes, m.HostAliasBytes, m.HostTempBytes
	for _, s := range sp {
		s.TotalBytes = s.TempBytes + s.ArgumentBytes + s.OutputBytes - s.AliasBytes
		s.ArenaBase = s.TotalBytes - s.TempBytes
	}
	w.top = w.topAddresses(sp)
	var base [2]int64
	for _, s := range ir.AllSpaces {
		base[s] = sp[s].ArenaBase
	}
	w.region(p.Plan, "body", "", base, nil, -1)
	if len(w.steps) == 0 {
		w.steps = append(w.steps, Step{Op: "(no ops)", Path: "body"})
	}
	out.Steps = w.steps
	for _, e := range w.order {
		s := sp[e.space]
		s.Buffers = append(s.Buffers, e.Buffer)
	}
	for _, s := range ir.AllSpaces {
		x := sp[s]
		if x.TotalBytes == 0 && len(x.Buffers) == 0 {
			continue
		}
		x.Live, x.PeakStep, x.PeakBytes, x.PeakTempBytes = liveBytes(w, s, len(w.steps), x.ArenaBase)
		out.Spaces = append(out.Spaces, *x)
	}
	return out, nil
}

type bufKey struct {
	plan *passes.RegionPlan
	v    *ir.Value
}

// entry is a Buffer being built, with what liveBytes needs.
type entry struct {
	Buffer
	space ir.MemorySpace
	temp  bool // counts as a temp in Live
}

type walker struct {
	prog    *passes.Program
	steps   []Step
	bufs    map[bufKey]*entry
	order   []*entry
	top     map[*ir.Value]int64 // y of top-level parameters and outputs
	aliased map[*ir.Value]bool  // top-level parameters a result is written over
	byID    map[string]*entry
}

// topAddresses gives the top-level parameters (stacked in order from 0 in
// their space), then the results that are not aliases (stacked after the
// arguments), their y; an alias takes its parameter's.
func (w *walker) topAddresses(sp [2]*Space) map[*ir.Value]int64 {
	plan := w.prog.Plan
	r := plan.Region
	y := map[*ir.Value]int64{}
	var next [2]int64
	for _, v := range r.Params {
		b := plan.Values[v]
		y[v] = next[b.Space]
		next[b.Space] += b.Size
	}
	for _, s := range ir.AllSpaces {
		next[s] = sp[s].ArgumentBytes
	}
	for _, v := range r.Results {
		b, ok := plan.Values[v]
		if !ok {
			continue
		}
		if _, done := y[v]; done {
			continue
		}
		switch b.Kind {
		case passes.BufOutput:
			y[v] = next[b.Space]
			next[b.Space] += b.Size
		case passes.BufAlias:
			y[v] = y[r.Params[b.Param]]
			w.aliased[r.Params[b.Param]] = true
		}
	}
	return y
}

// ysFunc tells a scan body where the slice of its result j is in the
// running iteration: the stacked buffer's ID and the slice's y.
type ysFunc func(j int) (id string, y int64, ok bool)

// region lays out the ops of rp from the current step and records the spans
// of its values; it returns the spans of its ys slices, whose ends the
// caller sets to the end of the scan.
//
// xsFrom ≥ 0 marks a scan body whose parameters from xsFrom on are slices
// of its xs.
func (w *walker) region(rp *passes.RegionPlan, path, iter string, base [2]int64, ys ysFunc, xsFrom int) []spanRef {
	r := rp.Region
	l := passes.ComputeLiveness(r)
	top := rp == w.prog.Plan
	values := append([]*ir.Value{}, r.Params...)
	for _, op := range r.Ops {
		values = append(values, op.Results...)
	}
	// Addresses first: nested regions need their stacked results'.
	y := map[*ir.Value]int64{}
	of := map[*ir.Value]string{}
	for _, v := range values {
		b, ok := rp.Values[v]
		if !ok {
			continue
		}
		switch b.Kind {
		case passes.BufParam, passes.BufOutput, passes.BufAlias:
			if top {
				y[v] = w.top[v]
			}
		case passes.BufTemp:
			y[v] = base[b.Space] + b.Offset
		case passes.BufSlice:
			if ys != nil {
				if id, at, ok := ys(b.Index); ok {
					y[v], of[v] = at, id
				}
			}
		}
	}
	for _, v := range values {
		if b, ok := rp.Values[v]; ok && (top || b.Kind != passes.BufParam) {
			e := w.entry(rp, v, b, path)
			e.DoubleBuffered = e.Kind == KindPrefetched && xsFrom >= 0 && doubleBuffered(rp, v, b, xsFrom)
		}
	}
	n := len(r.Ops)
	start := len(w.steps)
	opStart, opEnd := make([]int, n), make([]int, n)
	for k, op := range r.Ops {
		opStart[k] = len(w.steps)
		w.steps = append(w.steps, Step{Op: opLabel(op), Loc: op.Loc, Path: path, Iter: iter})
		if subs := rp.Sub[op]; len(subs) > 0 {
			off := rp.SubOffset[op]
			var nb [2]int64
			for _, s := range ir.AllSpaces {
				nb[s] = base[s] + off[s]
			}
			w.nested(rp, op, subs, path, nb, y)
		}
		opEnd[k] = len(w.steps) - 1
	}
	if n == 0 {
		w.steps = append(w.steps, Step{Op: "(empty region)", Path: path, Iter: iter})
	}
	end := len(w.steps) - 1
	at := func(pos int, first bool) int {
		switch {
		case pos < 0:
			return start
		case pos >= n:
			return end
		case first:
			return opStart[pos]
		}
		return opEnd[pos]
	}
	use := func(pos int, first bool) string {
		switch {
		case pos < 0:
			return "argument (before the first step)"
		case pos >= n:
			return fmt.Sprintf("returned (step %d)", end)
		}
		op := r.Ops[pos]
		s := fmt.Sprintf("step %d: %s", at(pos, first), opLabel(op))
		if op.Loc != "" {
			s += " at " + op.Loc
		}
		return s
	}
	var slices []spanRef
	for _, v := range values {
		b, ok := rp.Values[v]
		if !ok || !top && b.Kind == passes.BufParam {
			continue // a nested parameter is a view of the enclosing op's buffers
		}
		if _, ok := y[v]; !ok {
			continue
		}
		e := w.entry(rp, v, b, path)
		if e.FirstUse == "" {
			e.FirstUse, e.LastUse = use(l.Def[v], true), use(l.Last[v], false)
		}
		sp := Span{Start: at(l.Def[v], true), End: at(l.Last[v], false), Y: y[v], Reserved: -1}
		switch b.Kind {
		case passes.BufParam:
			sp.Start = 0
			if e.Kind != KindDonated || !w.aliased[v] {
				sp.End = end
			}
		case passes.BufOutput, passes.BufAlias:
			sp.End = end
		case passes.BufSlice:
			e.Of = of[v]
			if p := w.byID[e.Of]; p != nil && (p.Kind == KindOutput || p.Kind == KindDonated) {
				e.Kind = p.Kind // computed straight into a result buffer
			}
		}
		if e.DoubleBuffered {
			sp.Reserved, sp.End = sp.End, end
		}
		e.Spans = append(e.Spans, sp)
		if b.Kind == passes.BufSlice {
			slices = append(slices, spanRef{e, len(e.Spans) - 1})
		}
	}
	return slices
}

// nested lays out the regions of region op op: a scan's body once per
// iteration (only the first when that would take more than
// MaxUnrolledSteps steps), the regions of while and cond one after the
// other. y holds the addresses of the enclosing region's values.
func (w *walker) nested(rp *passes.RegionPlan, op *ir.Op, subs []*passes.RegionPlan, path string, base [2]int64, y map[*ir.Value]int64) {
	label := fmt.Sprintf("%s / %v %s", path, op.Code, valueList(op.Results))
	if op.Code != ir.Scan {
		for i, sp := range subs {
			w.region(sp, fmt.Sprintf("%s region %d", label, i), "", base, nil, -1)
		}
		return
	}
	length := op.Attrs.Int("length")
	reverse := op.Attrs.Bool("reverse")
	shown := length
	if length*countSteps(subs[0]) > MaxUnrolledSteps {
		shown = min(length, 1)
	}
	var pending []spanRef
	for it := range shown {
		slice := int64(it)
		if reverse {
			slice = int64(length - 1 - it)
		}
		ys := func(j int) (string, int64, bool) {
			if j >= len(op.Results) {
				return "", 0, false
			}
			v := op.Results[j]
			at, ok := y[v]
			if !ok {
				return "", 0, false
			}
			size := rp.Values[v].Size / int64(max(1, length))
			return bufID(path, v), at + slice*size, true
		}
		iter := fmt.Sprintf("iteration %d of %d", it+1, length)
		if reverse {
			iter += " (reverse)"
		}
		xs := op.Attrs.Int("num_consts") + op.Attrs.Int("num_carry")
		pending = append(pending, w.region(subs[0], label+" region 0", iter, base, ys, xs)...)
	}
	end := len(w.steps) - 1
	for _, s := range pending {
		s.e.Spans[s.i].End = end
	}
}

// spanRef is span i of an entry.
type spanRef struct {
	e *entry
	i int
}

func bufID(path string, v *ir.Value) string { return path + " " + v.String() }

func countSteps(rp *passes.RegionPlan) int {
	n := max(1, len(rp.Region.Ops))
	for op, subs := range rp.Sub {
		m := 0
		for _, s := range subs {
			m += countSteps(s)
		}
		if op.Code == ir.Scan {
			m *= max(1, op.Attrs.Int("length"))
		}
		n += m
	}
	return n
}

func valueList(vs []*ir.Value) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = v.String()
	}
	return strings.Join(s, ", ")
}

func opLabel(op *ir.Op) string {
	s := valueList(op.Results) + " = " + op.Code.String()
	if op.Code == ir.Fusion {
		s += "[" + op.Attrs.String("kind") + "]"
	}
	return s
}

// entry returns the buffer of v in rp, made on first use.
func (w *walker) entry(rp *passes.RegionPlan, v *ir.Value, b passes.Buffer, path string) *entry {
	k := bufKey{rp, v}
	if e := w.bufs[k]; e != nil {
		return e
	}
	t := v.Type
	e := &entry{space: b.Space, temp: b.Kind == passes.BufTemp}
	e.Buffer = Buffer{ID: bufID(path, v), Value: v.String(), Region: path, Plan: b.Kind.String(), Type: t.String(), DType: t.DType.String(),
		Shape: append([]int{}, t.Shape...), Bytes: b.Size, Offset: b.Offset}
	if e.Shape == nil {
		e.Shape = []int{}
	}
	if v.Op != nil {
		e.Op, e.Loc = opLabel(v.Op), v.Op.Loc
	} else {
		e.Op = fmt.Sprintf("argument %d", v.Index)
	}
	e.Kind = w.kind(rp, v, b)
	w.bufs[k] = e
	w.byID[e.ID] = e
	w.order = append(w.order, e)
	return e
}

// kind classifies a value for the picture.
func (w *walker) kind(rp *passes.RegionPlan, v *ir.Value, b passes.Buffer) string {
	switch b.Kind {
	case passes.BufParam:
		if v.Index < len(w.prog.Donated) && w.prog.Donated[v.Index] {
			return KindDonated
		}
		return KindArgument
	case passes.BufAlias:
		return KindDonated
	case passes.BufOutput:
		return KindOutput
	}
	if op := v.Op; op != nil && op.Code == ir.DevicePut && len(op.Args) == 1 && op.Args[0].Type.Space != v.Type.Space {
		if v.Type.Space == ir.PinnedHost {
			return KindOffloaded
		}
		return KindPrefetched
	}
	if v.Type.Space == ir.PinnedHost {
		return KindOffloaded
	}
	return KindTemp
}

// doubleBuffered reports whether v, a copy into device memory in scan body
// rp whose xs parameters start at xsFrom, is a copy of an xs slice that the
// executor double buffers: its operand is an xs parameter, it is not
// returned, and no other value of the body's plan shares its bytes (the
// test the plan's schedule makes for its prefetched copies, passes.Schedule).
func doubleBuffered(rp *passes.RegionPlan, v *ir.Value, b passes.Buffer, xsFrom int) bool {
	if b.Kind != passes.BufTemp || v.Op == nil || len(v.Op.Args) != 1 {
		return false
	}
	a := v.Op.Args[0]
	if ab, ok := rp.Values[a]; !ok || ab.Kind != passes.BufParam || a.Op != nil || ab.Index < xsFrom {
		return false
	}
	for _, r := range rp.Region.Results {
		if r == v {
			return false
		}
	}
	for u, ub := range rp.Values {
		if u != v && ub.Kind == passes.BufTemp && ub.Space == b.Space && ub.Size > 0 && ub.Offset < b.Offset+b.Size && b.Offset < ub.Offset+ub.Size {
			return false
		}
	}
	return true
}

// liveBytes computes, per step, the bytes in use in space s: arguments +
// outputs − aliases (base, always held) and the temps whose bars cover the
// step, each address once (the values of an in-place chain share theirs),
// with the first step where the sum is largest.
func liveBytes(w *walker, s ir.MemorySpace, steps int, base int64) (live []int64, peak int, peakBytes, peakTemp int64) {
	type bar struct {
		y    int64
		size int64
	}
	at := make([][]bar, steps)
	for _, e := range w.order {
		if e.space != s || !e.temp {
			continue
		}
		for _, sp := range e.Spans {
			end := sp.End
			if sp.Reserved >= 0 {
				end = sp.Reserved
			}
			for k := sp.Start; k <= end && k < steps; k++ {
				at[k] = append(at[k], bar{sp.Y, e.Bytes})
			}
		}
	}
	live = make([]int64, steps)
	for k := range steps {
		seen := map[int64]bool{}
		var t int64
		for _, b := range at[k] {
			if b.size > 0 && seen[b.y] {
				continue
			}
			seen[b.y] = true
			t += b.size
		}
		live[k] = base + t
		if live[k] > peakBytes || k == 0 {
			peak, peakBytes, peakTemp = k, live[k], t
		}
	}
	return live, peak, peakBytes, peakTemp
}
