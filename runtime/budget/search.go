package budget

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// candKey is a candidate's stable identity: (scan body, index in it).
type candKey struct{ scope, index int }

// sortedKeys returns the keys of m by scope, then index: sums over
// candidates run in this order, so an estimate is the same to the last bit
// in every run.
func sortedKeys[V any](m map[candKey]V) []candKey {
	ks := slices.Collect(maps.Keys(m))
	slices.SortFunc(ks, func(a, b candKey) int {
		if a.scope != b.scope {
			return a.scope - b.scope
		}
		return a.index - b.index
	})
	return ks
}

// candInfo is what one trace learns about a candidate.
type candInfo struct {
	op, typ, loc string
	name         string // the checkpoint name of a checkpoint_name op
	bytes        int64  // device bytes per iteration
	results      []ir.Type
	iters        int
	dot, elem    float64 // FLOPs per iteration (matrix products, the rest)
	carry        bool
	fromHost     bool // a device_put from pinned_host: recomputing it copies again
	device       bool // its results are on device
	reread       bool // a view of the scope's inputs: taken again for free (rereadable)
	needed       bool // the backward pass reads it
	// A residual of the top level (toplevel.go): noRecompute when no
	// segment computes it again; segDot and segElem are the FLOPs of its
	// segment.
	top, noRecompute bool
	segDot, segElem  float64
}

// canRecompute reports whether the candidate can be recomputed (a carry is
// kept instead).
func (ci *candInfo) canRecompute() bool { return !ci.carry && !ci.noRecompute }

// canOffload reports whether the candidate can be offloaded: a device
// value that is not a view of the scope's inputs (those are taken again,
// at no arithmetic, rather than copied out and back).
func (ci *candInfo) canOffload() bool { return ci.device && !ci.reread }

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
		info.results = append(info.results, r.Type)
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
	if info.reread = rereadable(op); info.reread {
		info.dot, info.elem = 0, 0
	}
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
		if info.canOffload() {
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
	decide map[candKey]trace.RematAction
	pt     *planTrace
	tr     Trace
	args   Args
	prog   *passes.Program
	total  int64
	cost   planCost
}

// planCost is a plan's estimate.
type planCost struct {
	compute, step float64
	per           map[candKey]float64 // seconds each decision adds
}

// baseCost is what a plan's estimate starts from: the arithmetic of the
// program with every residual kept (cost), its collectives' seconds
// (collective: the per-device program's, for a sharded function) and the
// host link's seconds per call of the arguments placed in pinned_host
// (host).
type baseCost struct {
	cost       passes.Cost
	collective float64
	host       linkSecs
}

