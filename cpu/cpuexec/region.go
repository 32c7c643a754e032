package cpuexec

import (
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// slot is one value of a region that has a buffer.
type slot struct {
	v    *ir.Value
	buf  passes.Buffer
	size int64 // bytes of v's type
}

// stepKind says how a step runs.
type stepKind uint8

const (
	stepOp     stepKind = iota // eval.EvalOpInto
	stepFusion                 // a fused block program
	stepScan
	stepWhile
	stepCond
	stepCopy       // a device_put between memory spaces (copy.go)
	stepCollective // a collective op over the execution's communicators (collective.go)
)

// step is one op of a region.
type step struct {
	op     *ir.Op
	kind   stepKind
	args   []int        // slots of the operands
	outs   []int        // slots of the results
	kernel *eval.Kernel // stepOp
	fused  *fusedKernel
	coll   *collStep // stepCollective
	subs   []*region // nested regions (scan: body; while: cond, body; cond: true, false)
	subOff [2]int64  // where the nested arenas start in this region's arena
	// stepCopy: the direction; whether a scan iteration may find its copy
	// prefetched by the previous one.
	dir        copyDir
	prefetched bool
	// waits lists copy steps to wait for before this step runs; prefetch the
	// double-buffered copies whose next-iteration copy starts after it.
	waits    []int
	prefetch []prefetch
}

// region is a compiled region: the slot of every value with a buffer and the
// steps in execution order.
type region struct {
	r       *ir.Region
	plan    *passes.RegionPlan
	slots   []slot
	slotOf  map[*ir.Value]int
	params  []int    // slot of each parameter
	derived [][]int  // per parameter: other slots that live in its memory
	results []int    // slot of each region result
	slices  [][2]int // scan body: {slot, result index} of values planned in ys slices
	steps   []step
	// endWaits lists the copy steps waited for only at the end of the region.
	endWaits []int
}

// compileRegion prepares region r with plan. top says whether r is the
// function body (where outputs and aliases exist); donated reports donated
// parameters; ysFrom ≥ 0 marks a scan body whose results from ysFrom on are
// ys (where BufSlice values may exist).
func compileRegion(r *ir.Region, plan *passes.RegionPlan, top bool, ysFrom int, donated func(int) bool) (*region, error) {
	if plan == nil {
		return nil, fmt.Errorf("region has no plan")
	}
	if plan.Region != nil && plan.Region != r {
		return nil, fmt.Errorf("plan belongs to another region")
	}
	g := &region{r: r, plan: plan, slotOf: map[*ir.Value]int{}}
	addSlot := func(v *ir.Value) (int, error) {
		if s, ok := g.slotOf[v]; ok {
			return s, nil
		}
		b, ok := plan.Values[v]
		if !ok && v.Op == nil {
			// Parameters are where the caller says; a plan may omit them.
			b, ok = passes.Buffer{Kind: passes.BufParam, Space: v.Type.Space, Index: v.Index, Size: v.Type.Bytes()}, true
		}
		if !ok {
			return 0, fmt.Errorf("%v (%v) has no buffer", v, v.Type)
		}
		size := v.Type.Bytes()
		if b.Size != 0 && b.Size < size {
			return 0, fmt.Errorf("%v (%v, %d bytes) has a %d-byte buffer", v, v.Type, size, b.Size)
		}
		if b.Space >= 2 {
			return 0, fmt.Errorf("%v: bad memory space %v", v, b.Space)
		}
		switch b.Kind {
		case passes.BufParam:
			if b.Index < 0 || b.Index >= len(r.Params) {
				return 0, fmt.Errorf("%v: parameter buffer %d out of range", v, b.Index)
			}
			if v.Op == nil && r.Params[b.Index] != v {
				return 0, fmt.Errorf("parameter %v has the buffer of parameter %d", v, b.Index)
			}
			if v.Op != nil && top && !donated(b.Index) {
				return 0, fmt.Errorf("%v is planned into parameter %d, which is not donated", v, b.Index)
			}
			if v.Op != nil && r.Params[b.Index].Type.Bytes() < size {
				return 0, fmt.Errorf("%v (%d bytes) does not fit parameter %d", v, size, b.Index)
			}
		case passes.BufTemp:
			if b.Offset < 0 || b.Offset+size > plan.Arena[b.Space] {
				return 0, fmt.Errorf("%v: [%d, %d) is outside the %d-byte %v arena", v, b.Offset, b.Offset+size, plan.Arena[b.Space], b.Space)
			}
		case passes.BufSlice:
			if ysFrom < 0 || b.Index < ysFrom || b.Index >= len(r.Results) || r.Results[b.Index] != v || v.Op == nil {
				return 0, fmt.Errorf("%v: ys slice of result %d is not a y of this scan body", v, b.Index)
			}
			for j, w := range r.Results {
				if w == v && j != b.Index {
					return 0, fmt.Errorf("%v: ys slice of result %d is also result %d", v, b.Index, j)
				}
			}
		case passes.BufOutput:
			if !top {
				return 0, fmt.Errorf("%v: output buffer inside a nested region", v)
			}
			if b.Index < 0 || b.Index >= len(r.Results) {
				return 0, fmt.Errorf("%v: output %d out of range", v, b.Index)
			}
		case passes.BufAlias:
			if !top {
				return 0, fmt.Errorf("%v: alias buffer inside a nested region", v)
			}
			if !donated(b.Param) || b.Param >= len(r.Params) {
				return 0, fmt.Errorf("%v aliases parameter %d, which is not donated", v, b.Param)
			}
			if r.Params[b.Param].Type.Bytes() < size {
				return 0, fmt.Errorf("%v (%d bytes) does not fit donated parameter %d", v, size, b.Param)
			}
		default:
			return 0, fmt.Errorf("%v: unknown buffer kind %v", v, b.Kind)
		}
		g.slots = append(g.slots, slot{v: v, buf: b, size: size})
		g.slotOf[v] = len(g.slots) - 1
		return len(g.slots) - 1, nil
	}
	for i, p := range r.Params {
		if b, ok := plan.Values[p]; ok && (b.Kind != passes.BufParam || b.Index != i) {
			return nil, fmt.Errorf("parameter %d (%v) is planned as %v %d", i, p, b.Kind, b.Index)
		}
		s, err := addSlot(p)
		if err != nil {
			return nil, err
		}
		g.params = append(g.params, s)
	}
	for _, op := range r.Ops {
		st := step{op: op}
		for j, a := range op.Args {
			s, ok := g.slotOf[a]
			if !ok {
				return nil, fmt.Errorf("%s: operand %d (%v) is not defined before use", op.Describe(), j, a)
			}
			st.args = append(st.args, s)
		}
		for _, v := range op.Results {
			s, err := addSlot(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op.Describe(), err)
			}
			st.outs = append(st.outs, s)
		}
		if dir, ok := crossSpaceCopy(op); ok {
			st.kind, st.dir = stepCopy, dir
			g.steps = append(g.steps, st)
			continue
		}
		switch {
		case op.Code.IsCollective():
			st.kind = stepCollective
			c, err := prepareCollective(op)
			if err != nil {
				return nil, err
			}
			st.coll = c
		case op.Code == ir.Fusion:
			st.kind = stepFusion
			k, err := compileFusion(op)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", op.Describe(), err)
			}
			st.fused = k
		case op.Code == ir.Scan, op.Code == ir.While, op.Code == ir.Cond:
			st.kind = map[ir.Code]stepKind{ir.Scan: stepScan, ir.While: stepWhile, ir.Cond: stepCond}[op.Code]
			subs := plan.Sub[op]
			if len(subs) != len(op.Regions) {
				return nil, fmt.Errorf("%s: %d nested plans for %d regions", op.Describe(), len(subs), len(op.Regions))
			}
			st.subOff = plan.SubOffset[op]
			for k, sr := range op.Regions {
				for sp := range 2 {
					if st.subOff[sp] < 0 || st.subOff[sp]+subs[k].Arena[sp] > plan.Arena[sp] {
						return nil, fmt.Errorf("%s: nested arena [%d, %d) is outside the %d-byte %v arena", op.Describe(),
							st.subOff[sp], st.subOff[sp]+subs[k].Arena[sp], plan.Arena[sp], ir.MemorySpace(sp))
					}
				}
				ys := -1
				if op.Code == ir.Scan {
					ys = op.Attrs.Int("num_carry")
				}
				sub, err := compileRegion(sr, subs[k], false, ys, donated)
				if err != nil {
					return nil, fmt.Errorf("%s, region %d: %w", op.Describe(), k, err)
				}
				if op.Code == ir.Scan {
					planPrefetch(sub, op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry"))
				}
				st.subs = append(st.subs, sub)
			}
			if err := checkRegionOp(op, st.subs); err != nil {
				return nil, fmt.Errorf("%s: %w", op.Describe(), err)
			}
		default:
			if op.Code.Info().NumRegions > 0 {
				return nil, fmt.Errorf("%s: no executor for region op", op.Describe())
			}
			k, err := eval.Prepare(op)
			if err != nil {
				return nil, err
			}
			st.kernel = k
		}
		g.steps = append(g.steps, st)
	}
	for i, v := range r.Results {
		s, ok := g.slotOf[v]
		if !ok {
			return nil, fmt.Errorf("result %d (%v) is not defined", i, v)
		}
		g.results = append(g.results, s)
	}
	g.derived = make([][]int, len(r.Params))
	for s, sl := range g.slots {
		if sl.buf.Kind == passes.BufParam && sl.v.Op != nil {
			g.derived[sl.buf.Index] = append(g.derived[sl.buf.Index], s)
		}
		if sl.buf.Kind == passes.BufSlice {
			g.slices = append(g.slices, [2]int{s, sl.buf.Index})
		}
	}
	copyWaits(g)
	return g, nil
}

