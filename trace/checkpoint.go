package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Rematerialisation (jax.checkpoint / jax.remat) and checkpoint names.
//
// Checkpoint(fn, policy) returns a function that computes what fn computes.
// Under differentiation the values fn's backward pass needs from its forward
// pass are, per the policy, saved (kept from the forward pass until the
// backward pass uses them), recomputed in the backward pass from fn's inputs,
// or offloaded: copied to another memory space (pinned_host) right after the
// forward pass produced them, and copied back right before the backward pass
// uses them.
//
// How it works. fn is traced once into a region of its own. Its ops are
// inlined where Checkpoint is called (the forward pass), followed by a
// device_put to the offload space of every value the policy offloads; the
// results are marked like a CustomVJP call whose residuals are fn's inputs,
// the saved values and the offloaded copies. The backward function traces, on
// top of the context it runs in, a replay of fn's region in which saved and
// offloaded values stand in for the ops that made them (offloaded ones through
// a device_put back), runs the VJP rules on it, drops every op the cotangents
// do not need, and inlines the rest. What the backward pass captures is
// therefore exactly: the inputs the recomputation needs, the saved values it
// needs, and the offloaded copies it needs. Inside a Scan those are the scan's
// residuals, stacked on axis 0 by the forward scan: an offloaded value is a
// pinned_host result of the body, so its stack lives in pinned_host, each
// forward iteration writing its slice there and each backward iteration
// reading its slice back (a pinned_host xs slice moved to device in the
// backward body).
//
// With PreventCSE (the default) the backward pass recomputes from
// optimization_barrier copies of the inputs and saved values, so that the
// compiler's CSE cannot merge the recomputation with the forward pass (which
// would keep the forward values alive until the backward pass: saving them
// after all). The compiler removes the barriers right after CSE.

// RematAction says what happens to a value a checkpointed function's backward
// pass needs.
type RematAction uint8

// Remat actions.
const (
	// Recompute: the backward pass recomputes the value from the function's
	// inputs (and whatever else is saved).
	Recompute RematAction = iota
	// Save: the value is kept from the forward pass (in its memory space).
	Save
	// Offload: the value is copied from Src to Dst after the forward pass
	// makes it, and back to Src before the backward pass uses it.
	Offload
)

func (a RematAction) String() string {
	switch a {
	case Recompute:
		return "recompute"
	case Save:
		return "save"
	case Offload:
		return "offload"
	}
	return "remat_action(?)"
}

// RematDecision is a policy's answer for one op's results.
type RematDecision struct {
	Action RematAction
	// Src and Dst are the memory spaces of an Offload: the value is moved from
	// Src to Dst and back. Src is normally ir.Device and Dst ir.PinnedHost.
	Src, Dst ir.MemorySpace
}

// CheckpointPolicy decides, for every op of a checkpointed function, whether
// its results are saved, recomputed or offloaded when the backward pass needs
// them (jax.checkpoint_policies). name is the op's checkpoint name
// (CheckpointName) for a checkpoint_name op, and "" otherwise. Policies are
// ordinary functions: users can write their own.
type CheckpointPolicy func(op *ir.Op, name string) RematDecision

var (
	recomputeDecision = RematDecision{Action: Recompute}
	saveDecision      = RematDecision{Action: Save}
)

func offloadDecision(src, dst ir.MemorySpace) RematDecision {
	return RematDecision{Action: Offload, Src: src, Dst: dst}
}

// EverythingSaveable saves every value (jax.checkpoint_policies.everything_saveable):
// no recomputation, as without Checkpoint.
func EverythingSaveable(*ir.Op, string) RematDecision { return saveDecision }

// NothingSaveable recomputes every value from the function's inputs
// (nothing_saveable, the default policy of jax.checkpoint).
func NothingSaveable(*ir.Op, string) RematDecision { return recomputeDecision }

// DotsSaveable saves the results of matrix products (dot_general) and
// recomputes the rest (dots_saveable).
func DotsSaveable(op *ir.Op, _ string) RematDecision {
	if op.Code == ir.DotGeneral {
		return saveDecision
	}
	return recomputeDecision
}

// isDotWithNoBatchDims reports whether op is a dot_general without batch
// dimensions (a plain matrix product, not a batched one).
func isDotWithNoBatchDims(op *ir.Op) bool {
	return op.Code == ir.DotGeneral && len(op.Attrs.Ints("lhs_batch")) == 0 && len(op.Attrs.Ints("rhs_batch")) == 0
}