// estimate prices the decisions dec over the candidates cands of a trace
// whose program is base (see MemoryPlan's fields): the arithmetic, the
// collectives beside it (Rates.overlap), the recomputations, and the host
// link's copies to device and to host (Rates.link: both directions at once,
// unless the copies share the cores).
func estimate(cands map[candKey]*candInfo, dec map[candKey]trace.RematAction, base baseCost, r Rates) planCost {
	c := planCost{per: map[candKey]float64{}}
	c.compute = base.cost.DotFlops/r.Flop + (base.cost.Flops-base.cost.DotFlops+base.cost.Transcendentals)/r.Elem
	fwd := map[int]float64{}   // per scope: forward compute seconds per iteration
	xfer := map[int]float64{}  // per scope: one-way transfer seconds per iteration
	iters := map[int]float64{} // per scope
	keys := sortedKeys(cands)
	for _, k := range keys {
		ci := cands[k]
		fwd[k.scope] += ci.dot/r.Flop + ci.elem/r.Elem
		iters[k.scope] = float64(ci.iters)
	}
	extra, link := 0.0, base.host
	for _, k := range keys {
		ci := cands[k]
		a, ok := dec[k]
		if !ok && ci.fromHost {
			a, ok = trace.Recompute, true // copied in again (planTrace.Decide)
		}
		if !ok {
			continue
		}
		switch {
		case a == trace.Recompute && ci.fromHost:
			c.per[k] = float64(ci.bytes) / r.Bandwidth * float64(ci.iters)
			link.in += c.per[k]
		case a == trace.Recompute && ci.canRecompute():
			s := ci.dot/r.Flop + ci.elem/r.Elem
			if ci.top {
				s = ci.segDot/r.Flop + ci.segElem/r.Elem
			}
			c.per[k] = s * float64(ci.iters)
			extra += c.per[k] // recomputation runs in the backward pass
		case a == trace.Offload && ci.canOffload():
			xfer[k.scope] += float64(ci.bytes) / r.Bandwidth
		}
	}
	scopes := slices.Sorted(maps.Keys(xfer))
	decKeys := sortedKeys(dec)
	for _, s := range scopes {
		t := xfer[s]
		// Out during the forward pass, back during the backward one (about
		// twice the forward's work): what the compute does not hide shows,
		// all of it when copies share the cores with the compute.
		out, in := math.Max(0, t-fwd[s])*iters[s], math.Max(0, t-2*fwd[s])*iters[s]
		if r.Serial {
			out, in = t*iters[s], t*iters[s]
		}
		link.out += out
		link.in += in
		for _, k := range decKeys {
			a := dec[k]
			if ci := cands[k]; ci != nil && k.scope == s && a == trace.Offload && ci.canOffload() && t > 0 {
				c.per[k] = (out + in) * float64(ci.bytes) / r.Bandwidth / t
			}
		}
	}
	c.step = r.overlap(c.compute, base.collective) + extra + r.link(link)
	return c
}

// search is one planning: the function, the budget, the rates, and the
// count of traces and compiles so far.
type search struct {
	f        Function
	name     string
	budget   int64
	rates    Rates
	compiles int
}

// plan is one search over the residuals, with the argument leaves host
// marks in pinned_host (their transfers estimated at hostLink per call).
type plan struct {
	*search
	host     []bool
	hostLink linkSecs
	ref      map[candKey]*candInfo // the base trace's candidates
	// The order: the candidates in the order they are decided, and the
	// action each gets (dec: the decisions taken so far).
	seq    []candKey
	seqAct []trace.RematAction
	dec    map[candKey]trace.RematAction
	// base is the arithmetic and collectives of the trace with every
	// residual kept: a plan's trace holds its recomputations too, which
	// the estimate prices on their own.
	base *baseCost
}

// plans plans the residuals with the argument leaves host marks in
// pinned_host (their transfers estimated at hostLink per call): it returns
// the plan with everything kept (base), the one with every residual it can
// plan recomputed or offloaded (full, the smallest total), and the tries
// that fit the budget (none when full does not).
func (s *search) plans(host []bool, hostLink linkSecs) (base, full *planTry, fits []*planTry, err error) {
	m, err := s.minimum(host, hostLink)
	if err != nil {
		return nil, nil, nil, err
	}
	fits, err = m.fitting()
	return m.base, m.full, fits, err
}

// minimumPlan is a search over the residuals taken to its smallest plan:
// the plan with everything kept (base) and the smallest (full).
type minimumPlan struct {
	p          *plan
	base, full *planTry
}

// minimum plans the residuals with the argument leaves host marks in
// pinned_host (their transfers estimated at hostLink per call) down to the
// smallest plan it reaches (or to base, when base fits).
func (s *search) minimum(host []bool, hostLink linkSecs) (*minimumPlan, error) {
	p := &plan{search: s, host: host, hostLink: hostLink, dec: map[candKey]trace.RematAction{}}
	base, err := p.try(nil)
	if err != nil {
		return nil, err
	}
	p.ref = base.pt.cands
	m := &minimumPlan{p: p, base: base, full: base}
	if base.total <= s.budget {
		return m, nil
	}
	if m.full, err = p.smallest(base); err != nil {
		return nil, err
	}
	return m, nil
}

