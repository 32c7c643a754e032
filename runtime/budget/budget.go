package budget

import (
	"cmp"
	"maps"
	"slices"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// Function is the function to plan, as the runtime traces it.
type Function interface {
	// Trace traces the function with p deciding the residuals of its
	// planned scopes (trace.Tracer.SetRematPlanner) and the argument
	// leaves host marks (nil: none) as parameters in pinned_host.
	Trace(p trace.RematPlanner, host []bool) (Trace, error)
}

// Trace is one trace of the function under a plan.
type Trace interface {
	// Func is the traced IR: its parameters are the argument leaves in
	// order, then the arrays the function captured.
	Func() *ir.Func
	// Args describes the trace's arguments and results.
	Args() Args
	// Compile compiles the trace (without dumping it) and returns the
	// program, whose memory analysis is the plan's.
	Compile() (*passes.Program, error)
}

// Args describes a trace's arguments and results to the planner.
type Args struct {
	// Defs and Results are the tree structures of the arguments and of the
	// results.
	Defs, Results []*trace.TreeDef
	// Weak and Donated mark the argument leaves that are weakly typed and
	// those the call donates.
	Weak, Donated []bool
	// Name describes argument leaf i in the plan ("leaf 1 of argument 0").
	Name func(i int) string
	// Mesh is the mesh a sharded function is partitioned over (nil: the
	// function runs on one device). The compiled program is then the
	// per-device program: its memory analysis, and so the budget, are
	// per device.
	Mesh *ir.Mesh
}

// Rates are the rates the planner prices plans with: FLOP/s of matrix
// products (Flop) and of elementwise arithmetic (Elem), and
// device↔pinned_host bytes per second one way (Bandwidth).
//
// Serial says that the backend's device↔pinned_host copies run on the
// cores that compute (the CPU backend emulates the two spaces in host
// memory): no copy is hidden behind arithmetic, so every offloaded byte
// costs its transfers out and back in full. Otherwise (a GPU's copy
// engines) a scan's offload transfers cost only what its compute does not
// hide.
type Rates struct {
	Flop, Elem, Bandwidth float64
	Serial                bool
}

// MaxCompiles bounds the traces and compiles of one bisection.
const MaxCompiles = 24

// Plan traces and compiles f under plans until it finds the fastest that
// fits budget bytes of device memory (MemoryAnalysis.TotalBytes), priced at
// rates r, and returns that trace, compiled, with its plan. For a sharded
// function (Args.Mesh) the budget is per device: the program compiled is
// the per-device one (its sharded residuals, the layers it gathers and the
// gradients it reduce-scatters), and its memory analysis is one device's.
// name names the
// function in errors. It plans the residuals with the arguments where the
// caller put them; when no such plan fits (and the function is not
// sharded), it places the arguments the
// program reads only as scans' xs (stacked layer weights) in pinned_host
// and plans again, then optimizer state passed in too. A budget no plan
// fits is an *Error.
func Plan(f Function, name string, budget int64, r Rates) (Trace, *passes.MemoryPlan, error) {
	s := &search{f: f, name: name, budget: budget, rates: r}
	base, full, fits, err := s.plans(nil, 0)
	if err != nil {
		return nil, nil, err
	}
	host := map[int]string{}                     // argument leaves placed in pinned_host: the action
	if len(fits) == 0 && base.args.Mesh == nil { // a sharded function's arguments stay put
		for _, m := range hostStages(base) {
			if m = s.traceable(m, len(base.args.Weak)); len(m) == 0 {
				continue
			}
			mask := hostMask(m, len(base.args.Weak))
			secs := 0.0
			for i, a := range m {
				secs += hostCopies(base.tr.Func(), base.args, i, a) * float64(base.tr.Func().Body.Params[i].Type.Bytes()) / r.Bandwidth
			}
			var hfull *planTry
			if _, hfull, fits, err = s.plans(mask, secs); err != nil {
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
		return nil, nil, newError(name, budget, base.total, full, base.args.Mesh)
	}
	// The fastest estimate wins; among equals (transfers the compute hides
	// cost nothing in the estimate), the plan that decides the fewest
	// values: it moves and recomputes the least.
	best := slices.MinFunc(fits, func(a, b *planTry) int {
		return cmp.Or(cmp.Compare(a.cost.step, b.cost.step), cmp.Compare(len(a.decide), len(b.decide)))
	})
	return best.tr, buildPlan(best, host, base.total, budget, r, s.compiles), nil
}

// hostStages returns the placements of arguments in pinned_host to try, in
// order, for the trace base (every argument where the caller put it):
// first the stacked weights; then the optimizer state too.
func hostStages(base *planTry) []map[int]string {
	f, a := base.tr.Func(), base.args
	streamed := streamedArgs(f, len(a.Weak), a.Weak)
	state := stateArgs(f, a.Defs, a.Results, a.Donated, a.Weak)
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
	return stages
}

// hostMask marks the n argument leaves of m.
func hostMask(m map[int]string, n int) []bool {
	mask := make([]bool, n)
	for i := range m {
		mask[i] = true
	}
	return mask
}

// traceable returns the part of placement m (of n argument leaves) the
// function traces with: all of it when it does; else, leaf by leaf in
// order, those it still traces with once added to the ones kept. A leaf
// the stage rules admit can still be read where only a device array is
// allowed (a parameter read elementwise, as a norm's scale, and returned
// updated looks like optimizer state, but its reader does not copy it in),
// and such a trace fails: that leaf stays where the caller put it.
// Traces here are not compiled.
func (s *search) traceable(m map[int]string, n int) map[int]string {
	try := func(m map[int]string) (err error) {
		defer trace.Recover(&err) // a trace error may come as a panic
		pt := &planTrace{cands: map[candKey]*candInfo{}}
		_, err = s.f.Trace(pt, hostMask(m, n))
		return err
	}
	if try(m) == nil {
		return m
	}
	ok := map[int]string{}
	for _, i := range slices.Sorted(maps.Keys(m)) {
		ok[i] = m[i]
		if try(ok) != nil {
			delete(ok, i)
		}
	}
	return ok
}

// hostCopies is how many times one call copies all of argument leaf i,
// placed in pinned_host with action, between the spaces: state is copied
// in and its new value out; streamed weights are copied in once in the
// forward pass (the backward pass's copies are stream values), and their
// new value out when the call returns one at their place (a donated
// argument whose result at the same position has its structure: the
// parameters a step updates).
//
// A streamed argument is copied in by every scan that reads it; each
// copy is a stream value of the scan's body, priced there, except the
// forward scan's of a gradient (the stream value is the copy its backward
// scan makes again): one copy when two or more scans read it (a forward
// and a backward scan, and perhaps an optimizer's scan over the layers),
// none when one does (an optimizer's moments, read by its scan only).
func hostCopies(f *ir.Func, a Args, i int, action string) float64 {
	if action == passes.ActionHostState {
		return 2
	}
	in := 0.0
	if scanReads(f, i) > 1 {
		in = 1
	}
	if i >= len(a.Donated) || !a.Donated[i] {
		return in
	}
	k := 0
	for j, d := range a.Defs {
		if n := d.NumLeaves(); i < k+n {
			if j < len(a.Results) && a.Results[j].String() == d.String() {
				return in + 1
			}
			return in
		}
		k += d.NumLeaves()
	}
	return in
}

// scanReads counts the top-level scans of f that read parameter i as xs.
func scanReads(f *ir.Func, i int) int {
	if i >= len(f.Body.Params) {
		return 0
	}
	p, n := f.Body.Params[i], 0
	for _, op := range f.Body.Ops {
		if op.Code != ir.Scan {
			continue
		}
		xs := op.Attrs.Int("num_consts") + op.Attrs.Int("num_carry")
		if xs < len(op.Args) && slices.Contains(op.Args[xs:], p) {
			n++
		}
	}
	return n
}
