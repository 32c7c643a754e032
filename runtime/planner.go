package runtime

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// The memory budget's planner (MemoryBudget). It traces the function with
// every residual kept, compiles it and reads the memory analysis; over the
// budget, it orders the residuals the backward pass reads by estimated cost
// per byte saved (recompute: the op's arithmetic at the measured rates;
// offload: the transfers to pinned_host and back, less what the scan's
// compute hides), takes the cheapest option for each in that order, and
// searches (by bisection over that order, re-tracing and compiling each
// try) for the shortest prefix that fits. Recomputing a value can make its
// operands residuals: they join the order. maxPlanCompiles bounds the tries.

// maxPlanCompiles bounds the traces and compiles of one planning.
const maxPlanCompiles = 24

// candKey is a candidate's stable identity: (scan body, index in it).
type candKey struct{ scope, index int }

// candInfo is what one trace learns about a candidate.
type candInfo struct {
	op, typ, loc string
	name         string // the checkpoint name of a checkpoint_name op
	bytes        int64  // device bytes per iteration
	iters        int
	dot, elem    float64 // FLOPs per iteration (matrix products, the rest)
	carry        bool
	fromHost     bool // a device_put from pinned_host: recomputing it copies again
	device       bool // its results are on device (it can be offloaded)
	needed       bool // the backward pass reads it
}

// planTrace is the trace.RematPlanner of one trace: it answers from decide
// (absent: keep) and records the candidates.
type planTrace struct {
	decide map[candKey]trace.RematAction
	cands  map[candKey]*candInfo
	order  []candKey
	ref    map[candKey]*candInfo // a previous trace's, to check the identity
	err    error
}

func (p *planTrace) Decide(c trace.RematCandidate) trace.RematDecision {
	k := candKey{c.Scope, c.Index}
	op := c.Op
	info := &candInfo{op: op.Code.String(), loc: op.Loc, iters: max(c.Iterations, 1), carry: c.Carry, device: true}
	var types []string
	for _, r := range op.Results {
		types = append(types, r.Type.String())
		if r.Type.Space == ir.Device {
			info.bytes += r.Type.Bytes()
		} else {
			info.device = false
		}
	}
	info.typ = strings.Join(types, ", ")
	if op.Code == ir.CheckpointName && !c.Carry {
		info.name = op.Attrs.String("name")
	}
	cost := passes.OpCost(op)
	info.dot, info.elem = cost.DotFlops, cost.Flops-cost.DotFlops+cost.Transcendentals
	// Shape ops and copies count no FLOPs but write their results: at
	// least one elementwise operation per element written.
	elems := 0
	for _, r := range op.Results {
		elems += r.Type.Size()
	}
	info.elem = max(info.elem, float64(elems))
	info.fromHost = op.Code == ir.DevicePut && len(op.Args) == 1 && op.Args[0].Type.Space == ir.PinnedHost
	if r, ok := p.ref[k]; ok && p.err == nil && (r.op != info.op || r.typ != info.typ) {
		p.err = fmt.Errorf("the function traced differently on a retrace (scan %d value %d was %s %s at %s, now %s %s at %s): a function with a memory budget must trace the same way every time", k.scope, k.index, r.op, r.typ, r.loc, info.op, info.typ, info.loc)
	}
	if _, ok := p.cands[k]; !ok {
		p.order = append(p.order, k)
	}
	p.cands[k] = info
	a, ok := p.decide[k]
	if !ok && info.fromHost {
		// A copy from pinned_host is copied again rather than kept,
		// unless the plan says otherwise.
		a, ok = trace.Recompute, true
	}
	switch {
	case !ok:
	case a == trace.Recompute:
		if !info.carry {
			return trace.RematDecision{Action: trace.Recompute}
		}
	case a == trace.Offload:
		if info.device {
			return trace.RematDecision{Action: trace.Offload, Src: ir.Device, Dst: ir.PinnedHost}
		}
	}
	return trace.RematDecision{Action: trace.Save}
}

func (p *planTrace) Needed(scope, index int) {
	if c := p.cands[candKey{scope, index}]; c != nil {
		c.needed = true
	}
}

// planTry is one traced and compiled plan.
type planTry struct {
	decide  map[candKey]trace.RematAction
	pt      *planTrace
	l       *Lowered
	outDefs []*trace.TreeDef
	exe     Executable
	prog    *passes.Program
	total   int64
	cost    planCost
}

