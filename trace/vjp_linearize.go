package trace

import (
	"maps"
	"runtime"
	"sync"
	"weak"

	"github.com/ferryml/ferry/ir"
)

// The linearizer: reverse-mode differentiation of a recorded region.
//
// To differentiate a function, Grad/VJP trace it into the region of a fresh
// tracer, then replay the region's ops in the outer context through Apply
// (concrete arrays in eager mode, ops of the enclosing trace under rt.Jit or an
// outer Grad), keeping a map from the region's values to the replayed arrays.
// The backward pass walks the replayed ops in reverse and applies each op's VJP
// rule, summing the cotangents of values used more than once. Because the rules
// are built from Apply too, differentiating again (grad of grad) just works:
// the outer differentiation sees the inner one's forward and backward ops as
// ordinary recorded ops.
//
// Only "active" values take part: float values that depend on a differentiated
// input. Integer and bool values, captured arrays (closures), the results of
// non-differentiable ops and of StopGradient get no cotangent.

// adNode is one step of the tape: an op or a custom_vjp call, its operand and
// result values in the region being linearized, and its backward function.
type adNode struct {
	argVals []*ir.Value
	argAct  []bool
	outVals []*ir.Value
	bwd     func(outCts []*Array) []*Array
	loc     string // source location of the forward op, given to its backward ops
}

// adLin is a linearized region: the replayed forward and the tape.
type adLin struct {
	region  *ir.Region
	env     map[*ir.Value]*Array
	act     map[*ir.Value]bool
	tape    []*adNode
	results []*Array
	resAct  []bool
}

// adLinearize replays region r on params (one per region parameter, arrays of
// the current context) and records what the backward pass needs. active[i] says
// whether parameter i is differentiated.
func adLinearize(r *ir.Region, params []*Array, active []bool) *adLin {
	return adLinearizeSub(r, params, active, nil)
}

// adLinearizeSub is adLinearize where sub, when non-nil, may give the results
// of a non-region op instead of replaying it (a checkpointed function's saved
// or offloaded values); the op's VJP rule still runs on them.
func adLinearizeSub(r *ir.Region, params []*Array, active []bool, sub func(op *ir.Op, args []*Array) []*Array) *adLin {
	replay := func(op *ir.Op, args []*Array) []*Array {
		if sub != nil && len(op.Regions) == 0 {
			if outs := sub(op, args); outs != nil {
				return outs
			}
		}
		return adReplay(op, args)
	}
	l := &adLin{region: r, env: make(map[*ir.Value]*Array, len(r.Ops)+len(r.Params)), act: map[*ir.Value]bool{}}
	for i, p := range r.Params {
		l.env[p] = params[i]
		l.act[p] = active[i] && adFloat(p.Type.DType)
	}
	ops := r.Ops
	for k := 0; k < len(ops); k++ {
		op := ops[k]
		if m := adMarkOfOp(op); m != nil && m.group != nil && m.index == 0 {
			k = l.customGroup(ops, k, m.group) - 1
			continue
		}
		args := make([]*Array, len(op.Args))
		argAct := make([]bool, len(op.Args))
		anyAct := false
		for i, v := range op.Args {
			a, ok := l.env[v]
			if !ok {
				panic(Errorf("grad", "internal error: %v operand %v is not defined", op.Code, v))
			}
			args[i] = a
			argAct[i] = l.act[v]
			anyAct = anyAct || argAct[i]
		}
		if m := adMarkOfOp(op); m != nil && m.stop {
			outs := replay(op, args)
			adMarkStop(outs[0])
			l.bind(op.Results, outs, nil)
			continue
		}
		if !anyAct {
			l.bind(op.Results, replay(op, args), nil)
			continue
		}
		switch op.Code {
		case ir.While:
			panic(Errorf("While", "reverse-mode differentiation of While is not supported; use Scan or ForLoop with static bounds"))
		case ir.Scan:
			outs, outAct, bwd := adScanLin(op, args, argAct)
			l.bind(op.Results, outs, outAct)
			l.tape = append(l.tape, &adNode{argVals: op.Args, argAct: argAct, outVals: op.Results, bwd: bwd, loc: op.Loc})
			continue
		case ir.Cond:
			outs, outAct, bwd := adCondLin(op, args, argAct)
			l.bind(op.Results, outs, outAct)
			l.tape = append(l.tape, &adNode{argVals: op.Args, argAct: argAct, outVals: op.Results, bwd: bwd, loc: op.Loc})
			continue
		}
		outs := replay(op, args)
		if !op.Info().Differentiable {
			l.bind(op.Results, outs, nil)
			continue
		}
		rule := vjpRules[op.Code]
		if rule == nil {
			panic(Errorf("grad", "no VJP rule for op %v", op.Code))
		}
		outAct := make([]bool, len(outs))
		for i := range outAct {
			outAct[i] = true
		}
		l.bind(op.Results, outs, outAct)
		call := &vjpCall{op: op, args: args, outs: outs, act: argAct}
		l.tape = append(l.tape, &adNode{argVals: op.Args, argAct: argAct, outVals: op.Results, loc: op.Loc, bwd: func(cts []*Array) []*Array {
			c := *call
			c.ct, c.cts = cts[0], cts
			return rule(&c)
		}})
	}
	l.results = make([]*Array, len(r.Results))
	l.resAct = make([]bool, len(r.Results))
	for i, v := range r.Results {
		a, ok := l.env[v]
		if !ok {
			panic(Errorf("grad", "internal error: result %v is not defined", v))
		}
		l.results[i] = a
		l.resAct[i] = l.act[v]
	}
	return l
}

