package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Automatic rematerialisation: a RematPlanner installed on the outermost
// tracer of a trace (rt.Jit does it for a jitted function with a memory
// budget) decides, for the values the backward pass of every scan body needs
// from its forward pass, whether they are saved, recomputed or offloaded;
// and so for a function differentiated (Grad, VJP) at the top level of the
// trace, when it has no control flow (a scan there would be recomputed as a
// whole; its body is planned instead).
//
// Each scan body traced while a planner is installed runs as if wrapped in
// Checkpoint (without PreventCSE, as is safe inside Scan) with a policy that
// asks the planner about each op: its candidates. The body's carry
// parameters are first passed through an identity op (a checkpoint_name the
// compiler removes) so that the carry, usually the largest residual of a
// layer, is a candidate too: saving it stacks it on device, offloading it
// stacks it in pinned_host. Candidates are numbered in trace order (the scope
// is the scan body's number, the index the op's number in it), so that a
// retrace of the same function numbers them the same way.
//
// User annotations win: the ops a user's Checkpoint (or Remat) records
// inside a planned body are saved by the planned checkpoint, so the user's
// policy alone decides what its backward pass keeps, recomputes or offloads.
// A body with control flow of its own (a nested scan, while or cond) is not
// planned (a checkpoint would recompute the nested loop in the backward
// pass); the bodies nested in it are.
//
// A scanned array the caller keeps in pinned_host (stacked layer weights,
// say) reaches a planned body as a device copy of its slice (a device_put
// the body starts with, which the compiler prefetches one iteration ahead):
// the parameters stream in one layer at a time, and the backward pass copies
// them in again unless the planner keeps them.

// autoRematName is the checkpoint name of the identity ops on planned carries.
const autoRematName = "ferry.auto_remat.carry"

// RematCandidate is one op of a planned scan body (or function
// differentiated at the top level) whose results the backward pass may need.
type RematCandidate struct {
	// Scope numbers the planned scan bodies of the trace in trace order, and
	// Index the candidates of one body.
	Scope, Index int
	// Op is the op as traced (code, attributes, result types, Loc).
	Op *ir.Op
	// Iterations is how many times the body runs per call of the traced
	// function: the scan's length times those of the planned scans around it
	// (1 for a function differentiated at the top level).
	Iterations int
	// Carry is true for the identity op standing for a carry parameter of
	// the body (the value the carry has when an iteration starts):
	// recomputing it means keeping the carry itself.
	Carry bool
}

// RematPlanner chooses what happens to the candidates of planned scan bodies
// (see SetRematPlanner). Its methods are called on the tracing goroutine.
type RematPlanner interface {
	// Decide returns the decision for c.
	Decide(c RematCandidate) RematDecision
	// Needed reports that the backward pass of scope reads candidate index
	// (saved or offloaded): it is one of the scan's residuals.
	Needed(scope, index int)
}

// plannerState is what a trace with a planner keeps (on its outermost tracer).
type plannerState struct {
	p      RematPlanner
	scopes int
	iters  int
	// user holds the ops recorded by user Checkpoints.
	user map[*ir.Op]bool
}

// SetRematPlanner installs p (nil removes it) for the scan bodies traced
// while t is the outermost active tracer of the goroutine: rt.Jit installs
// one on the tracer of a jitted function with a memory budget before it runs
// the function. It never affects other traces or goroutines.
func (t *Tracer) SetRematPlanner(p RematPlanner) {
	if p == nil {
		t.planner = nil
		return
	}
	t.planner = &plannerState{p: p, iters: 1, user: map[*ir.Op]bool{}}
}

// currentPlanner returns the planner of the goroutine's outermost tracer.
func currentPlanner() *plannerState {
	if t := active(true); t != nil {
		return t.planner
	}
	return nil
}

// autoScope is one planned scan body being traced.
type autoScope struct {
	ps    *plannerState
	scope int
	iters int
	carry int // the number of carry parameters (identity ops first)
}

