package ir

// ShardingRule is an op's sharding propagation rule, the OpInfo.Shard slot
// (GSPMD's per-op propagation). Given the shardings known so far of the op's
// operands (args) and results (nil: unknown), it proposes shardings for the
// others: forward (operands → results) and backward (results → operands), and
// from one operand to another where the op ties them (the contracting
// dimensions of dot_general). A proposal for a value whose sharding is already
// known says the layout the op wants that value in; propagation ignores it
// (a value keeps the first sharding it gets) and the partitioner reshards
// where the two differ. A rule never fails: where it knows nothing it
// proposes nil. Proposals are not checked against shapes; the caller drops
// the axes of a dimension they do not divide.
type ShardingRule func(op *Op, args, results []*NamedSharding) ShardingProposal

// ShardingProposal is what a ShardingRule proposes: one entry per operand and
// per result (nil: no proposal), and, for each result, whether it is a partial
// reduction.
type ShardingProposal struct {
	Args    []*NamedSharding
	Results []*NamedSharding
	// Partial, when not nil, has one entry per result: a result whose entry
	// names axes is, on each device, only a partial reduction over those mesh
	// axes (a reduction over, or a dot_general contracting, a dimension split
	// over them). Its sharding is the layout the value has once the partitioner
	// combines the partial values with an all-reduce of the entry's Reduction
	// over those axes (or a reduce-scatter, where the user wants the value
	// split over them).
	Partial []PartialReduction
}

// PartialReduction marks a value as a partial reduction over mesh axes.
type PartialReduction struct {
	// Axes are the mesh axes the partial values must be combined over; empty
	// when the value is complete.
	Axes []string
	// Reduction is how: "sum", "max", "min" (AllReduce's reductions) or
	// "prod".
	Reduction string
}

// DefaultShardedOps lists the ops whose Shard rule is ShardReplicate on
// purpose: their results are proposed fully replicated, so the partitioner
// gathers their operands. Every other op has a rule of its own.
var DefaultShardedOps = []Code{While, Cond, Fusion,
	AllReduce, AllGather, ReduceScatter, AllToAll, CollectivePermute, AxisIndex}

// ShardReplicate is the default rule: every result is proposed fully
// replicated on the mesh of a sharded operand or result; operands get no
// proposal (they become replicated unless something else shards them).
func ShardReplicate(op *Op, args, results []*NamedSharding) ShardingProposal {
	m := meshOf(args, results)
	if m == nil {
		return ShardingProposal{}
	}
	p := ShardingProposal{Results: make([]*NamedSharding, len(op.Results))}
	for i, r := range op.Results {
		p.Results[i] = Replicated(m, r.Type.Rank())
	}
	return p
}

// Replicated returns the sharding that keeps every dimension of a rank-rank
// array whole on mesh m.
func Replicated(m *Mesh, rank int) *NamedSharding {
	return &NamedSharding{Mesh: m, Spec: make(PartitionSpec, rank)}
}

func meshOf(lists ...[]*NamedSharding) *Mesh {
	for _, l := range lists {
		for _, s := range l {
			if s != nil {
				return s.Mesh
			}
		}
	}
	return nil
}

// dimAxes returns the axes of dimension d of s (nil when unknown or whole).
func dimAxes(s *NamedSharding, d int) []string {
	if s == nil || d >= len(s.Spec) {
		return nil
	}
	return s.Spec[d]
}

// build makes a sharding of rank dimensions over m from per-dimension axes,
// dropping an axis already used by an earlier dimension or listed in taken.
func build(m *Mesh, dims [][]string, taken ...string) *NamedSharding {
	used := map[string]bool{}
	for _, a := range taken {
		used[a] = true
	}
	spec := make(PartitionSpec, len(dims))
	for d, axes := range dims {
		for _, a := range axes {
			if !used[a] {
				used[a] = true
				spec[d] = append(spec[d], a)
			}
		}
	}
	return &NamedSharding{Mesh: m, Spec: spec}
}

// pickShared chooses, from the known shardings, the one most of them have
// (ties: the one splitting into more blocks, then the earliest): the choice
// that needs the fewest reshards, and GSPMD's preference for the more
// specific sharding.
func pickShared(ss []*NamedSharding) *NamedSharding {
	var best *NamedSharding
	bestN := 0
	for i, s := range ss {
		if s == nil {
			continue
		}
		n := 0
		for _, o := range ss[i:] {
			if o != nil && o.Equal(s) {
				n++
			}
		}
		if n > bestN || n == bestN && s.NumShards() > best.NumShards() {
			best, bestN = s, n
		}
	}
	return best
}