// planCost is a plan's estimate.
type planCost struct {
	compute, step float64
	per           map[candKey]float64 // seconds each decision adds
}

// estimate prices the decisions dec over the candidates cands of a trace
// whose arithmetic is base (see MemoryPlan's fields).
func estimate(cands map[candKey]*candInfo, dec map[candKey]trace.RematAction, base passes.Cost, r budgetRates) planCost {
	c := planCost{per: map[candKey]float64{}}
	c.compute = base.DotFlops/r.flop + (base.Flops-base.DotFlops+base.Transcendentals)/r.elem
	fwd := map[int]float64{}   // per scope: forward compute seconds per iteration
	xfer := map[int]float64{}  // per scope: one-way transfer seconds per iteration
	iters := map[int]float64{} // per scope
	for k, ci := range cands {
		fwd[k.scope] += ci.dot/r.flop + ci.elem/r.elem
		iters[k.scope] = float64(ci.iters)
	}
	extra := 0.0
	for k, ci := range cands {
		a, ok := dec[k]
		if !ok && ci.fromHost {
			a, ok = trace.Recompute, true // copied in again (planTrace.Decide)
		}
		if !ok {
			continue
		}
		switch {
		case a == trace.Recompute && !ci.carry:
			s := ci.dot/r.flop + ci.elem/r.elem
			if ci.fromHost {
				s = float64(ci.bytes) / r.bw
			}
			c.per[k] = s * float64(ci.iters)
			extra += c.per[k]
			fwd[k.scope] += 0 // recomputation runs in the backward pass
		case a == trace.Offload && ci.device:
			xfer[k.scope] += float64(ci.bytes) / r.bw
		}
	}
	for s, t := range xfer {
		// Out during the forward pass, back during the backward one (about
		// twice the forward's work): what the compute does not hide shows.
		shown := (math.Max(0, t-fwd[s]) + math.Max(0, t-2*fwd[s])) * iters[s]
		extra += shown
		for k, a := range dec {
			if ci := cands[k]; ci != nil && k.scope == s && a == trace.Offload && ci.device && t > 0 {
				c.per[k] = shown * float64(ci.bytes) / r.bw / t
			}
		}
	}
	c.step = c.compute + extra
	return c
}

// lowerBudget traces and compiles the function under plans until it finds
// the fastest that fits budget, and returns its Lowered (with the plan).
// It plans the residuals with the arguments where the caller put them;
// when no such plan fits, it places the arguments the program reads only
// as scans' xs (stacked layer weights) in pinned_host and plans again.
func (j *Jitted[F]) lowerBudget(args []any, budget int64) (*Lowered, []*trace.TreeDef, error) {
	rates := measuredRates()
	compiles := 0
	base, full, fits, err := j.searchPlans(args, budget, nil, 0, rates, &compiles)
	if err != nil {
		return nil, nil, err
	}
	host := map[int]string{} // argument leaves placed in pinned_host: the action
	if len(fits) == 0 {
		leaves, _, _ := flattenArgs(args)
		weakArgs := make([]bool, len(leaves))
		for i, l := range leaves {
			weakArgs[i] = l != nil && l.IsWeak()
		}
		// First the stacked weights; then the optimizer state too.
		streamed := streamedArgs(base.l.Func, base.l.numArgs, weakArgs)
		state := stateArgs(base.l.Func, base.l.argDefs, base.outDefs, base.l.donated, weakArgs)
		var stages []map[int]string
		if len(streamed) > 0 {
			m := map[int]string{}
			for _, i := range streamed {
				m[i] = passes.ActionHostArgument
			}
			stages = append(stages, m)
		}
		if len(state) > 0 {
			m := map[int]string{}
			for _, i := range streamed {
				m[i] = passes.ActionHostArgument
			}
			for _, i := range state {
				m[i] = passes.ActionHostState
			}
			stages = append(stages, m)
		}
		for _, m := range stages {
			mask := make([]bool, base.l.numArgs)
			secs := 0.0
			for i, a := range m {
				mask[i] = true
				// Streamed weights are copied in once in the forward
				// pass (the backward pass's copies are stream values);
				// state is copied in and its new value out.
				n := 1.0
				if a == passes.ActionHostState {
					n = 2
				}
				secs += n * float64(leaves[i].Type().Bytes()) / rates.bw
			}
			var hfull *planTry
			if _, hfull, fits, err = j.searchPlans(args, budget, mask, secs, rates, &compiles); err != nil {
				return nil, nil, err
			}
			if hfull.total < full.total {
				full = hfull
			}
			if len(fits) > 0 {
				host = m
				break
			}
		}
	}
	if len(fits) == 0 {
		return nil, nil, j.budgetError(budget, base.total, full)
	}
	best := slices.MinFunc(fits, func(a, b *planTry) int { return cmp.Compare(a.cost.step, b.cost.step) })
	best.l.plan = buildPlan(best, host, base.total, budget, rates, compiles)
	if !settings.DumpIR.IsSet() {
		// Nothing to dump: the try's executable is the one to run.
		best.prog.Analysis.Plan = best.l.plan
		best.l.planned = best.exe
	}
	return best.l, best.outDefs, nil
}