// checkRegionOp checks the shapes the loops rely on.
func checkRegionOp(op *ir.Op, subs []*region) error {
	switch op.Code {
	case ir.Scan:
		nc, nk := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
		body := subs[0].r
		if len(body.Params) != len(op.Args) || len(body.Results) != len(op.Results) || nc+nk > len(op.Args) {
			return fmt.Errorf("scan body does not match the op")
		}
	case ir.While:
		if len(subs[0].r.Results) != 1 || len(subs[1].r.Results) != len(op.Results) {
			return fmt.Errorf("while regions do not match the op")
		}
	case ir.Cond:
		for _, s := range subs {
			if len(s.r.Results) != len(op.Results) {
				return fmt.Errorf("cond branch does not match the op")
			}
		}
	}
	return nil
}

// frame is one activation of a region: a literal view per slot, the operand
// and result lists of every step, and nested frames made on first use.
type frame struct {
	g     *region
	cfg   *copyConfig
	env   *collEnv // the execution's communicators (nil without collectives)
	arena [2][]byte
	lits  []ir.Literal
	args  [][]*ir.Literal
	outs  [][]*ir.Literal
	subs  [][]*frame   // per step, per nested region (made on first use)
	stage [][][]byte   // per step: staging copies of region results (made on first use)
	ev    []*copyEvent // per copy step: its copy, until waited for
	pre   []*copyEvent // per copy step: its copy started by the previous iteration
	next  [][]byte     // scan body: per xs parameter, the next iteration's slice
}

