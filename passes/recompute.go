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
	var nred int
	redIdx := map[*ir.Op]int{}
	for _, op := range r.Ops {
		if isReduction(op) {
			redIdx[op] = nred
			nred++
		}
	}
	if nred == 0 {
		return false
	}
	pos := map[*ir.Op]int{}
	inRegion := map[*ir.Op]bool{}
	for i, op := range r.Ops {
		pos[op] = i
		inRegion[op] = true
	}
	// dep[op]: the reductions op depends on, transitively within r.
	dep := map[*ir.Op]*big.Int{}
	for _, op := range r.Ops {
		d := new(big.Int)
		for _, a := range op.Args {
			p := a.Op
			if p == nil || !inRegion[p] {
				continue
			}
			d.Or(d, dep[p])
			if i, ok := redIdx[p]; ok {
				d.SetBit(d, i, 1)
			}
		}
		dep[op] = d
	}
	us := users(r)
	ret := returned(r)
	// reach[op]: the reductions a chain op's result flows into through chain
	// ops only (the reductions whose input fusion it may join).
	reach := map[*ir.Op]*big.Int{}
	for i := len(r.Ops) - 1; i >= 0; i-- {
		op := r.Ops[i]
		if !chainOp(op) {
			continue
		}
		m := new(big.Int)
		for _, u := range us[op.Result()] {
			if j, ok := redIdx[u]; ok && u.Args[0] == op.Result() {
				m.SetBit(m, j, 1)
			} else if chainOp(u) && reach[u] != nil {
				m.Or(m, reach[u])
			}
		}
		reach[op] = m
	}

	before := map[*ir.Op][]*ir.Op{} // op → copies to insert before it
	// fresh holds this round's copies, touched the ops whose operands this
	// round changed; chains through either wait for the next round, which
	// sees them with fresh maps.
	fresh, touched := map[*ir.Op]bool{}, map[*ir.Op]bool{}
	for _, op := range r.Ops {
		if !chainOp(op) || !op.Info().Elementwise || reach[op].Sign() == 0 {
			continue
		}
		v := op.Result()
		if ret[v] {
			continue
		}
		var dependents []*ir.Op
		for _, u := range us[v] {
			if new(big.Int).And(dep[u], reach[op]).Sign() != 0 && !containsOp(dependents, u) {
				dependents = append(dependents, u)
			}
		}
		if len(dependents) == 0 {
			continue
		}
		size := v.Type.Shape.Size()
		var stored []*ir.Value // full-size leaves: only the chain may read them
		leaf := func(a *ir.Value) bool {
			switch {
			case a.Op == nil:
				return !donated[a]
			case fresh[a.Op]:
				return false // a copy made in this round: the next round sees it
			case !inRegion[a.Op]:
				return true // defined in an enclosing region: live across r
			case a.Type.Shape.Size()*narrowRatio <= size:
				return true
			case a.Op.Code == ir.Iota, isScalarConst(a.Op):
				return true
			case !chainOp(a.Op) && a.Type.Shape.Size() <= size:
				stored = append(stored, a)
				return true
			}
			return false
		}
		// Collect the chain in topological order, or give up.
		var chain []*ir.Op
		seen := map[*ir.Op]bool{}
		var visit func(o *ir.Op) bool
		visit = func(o *ir.Op) bool {
			if seen[o] {
				return true
			}
			if !chainOp(o) || !cheapToRepeat(o) || fresh[o] || touched[o] || len(chain) >= maxRecompute {
				return false
			}
			for _, a := range o.Args {
				if leaf(a) {
					continue
				}
				if a.Op == nil || !visit(a.Op) {
					return false
				}
			}
			seen[o] = true
			chain = append(chain, o)
			return true
		}
		if !visit(op) {
			continue
		}
		// A full-size leaf (a matrix product, say) is kept alive until the
		// copy instead of v, which is no larger; that holds when the leaf
		// is read only by elementwise chains and reductions, which fusion
		// puts beside v's own chain.
		fusibleOnly := true
		for _, a := range stored {
			for _, u := range us[a] {
				fusibleOnly = fusibleOnly && (chainOp(u) || isReduction(u))
			}
		}
		if !fusibleOnly {
			continue
		}
		first := dependents[0]
		for _, u := range dependents[1:] {
			if pos[u] < pos[first] {
				first = u
			}
		}
		copies := map[*ir.Value]*ir.Value{}
		for _, o := range chain {
			args := make([]*ir.Value, len(o.Args))
			for i, a := range o.Args {
				args[i] = a
				if c, ok := copies[a]; ok {
					args[i] = c
				}
			}
			c, err := f.NewOp(o.Code, args, ir.CloneAttrs(o.Attrs))
			if err != nil {
				panic("passes: recompute: copying " + o.Code.String() + ": " + err.Error())
			}
			c.Loc = o.Loc
			fresh[c] = true
			copies[o.Result()] = c.Result()
			before[first] = append(before[first], c)
		}
		for _, u := range dependents {
			touched[u] = true
			for i, a := range u.Args {
				if a == v {
					u.Args[i] = copies[v]
				}
			}
		}
	}
	if len(before) == 0 {
		return false
	}
	ops := make([]*ir.Op, 0, len(r.Ops))
	for _, op := range r.Ops {
		ops = append(ops, before[op]...)
		ops = append(ops, op)
	}
	r.Ops = ops
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