// searchPlans plans the residuals with the argument leaves host marks in
// pinned_host (their transfers estimated at hostSecs per call): it returns
// the plan with everything kept (base), the one with every residual it can
// plan recomputed or offloaded (full, the smallest total), and the tries
// that fit budget (none when full does not).
func (j *Jitted[F]) searchPlans(args []any, budget int64, host []bool, hostSecs float64, rates budgetRates, compiles *int) (base, full *planTry, fits []*planTry, err error) {
	var ref map[candKey]*candInfo
	try := func(dec map[candKey]trace.RematAction) (*planTry, error) {
		*compiles++
		pt := &planTrace{decide: dec, cands: map[candKey]*candInfo{}, ref: ref}
		l, outDefs, err := j.lowerWith(args, pt, host)
		if err != nil {
			return nil, err
		}
		if pt.err != nil {
			return nil, trace.Errorf("rt.Jit", "%s: MemoryBudget: %v", j.opts.name, pt.err)
		}
		exe, err := compileFunc(DefaultBackend(), l.Func, CompileOptions{Donated: l.donated, NoDump: true})
		if err != nil {
			return nil, err
		}
		prog := exe.Program()
		t := &planTry{decide: dec, pt: pt, l: l, outDefs: outDefs, exe: exe, prog: prog, total: prog.Analysis.TotalBytes()}
		t.cost = estimate(pt.cands, dec, passes.CostAnalysis(l.Func), rates)
		t.cost.step += hostSecs
		return t, nil
	}
	if base, err = try(nil); err != nil {
		return nil, nil, nil, err
	}
	ref = base.pt.cands
	if base.total <= budget {
		return base, base, []*planTry{base}, nil
	}

	// The order: greedily the cheapest option per byte saved, given the
	// options already taken.
	dec := map[candKey]trace.RematAction{}
	var seq []candKey
	var seqAct []trace.RematAction
	extend := func(t *planTry) int {
		var pending []candKey
		for _, k := range t.pt.order {
			ci := t.pt.cands[k]
			if _, done := dec[k]; !done && ci.needed && ci.bytes > 0 {
				pending = append(pending, k)
			}
		}
		n := 0
		for len(pending) > 0 {
			cur := estimate(t.pt.cands, dec, passes.Cost{}, rates).step
			bi, ba, bcost := -1, trace.Save, math.Inf(1)
			for i, k := range pending {
				ci := t.pt.cands[k]
				for _, a := range []trace.RematAction{trace.Recompute, trace.Offload} {
					if a == trace.Recompute && ci.carry || a == trace.Offload && !ci.device {
						continue
					}
					dec[k] = a
					d := (estimate(t.pt.cands, dec, passes.Cost{}, rates).step - cur) / float64(ci.bytes*int64(ci.iters))
					delete(dec, k)
					if d < bcost {
						bi, ba, bcost = i, a, d
					}
				}
			}
			if bi < 0 {
				break
			}
			k := pending[bi]
			dec[k] = ba
			seq, seqAct = append(seq, k), append(seqAct, ba)
			pending = slices.Delete(pending, bi, bi+1)
			n++
		}
		return n
	}
	prefix := func(n int) map[candKey]trace.RematAction {
		m := make(map[candKey]trace.RematAction, n)
		for i := range n {
			m[seq[i]] = seqAct[i]
		}
		return m
	}
	extend(base)
	full = base
	for round := 0; round < 4 && len(seq) > 0; round++ {
		if full, err = try(prefix(len(seq))); err != nil {
			return nil, nil, nil, err
		}
		if extend(full) == 0 {
			break
		}
	}
	if full.total > budget {
		// The greedy order's choice between recomputing and offloading
		// follows the measured rates, which vary with the machine's load;
		// the extremes (offload all it can, recompute all it can) may reach
		// lower: the smallest plan found must not depend on the rates.
		for _, pref := range []trace.RematAction{trace.Offload, trace.Recompute} {
			alt, altSeq, altAct, err := extremePlan(try, base, pref)
			if err != nil {
				return nil, nil, nil, err
			}
			if alt.total < full.total {
				full, seq, seqAct = alt, altSeq, altAct
			}
			if full.total <= budget {
				break
			}
		}
	}
	if full.total > budget {
		return base, full, nil, nil
	}
	// The shortest prefix that fits, by bisection (the tries that fit are
	// kept: the fastest estimate wins).
	fits = []*planTry{full}
	lo, hi := 0, len(seq)
	for limit := *compiles + maxPlanCompiles; hi-lo > 1 && *compiles < limit; {
		mid := (lo + hi) / 2
		t, err := try(prefix(mid))
		if err != nil {
			return nil, nil, nil, err
		}
		if t.total <= budget {
			hi = mid
			fits = append(fits, t)
		} else {
			lo = mid
		}
	}
	return base, full, fits, nil
}

