package passes

import (
	"math/big"

	"github.com/ferryml/ferry/ir"
)

// maxRecompute bounds the ops copied to recompute one value, and
// maxRecomputeRounds the rounds over a region.
const (
	maxRecompute       = 16
	maxRecomputeRounds = 8
)

// recompute copies, for the ops that need it after a reduction, the
// elementwise chain that computes the reduction's operand, so that fusion
// does not have to keep that full-size value in a buffer.
//
// A value v computed elementwise and reduced (the exponentials of a softmax,
// the centred input of a layer norm) is often read again by ops that depend on
// that very reduction (the division by the row sums, the scaling by the
// variance's rsqrt). No fusion can hold both the reduction and those ops, so
// v would be a result of the reduction's input fusion, materialised at full
// size until its last use. Instead, when v is computed from values that are
// live anyway — region parameters (not donated top-level ones), values at
// least narrowRatio times smaller than v (row vectors), scalar constants and
// iotas — or from a stored value no larger than v that only the chain reads
// (a matrix product), through at most maxRecompute elementwise ops (no
// comparison or select: cheapToRepeat), broadcasts and reshapes, recompute
// copies that chain once, just before the first op that
// depends on the reduction, and makes those ops read the copy. Fusion then
// puts the copy into their loop fusion: v is computed twice and never stored.
// (XLA:CPU gets there by fusing a reduction with the ops after it; see
// conformance/memory for the comparison.)
func recompute(st *State) error {
	donated := map[*ir.Value]bool{}
	for i, d := range st.Options.Donated {
		if d && i < len(st.Func.Body.Params) {
			donated[st.Func.Body.Params[i]] = true
		}
	}
	return walkRegions(st.Func.Body, false, func(r *ir.Region) error {
		// A copy may itself feed a later reduction and ops that depend on
		// it (the backward pass of a softmax): a few more rounds copy it too.
		for range maxRecomputeRounds {
			if !recomputeRegion(st.Func, r, donated) {
				break
			}
		}
		return nil
	})
}

func isReduction(op *ir.Op) bool {
	switch op.Code {
	case ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd:
		return true
	}
	return false
}

// chainOp reports whether op may be part of a recomputed chain: one result,
// elementwise, a broadcast or a reshape.
func chainOp(op *ir.Op) bool {
	return len(op.Results) == 1 && len(op.Regions) == 0 &&
		(op.Info().Elementwise || op.Code == ir.BroadcastInDim || op.Code == ir.Reshape)
}

// recomputeRegion makes one round over r and reports whether it copied anything.
func recomputeRegion(f *ir.Func, r *ir.Region, donated map[*ir.Value]bool) bool {
	s := newRecomputeState(f, r, donated)
	if s == nil {
		return false
	}
	for _, op := range r.Ops {
		s.tryCopy(op)
	}
	if len(s.before) == 0 {
		return false
	}
	ops := make([]*ir.Op, 0, len(r.Ops))
	for _, op := range r.Ops {
		ops = append(ops, s.before[op]...)
		ops = append(ops, op)
	}
	r.Ops = ops
	return true
}

// recomputeState is one round of recompute over a region: what each op
// depends on and flows into, and the copies made so far.
type recomputeState struct {
	f       *ir.Func
	r       *ir.Region
	donated map[*ir.Value]bool
	// redIdx numbers the reductions of r.
	redIdx   map[*ir.Op]int
	pos      map[*ir.Op]int
	inRegion map[*ir.Op]bool
	// dep[op]: the reductions op depends on, transitively within r.
	dep map[*ir.Op]*big.Int
	// reach[op]: the reductions a chain op's result flows into through chain
	// ops only (the reductions whose input fusion it may join).
	reach map[*ir.Op]*big.Int
	us    map[*ir.Value][]*ir.Op
	ret   map[*ir.Value]bool
	// before maps an op to the copies to insert before it.
	before map[*ir.Op][]*ir.Op
	// fresh holds this round's copies, touched the ops whose operands this
	// round changed; chains through either wait for the next round, which
	// sees them with fresh maps.
	fresh, touched map[*ir.Op]bool
}

// newRecomputeState returns the state of a round over r, or nil when r
// has no reduction.
func newRecomputeState(f *ir.Func, r *ir.Region, donated map[*ir.Value]bool) *recomputeState {
	var nred int
	redIdx := map[*ir.Op]int{}
	for _, op := range r.Ops {
		if isReduction(op) {
			redIdx[op] = nred
			nred++
		}
	}
	if nred == 0 {
		return nil
	}
	s := &recomputeState{
		f: f, r: r, donated: donated, redIdx: redIdx,
		pos:      map[*ir.Op]int{},
		inRegion: map[*ir.Op]bool{},
		before:   map[*ir.Op][]*ir.Op{},
		fresh:    map[*ir.Op]bool{},
		touched:  map[*ir.Op]bool{},
	}
	for i, op := range r.Ops {
		s.pos[op] = i
		s.inRegion[op] = true
	}
	s.findDeps()
	s.us = users(r)
	s.ret = returned(r)
	s.findReach()
	return s
}

// findDeps fills dep.
func (s *recomputeState) findDeps() {
	s.dep = map[*ir.Op]*big.Int{}
	for _, op := range s.r.Ops {
		d := new(big.Int)
		for _, a := range op.Args {
			p := a.Op
			if p == nil || !s.inRegion[p] {
				continue
			}
			d.Or(d, s.dep[p])
			if i, ok := s.redIdx[p]; ok {
				d.SetBit(d, i, 1)
			}
		}
		s.dep[op] = d
	}
}

