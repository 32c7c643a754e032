package passes

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// Fusion kinds (the "kind" attribute of a fusion op).
const (
	FusionLoop   = "loop"   // elementwise ops, broadcasts and reshapes
	FusionInput  = "input"  // a loop group feeding reductions, whose results are outputs
	FusionOutput = "output" // a matrix product first, then its elementwise epilogue
)

// fusion groups ops of every region (not across region boundaries) into
// fusion ops:
//
//   - loop: elementwise ops (OpInfo.Elementwise), broadcast_in_dim and reshape
//     connected by def-use edges form one group;
//   - input: a reduce_sum/max/min/prod whose operand is produced by a loop
//     group joins it; nothing that depends on a reduction joins its group, so
//     every reduction result is an output of the fusion;
//   - output: a dot_general whose result is used only by elementwise ops of
//     one loop group (its epilogue), and is not returned, joins that group;
//     the fusion region holds the dot_general first. At the top level, with
//     Options.FusionInPlace, it does not when the group updates a donated
//     parameter (reads it and returns a result of its size and space): the
//     product is computed into the result's buffer before the epilogue reads
//     its operands, so an output fusion can't write over the parameter,
//     while the loop group alone can (a training step's weight update then
//     reuses the weight's buffer, at the cost of the gradient's temp).
//
// A loop op pulls in the group of a narrow operand (narrowEdge: a value at
// least narrowRatio times smaller than the op's result, such as a global
// norm or a step count about to be broadcast) only once the other merges are
// done, and only when nothing outside the two groups reads the producer
// group: a narrow value costs next to nothing to keep in a buffer, and
// merging through it would tie every large consumer of it (independent
// chains) into one multi-output fusion whose operands and results must then
// all be live at once. For the same reason a broadcast of a narrow operand
// is first copied for each of its fusible users (splitNarrowBroadcasts).
//
// Cheap producers — scalar constants, iota, and broadcasts and reshapes of
// those — are not grouped but copied into every group that reads them (not
// into a dot_general's operands), so broadcast scalars never get a buffer.
// Groups merge only when no path leaves the merged group and comes back (no
// cycles). A value of a group used outside it, or returned, is a result of the
// fusion op; fusion operands are the outside values in order of first use, and
// results follow the order of the grouped ops. A group of one op with no
// cheap producer to copy in is left as a plain op.
func fusion(st *State) error {
	return walkRegions(st.Func.Body, false, func(r *ir.Region) error {
		var donated map[*ir.Value]bool
		if r == st.Func.Body && st.Options.FusionInPlace {
			donated = map[*ir.Value]bool{}
			for i, d := range st.Options.Donated {
				if d {
					donated[r.Params[i]] = true
				}
			}
		}
		fuseRegion(st.Func, r, donated)
		return nil
	})
}

type fuseKind uint8

const (
	fkNone fuseKind = iota
	fkLoop
	fkReduce
	fkDot
	fkCheap
)

type fuseGroup struct {
	members   []*ir.Op
	hasReduce bool
	hasDot    bool
	// reductions holds the reductions in the group; consumes those that
	// members read.
	reductions map[*ir.Op]bool
	consumes   map[*ir.Op]bool
	seen       uint32 // the stamp of the last cycle search that entered it
}

type fuser struct {
	f     *ir.Func
	r     *ir.Region
	pos   map[*ir.Op]int
	def   map[*ir.Value]*ir.Op
	users map[*ir.Value][]*ir.Op
	ret   map[*ir.Value]bool
	kinds map[*ir.Op]fuseKind
	group map[*ir.Op]*fuseGroup
	// donated holds the donated parameters of the top-level region.
	donated map[*ir.Value]bool
	// The cycle search's marks (seen[pos] == stamp) and stack.
	stamp uint32
	seen  []uint32
	stack []*ir.Op
}