// DotsWithNoBatchDimsSaveable saves the results of matrix products without
// batch dimensions and recomputes the rest (dots_with_no_batch_dims_saveable).
func DotsWithNoBatchDimsSaveable(op *ir.Op, _ string) RematDecision {
	if isDotWithNoBatchDims(op) {
		return saveDecision
	}
	return recomputeDecision
}

// SaveOnlyTheseNames saves the values named (CheckpointName) with one of names
// and recomputes the rest (save_only_these_names).
func SaveOnlyTheseNames(names ...string) CheckpointPolicy {
	names = slices.Clone(names)
	return func(op *ir.Op, name string) RematDecision {
		if op.Code == ir.CheckpointName && slices.Contains(names, name) {
			return saveDecision
		}
		return recomputeDecision
	}
}

// SaveAnyNamesButThese saves every named value except those named with one of
// names, and recomputes the rest (save_any_names_but_these).
func SaveAnyNamesButThese(names ...string) CheckpointPolicy {
	names = slices.Clone(names)
	return func(op *ir.Op, name string) RematDecision {
		if op.Code == ir.CheckpointName && !slices.Contains(names, name) {
			return saveDecision
		}
		return recomputeDecision
	}
}

// SaveAndOffloadOnlyTheseNames saves the values named with one of saved,
// offloads (src → dst → src) those named with one of offloaded, and
// recomputes the rest (save_and_offload_only_these_names). A name in both
// lists is saved.
func SaveAndOffloadOnlyTheseNames(saved, offloaded []string, src, dst ir.MemorySpace) CheckpointPolicy {
	saved, offloaded = slices.Clone(saved), slices.Clone(offloaded)
	return func(op *ir.Op, name string) RematDecision {
		if op.Code != ir.CheckpointName {
			return recomputeDecision
		}
		switch {
		case slices.Contains(saved, name):
			return saveDecision
		case slices.Contains(offloaded, name):
			return offloadDecision(src, dst)
		}
		return recomputeDecision
	}
}

// OffloadDotWithNoBatchDims offloads (src → dst → src) the results of matrix
// products without batch dimensions and recomputes the rest
// (offload_dot_with_no_batch_dims).
func OffloadDotWithNoBatchDims(src, dst ir.MemorySpace) CheckpointPolicy {
	return func(op *ir.Op, _ string) RematDecision {
		if isDotWithNoBatchDims(op) {
			return offloadDecision(src, dst)
		}
		return recomputeDecision
	}
}

// SaveFromBothPolicies combines two policies (save_from_both_policies): a
// value is saved if either saves it, else offloaded if either offloads it
// (the first one's spaces win), else recomputed.
func SaveFromBothPolicies(a, b CheckpointPolicy) CheckpointPolicy {
	if a == nil {
		a = NothingSaveable
	}
	if b == nil {
		b = NothingSaveable
	}
	return func(op *ir.Op, name string) RematDecision {
		da, db := a(op, name), b(op, name)
		switch {
		case da.Action == Save || db.Action == Save:
			return saveDecision
		case da.Action == Offload:
			return da
		case db.Action == Offload:
			return db
		}
		return recomputeDecision
	}
}

// CheckpointOption configures Checkpoint.
type CheckpointOption func(*checkpointConfig)

type checkpointConfig struct {
	preventCSE bool
}

// PreventCSE sets jax.checkpoint's prevent_cse (default true): the backward
// pass's recomputation goes through optimization barriers that the compiler's
// CSE does not look through. Turning it off is safe inside Scan, where the
// forward and backward passes are separate loop bodies anyway.
func PreventCSE(on bool) CheckpointOption {
	return func(c *checkpointConfig) { c.preventCSE = on }
}

// CheckpointName returns x tagged with name, for checkpoint policies
// (jax.ad_checkpoint.checkpoint_name): SaveOnlyTheseNames("x") saves x,
// SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ...) offloads it. It is an
// identity: on a concrete array outside any trace it returns x itself; while
// tracing it records a checkpoint_name op, which the compiler removes.
func CheckpointName(x *Array, name string) *Array {
	checkLive("CheckpointName", x)
	if !x.IsTraced() && current() == nil {
		return x
	}
	return Apply1(ir.CheckpointName, ir.Attrs{"name": name}, x)
}

