package budget

import (
	"cmp"
	"fmt"
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
// products (Flop) and of elementwise arithmetic (Elem),
// device↔pinned_host bytes per second one way (Bandwidth), and, for a
// sharded function, the collectives' bus bytes per second (Collective,
// NCCL's busbw: an all-gather or reduce-scatter of S bytes over n devices
// takes S·(n−1)/n / Collective, an all-reduce twice that; 0 leaves the
// collectives unpriced).
//
// Serial says that the backend's device↔pinned_host copies (and its
// collectives) run on the cores that compute (the CPU backend emulates the
// two spaces in host memory): no copy is hidden behind arithmetic, so every
// offloaded byte costs its transfers out and back in full, the copies to
// device and to host one after the other, and the collectives add to the
// arithmetic. Otherwise (a GPU's copy engines, with a stream for each
// direction) a scan's offload transfers cost only what its compute does not
// hide, the link is full duplex (the step pays the larger of its copies to
// device and to host, not their sum) and the collectives run beside the
// arithmetic (the step pays the longer).
type Rates struct {
	Flop, Elem, Bandwidth, Collective float64
	Serial                            bool
}

// MaxCompiles bounds the traces and compiles of one bisection.
const MaxCompiles = 24

// Plan traces and compiles f under plans until it finds the fastest that
// fits budget bytes of device memory (MemoryAnalysis.TotalBytes), priced at
// rates r, and returns that trace, compiled, with its plan. For a sharded
// function (Args.Mesh) the budget is per device: the program compiled is
// the per-device one (its sharded residuals, the layers it gathers and the
// gradients it reduce-scatters), and its memory analysis is one device's;
// so is the estimate (the per-device program's arithmetic and collectives,
// each residual's share of a device's bytes and arithmetic) and so are the
// plan's bytes.
// name names the function in errors. It plans the residuals with the
// arguments where the caller put them; when no such plan fits (and the
// function is not sharded), it places in pinned_host the smallest set of
// arguments it finds that makes a plan fit, among the stacked layer weights
// (arguments the program reads only as scans' xs) and the optimizer state
// passed in (hostArgs), and plans the residuals again. A budget no plan
// fits is an *Error.
func Plan(f Function, name string, budget int64, r Rates) (Trace, *passes.MemoryPlan, error) {
	s := &search{f: f, name: name, budget: budget, rates: r}
	base, full, fits, err := s.plans(nil, linkSecs{})
	if err != nil {
		return nil, nil, err
	}
	host := map[int]string{}                     // argument leaves placed in pinned_host: the action
	if len(fits) == 0 && base.args.Mesh == nil { // a sharded function's arguments stay put
		var hfull *planTry
		if host, hfull, fits, err = s.hostArgs(base, full); err != nil {
			return nil, nil, err
		}
		if hfull != nil && hfull.total < full.total {
			full = hfull
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

// hostArgs chooses the argument leaves to place in pinned_host when no plan
// of the residuals fits with every argument where the caller put it (base,
// and full, the smallest such plan): the candidates are stacked weights
// (streamedArgs) and optimizer state (stateArgs) the function traces with
// there; it orders them cheapest transfer per byte first and, among equals,
// so that the first ones cover the bytes full is over the budget with the
// fewest bytes (the smallest leaf that covers what is left, else the
// largest); then it searches, by bisection over that order with each try
// planning the residuals to their minimum, for the shortest prefix whose
// smallest plan fits, and plans the residuals with it. It returns the leaves
// placed (none when even all of them do not fit), the smallest plan it
// reached, and the tries that fit.
func (s *search) hostArgs(base, full *planTry) (host map[int]string, hfull *planTry, fits []*planTry, err error) {
	seq := s.hostOrder(base, full.total-s.budget)
	if len(seq) == 0 {
		return nil, nil, nil, nil
	}
	tried := map[string]*minimumPlan{} // by the set's leaves
	key := func(set []hostArg) string { return fmt.Sprint(s.hostMask(base, set)) }
	probeSet := func(set []hostArg) (bool, error) {
		m, err := s.minimum(s.hostMask(base, set), s.hostSecs(base, set))
		if err != nil {
			return false, err
		}
		tried[key(set)] = m
		hf := m.full
		if hfull == nil || hf.total < hfull.total {
			hfull = hf
		}
		return hf.total <= s.budget, nil
	}
	probe := func(k int) (bool, error) { return probeSet(seq[:k]) }
	// The first guess: the leaves that cover the bytes over the budget.
	lo, hi := 0, len(seq)
	over, guess := full.total-s.budget, 0
	for guess < len(seq) && s.bytesOf(base, seq[:guess]) < over {
		guess++
	}
	guess = max(guess, 1)
	ok, err := probe(guess)
	if err != nil {
		return nil, nil, nil, err
	}
	if ok {
		// A leaf moved saves at most its bytes: no shorter prefix covers
		// what is over the budget.
		lo, hi = guess-1, guess
	} else {
		if lo = guess; guess < len(seq) {
			if ok, err = probe(len(seq)); err != nil {
				return nil, nil, nil, err
			}
		}
		if !ok {
			return nil, hfull, nil, nil
		}
	}
	for limit := s.compiles + MaxCompiles; hi-lo > 1 && s.compiles < limit; {
		mid := (lo + hi) / 2
		if ok, err = probe(mid); err != nil {
			return nil, nil, nil, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	// The prefix may hold leaves the budget does not need (cheap ones
	// before the dear ones that were needed anyway): leave out each group
	// of leaves copied as often and placed alike, the largest group first,
	// while the rest still fits.
	set := seq[:hi]
	for _, g := range s.hostGroups(base, set) {
		rest := slices.DeleteFunc(slices.Clone(set), func(c hostArg) bool { return g[c] })
		if len(rest) == 0 || len(rest) == len(set) || s.bytesOf(base, rest) < over {
			continue // (too few bytes left to fit)
		}
		if ok, err = probeSet(rest); err != nil {
			return nil, nil, nil, err
		}
		if ok {
			set = rest
		}
	}
	host = map[int]string{}
	for _, c := range set {
		host[c.leaf] = c.action
	}
	// The set's minimum is known: search on from there.
	m := tried[key(set)]
	if m == nil {
		if m, err = s.minimum(s.hostMask(base, set), s.hostSecs(base, set)); err != nil {
			return nil, nil, nil, err
		}
	}
	hf := m.full
	if fits, err = m.fitting(); err != nil {
		return nil, nil, nil, err
	}
	if hf.total < hfull.total {
		hfull = hf
	}
	return host, hfull, fits, nil
}

// hostArg is an argument leaf the planner may place in pinned_host, with
// the action that places it.
type hostArg struct {
	leaf   int
	action string
}

// hostOrder returns the argument leaves the planner may place in
// pinned_host for the trace base (every argument where the caller put it),
// those the function does not trace with there left out, in the order
// hostArgs tries them: the fewest copies per call first (the cheapest
// transfer per byte moved); among leaves copied as often, those that cover
// over bytes with the fewest bytes first (the smallest leaf that covers
// what is left, else the largest), then the rest by size, largest first.
func (s *search) hostOrder(base *planTry, over int64) []hostArg {
	f, a := base.tr.Func(), base.args
	all := map[int]string{}
	for _, i := range streamedArgs(f, len(a.Weak), a.Weak) {
		all[i] = passes.ActionHostArgument
	}
	for _, i := range stateArgs(f, a.Defs, a.Results, a.Donated, a.Weak) {
		all[i] = passes.ActionHostState
	}
	if len(all) == 0 {
		return nil
	}
	all = s.traceable(all, len(a.Weak))
	bytes := func(i int) int64 { return savedBytes(f, a, i, all[i]) }
	copies := func(i int) float64 { return moveCopies(f, a, i, all[i]) }
	// By copies, then largest first, then by leaf.
	rest := slices.SortedFunc(maps.Keys(all), func(x, y int) int {
		return cmp.Or(cmp.Compare(copies(x), copies(y)), cmp.Compare(bytes(y), bytes(x)), cmp.Compare(x, y))
	})
	var seq []hostArg
	for len(rest) > 0 && over > 0 {
		// Among the cheapest left, the smallest leaf that covers what is
		// left, else the largest (the first).
		pick := 0
		for j, i := range rest {
			if copies(i) != copies(rest[0]) {
				break
			}
			if bytes(i) >= over {
				pick = j
			}
		}
		i := rest[pick]
		seq = append(seq, hostArg{i, all[i]})
		over -= bytes(i)
		rest = slices.Delete(rest, pick, pick+1)
	}
	for _, i := range rest {
		seq = append(seq, hostArg{i, all[i]})
	}
	return seq
}

// hostGroups returns the leaves of set in groups of those copied as often
// per call and placed with the same action, the group of the most bytes
// first.
func (s *search) hostGroups(base *planTry, set []hostArg) []map[hostArg]bool {
	f, a := base.tr.Func(), base.args
	type key struct {
		copies float64
		action string
	}
	groups := map[key]map[hostArg]bool{}
	bytes := map[key]int64{}
	var keys []key
	for _, c := range set {
		k := key{moveCopies(f, a, c.leaf, c.action), c.action}
		if groups[k] == nil {
			groups[k] = map[hostArg]bool{}
			keys = append(keys, k)
		}
		groups[k][c] = true
		bytes[k] += f.Body.Params[c.leaf].Type.Bytes()
	}
	slices.SortStableFunc(keys, func(x, y key) int { return cmp.Compare(bytes[y], bytes[x]) })
	out := make([]map[hostArg]bool, len(keys))
	for i, k := range keys {
		out[i] = groups[k]
	}
	return out
}

// bytesOf returns the most device bytes placing the argument leaves set of
// base in pinned_host can save: their bytes, twice for a leaf whose new
// value the call returns at its place (it goes to pinned_host too).
func (s *search) bytesOf(base *planTry, set []hostArg) int64 {
	n := int64(0)
	for _, c := range set {
		n += savedBytes(base.tr.Func(), base.args, c.leaf, c.action)
	}
	return n
}

// savedBytes is the most device bytes placing argument leaf i in
// pinned_host with action can save (bytesOf).
func savedBytes(f *ir.Func, a Args, i int, action string) int64 {
	b := f.Body.Params[i].Type.Bytes()
	if moveCopies(f, a, i, action) > float64(scanReads(f, i)) {
		b *= 2 // its new value is written to pinned_host too
	}
	return b
}

// hostMask marks the leaves of args among the argument leaves of base.
func (s *search) hostMask(base *planTry, args []hostArg) []bool {
	mask := make([]bool, len(base.args.Weak))
	for _, c := range args {
		mask[c.leaf] = true
	}
	return mask
}

// hostSecs estimates the seconds per call of the copies of args, placed in
// pinned_host, that no scan body prices (hostCopies), to device and to host.
func (s *search) hostSecs(base *planTry, args []hostArg) linkSecs {
	f := base.tr.Func()
	var l linkSecs
	for _, c := range args {
		in, out := hostCopiesDir(f, base.args, c.leaf, c.action)
		b := float64(f.Body.Params[c.leaf].Type.Bytes()) / s.rates.Bandwidth
		l.in += in * b
		l.out += out * b
	}
	return l
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
		mask := make([]bool, n)
		for i := range m {
			mask[i] = true
		}
		_, err = s.f.Trace(pt, mask)
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
	in, out := hostCopiesDir(f, a, i, action)
	return in + out
}

// hostCopiesDir is hostCopies by direction: the copies to device (in) and
// to pinned_host (out).
func hostCopiesDir(f *ir.Func, a Args, i int, action string) (in, out float64) {
	if action == passes.ActionHostState {
		return 1, 1
	}
	if scanReads(f, i) > 1 {
		in = 1
	}
	if i >= len(a.Donated) || !a.Donated[i] {
		return in, 0
	}
	k := 0
	for j, d := range a.Defs {
		if n := d.NumLeaves(); i < k+n {
			if j < len(a.Results) && a.Results[j].String() == d.String() {
				return in, 1
			}
			return in, 0
		}
		k += d.NumLeaves()
	}
	return in, 0
}

// moveCopies is how many times one call copies all of argument leaf i,
// placed in pinned_host with action, between the spaces, scans' copies
// included: state in and out; streamed weights in by every scan that reads
// them, and out when the call returns their new value (hostCopies).
func moveCopies(f *ir.Func, a Args, i int, action string) float64 {
	if action == passes.ActionHostState {
		return 2
	}
	in := 0.0
	if scanReads(f, i) > 1 {
		in = 1
	}
	return hostCopies(f, a, i, action) - in + float64(scanReads(f, i))
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