func fuseRegion(f *ir.Func, r *ir.Region, donated map[*ir.Value]bool) {
	splitNarrowBroadcasts(f, r)
	fu := &fuser{f: f, r: r, pos: map[*ir.Op]int{}, def: map[*ir.Value]*ir.Op{}, users: users(r),
		ret: returned(r), kinds: map[*ir.Op]fuseKind{}, group: map[*ir.Op]*fuseGroup{}, donated: donated}
	for i, op := range r.Ops {
		fu.pos[op] = i
		for _, v := range op.Results {
			fu.def[v] = op
		}
	}
	for _, op := range r.Ops {
		fu.kinds[op] = fu.classify(op)
	}
	type edge struct {
		p, op *ir.Op
	}
	var narrow []edge
	for _, op := range r.Ops {
		switch fu.kinds[op] {
		case fkLoop:
			g := fu.newGroup(op)
			for _, a := range op.Args {
				p := fu.def[a]
				if p == nil || fu.kinds[p] != fkLoop {
					continue
				}
				if narrowEdge(a, op) {
					narrow = append(narrow, edge{p, op})
					continue
				}
				if pg := fu.group[p]; pg != g && !pg.hasDot {
					g = fu.tryMerge(pg, g)
				}
			}
		case fkReduce:
			g := fu.newGroup(op)
			g.hasReduce = true
			g.reductions[op] = true
			if p := fu.def[op.Args[0]]; p != nil && fu.kinds[p] == fkLoop {
				if pg := fu.group[p]; !pg.hasDot {
					fu.tryMerge(pg, g)
				}
			}
		}
	}
	for _, e := range narrow {
		pg, g := fu.group[e.p], fu.group[e.op]
		if pg != g && !pg.hasDot && fu.onlyFeeds(pg, g) {
			fu.tryMerge(pg, g)
		}
	}
	for _, op := range r.Ops {
		if fu.kinds[op] == fkDot {
			fu.tryEpilogue(op)
		}
	}
	fu.rewrite()
}

// narrowRatio is how many times more elements a loop op's result must have
// than an operand for that operand to be narrow (see narrowEdge).
const narrowRatio = 64

// narrowEdge reports whether operand a of loop op is narrow: a has at most
// 1/narrowRatio of the elements of op's result. A narrow operand's producer
// group joins op's group only after the other merges, and only when it feeds
// nothing else (fuser.onlyFeeds).
func narrowEdge(a *ir.Value, op *ir.Op) bool {
	n := op.Results[0].Type.Shape.Size()
	return a.Type.Shape.Size()*narrowRatio <= n
}

// splitNarrowBroadcasts gives every fusible user (an elementwise op, a
// broadcast, a reshape or a reduction) of a broadcast_in_dim of a narrow
// operand its own copy of the broadcast, placed just before it, when the
// broadcast has more than one user. A fused kernel recomputes such a
// broadcast for free, and one shared broadcast would otherwise merge all its
// users (independent chains that share only, say, a global norm) into one
// multi-output fusion. Users of other kinds keep the original.
func splitNarrowBroadcasts(f *ir.Func, r *ir.Region) {
	us := users(r)
	ret := returned(r)
	fusible := func(op *ir.Op) bool {
		switch op.Code {
		case ir.BroadcastInDim, ir.Reshape, ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd:
			return true
		}
		return op.Info().Elementwise
	}
	before := map[*ir.Op][]*ir.Op{} // user → copies to insert before it
	for _, op := range r.Ops {
		if op.Code != ir.BroadcastInDim || !narrowEdge(op.Args[0], op) {
			continue
		}
		v := op.Result()
		var distinct []*ir.Op
		for _, u := range us[v] {
			if !slices.Contains(distinct, u) {
				distinct = append(distinct, u)
			}
		}
		if len(distinct) < 2 {
			continue
		}
		keep := ret[v] || slices.ContainsFunc(distinct, func(u *ir.Op) bool { return !fusible(u) })
		for _, u := range distinct {
			if !fusible(u) {
				continue
			}
			if !keep {
				keep = true // the first fusible user keeps the original
				continue
			}
			c, err := f.NewOp(op.Code, []*ir.Value{op.Args[0]}, ir.CloneAttrs(op.Attrs))
			if err != nil {
				panic("passes: fusion: copying broadcast_in_dim: " + err.Error())
			}
			c.Loc = op.Loc
			for i, a := range u.Args {
				if a == v {
					u.Args[i] = c.Result()
				}
			}
			before[u] = append(before[u], c)
		}
	}
	if len(before) == 0 {
		return
	}
	ops := make([]*ir.Op, 0, len(r.Ops))
	for _, op := range r.Ops {
		ops = append(ops, before[op]...)
		ops = append(ops, op)
	}
	r.Ops = ops
}