// fitting returns the tries of m that fit the budget: base when it fits,
// else those the bisection finds when full fits, else none.
func (m *minimumPlan) fitting() ([]*planTry, error) {
	switch {
	case m.base.total <= m.p.budget:
		return []*planTry{m.base}, nil
	case m.full.total > m.p.budget:
		return nil, nil
	}
	return m.p.bisect(m.full)
}

// try traces and compiles the plan dec.
func (p *plan) try(dec map[candKey]trace.RematAction) (*planTry, error) {
	p.compiles++
	pt := &planTrace{decide: dec, cands: map[candKey]*candInfo{}, ref: p.ref}
	tr, err := p.f.Trace(pt, p.host)
	if err != nil {
		return nil, err
	}
	if pt.err != nil {
		return nil, trace.Errorf("rt.Jit", "%s: MemoryBudget: %v", p.name, pt.err)
	}
	if err := planTop(tr, pt); err != nil {
		return nil, trace.Errorf("rt.Jit", "%s: MemoryBudget: %v", p.name, err)
	}
	args := tr.Args()
	if args.Mesh != nil {
		// One device's share of each candidate's bytes and arithmetic.
		perDeviceCands(tr.Func(), pt)
	}
	prog, err := tr.Compile()
	if err != nil {
		return nil, err
	}
	t := &planTry{decide: dec, pt: pt, tr: tr, args: args, prog: prog, total: prog.Analysis.TotalBytes()}
	base := baseCost{cost: passes.CostAnalysis(tr.Func())}
	if args.Mesh != nil {
		// The per-device program: its arithmetic and its collectives.
		base = baseCost{cost: passes.CostAnalysis(prog.Func), collective: collectiveSeconds(prog.Func, p.rates)}
	}
	if p.base == nil && len(dec) == 0 {
		p.base = &base
	}
	if p.base != nil {
		base = *p.base
	}
	base.host = p.hostLink
	t.cost = estimate(pt.cands, dec, base, p.rates)
	return t, nil
}

// smallest returns the try with every residual the planner can decide
// recomputed or offloaded, in the greedy order (extend), or one of the
// extremes (extremePlan) when that reaches lower; the order is then that
// try's.
func (p *plan) smallest(base *planTry) (full *planTry, err error) {
	p.extend(base)
	full = base
	for round := 0; round < 4 && len(p.seq) > 0; round++ {
		if full, err = p.try(p.prefix(len(p.seq))); err != nil {
			return nil, err
		}
		if p.extend(full) == 0 {
			break
		}
	}
	if full.total <= p.budget {
		return full, nil
	}
	// The greedy order's choice between recomputing and offloading
	// follows the measured rates, which vary with the machine's load;
	// the extremes (offload all it can, recompute all it can) may reach
	// lower: the smallest plan found must not depend on the rates.
	for _, pref := range []trace.RematAction{trace.Offload, trace.Recompute} {
		alt, altSeq, altAct, err := extremePlan(p.try, base, pref)
		if err != nil {
			return nil, err
		}
		if alt.total < full.total {
			full, p.seq, p.seqAct = alt, altSeq, altAct
		}
		if full.total <= p.budget {
			break
		}
	}
	return full, nil
}

// extend appends to the order the candidates of t the backward pass reads
// and the order lacks: greedily the cheapest option per byte saved, given
// the options already taken. It returns how many it appended.
func (p *plan) extend(t *planTry) int {
	var pending []candKey
	for _, k := range t.pt.order {
		ci := t.pt.cands[k]
		if _, done := p.dec[k]; !done && ci.needed && ci.bytes > 0 {
			pending = append(pending, k)
		}
	}
	n := 0
	for len(pending) > 0 {
		zero := baseCost{host: p.hostLink}
		cur := estimate(t.pt.cands, p.dec, zero, p.rates).step
		bi, ba, bcost := -1, trace.Save, math.Inf(1)
		for i, k := range pending {
			ci := t.pt.cands[k]
			for _, a := range []trace.RematAction{trace.Recompute, trace.Offload} {
				if a == trace.Recompute && !ci.canRecompute() || a == trace.Offload && !ci.canOffload() {
					continue
				}
				p.dec[k] = a
				d := (estimate(t.pt.cands, p.dec, zero, p.rates).step - cur) / float64(ci.bytes*int64(ci.iters))
				delete(p.dec, k)
				if d < bcost {
					bi, ba, bcost = i, a, d
				}
			}
		}
		if bi < 0 {
			break
		}
		k := pending[bi]
		p.dec[k] = ba
		p.seq, p.seqAct = append(p.seq, k), append(p.seqAct, ba)
		pending = slices.Delete(pending, bi, bi+1)
		n++
	}
	return n
}