// shardElementwise: the result and every operand share one sharding — the
// result's when known, else the one most operands have (see pickShared).
func shardElementwise(op *Op, args, results []*NamedSharding) ShardingProposal {
	s := results[0]
	if s == nil {
		s = pickShared(args)
	}
	if s == nil {
		return ShardingProposal{}
	}
	p := ShardingProposal{Args: make([]*NamedSharding, len(args)), Results: []*NamedSharding{s}}
	for i := range args {
		p.Args[i] = s
	}
	return p
}

// shardIdentity: operand i and result i share a sharding (the result's when
// known, as in the elementwise rule).
func shardIdentity(op *Op, args, results []*NamedSharding) ShardingProposal {
	p := ShardingProposal{Args: make([]*NamedSharding, len(args)), Results: make([]*NamedSharding, len(results))}
	for i := range args {
		s := results[i]
		if s == nil {
			s = args[i]
		}
		p.Args[i], p.Results[i] = s, s
	}
	return p
}

// shardNothing is the rule of ops without operands (constant, iota): they
// take whatever their users propose.
func shardNothing(*Op, []*NamedSharding, []*NamedSharding) ShardingProposal {
	return ShardingProposal{}
}

// mapDims is the rule of ops whose result dimension j holds operand 0's
// dimension src[j] unchanged (src[j] = -1: a new or changed dimension, kept
// whole). Other operands get no proposal.
func mapDims(op *Op, args, results []*NamedSharding, src []int) ShardingProposal {
	p := ShardingProposal{Args: make([]*NamedSharding, len(args)), Results: make([]*NamedSharding, 1)}
	if a := args[0]; a != nil {
		dims := make([][]string, len(src))
		for j, i := range src {
			if i >= 0 {
				dims[j] = dimAxes(a, i)
			}
		}
		p.Results[0] = build(a.Mesh, dims)
	}
	if r := results[0]; r != nil {
		dims := make([][]string, op.Args[0].Type.Rank())
		for j, i := range src {
			if i >= 0 {
				dims[i] = dimAxes(r, j)
			}
		}
		p.Args[0] = build(r.Mesh, dims)
	}
	return p
}

func shardBroadcast(op *Op, args, results []*NamedSharding) ShardingProposal {
	in, out := op.Args[0].Type.Shape, op.Results[0].Type.Shape
	src := make([]int, len(out))
	for j := range src {
		src[j] = -1
	}
	for i, j := range op.Attrs.Ints("dims") {
		if in[i] == out[j] { // a broadcast size-1 dimension is not carried
			src[j] = i
		}
	}
	p := mapDims(op, args, results, src)
	// Values repeat along the other dimensions: a device makes any block of
	// them, so a known result keeps its split there.
	if r := results[0]; r != nil && p.Results[0] != nil {
		dims := make([][]string, len(out))
		for j := range out {
			dims[j] = dimAxes(p.Results[0], j)
		}
		var taken []string
		for j := range out {
			taken = append(taken, dims[j]...)
		}
		for j := range out {
			if src[j] < 0 && len(dims[j]) == 0 {
				dims[j] = without(dimAxes(r, j), taken)
				taken = append(taken, dims[j]...)
			}
		}
		p.Results[0] = build(r.Mesh, dims)
	}
	return p
}

func shardTranspose(op *Op, args, results []*NamedSharding) ShardingProposal {
	return mapDims(op, args, results, op.Attrs.Ints("perm"))
}

// shardSlice: dimensions a slice takes whole keep their axes.
func shardSlice(op *Op, args, results []*NamedSharding) ShardingProposal {
	in := op.Args[0].Type.Shape
	start, limit, strides := op.Attrs.Ints("start"), op.Attrs.Ints("limit"), op.Attrs.Ints("strides")
	src := make([]int, len(in))
	for d := range in {
		src[d] = -1
		if start[d] == 0 && limit[d] == in[d] && (strides == nil || strides[d] == 1) {
			src[d] = d
		}
	}
	return mapDims(op, args, results, src)
}

// shardPad: dimensions without padding keep their axes; the padding value
// (a scalar) is replicated.
func shardPad(op *Op, args, results []*NamedSharding) ShardingProposal {
	low, high, interior := op.Attrs.Ints("low"), op.Attrs.Ints("high"), op.Attrs.Ints("interior")
	src := make([]int, op.Args[0].Type.Rank())
	for d := range src {
		src[d] = -1
		if low[d] == 0 && high[d] == 0 && interior[d] == 0 {
			src[d] = d
		}
	}
	p := mapDims(op, args, results, src)
	if m := meshOf(args, results); m != nil {
		p.Args[1] = Replicated(m, 0)
	}
	return p
}