// onlyFeeds reports whether every op outside group p that reads a result of
// p is a member of group g.
func (fu *fuser) onlyFeeds(p, g *fuseGroup) bool {
	for _, m := range p.members {
		for _, v := range m.Results {
			for _, u := range fu.users[v] {
				if ug := fu.group[u]; ug != p && ug != g {
					return false
				}
			}
		}
	}
	return true
}

// classify says how op may take part in fusion.
func (fu *fuser) classify(op *ir.Op) fuseKind {
	if fu.cheap(op) {
		return fkCheap
	}
	switch {
	case op.Info().Elementwise, op.Code == ir.BroadcastInDim, op.Code == ir.Reshape, op.Code == ir.Transpose:
		return fkLoop
	case op.Code == ir.ReduceSum, op.Code == ir.ReduceMax, op.Code == ir.ReduceMin, op.Code == ir.ReduceProd:
		return fkReduce
	case op.Code == ir.DotGeneral:
		return fkDot
	}
	return fkNone
}

// cheap reports whether op is a scalar constant, an iota, a broadcast or
// reshape of a cheap op of this region, or an elementwise op of cheap ops
// (a causal mask: iota ≥ iota).
func (fu *fuser) cheap(op *ir.Op) bool {
	if k, ok := fu.kinds[op]; ok {
		return k == fkCheap
	}
	switch op.Code {
	case ir.Iota:
		return true
	case ir.Constant:
		return isScalarConst(op)
	case ir.BroadcastInDim, ir.Reshape:
		p := fu.def[op.Args[0]]
		return p != nil && fu.cheap(p)
	}
	if op.Info().Elementwise && len(op.Results) == 1 && len(op.Args) > 0 {
		// A comparison of iotas (a causal mask) and the like.
		for _, a := range op.Args {
			if p := fu.def[a]; p == nil || !fu.cheap(p) {
				return false
			}
		}
		return true
	}
	return false
}

func (fu *fuser) newGroup(op *ir.Op) *fuseGroup {
	g := &fuseGroup{members: []*ir.Op{op}, reductions: map[*ir.Op]bool{}, consumes: map[*ir.Op]bool{}}
	for _, a := range op.Args {
		if p := fu.def[a]; p != nil && fu.kinds[p] == fkReduce {
			g.consumes[p] = true
		}
	}
	fu.group[op] = g
	return g
}

// tryMerge merges groups a and b when that is legal and returns the group b's
// members are in afterwards.
func (fu *fuser) tryMerge(a, b *fuseGroup) *fuseGroup {
	if a == b {
		return a
	}
	if a.hasDot && b.hasDot || (a.hasDot || b.hasDot) && (a.hasReduce || b.hasReduce) {
		return b
	}
	for op := range a.reductions {
		if b.consumes[op] {
			return b
		}
	}
	for op := range b.reductions {
		if a.consumes[op] {
			return b
		}
	}
	if fu.cycle(a, b) || fu.breaksInPlace(a, b) {
		return b
	}
	if len(a.members) < len(b.members) {
		a, b = b, a
	}
	for _, op := range b.members {
		fu.group[op] = a
	}
	a.members = append(a.members, b.members...)
	a.hasReduce = a.hasReduce || b.hasReduce
	a.hasDot = a.hasDot || b.hasDot
	for op := range b.reductions {
		a.reductions[op] = true
	}
	for op := range b.consumes {
		a.consumes[op] = true
	}
	return a
}

// cycle reports whether some path leaves a ∪ b and comes back, which merging
// the two would turn into a cycle. Paths run through other groups as single
// nodes.
func (fu *fuser) cycle(a, b *fuseGroup) bool {
	// The search runs once per merge attempt, so its marks are stamps (a
	// new stamp clears them all) and its stack is reused.
	fu.stamp++
	stamp := fu.stamp
	if len(fu.seen) < len(fu.r.Ops) {
		fu.seen = make([]uint32, len(fu.r.Ops))
	}
	in := func(op *ir.Op) bool {
		g := fu.group[op]
		return g == a || g == b
	}
	stack := fu.stack[:0]
	push := func(op *ir.Op) {
		i, ok := fu.pos[op]
		if !ok || fu.seen[i] == stamp {
			return
		}
		fu.seen[i] = stamp
		stack = append(stack, op)
	}
	succ := func(op *ir.Op, outside bool) bool {
		for _, v := range op.Results {
			for _, u := range fu.users[v] {
				if in(u) {
					if outside {
						return true
					}
					continue
				}
				push(u)
			}
		}
		return false
	}
	for _, g := range []*fuseGroup{a, b} {
		for _, m := range g.members {
			succ(m, false)
		}
	}
	defer func() { fu.stack = stack[:0] }()
	for len(stack) > 0 {
		op := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if g := fu.group[op]; g != nil && g.seen != stamp {
			g.seen = stamp
			for _, m := range g.members {
				push(m)
			}
		}
		if succ(op, true) {
			return true
		}
	}
	return false
}