// bind records the replayed results of an op; act[i] (when act is non-nil) says
// whether result i may carry a cotangent (only float results do).
func (l *adLin) bind(vals []*ir.Value, outs []*Array, act []bool) {
	for i, v := range vals {
		l.env[v] = outs[i]
		l.act[v] = act != nil && act[i] && adFloat(v.Type.DType)
	}
}

// customGroup replays the markers of a custom_vjp call starting at ops[k] and
// records one tape node for the whole call. It returns the index after the
// group's markers.
func (l *adLin) customGroup(ops []*ir.Op, k int, g *adGroup) int {
	n := len(g.outputs)
	if k+n > len(ops) {
		panic(Errorf("CustomVJP", "internal error: custom_vjp markers out of order"))
	}
	for i := 0; i < n; i++ {
		if ops[k+i].Results[0] != g.outputs[i] {
			panic(Errorf("CustomVJP", "internal error: custom_vjp markers out of order"))
		}
	}
	get := func(vs []*ir.Value) ([]*Array, []bool, bool) {
		as, act, anyAct := make([]*Array, len(vs)), make([]bool, len(vs)), false
		for i, v := range vs {
			a, ok := l.env[v]
			if !ok {
				panic(Errorf("CustomVJP", "internal error: value %v of a custom_vjp call is not defined", v))
			}
			as[i], act[i] = a, l.act[v]
			anyAct = anyAct || act[i]
		}
		return as, act, anyAct
	}
	ins, insAct, anyAct := get(g.inputs)
	res, _, _ := get(g.residuals)
	t, inVals, resVals := adCustomPrepare(ins, res)
	outs := make([]*Array, n)
	for i := 0; i < n; i++ {
		op := ops[k+i]
		outs[i] = adReplay(op, []*Array{l.env[op.Args[0]]})[0]
	}
	adCustomFinish(t, inVals, resVals, outs, g.bwd)
	act := make([]bool, n)
	for i := range act {
		act[i] = anyAct
	}
	l.bind(g.outputs, outs, act)
	if anyAct {
		l.tape = append(l.tape, &adNode{argVals: g.inputs, argAct: insAct, outVals: g.outputs, loc: ops[k].Loc, bwd: func(cts []*Array) []*Array {
			return adCallBwd(g.bwd, ins, res, outs, cts)
		}})
	}
	return k + n
}

// backward runs the tape in reverse from the cotangents of the region's results
// (nil entries are zero) and returns one cotangent per region parameter (nil
// where it is zero or the parameter is not active).
func (l *adLin) backward(cts []*Array) []*Array {
	ctm := map[*ir.Value]*Array{}
	for i, v := range l.region.Results {
		if i < len(cts) && cts[i] != nil && l.act[v] {
			ctm[v] = adAccum(ctm[v], cts[i])
		}
	}
	for k := len(l.tape) - 1; k >= 0; k-- {
		n := l.tape[k]
		outCts := make([]*Array, len(n.outVals))
		anyCt := false
		for i, v := range n.outVals {
			if c := ctm[v]; c != nil {
				outCts[i] = c
				anyCt = true
				delete(ctm, v)
			}
		}
		if !anyCt {
			continue
		}
		t := current()
		mark := 0
		if t != nil {
			mark = len(t.region.Ops)
		}
		argCts := n.bwd(outCts)
		if t != nil && n.loc != "" {
			for _, op := range t.region.Ops[mark:] {
				op.Loc = n.loc
			}
		}
		for i, v := range n.argVals {
			if i < len(argCts) && argCts[i] != nil && n.argAct[i] {
				ctm[v] = adAccum(ctm[v], argCts[i])
			}
		}
	}
	out := make([]*Array, len(l.region.Params))
	for i, p := range l.region.Params {
		out[i] = ctm[p]
	}
	return out
}