// prefix returns the decisions of the first n candidates of the order.
func (p *plan) prefix(n int) map[candKey]trace.RematAction {
	m := make(map[candKey]trace.RematAction, n)
	for i := range n {
		m[p.seq[i]] = p.seqAct[i]
	}
	return m
}

// bisect returns the tries that fit the budget, full (the whole order,
// which fits) first, searching by bisection for the shortest prefix of the
// order that fits (the tries that fit are kept: the fastest estimate
// wins), within MaxCompiles more compiles.
func (p *plan) bisect(full *planTry) ([]*planTry, error) {
	fits := []*planTry{full}
	lo, hi := 0, len(p.seq)
	for limit := p.compiles + MaxCompiles; hi-lo > 1 && p.compiles < limit; {
		mid := (lo + hi) / 2
		t, err := p.try(p.prefix(mid))
		if err != nil {
			return nil, err
		}
		if t.total <= p.budget {
			hi = mid
			fits = append(fits, t)
		} else {
			lo = mid
		}
	}
	return fits, nil
}

// buildPlan describes try t, with the argument leaves host places in
// pinned_host, as a MemoryPlan.
func buildPlan(t *planTry, host map[int]string, baseline, budget int64, r Rates, compiles int) *passes.MemoryPlan {
	p := &passes.MemoryPlan{Budget: budget, BaselineBytes: baseline, TotalBytes: t.total,
		ComputeSeconds: t.cost.compute, StepSeconds: t.cost.step,
		FlopRate: r.Flop, ElementRate: r.Elem, Bandwidth: r.Bandwidth, Compiles: compiles}
	for _, i := range slices.Sorted(maps.Keys(host)) {
		typ := t.tr.Func().Body.Params[i].Type
		secs := hostCopies(t.tr.Func(), t.args, i, host[i]) * float64(typ.Bytes()) / r.Bandwidth
		p.Values = append(p.Values, passes.PlannedValue{Scope: -1, Index: i, Op: "argument", Type: typ.String(), Loc: t.args.Name(i),
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
		case decided && a == trace.Offload && ci.canOffload():
			action = "offload"
		case decided && a == trace.Recompute && ci.canRecompute():
			action = "recompute"
		}
		flops := 0.0
		if action == "recompute" {
			flops = (ci.dot + ci.elem) * float64(ci.iters)
			if ci.top {
				flops = ci.segDot + ci.segElem
			}
		}
		p.Values = append(p.Values, passes.PlannedValue{Scope: k.scope, Index: k.index, Op: ci.op, Type: ci.typ, Loc: ci.loc, Name: ci.name,
			Carry: ci.carry, Action: action, Iterations: ci.iters, Bytes: ci.bytes * int64(ci.iters), Seconds: t.cost.per[k], Flops: flops})
	}
	return p
}

// extremePlan decides every residual the backward pass reads (in trace
// order, with the ones that recomputations make necessary, over a few
// rounds) with action pref where it applies (recompute: not a carry;
// offload: a device value), else with the other action, and returns the
// last try with its order and actions.
func extremePlan(compile func(map[candKey]trace.RematAction) (*planTry, error), base *planTry, pref trace.RematAction) (*planTry, []candKey, []trace.RematAction, error) {
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
			canRecompute, canOffload := ci.canRecompute(), ci.canOffload()
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
		if t, err = compile(maps.Clone(dec)); err != nil {
			return nil, nil, nil, err
		}
	}
	return t, seq, acts, nil
}