// tryEpilogue merges dot_general d into the loop group that uses its result,
// when every use is an elementwise op of that one group.
func (fu *fuser) tryEpilogue(d *ir.Op) {
	v := d.Result()
	us := fu.users[v]
	if fu.ret[v] || len(us) == 0 {
		return
	}
	g := fu.group[us[0]]
	if g == nil || g.hasDot || g.hasReduce {
		return
	}
	for _, u := range us {
		if fu.group[u] != g || !u.Info().Elementwise {
			return
		}
	}
	for _, a := range d.Args {
		if p := fu.def[a]; p != nil && fu.group[p] == g {
			return
		}
	}
	if fu.updatesDonated(g) || !fu.fitsProduct(g, v) {
		return
	}
	dg := fu.newGroup(d)
	dg.hasDot = true
	fu.tryMerge(g, dg)
}

// fitsProduct reports whether group g has an output (a member's result used
// outside g or returned) with the element count and element size of the
// product v: the buffer an output fusion computes its product into before
// the epilogue runs (passes.Kernel.DotResult). A bf16 product whose
// epilogue only converts it to f32 has none, and is not fused.
func (fu *fuser) fitsProduct(g *fuseGroup, v *ir.Value) bool {
	for _, op := range g.members {
		for _, r := range op.Results {
			if r.Type.Size() != v.Type.Size() || r.Type.DType.Size() != v.Type.DType.Size() {
				continue
			}
			if fu.ret[r] {
				return true
			}
			for _, u := range fu.users[r] {
				if fu.group[u] != g {
					return true
				}
			}
		}
	}
	return false
}

// breaksInPlace reports whether merging groups a and b would stop an update
// of a donated parameter that one of them may write in place (see
// inPlaceUpdates) from being in place: say the group computing a step count
// count+1 next to values broadcast from it.
func (fu *fuser) breaksInPlace(a, b *fuseGroup) bool {
	if len(fu.donated) == 0 {
		return false
	}
	before := fu.inPlaceUpdates(a.members)
	for p := range fu.inPlaceUpdates(b.members) {
		before[p] = true
	}
	if len(before) == 0 {
		return false
	}
	after := fu.inPlaceUpdates(append(append([]*ir.Op(nil), a.members...), b.members...))
	for p := range before {
		if !after[p] {
			return true
		}
	}
	return false
}

// inPlaceUpdates returns the donated parameters that a fusion of members
// reads only element for element (through elementwise ops and reshapes, as
// pointwiseOperand requires) and that it returns a value of the size and
// memory space of: the parameters it may overwrite in place.
func (fu *fuser) inPlaceUpdates(members []*ir.Op) map[*ir.Value]bool {
	out := map[*ir.Value]bool{}
	ops := slices.Clone(members)
	slices.SortFunc(ops, func(x, y *ir.Op) int { return fu.pos[x] - fu.pos[y] })
	for _, m := range ops {
		for _, p := range m.Args {
			if !fu.donated[p] || out[p] {
				continue
			}
			returns := false
			for _, o := range ops {
				for _, v := range o.Results {
					returns = returns || fu.ret[v] && bytesOf(v) == bytesOf(p) && v.Type.Space == p.Type.Space
				}
			}
			if returns && pointwiseFrom(ops, p) {
				out[p] = true
			}
		}
	}
	return out
}

// pointwiseFrom reports whether ops (in order) reach the values from only
// through elementwise ops and reshapes.
func pointwiseFrom(ops []*ir.Op, from ...*ir.Value) bool {
	tainted := map[*ir.Value]bool{}
	for _, v := range from {
		tainted[v] = true
	}
	for _, op := range ops {
		if !slices.ContainsFunc(op.Args, func(a *ir.Value) bool { return tainted[a] }) {
			continue
		}
		if !op.Info().Elementwise && op.Code != ir.Reshape {
			return false
		}
		for _, v := range op.Results {
			tainted[v] = true
		}
	}
	return true
}