// Checkpoint returns fn rematerialised under policy (jax.checkpoint, alias
// jax.remat, on flat arrays): the returned function computes fn(args), and
// when it is differentiated, every value fn's backward pass needs is saved,
// recomputed or offloaded as the policy says (nil means NothingSaveable).
// Its inputs (args and the arrays fn closes over) are always available to the
// backward pass: whatever encloses the call saves them if the recomputation
// needs them. See Remat for functions over trees.
//
//	layer := trace.Checkpoint(func(a []*trace.Array) []*trace.Array {
//		x := trace.CheckpointName(a[0], "x")
//		return []*trace.Array{trace.MatMul(trace.MatMul(x, a[1]), a[2])}
//	}, trace.SaveAndOffloadOnlyTheseNames(nil, []string{"x"}, ir.Device, ir.PinnedHost))
func Checkpoint(fn func(args []*Array) []*Array, policy CheckpointPolicy, opts ...CheckpointOption) func(args ...*Array) []*Array {
	if fn == nil {
		panic(Errorf("Checkpoint", "nil function"))
	}
	if policy == nil {
		policy = NothingSaveable
	}
	cfg := checkpointConfig{preventCSE: true}
	for _, o := range opts {
		o(&cfg)
	}
	return func(args ...*Array) []*Array {
		for i, a := range args {
			if a == nil {
				panic(Errorf("Checkpoint", "argument %d is nil", i))
			}
			checkLive("Checkpoint", a)
		}
		if current() == nil {
			// Nothing is being traced or differentiated: just run fn.
			return fn(args)
		}
		return adCheckpointCall(fn, policy, cfg, args, nil)
	}
}

// Remat is Checkpoint for any function whose parameters and results are trees
// of arrays (structs, slices, maps of *Array, as Grad takes): it returns a
// function of the same type.
//
//	layer := trace.Remat(func(x *trace.Array, w Weights) *trace.Array { ... }, policy)
func Remat[F any](fn F, policy CheckpointPolicy, opts ...CheckpointOption) F {
	return treeWrap("Remat", fn, func(flat func([]*Array) []*Array, leaves []*Array) []*Array {
		return Checkpoint(flat, policy, opts...)(leaves...)
	})
}

// adCheckpointCall records one call of a checkpointed function in the current
// trace (see the comment at the top of the file). auto, when not nil, is the
// planned scan body fn is (see autoremat.go): the planner decides instead of
// policy.
func adCheckpointCall(fn func([]*Array) []*Array, policy CheckpointPolicy, cfg checkpointConfig, args []*Array, auto *autoScope) []*Array {
	// Trace fn into a region of its own.
	ft := NewFuncTracer("checkpoint")
	func() {
		defer ft.Close()
		adWith(ft, func() {
			ps := make([]*Array, len(args))
			for i, a := range args {
				ps[i] = ft.Param(a.Type())
			}
			res := fn(ps)
			vals := make([]*ir.Value, len(res))
			for i, r := range res {
				if r == nil {
					panic(Errorf("Checkpoint", "the function returned a nil array as output %d", i))
				}
				checkLive("Checkpoint", r)
				vals[i] = ft.Output(r)
			}
			ft.region.Results = vals
		})
	}()
	region := ft.region
	ins := append(append([]*Array{}, args...), ft.Captures()...)
	nIn := len(ins)

	// Decide, per op, what happens to its results.
	decisions := map[*ir.Op]RematDecision{}
	var autoIndex map[*ir.Op]int
	if auto != nil {
		var ok bool
		if decisions, autoIndex, ok = auto.decide(region); !ok {
			return adInline(region, ins, nil) // not planned: as if fn were called
		}
	} else {
		for _, op := range region.Ops {
			if len(op.Regions) > 0 || adMarkOfOp(op) != nil {
				continue // region ops and StopGradient/CustomVJP markers are recomputed
			}
			name := ""
			if op.Code == ir.CheckpointName {
				name = op.Attrs.String("name")
			}
			if d := policy(op, name); d.Action != Recompute {
				decisions[op] = d
			}
		}
	}
	// Inside a planned body, the ops this call records are the user's.
	var ps *plannerState
	var cur *Tracer
	n0 := 0
	if auto == nil {
		if ps = currentPlanner(); ps != nil {
			if cur = current(); cur != nil {
				n0 = len(cur.region.Ops)
			}
		}
	}

	// The forward pass, inlined, with the saved values and offloaded copies as
	// residuals.
	var res []*Array
	resOf := map[*ir.Op][]int{} // op → indices in res of its results
	outs := adInline(region, ins, func(op *ir.Op, outs []*Array) {
		d, ok := decisions[op]
		if !ok {
			return
		}
		for _, o := range outs {
			r := o
			if d.Action == Offload && o.Space() != d.Dst {
				r = Apply1(ir.DevicePut, ir.Attrs{"space": d.Dst}, o)
			}
			resOf[op] = append(resOf[op], len(res))
			res = append(res, r)
		}
	})
	if len(outs) == 0 {
		return outs
	}

	bwd := func(resid, cts []*Array) []*Array {
		inArrs, saved := resid[:nIn], resid[nIn:]
		var needed func(savedIdx int)
		if auto != nil {
			needed = func(k int) {
				for op, idx := range resOf {
					if slices.Contains(idx, k) {
						if i, ok := autoIndex[op]; ok {
							auto.ps.p.Needed(auto.scope, i)
						}
					}
				}
			}
		}
		return adCheckpointBwd(region, inArrs, saved, resOf, decisions, cts, cfg, needed)
	}
	t, inVals, resVals := adCustomPrepare(ins, append(append([]*Array{}, ins...), res...))
	marked := make([]*Array, len(outs))
	for i, o := range outs {
		marked[i] = Apply1(ir.DevicePut, ir.Attrs{"space": o.Space()}, o)
	}
	adCustomFinish(t, inVals, resVals, marked, bwd)
	// Op results are unsharded (ir.InferTypes): a sharded output keeps its
	// layout through a constraint after the marker, so that a checkpointed
	// scan body returns its sharded carry as it came.
	ret := slices.Clone(marked)
	for i, o := range outs {
		if s := o.Type().Sharding; s != nil {
			ret[i] = WithShardingConstraint(marked[i], s)
		}
	}
	if ps != nil {
		ps.markUser(cur, n0)
	}
	return ret
}