// planScanBody returns body wrapped for planning by ps (see the comment at
// the top of the file); n is the scan's length.
func (ps *plannerState) planScanBody(body func(carry, x []*Array) ([]*Array, []*Array), n int) func(carry, x []*Array) ([]*Array, []*Array) {
	return func(carry, x []*Array) ([]*Array, []*Array) {
		sc := &autoScope{ps: ps, scope: ps.scopes, iters: ps.iters * n, carry: len(carry)}
		ps.scopes++
		saved := ps.iters
		ps.iters = sc.iters
		defer func() { ps.iters = saved }()
		ny := 0
		flat := func(args []*Array) []*Array {
			c := make([]*Array, len(carry))
			for i := range c {
				c[i] = Apply1(ir.CheckpointName, ir.Attrs{"name": autoRematName}, args[i])
			}
			xs := slices.Clone(args[len(carry):])
			for i, a := range xs {
				if a.Space() == ir.PinnedHost {
					xs[i] = DevicePut(a, ir.Device)
				}
			}
			nc, y := body(c, xs)
			ny = len(y)
			return append(append([]*Array{}, nc...), y...)
		}
		args := append(append([]*Array{}, carry...), x...)
		outs := adCheckpointCall(flat, nil, checkpointConfig{}, args, sc)
		k := len(outs) - ny
		return outs[:k], outs[k:]
	}
}

// planFunc returns fn, a function VJP differentiates at the top level of
// the trace, wrapped for planning by ps like a scan body that runs once
// (with PreventCSE: the recomputation must not merge with the forward pass).
func (ps *plannerState) planFunc(fn func([]*Array) []*Array) func([]*Array) []*Array {
	return func(args []*Array) []*Array {
		sc := &autoScope{ps: ps, scope: ps.scopes, iters: ps.iters}
		ps.scopes++
		return adCheckpointCall(fn, nil, checkpointConfig{preventCSE: true}, args, sc)
	}
}

// markUser records the ops added to t's region from index n0 on as ops of a
// user Checkpoint.
func (ps *plannerState) markUser(t *Tracer, n0 int) {
	if t == nil {
		return
	}
	for _, op := range t.region.Ops[n0:] {
		ps.user[op] = true
	}
}

// decide returns the planned decisions for the ops of a traced body region,
// or ok false when the region is not planned (it has control flow).
func (sc *autoScope) decide(region *ir.Region) (decisions map[*ir.Op]RematDecision, index map[*ir.Op]int, ok bool) {
	for _, op := range region.Ops {
		if len(op.Regions) > 0 {
			return nil, nil, false
		}
	}
	decisions, index = map[*ir.Op]RematDecision{}, map[*ir.Op]int{}
	k := 0
	for i, op := range region.Ops {
		if adMarkOfOp(op) != nil {
			continue
		}
		if sc.ps.user[op] {
			decisions[op] = saveDecision
			continue
		}
		c := RematCandidate{Scope: sc.scope, Index: k, Op: op, Iterations: sc.iters,
			Carry: i < sc.carry && op.Code == ir.CheckpointName && op.Attrs.String("name") == autoRematName}
		index[op] = k
		k++
		if d := sc.ps.p.Decide(c); d.Action != Recompute {
			decisions[op] = d
		}
	}
	return decisions, index, true
}

// adUsedParams reports which parameters of t's region the ops its results
// need read (the captures adInlineTracer keeps).
func adUsedParams(r *ir.Region) map[*ir.Value]bool {
	used, _ := adNeeded(r)
	return used
}

// adNeeded returns the values r's results need and which ops compute them.
func adNeeded(r *ir.Region) (map[*ir.Value]bool, []bool) {
	used := map[*ir.Value]bool{}
	for _, v := range r.Results {
		used[v] = true
	}
	keep := make([]bool, len(r.Ops))
	for i := len(r.Ops) - 1; i >= 0; i-- {
		op := r.Ops[i]
		for _, v := range op.Results {
			keep[i] = keep[i] || used[v]
		}
		if keep[i] {
			for _, a := range op.Args {
				used[a] = true
			}
		}
	}
	return used, keep
}