// updatesDonated reports whether group g reads a donated parameter and
// returns a value of the parameter's size and memory space.
func (fu *fuser) updatesDonated(g *fuseGroup) bool {
	if len(fu.donated) == 0 {
		return false
	}
	for _, m := range g.members {
		for _, a := range m.Args {
			if !fu.donated[a] {
				continue
			}
			for _, o := range g.members {
				for _, v := range o.Results {
					if fu.ret[v] && bytesOf(v) == bytesOf(a) && v.Type.Space == a.Type.Space {
						return true
					}
				}
			}
		}
	}
	return false
}

// rewrite replaces every group of two or more ops (cheap copies included) by a
// fusion op and restores a topological order.
func (fu *fuser) rewrite() {
	done := map[*fuseGroup]bool{}
	s := subst{}
	replaced := map[*ir.Op]*ir.Op{}
	key := map[*ir.Op]int{}
	for _, op := range fu.r.Ops {
		g := fu.group[op]
		if g == nil || done[g] {
			continue
		}
		done[g] = true
		if fop := fu.build(g, s); fop != nil {
			for _, m := range g.members {
				replaced[m] = fop
			}
			key[fop] = fu.pos[op]
		}
	}
	if len(replaced) == 0 {
		return
	}
	var ops []*ir.Op
	added := map[*ir.Op]bool{}
	for _, op := range fu.r.Ops {
		if fop, ok := replaced[op]; ok {
			if !added[fop] {
				added[fop] = true
				ops = append(ops, fop)
			}
			continue
		}
		key[op] = fu.pos[op]
		ops = append(ops, op)
	}
	for _, op := range ops {
		s.apply(op)
	}
	s.applyResults(fu.r)
	ops = stableTopo(ops, func(op *ir.Op) int { return key[op] })
	// Cheap producers copied into every group that read them may be dead now.
	used := map[*ir.Value]bool{}
	for _, v := range fu.r.Results {
		used[v] = true
	}
	keep := make([]bool, len(ops))
	for i := len(ops) - 1; i >= 0; i-- {
		op := ops[i]
		live := fu.kinds[op] != fkCheap
		for _, v := range op.Results {
			live = live || used[v]
		}
		if live {
			keep[i] = true
			for _, a := range op.Args {
				used[a] = true
			}
		}
	}
	fu.r.Ops = fu.r.Ops[:0]
	for i, op := range ops {
		if keep[i] {
			fu.r.Ops = append(fu.r.Ops, op)
		}
	}
}

// build makes the fusion op of group g (nil when g is too small to fuse) and
// records the replacement of its outputs in s.
func (fu *fuser) build(g *fuseGroup, s subst) *ir.Op {
	b := newFusionBuilder(fu, g)
	if b.size() < 2 {
		return nil
	}
	b.region = fu.f.NewRegion()
	b.bindArgs()
	b.region.Ops = b.regionOps()
	outs := b.outputs()
	b.region.Results = outs
	kind := FusionLoop
	switch {
	case g.hasDot:
		kind = FusionOutput
	case g.hasReduce:
		kind = FusionInput
	}
	region := b.region
	fop, err := fu.f.NewOp(ir.Fusion, b.args, ir.Attrs{"kind": kind}, region)
	if err != nil {
		panic("passes: fusion: " + err.Error())
	}
	fop.Loc = region.Ops[len(region.Ops)-1].Loc
	if g.hasDot {
		fop.Loc = region.Ops[0].Loc
	}
	for i, v := range outs {
		s[v] = fop.Results[i]
	}
	return fop
}

// fusionBuilder is the state of fuser.build: the group's members and the
// fusion region made of them.
type fusionBuilder struct {
	fu *fuser
	g  *fuseGroup
	// members are the group's ops in traced order, its dot (if any) first.
	members []*ir.Op
	inGroup map[*ir.Op]bool
	region  *ir.Region
	// inner maps an outside value to its region value.
	inner map[*ir.Value]*ir.Value
	// args are the fusion op's operands, one per region parameter.
	args []*ir.Value
	// cheapOps are the copies of cheap producers, in the order made.
	cheapOps []*ir.Op
}