// adCheckpointBwd is the backward pass of a checkpointed call: it returns the
// cotangents of the call's inputs (see the comment at the top of the file).
// needed, when not nil, is told the index in saved of every saved value the
// backward pass reads.
func adCheckpointBwd(region *ir.Region, ins, saved []*Array, resOf map[*ir.Op][]int, decisions map[*ir.Op]RematDecision, cts []*Array, cfg checkpointConfig, needed func(int)) []*Array {
	barrier := func(a *Array) *Array {
		if !cfg.preventCSE {
			return a
		}
		return Apply(ir.OptimizationBarrier, nil, nil, a)[0]
	}
	dst := adDstFunc()
	bt := NewTracer(dst, dst.NewRegion())
	var inCts []*Array
	func() {
		defer bt.Close()
		adWith(bt, func() {
			params := make([]*Array, len(ins))
			active := make([]bool, len(ins))
			for i, a := range ins {
				params[i] = barrier(a)
				active[i] = adFloat(a.DType())
			}
			sub := func(op *ir.Op, _ []*Array) []*Array {
				idx, ok := resOf[op]
				if !ok {
					return nil
				}
				d := decisions[op]
				outs := make([]*Array, len(idx))
				for i, k := range idx {
					r := saved[k]
					if d.Action == Offload {
						outs[i] = Apply1(ir.DevicePut, ir.Attrs{"space": op.Results[i].Type.Space}, r)
					} else {
						outs[i] = barrier(r)
					}
				}
				return outs
			}
			lin := adLinearizeSub(region, params, active, sub)
			pc := lin.backward(cts)
			vals := make([]*ir.Value, 0, len(pc))
			for i, c := range pc {
				if c == nil || !active[i] {
					pc[i] = nil
					continue
				}
				pc[i] = adCtOrZeros(c, ins[i].Type())
				vals = append(vals, bt.Output(pc[i]))
			}
			bt.region.Results = vals
			inCts = pc
		})
	}()
	if needed != nil {
		used := adUsedParams(bt.region)
		for i, c := range bt.Captures() {
			if !used[bt.region.Params[i]] {
				continue
			}
			for k, s := range saved {
				if s == c {
					needed(k)
				}
			}
		}
	}
	out := adInlineTracer(bt)
	k := 0
	for i, c := range inCts {
		if c != nil {
			inCts[i] = out[k]
			k++
		}
	}
	return inCts
}