// newFrame makes the views of g's temporaries in arena (the region's own
// arena per space); parameters, outputs and aliases are set by the caller.
func newFrame(g *region, arena [2][]byte, cfg *copyConfig, env *collEnv) *frame {
	// The per-step slices share backing arrays (full slice expressions keep
	// them apart): a frame is made per execution unless one is reused
	// (Executable.getFrame), so allocations count.
	n := len(g.steps)
	f := &frame{g: g, lits: make([]ir.Literal, len(g.slots))}
	events := make([]*copyEvent, 2*n)
	f.ev, f.pre = events[:n:n], events[n:]
	f.next = make([][]byte, len(g.params))
	for s, sl := range g.slots {
		f.lits[s].Type = sl.v.Type
	}
	lists := make([][]*ir.Literal, 2*n)
	f.args, f.outs = lists[:n:n], lists[n:]
	total := 0
	for _, st := range g.steps {
		total += len(st.args) + len(st.outs)
	}
	ptrs := make([]*ir.Literal, total)
	take := func(m int) []*ir.Literal {
		p := ptrs[:m:m]
		ptrs = ptrs[m:]
		return p
	}
	for i, st := range g.steps {
		f.args[i] = take(len(st.args))
		for j, s := range st.args {
			f.args[i][j] = &f.lits[s]
		}
		f.outs[i] = take(len(st.outs))
		for j, s := range st.outs {
			f.outs[i][j] = &f.lits[s]
		}
	}
	f.bind(arena, cfg, env)
	return f
}