// shardAlong is the rule of ops that treat every operand and result alike
// except along one dimension, which must be whole (concatenate's axis,
// sort's dimension): the elementwise rule with that dimension dropped.
func shardAlong(dim int) func(op *Op, args, results []*NamedSharding) ShardingProposal {
	return func(op *Op, args, results []*NamedSharding) ShardingProposal {
		s := pickShared(results)
		if s == nil {
			s = pickShared(args)
		}
		if s == nil {
			return ShardingProposal{}
		}
		rank := op.Results[0].Type.Rank()
		dims := make([][]string, rank)
		for d := range rank {
			if d != dim {
				dims[d] = dimAxes(s, d)
			}
		}
		s = build(s.Mesh, dims)
		p := ShardingProposal{Args: make([]*NamedSharding, len(args)), Results: make([]*NamedSharding, len(results))}
		for i := range args {
			p.Args[i] = s
		}
		for i := range results {
			p.Results[i] = s
		}
		return p
	}
}

func shardConcatenate(op *Op, args, results []*NamedSharding) ShardingProposal {
	return shardAlong(op.Attrs.Int("axis"))(op, args, results)
}

func shardSort(op *Op, args, results []*NamedSharding) ShardingProposal {
	return shardAlong(op.Attrs.Int("dimension"))(op, args, results)
}

// shardReduce: the result keeps the axes of the kept dimensions. A known
// operand stays as it is along the reduced dimensions: their axes make the
// result a partial reduction over them (Partial), and the result's spec does
// not use them. Backward, an unknown operand is proposed whole along the
// reduced dimensions. argmax and argmin (no reduction) want their axis whole.
func shardReduce(reduction string) ShardingRule {
	return func(op *Op, args, results []*NamedSharding) ShardingProposal {
		axes := op.Attrs.Ints("axes")
		if op.Code == ArgMax || op.Code == ArgMin {
			axes = []int{op.Attrs.Int("axis")}
		}
		rank := op.Args[0].Type.Rank()
		reduced := map[int]bool{}
		for _, a := range axes {
			reduced[a] = true
		}
		var src []int
		for d := range rank {
			if !reduced[d] {
				src = append(src, d)
			}
		}
		p := mapDims(op, args, results, src)
		a := args[0]
		if a == nil || reduction == "" {
			return p
		}
		var partial []string
		for d := range rank {
			if reduced[d] {
				partial = append(partial, dimAxes(a, d)...)
			}
		}
		if len(partial) == 0 {
			return p
		}
		// The wanted operand: its own axes on the reduced dimensions, the
		// result's (or its own) elsewhere; the result without the partial axes.
		want := p.Args[0]
		if want == nil {
			want = a
		}
		dims := make([][]string, rank)
		resDims := make([][]string, len(src))
		for d := range rank {
			if reduced[d] {
				dims[d] = dimAxes(a, d)
			}
		}
		for j, d := range src {
			dims[d] = without(dimAxes(want, d), partial)
			resDims[j] = dims[d]
		}
		p.Args[0] = build(a.Mesh, dims)
		p.Results[0] = build(a.Mesh, resDims)
		p.Partial = []PartialReduction{{Axes: partial, Reduction: reduction}}
		return p
	}
}

// without returns the axes of xs not in drop.
func without(xs, drop []string) []string {
	var out []string
	for _, x := range xs {
		keep := true
		for _, d := range drop {
			keep = keep && x != d
		}
		if keep {
			out = append(out, x)
		}
	}
	return out
}

// shardReshape carries a dimension's axes through a reshape where dimensions
// split or merge cleanly (see reshapeSpec); other dimensions are whole.
func shardReshape(op *Op, args, results []*NamedSharding) ShardingProposal {
	in, out := op.Args[0].Type.Shape, op.Results[0].Type.Shape
	p := ShardingProposal{Args: make([]*NamedSharding, 1), Results: make([]*NamedSharding, 1)}
	if a := args[0]; a != nil {
		p.Results[0] = &NamedSharding{Mesh: a.Mesh, Spec: reshapeSpec(a, in, out)}
	}
	if r := results[0]; r != nil {
		p.Args[0] = &NamedSharding{Mesh: r.Mesh, Spec: reshapeSpec(r, out, in)}
	}
	return p
}