// adActivity returns which results of r may be active given which parameters
// are. It is the linearizer's rule, conservative for nested regions.
func adActivity(r *ir.Region, paramAct []bool) []bool {
	act := map[*ir.Value]bool{}
	for i, p := range r.Params {
		act[p] = paramAct[i] && adFloat(p.Type.DType)
	}
	for _, op := range r.Ops {
		anyAct := false
		for _, v := range op.Args {
			anyAct = anyAct || act[v]
		}
		if m := adMarkOfOp(op); m != nil {
			if m.stop {
				anyAct = false
			} else if m.group != nil {
				anyAct = false
				for _, v := range m.group.inputs {
					anyAct = anyAct || act[v]
				}
			}
		} else if !op.Info().Differentiable && op.Code != ir.While {
			anyAct = false
		}
		for _, v := range op.Results {
			act[v] = anyAct && adFloat(v.Type.DType)
		}
	}
	out := make([]bool, len(r.Results))
	for i, v := range r.Results {
		out[i] = act[v]
	}
	return out
}

// ---- replay and region plumbing

// adDstFunc returns the function new regions must belong to: the innermost
// trace's, or a fresh one in eager mode.
func adDstFunc() *ir.Func {
	if t := current(); t != nil {
		return t.fn
	}
	return ir.NewFunc("eager")
}

// adReplay applies op to args in the current context, cloning its regions into
// the function being recorded, and keeps the op's source location.
func adReplay(op *ir.Op, args []*Array) []*Array {
	if s := op.Results[0].Type.Sharding; op.Code == ir.ShardingConstraint && s != nil && len(args) == 1 {
		// The generic Apply gives unsharded results: the constraint's
		// layout is its result's type.
		out := constrain(args[0], s)
		if op.Loc != "" && out.val != nil && out.val.Op != nil {
			out.val.Op.Loc = op.Loc
		}
		return []*Array{out}
	}
	outs := adApplyRegions(op.Code, maps.Clone(op.Attrs), op.Regions, true, args)
	if op.Loc != "" && len(outs) > 0 && outs[0].val != nil && outs[0].val.Op != nil {
		outs[0].val.Op.Loc = op.Loc
	}
	return outs
}

// adApplyRegions is Apply for ops with regions: when clone is set (or the
// regions belong to another function), the regions are copied into the function
// of the trace the op is recorded in, so that no region is shared by two ops.
func adApplyRegions(code ir.Code, attrs ir.Attrs, regions []*ir.Region, clone bool, args []*Array) []*Array {
	if len(regions) > 0 {
		if t := current(); t != nil {
			rs := make([]*ir.Region, len(regions))
			for i, r := range regions {
				if clone || r.Func() != t.fn {
					rs[i] = adCloneRegion(t.fn, r)
				} else {
					rs[i] = r
				}
			}
			regions = rs
		}
	}
	return Apply(code, attrs, regions, args...)
}

// adCloneRegion deep-copies r (nested regions included) into dst, with fresh
// values, keeping StopGradient and CustomVJP marks.
func adCloneRegion(dst *ir.Func, r *ir.Region) *ir.Region {
	vmap := map[*ir.Value]*ir.Value{}
	var marked []*ir.Value
	nr := adCloneInto(dst, r, vmap, &marked)
	groups := map[*adGroup]*adGroup{}
	for _, old := range marked {
		m := adMarkOf(old)
		if m == nil {
			continue
		}
		nm := &adMark{stop: m.stop, index: m.index}
		if m.group != nil {
			ng := groups[m.group]
			if ng == nil {
				ng = &adGroup{bwd: m.group.bwd,
					inputs:    adMapVals(m.group.inputs, vmap),
					residuals: adMapVals(m.group.residuals, vmap),
					outputs:   adMapVals(m.group.outputs, vmap)}
				groups[m.group] = ng
			}
			nm.group = ng
		}
		adSetMark(vmap[old], nm)
	}
	return nr
}

func adMapVals(vs []*ir.Value, vmap map[*ir.Value]*ir.Value) []*ir.Value {
	out := make([]*ir.Value, len(vs))
	for i, v := range vs {
		out[i] = vmap[v]
	}
	return out
}