// bind points f (and the nested frames made so far) at new arenas: the
// temporaries become views into arena, every other slot is unset until the
// caller sets parameters, outputs and aliases.
func (f *frame) bind(arena [2][]byte, cfg *copyConfig, env *collEnv) {
	f.arena, f.cfg, f.env = arena, cfg, env
	for s, sl := range f.g.slots {
		f.lits[s].Data = nil
		if sl.buf.Kind == passes.BufTemp {
			f.lits[s].Data = arena[sl.buf.Space][sl.buf.Offset : sl.buf.Offset+sl.size : sl.buf.Offset+sl.size]
		}
	}
	clear(f.next)
	for i, subs := range f.subs {
		for k, sub := range subs {
			if sub != nil {
				sub.bind(f.subArena(i, k), cfg, env)
			}
		}
	}
}

// unbind drops f's views (recursively), so that a frame kept for reuse
// holds no memory of the arrays of the execution that used it.
func (f *frame) unbind() {
	f.arena, f.cfg, f.env = [2][]byte{}, nil, nil
	for s := range f.lits {
		f.lits[s].Data = nil
	}
	clear(f.next)
	for _, subs := range f.subs {
		for _, sub := range subs {
			if sub != nil {
				sub.unbind()
			}
		}
	}
}

// setParam points parameter i (and values planned into its memory) at data.
func (f *frame) setParam(i int, data []byte) {
	f.lits[f.g.params[i]].Data = data
	for _, s := range f.g.derived[i] {
		f.lits[s].Data = data[:f.g.slots[s].size:f.g.slots[s].size]
	}
}

// refresh re-derives the views of values planned into parameter memory.
func (f *frame) refresh() {
	for i := range f.g.params {
		f.setParam(i, f.lits[f.g.params[i]].Data)
	}
}

// sub returns the frame of nested region k of step i, making it on first use.
func (f *frame) sub(i, k int) *frame {
	if f.subs == nil {
		f.subs = make([][]*frame, len(f.g.steps))
	}
	if f.subs[i] == nil {
		f.subs[i] = make([]*frame, len(f.g.steps[i].subs))
	}
	if f.subs[i][k] == nil {
		f.subs[i][k] = newFrame(f.g.steps[i].subs[k], f.subArena(i, k), f.cfg, f.env)
	}
	return f.subs[i][k]
}

// subArena is the arena of nested region k of step i inside f's.
func (f *frame) subArena(i, k int) [2][]byte {
	st := &f.g.steps[i]
	var arena [2][]byte
	for sp := range arena {
		off := st.subOff[sp]
		arena[sp] = f.arena[sp][off : off+st.subs[k].plan.Arena[sp]]
	}
	return arena
}

// run executes the steps of the region. Every copy it starts is complete
// when it returns (prefetches of the next iteration aside).
func (f *frame) run() error {
	defer f.waitAll()
	for i := range f.g.steps {
		st := &f.g.steps[i]
		f.waitCopies(st.waits)
		var err error
		switch st.kind {
		case stepCopy:
			f.runCopy(i)
		case stepCollective:
			err = f.runCollective(i)
		case stepOp:
			err = st.kernel.Into(f.args[i], f.outs[i])
		case stepFusion:
			err = st.fused.run(f.args[i], f.outs[i])
			if err != nil {
				err = fmt.Errorf("%s: %w", st.op.Describe(), err)
			}
		case stepScan:
			err = f.runScan(i)
		case stepWhile:
			err = f.runWhile(i)
		case stepCond:
			err = f.runCond(i)
		}
		if err != nil {
			return err
		}
		if len(st.prefetch) > 0 {
			f.startPrefetches(i)
		}
	}
	f.waitCopies(f.g.endWaits)
	return nil
}

// result returns the memory of result j of the region.
func (f *frame) result(j int) []byte { return f.lits[f.g.results[j]].Data }