// adInline replays region r's ops in the current context (the innermost
// trace, or eagerly) on params, one array per region parameter, keeping
// StopGradient and CustomVJP marks, and returns the results. after, when not
// nil, is called after each top-level op with its replayed results.
func adInline(r *ir.Region, params []*Array, after func(op *ir.Op, outs []*Array)) []*Array {
	env := make(map[*ir.Value]*Array, len(r.Params)+len(r.Ops))
	for i, p := range r.Params {
		env[p] = params[i]
	}
	var marked []*ir.Value
	for _, op := range r.Ops {
		args := make([]*Array, len(op.Args))
		for i, v := range op.Args {
			a, ok := env[v]
			if !ok {
				panic(Errorf("Checkpoint", "internal error: %v operand %v is not defined", op.Code, v))
			}
			args[i] = a
		}
		outs := adReplay(op, args)
		for i, v := range op.Results {
			env[v] = outs[i]
		}
		if adMarkOfOp(op) != nil {
			marked = append(marked, op.Results[0])
		}
		if after != nil {
			after(op, outs)
		}
	}
	adCopyMarks(marked, env)
	out := make([]*Array, len(r.Results))
	for i, v := range r.Results {
		out[i] = env[v]
	}
	return out
}

// adCopyMarks gives the replayed values (env) of the marked values their
// marks, with CustomVJP groups remapped. Nothing is marked in eager mode.
func adCopyMarks(marked []*ir.Value, env map[*ir.Value]*Array) {
	groups := map[*adGroup]*adGroup{}
	mapVals := func(vs []*ir.Value) []*ir.Value {
		out := make([]*ir.Value, len(vs))
		for i, v := range vs {
			if a := env[v]; a != nil {
				out[i] = a.val
			}
		}
		return out
	}
	for _, old := range marked {
		m := adMarkOf(old)
		a := env[old]
		if m == nil || a == nil || a.val == nil {
			continue
		}
		nm := &adMark{stop: m.stop, index: m.index}
		if m.group != nil {
			ng := groups[m.group]
			if ng == nil {
				ng = &adGroup{bwd: m.group.bwd, inputs: mapVals(m.group.inputs), residuals: mapVals(m.group.residuals), outputs: mapVals(m.group.outputs)}
				if slices.Contains(ng.inputs, nil) || slices.Contains(ng.residuals, nil) || slices.Contains(ng.outputs, nil) {
					continue
				}
				groups[m.group] = ng
			}
			nm.group = ng
		}
		adSetMark(a.val, nm)
	}
}

// adInlineTracer moves what the closed tracer t recorded into the current
// context, dropping the ops its results do not need, and returns its results
// there. Its parameters (all captures) become the captured arrays. Ops move
// as they are into the enclosing trace (same function, marks kept), or run
// eagerly when nothing is being traced.
func adInlineTracer(t *Tracer) []*Array {
	r := t.region
	caps := t.Captures()
	// Keep only the ops the results need.
	used, keep := adNeeded(r)
	paramArr := map[*ir.Value]*Array{}
	for i, p := range r.Params {
		paramArr[p] = caps[i]
	}
	cur := current()
	if cur == nil || cur.fn != t.fn {
		// Eager (or another function): replay the kept ops.
		kept := &ir.Region{Params: r.Params, Results: r.Results}
		for i, op := range r.Ops {
			if keep[i] {
				kept.Ops = append(kept.Ops, op)
			}
		}
		params := make([]*Array, len(r.Params))
		for i, p := range r.Params {
			params[i] = paramArr[p]
		}
		return adInline(kept, params, nil)
	}
	// Capture in parameter order: valueOf may give a capture a parameter of
	// the enclosing region, and that order must not depend on map iteration.
	pv := map[*ir.Value]*ir.Value{}
	for i, p := range r.Params {
		if used[p] {
			pv[p] = cur.valueOf(caps[i])
		}
	}
	for i, op := range r.Ops {
		if !keep[i] {
			continue
		}
		for j, a := range op.Args {
			if v, ok := pv[a]; ok {
				op.Args[j] = v
			}
		}
		cur.region.Ops = append(cur.region.Ops, op)
	}
	out := make([]*Array, len(r.Results))
	for i, v := range r.Results {
		if a, ok := paramArr[v]; ok {
			out[i] = a
		} else {
			out[i] = cur.Wrap(v)
		}
	}
	return out
}