// newFusionBuilder orders g's members.
func newFusionBuilder(fu *fuser, g *fuseGroup) *fusionBuilder {
	members := append([]*ir.Op{}, g.members...)
	sortOps(members, fu.pos)
	if g.hasDot {
		for i, m := range members {
			if fu.kinds[m] == fkDot {
				copy(members[1:i+1], members[:i])
				members[0] = m
				break
			}
		}
	}
	inGroup := map[*ir.Op]bool{}
	for _, m := range members {
		inGroup[m] = true
	}
	return &fusionBuilder{fu: fu, g: g, members: members, inGroup: inGroup, inner: map[*ir.Value]*ir.Value{}}
}

// size counts the ops the fusion would hold, cheap copies included, to
// decide whether fusing is worth it.
func (b *fusionBuilder) size() int {
	fu := b.fu
	n := len(b.members)
	cheapSeen := map[*ir.Op]bool{}
	for _, m := range b.members {
		if fu.kinds[m] == fkDot {
			continue
		}
		for _, a := range m.Args {
			if p := fu.def[a]; p != nil && !b.inGroup[p] && fu.kinds[p] == fkCheap {
				n += b.countCheap(p, cheapSeen)
			}
		}
	}
	return n
}

// countCheap counts op and the ops it reads, transitively, not in seen,
// and adds them to seen.
func (b *fusionBuilder) countCheap(op *ir.Op, seen map[*ir.Op]bool) int {
	if seen[op] {
		return 0
	}
	seen[op] = true
	n := 1
	for _, a := range op.Args {
		if p := b.fu.def[a]; p != nil {
			n += b.countCheap(p, seen)
		}
	}
	return n
}

// bindArgs makes the members read region values: a copy of a cheap
// producer, or a parameter. The dot's operands come first, so that they
// are the first parameters.
func (b *fusionBuilder) bindArgs() {
	fu := b.fu
	for _, m := range b.members {
		isDot := fu.kinds[m] == fkDot
		for i, a := range m.Args {
			p := fu.def[a]
			switch {
			case p != nil && b.inGroup[p]:
			case p != nil && !isDot && fu.kinds[p] == fkCheap:
				m.Args[i] = b.clone(a)
			default:
				m.Args[i] = b.param(a)
			}
		}
	}
}

// clone returns the region copy of v, copying its op and (recursively)
// the ops it reads.
func (b *fusionBuilder) clone(v *ir.Value) *ir.Value {
	if iv, ok := b.inner[v]; ok {
		return iv
	}
	fu := b.fu
	op := fu.def[v]
	cargs := make([]*ir.Value, len(op.Args))
	for i, a := range op.Args {
		cargs[i] = b.clone(a)
	}
	c, err := fu.f.NewOp(op.Code, cargs, ir.CloneAttrs(op.Attrs))
	if err != nil {
		panic("passes: fusion: copying " + op.Code.String() + ": " + err.Error())
	}
	c.Loc = op.Loc
	b.cheapOps = append(b.cheapOps, c)
	for i, r := range op.Results {
		b.inner[r] = c.Results[i]
	}
	return b.inner[v]
}

// param returns the region parameter bound to v, adding it if new.
func (b *fusionBuilder) param(v *ir.Value) *ir.Value {
	if iv, ok := b.inner[v]; ok {
		return iv
	}
	p := b.region.AddParam(v.Type)
	b.args = append(b.args, v)
	b.inner[v] = p
	return p
}

// regionOps returns the region's ops: the dot, the cheap copies, then the
// other members.
func (b *fusionBuilder) regionOps() []*ir.Op {
	members := b.members
	var ops []*ir.Op
	if b.g.hasDot {
		ops = append(ops, members[0])
		members = members[1:]
	}
	ops = append(ops, b.cheapOps...)
	return append(ops, members...)
}

// outputs returns the members' results read outside the group or returned.
func (b *fusionBuilder) outputs() []*ir.Value {
	fu := b.fu
	var outs []*ir.Value
	for _, m := range b.region.Ops {
		if !b.inGroup[m] {
			continue
		}
		for _, v := range m.Results {
			out := fu.ret[v]
			for _, u := range fu.users[v] {
				out = out || !b.inGroup[u]
			}
			if out {
				outs = append(outs, v)
			}
		}
	}
	return outs
}

// sortOps sorts ops by position.
func sortOps(ops []*ir.Op, pos map[*ir.Op]int) {
	slices.SortFunc(ops, func(a, b *ir.Op) int { return pos[a] - pos[b] })
}