// buildPlan describes try t, with the argument leaves host places in
// pinned_host, as a MemoryPlan.
func buildPlan(t *planTry, host map[int]string, baseline, budget int64, r budgetRates, compiles int) *passes.MemoryPlan {
	p := &passes.MemoryPlan{Budget: budget, BaselineBytes: baseline, TotalBytes: t.total,
		ComputeSeconds: t.cost.compute, StepSeconds: t.cost.step,
		FlopRate: r.flop, ElementRate: r.elem, Bandwidth: r.bw, Compiles: compiles}
	for _, i := range slices.Sorted(maps.Keys(host)) {
		typ := t.l.Func.Body.Params[i].Type
		secs := float64(typ.Bytes()) / r.bw
		if host[i] == passes.ActionHostState {
			secs *= 2
		}
		p.Values = append(p.Values, passes.PlannedValue{Scope: -1, Index: i, Op: "argument", Type: typ.String(), Loc: t.l.leafName(i),
			Action: host[i], Iterations: 1, Bytes: typ.Bytes(), Seconds: secs})
	}
	for _, k := range t.pt.order {
		ci := t.pt.cands[k]
		a, decided := t.decide[k]
		if !ci.needed && !decided && !ci.fromHost || ci.bytes == 0 {
			continue
		}
		action := "keep"
		switch {
		case !decided && ci.fromHost:
			action = "stream"
		case decided && a == trace.Offload && ci.device:
			action = "offload"
		case decided && a == trace.Recompute && !ci.carry:
			action = "recompute"
		}
		flops := 0.0
		if action == "recompute" {
			flops = (ci.dot + ci.elem) * float64(ci.iters)
		}
		p.Values = append(p.Values, passes.PlannedValue{Scope: k.scope, Index: k.index, Op: ci.op, Type: ci.typ, Loc: ci.loc, Name: ci.name,
			Carry: ci.carry, Action: action, Iterations: ci.iters, Bytes: ci.bytes * int64(ci.iters), Seconds: t.cost.per[k], Flops: flops})
	}
	return p
}

// MemoryBudgetError says that no plan fits a memory budget: Minimum is the
// smallest device total the planner reached (every residual it could
// recompute or offload so), and Dominant lists what fills it.
type MemoryBudgetError struct {
	Function         string
	Budget, Baseline int64
	Minimum          int64
	Analysis         passes.MemoryAnalysis // at the minimum
	Dominant         []string              // the largest device buffers there, with op and location
}

func (e *MemoryBudgetError) Error() string {
	hint := ""
	if io := e.Analysis.ArgumentBytes + e.Analysis.OutputBytes - e.Analysis.AliasBytes; 2*io > e.Minimum {
		hint = fmt.Sprintf("; arguments and results are %s of it, and the planner moves to pinned_host only stacked layer weights (arguments read only as scans' xs) and optimizer state (donated arguments read elementwise and returned updated at the same position): other arguments can live there by hand (rt.DevicePut, optim.InitIn, rt.OutSpace)", fmtBytes(io))
	}
	return fmt.Sprintf("rt.Jit: %s: no plan fits the memory budget of %s: the smallest budget that fits is %s, with every residual it plans recomputed or offloaded (%s with everything kept); at that plan the device total is argument %s + output %s + temp %s − alias %s; largest device buffers: %s%s",
		e.Function, exactBytes(e.Budget), exactBytes(e.Minimum), exactBytes(e.Baseline),
		fmtBytes(e.Analysis.ArgumentBytes), fmtBytes(e.Analysis.OutputBytes), fmtBytes(e.Analysis.TempBytes), fmtBytes(e.Analysis.AliasBytes), strings.Join(e.Dominant, "; "), hint)
}