func (f *frame) runScan(i int) error {
	st := &f.g.steps[i]
	op := st.op
	nc, nk, n := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry"), op.Attrs.Int("length")
	reverse := op.Attrs.Bool("reverse")
	args, outs := f.args[i], f.outs[i]
	for j := 0; j < nk; j++ {
		copyMem(outs[j].Data, args[nc+j].Data)
	}
	if n == 0 {
		return nil
	}
	body := f.sub(i, 0)
	for k := 0; k < nc; k++ {
		body.setParam(k, args[k].Data)
	}
	for j := 0; j < nk; j++ {
		body.setParam(nc+j, outs[j].Data)
	}
	nx := len(args) - nc - nk
	ny := len(outs) - nk
	defer body.drainPrefetches()
	dst := make([][]byte, nk+ny)
	src := make([][]byte, nk+ny)
	for j := 0; j < nk; j++ {
		dst[j] = outs[j].Data
	}
	for it := 0; it < n; it++ {
		idx := it
		if reverse {
			idx = n - 1 - it
		}
		nextIdx := idx + 1
		if reverse {
			nextIdx = idx - 1
		}
		for j := 0; j < nx; j++ {
			xs := args[nc+nk+j].Data
			sz := len(xs) / n
			body.setParam(nc+nk+j, xs[idx*sz:(idx+1)*sz:(idx+1)*sz])
			body.next[nc+nk+j] = nil
			if f.cfg.async && it+1 < n {
				body.next[nc+nk+j] = xs[nextIdx*sz : (nextIdx+1)*sz : (nextIdx+1)*sz]
			}
		}
		for j := 0; j < ny; j++ {
			ys := outs[nk+j].Data
			sz := len(ys) / n
			dst[nk+j] = ys[idx*sz : (idx+1)*sz]
		}
		// Values planned in ys slices are computed there (their copy
		// below is then a no-op).
		for _, sj := range body.g.slices {
			size := body.g.slots[sj[0]].size
			body.lits[sj[0]].Data = dst[sj[1]][:size:size]
		}
		if err := body.run(); err != nil {
			return fmt.Errorf("%s: body, iteration %d: %w", op.Describe(), idx, err)
		}
		for j := range src {
			src[j] = body.result(j)
		}
		f.copyResults(i, dst, src)
	}
	return nil
}

func (f *frame) runWhile(i int) error {
	st := &f.g.steps[i]
	op := st.op
	nc := op.Attrs.Int("num_consts")
	args, outs := f.args[i], f.outs[i]
	for j := range outs {
		copyMem(outs[j].Data, args[nc+j].Data)
	}
	cond, body := f.sub(i, 0), f.sub(i, 1)
	for k := 0; k < nc; k++ {
		cond.setParam(k, args[k].Data)
		body.setParam(k, args[k].Data)
	}
	dst := make([][]byte, len(outs))
	src := make([][]byte, len(outs))
	for j := range outs {
		cond.setParam(nc+j, outs[j].Data)
		body.setParam(nc+j, outs[j].Data)
		dst[j] = outs[j].Data
	}
	for it := 0; ; it++ {
		if err := cond.run(); err != nil {
			return fmt.Errorf("%s: cond, iteration %d: %w", op.Describe(), it, err)
		}
		if p := cond.result(0); len(p) == 0 || p[0] == 0 {
			return nil
		}
		if err := body.run(); err != nil {
			return fmt.Errorf("%s: body, iteration %d: %w", op.Describe(), it, err)
		}
		for j := range src {
			src[j] = body.result(j)
		}
		f.copyResults(i, dst, src)
	}
}

func (f *frame) runCond(i int) error {
	st := &f.g.steps[i]
	args, outs := f.args[i], f.outs[i]
	k, name := 1, "false branch"
	if args[0].Data[0] != 0 {
		k, name = 0, "true branch"
	}
	br := f.sub(i, k)
	for j, a := range args[1:] {
		br.setParam(j, a.Data)
	}
	if err := br.run(); err != nil {
		return fmt.Errorf("%s: %s: %w", st.op.Describe(), name, err)
	}
	dst := make([][]byte, len(outs))
	src := make([][]byte, len(outs))
	for j := range outs {
		dst[j], src[j] = outs[j].Data, br.result(j)
	}
	f.copyResults(i, dst, src)
	return nil
}

// copyResults copies src[j] into dst[j] for every j as if all sources were
// read before any destination is written: a source that overlaps another
// result's destination is first copied into a staging buffer of step i.
func (f *frame) copyResults(i int, dst, src [][]byte) {
	if f.stage == nil {
		f.stage = make([][][]byte, len(f.g.steps))
	}
	if f.stage[i] == nil {
		f.stage[i] = make([][]byte, len(dst))
	}
	for k := range src {
		for j := range dst {
			if j != k && overlaps(dst[j], src[k]) {
				if cap(f.stage[i][k]) < len(src[k]) {
					f.stage[i][k] = make([]byte, len(src[k]))
				}
				s := f.stage[i][k][:len(src[k])]
				copy(s, src[k])
				src[k] = s
				break
			}
		}
	}
	for j := range dst {
		copyMem(dst[j], src[j])
	}
}

// copyMem copies src to dst unless they are the same memory.
func copyMem(dst, src []byte) {
	if len(dst) > 0 && len(src) > 0 && &dst[0] == &src[0] {
		return
	}
	copy(dst, src)
}

// overlaps reports whether two byte slices share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}