// reshapeSpec maps the spec of s, on shape from, to shape to. The shapes are
// cut into groups of consecutive dimensions with equal products; in a group,
// the axes of the first dimension of size > 1 move to the group's first
// output dimension of size > 1, provided no other dimension of the group is
// split and the axes' size divides that output dimension. Every block a
// device holds is then the same run of elements before and after, so the
// reshape needs no communication. Anything else stays whole.
func reshapeSpec(s *NamedSharding, from, to Shape) PartitionSpec {
	out := make(PartitionSpec, len(to))
	if from.Size() == 0 {
		return out
	}
	i, j := 0, 0
	for i < len(from) && j < len(to) {
		i0, j0 := i, j
		pi, pj := from[i], to[j]
		i, j = i+1, j+1
		for pi != pj {
			if pi < pj && i < len(from) {
				pi *= from[i]
				i++
			} else if pj < pi && j < len(to) {
				pj *= to[j]
				j++
			} else {
				return out
			}
		}
		var axes []string
		ok := true
		for d := i0; d < i; d++ {
			if a := dimAxes(s, d); len(a) > 0 {
				if axes != nil || from[d] == 1 {
					ok = false
				}
				axes = a
			} else if axes == nil && from[d] > 1 {
				axes = []string{} // the first dimension of size > 1 is whole
			}
		}
		if !ok || len(axes) == 0 {
			continue
		}
		ways := 1
		for _, a := range axes {
			ways *= s.Mesh.AxisSize(a)
		}
		for d := j0; d < j; d++ {
			if to[d] > 1 {
				if to[d]%ways == 0 {
					out[d] = append([]string{}, axes...)
				}
				break
			}
		}
	}
	return out
}