// fmtBytes prints a byte count in the unit that fits it ("512 B", "48.1 MiB").
func fmtBytes(n int64) string { return backend.FormatBytes(n) }

// exactBytes is fmtBytes followed by the exact count where fmtBytes rounds
// it: "512 B", "4.5 KiB (4608 bytes)".
func exactBytes(n int64) string {
	if n > -1024 && n < 1024 {
		return fmtBytes(n)
	}
	return fmt.Sprintf("%s (%d bytes)", fmtBytes(n), n)
}

// budgetError builds the error for a budget below the minimum plan t.
func (j *Jitted[F]) budgetError(budget, baseline int64, t *planTry) error {
	e := &MemoryBudgetError{Function: j.opts.name, Budget: budget, Baseline: baseline, Minimum: t.total, Analysis: t.prog.Analysis}
	type buf struct {
		size int64
		what string
	}
	var bufs []buf
	seen := map[*ir.Value]bool{}
	var walk func(rp *passes.RegionPlan, top bool)
	walk = func(rp *passes.RegionPlan, top bool) {
		if rp == nil {
			return
		}
		for v, b := range rp.Values {
			// Nested regions' parameters are views of buffers counted
			// where they live.
			if b.Space != ir.Device || seen[v] || b.Kind == passes.BufSlice || !top && b.Kind == passes.BufParam {
				continue
			}
			seen[v] = true
			what := fmt.Sprintf("%s %v", b.Kind, v.Type)
			if v.Op != nil {
				what += " from " + v.Op.Code.String()
				if v.Op.Loc != "" {
					what += " at " + v.Op.Loc
				}
			} else if b.Kind == passes.BufParam {
				what += fmt.Sprintf(" (argument %d)", b.Index)
			}
			bufs = append(bufs, buf{b.Size, what})
		}
		for _, subs := range rp.Sub {
			for _, s := range subs {
				walk(s, false)
			}
		}
	}
	walk(t.prog.Plan, true)
	slices.SortFunc(bufs, func(a, b buf) int {
		return cmp.Or(cmp.Compare(b.size, a.size), strings.Compare(a.what, b.what))
	})
	for i, b := range bufs {
		if i == 5 {
			break
		}
		e.Dominant = append(e.Dominant, fmt.Sprintf("%s %s", fmtBytes(b.size), b.what))
	}
	return e
}

// MemoryPlan returns what the memory budget decided (MemoryBudget), or nil
// for a function compiled without one.
func (c *Compiled) MemoryPlan() *passes.MemoryPlan { return c.MemoryAnalysis().Plan }

// extremePlan decides every residual the backward pass reads (in trace
// order, with the ones that recomputations make necessary, over a few
// rounds) with action pref where it applies (recompute: not a carry;
// offload: a device value), else with the other action, and returns the
// last try with its order and actions.
func extremePlan(try func(map[candKey]trace.RematAction) (*planTry, error), base *planTry, pref trace.RematAction) (*planTry, []candKey, []trace.RematAction, error) {
	dec := map[candKey]trace.RematAction{}
	var seq []candKey
	var acts []trace.RematAction
	t := base
	for round := 0; round < 4; round++ {
		added := 0
		for _, k := range t.pt.order {
			ci := t.pt.cands[k]
			if _, done := dec[k]; done || !ci.needed || ci.bytes <= 0 {
				continue
			}
			canRecompute, canOffload := !ci.carry, ci.device
			a := pref
			switch {
			case pref == trace.Offload && !canOffload || pref == trace.Recompute && !canRecompute:
				if a = trace.Recompute; pref == trace.Recompute {
					a = trace.Offload
				}
				if a == trace.Recompute && !canRecompute || a == trace.Offload && !canOffload {
					continue
				}
			}
			dec[k] = a
			seq, acts = append(seq, k), append(acts, a)
			added++
		}
		if added == 0 {
			break
		}
		var err error
		if t, err = try(maps.Clone(dec)); err != nil {
			return nil, nil, nil, err
		}
	}
	return t, seq, acts, nil
}