// findReach fills reach, from the last op back.
func (s *recomputeState) findReach() {
	s.reach = map[*ir.Op]*big.Int{}
	for i := len(s.r.Ops) - 1; i >= 0; i-- {
		op := s.r.Ops[i]
		if !chainOp(op) {
			continue
		}
		m := new(big.Int)
		for _, u := range s.us[op.Result()] {
			if j, ok := s.redIdx[u]; ok && u.Args[0] == op.Result() {
				m.SetBit(m, j, 1)
			} else if chainOp(u) && s.reach[u] != nil {
				m.Or(m, s.reach[u])
			}
		}
		s.reach[op] = m
	}
}

// tryCopy copies the chain computing op's result before the first of its
// readers that depends on a reduction op flows into, when that chain is
// cheap and reads only values live anyway.
func (s *recomputeState) tryCopy(op *ir.Op) {
	if !chainOp(op) || !op.Info().Elementwise || s.reach[op].Sign() == 0 {
		return
	}
	v := op.Result()
	if s.ret[v] {
		return
	}
	dependents := s.dependents(op)
	if len(dependents) == 0 {
		return
	}
	c := &recomputeChain{s: s, size: v.Type.Shape.Size(), seen: map[*ir.Op]bool{}}
	if !c.visit(op) || !s.fusibleOnly(c.stored) {
		return
	}
	first := dependents[0]
	for _, u := range dependents[1:] {
		if s.pos[u] < s.pos[first] {
			first = u
		}
	}
	copies := s.copyChain(c.chain, first)
	for _, u := range dependents {
		s.touched[u] = true
		for i, a := range u.Args {
			if a == v {
				u.Args[i] = copies[v]
			}
		}
	}
}

// dependents returns the distinct readers of op's result that depend on a
// reduction it flows into.
func (s *recomputeState) dependents(op *ir.Op) []*ir.Op {
	var dependents []*ir.Op
	for _, u := range s.us[op.Result()] {
		if new(big.Int).And(s.dep[u], s.reach[op]).Sign() != 0 && !containsOp(dependents, u) {
			dependents = append(dependents, u)
		}
	}
	return dependents
}

// fusibleOnly reports whether the full-size leaves stored are read only
// by elementwise chains and reductions. Such a leaf (a matrix product,
// say) is kept alive until the copy instead of v, which is no larger;
// fusion puts those readers beside v's own chain.
func (s *recomputeState) fusibleOnly(stored []*ir.Value) bool {
	fusibleOnly := true
	for _, a := range stored {
		for _, u := range s.us[a] {
			fusibleOnly = fusibleOnly && (chainOp(u) || isReduction(u))
		}
	}
	return fusibleOnly
}

// copyChain copies the ops of chain, in order, to run just before first,
// and returns the copy of each chain value.
func (s *recomputeState) copyChain(chain []*ir.Op, first *ir.Op) map[*ir.Value]*ir.Value {
	copies := map[*ir.Value]*ir.Value{}
	for _, o := range chain {
		args := make([]*ir.Value, len(o.Args))
		for i, a := range o.Args {
			args[i] = a
			if c, ok := copies[a]; ok {
				args[i] = c
			}
		}
		c, err := s.f.NewOp(o.Code, args, ir.CloneAttrs(o.Attrs))
		if err != nil {
			panic("passes: recompute: copying " + o.Code.String() + ": " + err.Error())
		}
		c.Loc = o.Loc
		s.fresh[c] = true
		copies[o.Result()] = c.Result()
		s.before[first] = append(s.before[first], c)
	}
	return copies
}

// recomputeChain collects the chain that computes one value of size
// elements, in topological order.
type recomputeChain struct {
	s    *recomputeState
	size int
	// stored lists the full-size leaves: only the chain may read them.
	stored []*ir.Value
	chain  []*ir.Op
	seen   map[*ir.Op]bool
}

// leaf reports whether the chain may read a without copying its op.
func (c *recomputeChain) leaf(a *ir.Value) bool {
	switch {
	case a.Op == nil:
		return !c.s.donated[a]
	case c.s.fresh[a.Op]:
		return false // a copy made in this round: the next round sees it
	case !c.s.inRegion[a.Op]:
		return true // defined in an enclosing region: live across r
	case a.Type.Shape.Size()*narrowRatio <= c.size:
		return true
	case a.Op.Code == ir.Iota, isScalarConst(a.Op):
		return true
	case !chainOp(a.Op) && a.Type.Shape.Size() <= c.size:
		c.stored = append(c.stored, a)
		return true
	}
	return false
}

// visit adds o and the ops it reads to the chain, or reports that the
// chain cannot be copied.
func (c *recomputeChain) visit(o *ir.Op) bool {
	if c.seen[o] {
		return true
	}
	if !chainOp(o) || !cheapToRepeat(o) || c.s.fresh[o] || c.s.touched[o] || len(c.chain) >= maxRecompute {
		return false
	}
	for _, a := range o.Args {
		if c.leaf(a) {
			continue
		}
		if a.Op == nil || !c.visit(a.Op) {
			return false
		}
	}
	c.seen[o] = true
	c.chain = append(c.chain, o)
	return true
}

func containsOp(ops []*ir.Op, op *ir.Op) bool {
	for _, o := range ops {
		if o == op {
			return true
		}
	}
	return false
}

// cheapToRepeat reports whether computing op a second time costs little on
// the CPU backend: not a comparison or a select (bool operands), which its
// fused loops evaluate element by element.
func cheapToRepeat(op *ir.Op) bool {
	switch op.Code {
	case ir.Select, ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge:
		return false
	}
	return true
}