func adCloneInto(dst *ir.Func, r *ir.Region, vmap map[*ir.Value]*ir.Value, marked *[]*ir.Value) *ir.Region {
	nr := dst.NewRegion()
	for _, p := range r.Params {
		vmap[p] = nr.AddParam(p.Type)
	}
	for _, op := range r.Ops {
		args := make([]*ir.Value, len(op.Args))
		for i, a := range op.Args {
			args[i] = vmap[a]
			if args[i] == nil {
				panic(Errorf("grad", "internal error: cloning %v: operand %v is not defined in its region", op.Code, a))
			}
		}
		var subs []*ir.Region
		for _, s := range op.Regions {
			subs = append(subs, adCloneInto(dst, s, vmap, marked))
		}
		nop, err := dst.NewOp(op.Code, args, maps.Clone(op.Attrs), subs...)
		if err != nil {
			panic(Errorf("grad", "internal error: cloning %v: %v", op.Code, err))
		}
		nop.Loc = op.Loc
		nr.Ops = append(nr.Ops, nop)
		for i, v := range op.Results {
			vmap[v] = nop.Results[i]
			if op.Code == ir.DevicePut && adMarkOf(v) != nil {
				*marked = append(*marked, v)
			}
		}
	}
	nr.Results = make([]*ir.Value, len(r.Results))
	for i, v := range r.Results {
		nr.Results[i] = vmap[v]
	}
	return nr
}

// adWith runs fn with t pushed as the innermost tracer.
func adWith(t *Tracer, fn func()) {
	t.Push()
	defer t.Pop()
	fn()
}

// adSlot is one parameter of a region being rearranged: an existing parameter,
// or (v == nil) a fresh unused one of type t.
type adSlot struct {
	v *ir.Value
	t ir.Type
}

// adArrange replaces r's parameter list by slots, in order. Every existing
// parameter must appear exactly once.
func adArrange(r *ir.Region, slots []adSlot) {
	old := append([]*ir.Value(nil), r.Params...)
	seen := map[*ir.Value]bool{}
	ps := make([]*ir.Value, len(slots))
	for i, s := range slots {
		if s.v != nil {
			if seen[s.v] {
				panic(Errorf("grad", "internal error: region parameter %v used twice", s.v))
			}
			ps[i] = s.v
			seen[s.v] = true
		} else {
			ps[i] = r.AddParam(s.t)
		}
	}
	for _, p := range old {
		if !seen[p] {
			panic(Errorf("grad", "internal error: region parameter %v dropped", p))
		}
	}
	r.Params = ps
	for i, p := range ps {
		p.Index = i
	}
}

// adKey identifies an outer array: its value when traced, itself when concrete.
func adKey(a *Array) any {
	if a.val != nil {
		return a.val
	}
	return a
}

// adUnion is an ordered set of outer arrays.
type adUnion struct {
	arrs []*Array
	idx  map[any]int
}

func (u *adUnion) add(a *Array) int {
	if u.idx == nil {
		u.idx = map[any]int{}
	}
	k := adKey(a)
	if i, ok := u.idx[k]; ok {
		return i
	}
	u.idx[k] = len(u.arrs)
	u.arrs = append(u.arrs, a)
	return len(u.arrs) - 1
}

// ---- marks: StopGradient and CustomVJP results are identity device_put ops
// whose result values are marked in a side table (weakly keyed, so marks of
// dropped traces are collected).

type adMark struct {
	stop  bool
	group *adGroup
	index int
}

// adGroup is one custom_vjp call: values of the region its markers are in.
type adGroup struct {
	inputs    []*ir.Value
	residuals []*ir.Value
	outputs   []*ir.Value
	bwd       func(residuals, cts []*Array) []*Array
}

var adMarks sync.Map // weak.Pointer[ir.Value] → *adMark

func adSetMark(v *ir.Value, m *adMark) {
	wp := weak.Make(v)
	adMarks.Store(wp, m)
	runtime.AddCleanup(v, func(wp weak.Pointer[ir.Value]) { adMarks.Delete(wp) }, wp)
}

func adMarkOf(v *ir.Value) *adMark {
	m, ok := adMarks.Load(weak.Make(v))
	if !ok {
		return nil
	}
	return m.(*adMark)
}

func adMarkOfOp(op *ir.Op) *adMark {
	if op.Code != ir.DevicePut {
		return nil
	}
	return adMarkOf(op.Results[0])
}

func adMarkStop(a *Array) {
	if a.val != nil {
		adSetMark(a.val, &adMark{stop: true})
	}
}