// shardDot is dot_general's rule. Result dimensions are the batch dimensions,
// then lhs's free ones, then rhs's. A known result's layout holds and the
// operands follow it; else a batch dimension takes its axes from lhs, else
// rhs, and free dimensions come from their operand;
// a contracting dimension takes the axes of its partner on the other side.
// When both operands split a contracting pair over the same axes, the result
// is a partial sum over them (Partial), and those axes are not used by the
// result's spec.
func shardDot(op *Op, args, results []*NamedSharding) ShardingProposal {
	m := meshOf(args, results)
	if m == nil {
		return ShardingProposal{}
	}
	at := op.Attrs
	lb, rb, lc, rc := at.Ints("lhs_batch"), at.Ints("rhs_batch"), at.Ints("lhs_contract"), at.Ints("rhs_contract")
	lr, rr := op.Args[0].Type.Rank(), op.Args[1].Type.Rank()
	free := func(rank int, b, c []int) []int {
		skip := map[int]bool{}
		for _, d := range append(append([]int{}, b...), c...) {
			skip[d] = true
		}
		var f []int
		for d := range rank {
			if !skip[d] {
				f = append(f, d)
			}
		}
		return f
	}
	lf, rf := free(lr, lb, lc), free(rr, rb, rc)
	l, r, res := args[0], args[1], results[0]
	first := func(xs ...[]string) []string {
		for _, x := range xs {
			if len(x) > 0 {
				return x
			}
		}
		return nil
	}
	// Contracting pairs: the axes both sides agree on (or one side's, the
	// other unknown) make a partial sum.
	var partial []string
	contract := make([][]string, len(lc))
	for k := range lc {
		la, ra := dimAxes(l, lc[k]), dimAxes(r, rc[k])
		switch {
		case l != nil && r != nil:
			if slicesEqual(la, ra) {
				contract[k] = la
			}
		case l != nil:
			contract[k] = la
		case r != nil:
			contract[k] = ra
		}
		partial = append(partial, contract[k]...)
	}
	resDims := make([][]string, 0, len(lb)+len(lf)+len(rf))
	if res != nil { // a known result: the operands follow it
		for d := range len(lb) + len(lf) + len(rf) {
			resDims = append(resDims, dimAxes(res, d))
		}
	}
	for k := 0; res == nil && k < len(lb); k++ {
		resDims = append(resDims, first(dimAxes(l, lb[k]), dimAxes(r, rb[k]), dimAxes(res, k)))
	}
	for k := 0; res == nil && k < len(lf); k++ {
		resDims = append(resDims, dimAxes(l, lf[k]))
	}
	for k := 0; res == nil && k < len(rf); k++ {
		resDims = append(resDims, dimAxes(r, rf[k]))
	}
	p := ShardingProposal{Args: make([]*NamedSharding, 2), Results: []*NamedSharding{build(m, resDims, partial...)}}
	resS := p.Results[0]
	ld, rd := make([][]string, lr), make([][]string, rr)
	for k := range lb {
		ld[lb[k]], rd[rb[k]] = dimAxes(resS, k), dimAxes(resS, k)
	}
	for k, d := range lf {
		ld[d] = dimAxes(resS, len(lb)+k)
	}
	for k, d := range rf {
		rd[d] = dimAxes(resS, len(lb)+len(lf)+k)
	}
	for k := range lc {
		ld[lc[k]], rd[rc[k]] = contract[k], contract[k]
	}
	p.Args[0], p.Args[1] = build(m, ld), build(m, rd)
	if len(partial) > 0 {
		p.Partial = []PartialReduction{{Axes: partial, Reduction: "sum"}}
	}
	return p
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// shardScan ties the carry: operand num_consts+i and result i share a
// sharding. The scan's stacked outputs (ys) get no proposal here; the
// propagation pass carries shardings into the body through its parameters.
func shardScan(op *Op, args, results []*NamedSharding) ShardingProposal {
	nc, nk := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
	p := ShardingProposal{Args: make([]*NamedSharding, len(args)), Results: make([]*NamedSharding, len(results))}
	for i := range nk {
		s := args[nc+i]
		if s == nil {
			s = results[i]
		}
		p.Args[nc+i], p.Results[i] = s, s
	}
	return p
}

// dimRef names dimension Dim of operand Arg (Arg >= 0) or of result -Arg-1.
type dimRef struct{ Arg, Dim int }

// shardLinked is the rule of ops whose dimensions fall into groups that must
// be split alike (an operand dimension and the result dimension it becomes):
// groups have two members or more, and a group takes the axes of a known
// result in it, else of its first operand with a known sharding; dimensions
// in no group are whole. A value is proposed a sharding when it is known or
// one of its groups has a known member; the operands listed in scalars
// (start indices) are proposed replicated.
func shardLinked(op *Op, args, results []*NamedSharding, groups [][]dimRef, scalars ...int) ShardingProposal {
	m := meshOf(args, results)
	if m == nil {
		return ShardingProposal{}
	}
	known := func(r dimRef) *NamedSharding {
		if r.Arg >= 0 {
			return args[r.Arg]
		}
		return results[-r.Arg-1]
	}
	p := ShardingProposal{Args: make([]*NamedSharding, len(args)), Results: make([]*NamedSharding, len(results))}
	argDims, resDims := make([][][]string, len(args)), make([][][]string, len(results))
	argSeen, resSeen := make([]bool, len(args)), make([]bool, len(results))
	for i, a := range op.Args {
		argDims[i] = make([][]string, a.Type.Rank())
	}
	for i, r := range op.Results {
		resDims[i] = make([][]string, r.Type.Rank())
	}
	for _, g := range groups {
		var axes []string
		found := false
		for _, results := range []bool{true, false} { // a known result first
			for _, r := range g {
				if s := known(r); s != nil && !found && (r.Arg < 0) == results {
					axes, found = dimAxes(s, r.Dim), true
				}
			}
		}
		if !found {
			continue
		}
		for _, r := range g {
			if r.Arg >= 0 {
				argDims[r.Arg][r.Dim], argSeen[r.Arg] = axes, true
			} else {
				resDims[-r.Arg-1][r.Dim], resSeen[-r.Arg-1] = axes, true
			}
		}
	}
	for i := range args {
		if argSeen[i] || args[i] != nil {
			p.Args[i] = build(m, argDims[i])
		}
	}
	for i := range results {
		if resSeen[i] || results[i] != nil {
			p.Results[i] = build(m, resDims[i])
		}
	}
	for _, i := range scalars {
		p.Args[i] = Replicated(m, op.Args[i].Type.Rank())
	}
	return p
}

// upTo returns from, from+1, ..., n-1.
func upTo(from, n int) []int {
	out := make([]int, 0, n-from)
	for i := from; i < n; i++ {
		out = append(out, i)
	}
	return out
}

// gatherGroups links the dimensions of a gather's operand (argument 0),
// indices (argument 1) and result res (a dimRef Arg) — or a scatter's
// operand, indices and updates: the operand's dimensions but axis go to the
// same positions around the indices' dimensions; the operand's axis is whole.
func gatherGroups(op *Op, res int) [][]dimRef {
	axis := op.Attrs.Int("axis")
	rank, nIdx := op.Args[0].Type.Rank(), op.Args[1].Type.Rank()
	var g [][]dimRef
	for d := range rank {
		switch {
		case d < axis:
			g = append(g, []dimRef{{0, d}, {res, d}})
		case d > axis:
			g = append(g, []dimRef{{0, d}, {res, d - 1 + nIdx}})
		}
	}
	for k := range nIdx {
		g = append(g, []dimRef{{1, k}, {res, axis + k}})
	}
	return g
}

// shardGather: the result is split like the operand outside the gathered
// axis and like the indices inside it; the gathered axis is whole.
func shardGather(op *Op, args, results []*NamedSharding) ShardingProposal {
	return shardLinked(op, args, results, gatherGroups(op, -1))
}

// shardScatterAdd: the result is split like the operand, and the updates'
// dimensions that come from the operand alike; the scattered axis, the
// indices and the updates' index dimensions are whole (a device holding only
// some of the updates would make the result a partial sum that also counts
// the operand once per device).
func shardScatterAdd(op *Op, args, results []*NamedSharding) ShardingProposal {
	var g [][]dimRef
	for _, grp := range gatherGroups(op, 2) {
		if grp[0].Arg == 0 {
			g = append(g, append(grp, dimRef{-1, grp[0].Dim}))
		}
	}
	return shardLinked(op, args, results, g)
}

// shardDynamicSlice: dimensions taken whole keep their axes; the start
// indices are replicated.
func shardDynamicSlice(op *Op, args, results []*NamedSharding) ShardingProposal {
	in, sizes := op.Args[0].Type.Shape, op.Attrs.Ints("sizes")
	var g [][]dimRef
	for d := range in {
		if sizes[d] == in[d] {
			g = append(g, []dimRef{{0, d}, {-1, d}})
		}
	}
	return shardLinked(op, args, results, g, upTo(1, len(op.Args))...)
}

// shardDynamicUpdateSlice: the dimensions the update covers whole are split
// alike in operand, update and result; the others are whole (the window
// may land anywhere along them); the start indices are replicated.
func shardDynamicUpdateSlice(op *Op, args, results []*NamedSharding) ShardingProposal {
	in, up := op.Args[0].Type.Shape, op.Args[1].Type.Shape
	var g [][]dimRef
	for d := range in {
		if up[d] == in[d] {
			g = append(g, []dimRef{{0, d}, {-1, d}, {1, d}})
		}
	}
	return shardLinked(op, args, results, g, upTo(2, len(op.Args))...)
}

// installShardRules fills the Shard slot of every op.
func installShardRules() {
	for c := Code(1); c < numCodes; c++ {
		info := &opTable[c]
		if info.Elementwise {
			info.Shard = shardElementwise
		}
	}
	set := func(r ShardingRule, codes ...Code) {
		for _, c := range codes {
			opTable[c].Shard = r
		}
	}
	set(shardNothing, Constant, Iota)
	set(shardIdentity, DevicePut, CheckpointName, OptimizationBarrier)
	set(shardConstraint, ShardingConstraint)
	set(shardBroadcast, BroadcastInDim)
	set(shardReshape, Reshape)
	set(shardTranspose, Transpose)
	set(shardSlice, Slice)
	set(shardPad, Pad)
	set(shardConcatenate, Concatenate)
	set(shardSort, Sort)
	set(shardReduce("sum"), ReduceSum)
	set(shardReduce("max"), ReduceMax)
	set(shardReduce("min"), ReduceMin)
	set(shardReduce("prod"), ReduceProd)
	set(shardReduce(""), ArgMax, ArgMin) // the arg axis is proposed whole
	set(shardDot, DotGeneral)
	set(shardScan, Scan)
	set(shardGather, Gather)
	set(shardScatterAdd, ScatterAdd)
	set(shardDynamicSlice, DynamicSlice)
	set(shardDynamicUpdateSlice, DynamicUpdateSlice)
	set(ShardReplicate, DefaultShardedOps...)
}

// shardConstraint: the result and the operand take the sharding the
// constraint names, whatever else is known (a layout other than that is the
// partitioner's to reshard into it).
func shardConstraint(op *Op, args, results []*NamedSharding) ShardingProposal {
	s, err := ParseSharding(op.Attrs.String("sharding"))
	if err != nil { // the verifier has checked it
		return ShardingProposal{}
	}
	return ShardingProposal{Args: []*NamedSharding{s}, Results: []*NamedSharding{s}}
}
