package passes

import (
	"github.com/ferryml/ferry/ir"
)

// schedule orders the ops of every region (inner regions first; not fusion
// regions) to keep memory low. A greedy list scheduler repeatedly runs, among
// the ops whose operands are ready, the one that frees the most device bytes
// (operands it is the last reader of) minus the bytes it allocates (its
// results that get arena space), ties broken by host bytes, then by the
// traced order. The region's arena is then planned for both the greedy and the
// traced order, and the greedy order is kept only when it needs strictly less
// (device bytes first, then pinned_host bytes). The result depends only on the
// IR. As a last guard the whole function's arenas are compared with the
// traced orders', and the traced orders restored if they need less.
func schedule(st *State) error {
	body := st.Func.Body
	orig := map[*ir.Region][]*ir.Op{}
	_ = walkRegions(body, false, func(r *ir.Region) error {
		orig[r] = append([]*ir.Op(nil), r.Ops...)
		return nil
	})
	before := arenaOf(body, true, st.Options.FusionInPlace)
	_ = walkRegions(body, false, func(r *ir.Region) error {
		scheduleRegion(r, r == body, st.Options.FusionInPlace)
		return nil
	})
	after := arenaOf(body, true, st.Options.FusionInPlace)
	if after[ir.Device] > before[ir.Device] || after[ir.Device] == before[ir.Device] && after[ir.PinnedHost] > before[ir.PinnedHost] {
		for r, ops := range orig {
			r.Ops = ops
		}
	}
	return nil
}

// arenaOf plans r in its current order and returns its arena sizes.
func arenaOf(r *ir.Region, top, fusionInPlace bool) [2]int64 {
	return planRegion(r, top, nil, fusionInPlace, ComputeLiveness).Arena
}

func scheduleRegion(r *ir.Region, top, fusionInPlace bool) {
	if len(r.Ops) < 3 {
		return
	}
	orig := r.Ops
	greedy := greedyOrder(r, top)
	same := true
	for i := range orig {
		same = same && orig[i] == greedy[i]
	}
	if same {
		return
	}
	before := arenaOf(r, top, fusionInPlace)
	r.Ops = greedy
	after := arenaOf(r, top, fusionInPlace)
	if after[ir.Device] < before[ir.Device] || after[ir.Device] == before[ir.Device] && after[ir.PinnedHost] < before[ir.PinnedHost] {
		return
	}
	r.Ops = orig
}

// greedyOrder returns the list-scheduled order of r's ops.
func greedyOrder(r *ir.Region, top bool) []*ir.Op {
	n := len(r.Ops)
	idx := make(map[*ir.Op]int, n)
	def := map[*ir.Value]int{}
	for i, op := range r.Ops {
		idx[op] = i
		for _, v := range op.Results {
			def[v] = i
		}
	}
	ret := returned(r)
	// remaining[v] counts the distinct ops still to run that read v.
	remaining := map[*ir.Value]int{}
	preds := make([]int, n)
	succs := make([][]int, n)
	distinctArgs := make([][]*ir.Value, n)
	for i, op := range r.Ops {
		seen := map[*ir.Value]bool{}
		predSeen := map[int]bool{}
		for _, a := range op.Args {
			if seen[a] {
				continue
			}
			seen[a] = true
			distinctArgs[i] = append(distinctArgs[i], a)
			remaining[a]++
			if p, ok := def[a]; ok && !predSeen[p] {
				predSeen[p] = true
				preds[i]++
				succs[p] = append(succs[p], i)
			}
		}
	}
	// inArena reports whether a value defined in r takes arena bytes.
	inArena := func(v *ir.Value) bool {
		_, local := def[v]
		return local && !(top && ret[v])
	}
	var ready []int
	for i := range r.Ops {
		if preds[i] == 0 {
			ready = append(ready, i)
		}
	}
	out := make([]*ir.Op, 0, n)
	for len(ready) > 0 {
		best := -1
		var bestDev, bestHost int64
		for j, i := range ready {
			var dev, host int64
			add := func(v *ir.Value, sign int64) {
				if v.Type.Space == ir.Device {
					dev += sign * bytesOf(v)
				} else {
					host += sign * bytesOf(v)
				}
			}
			for _, a := range distinctArgs[i] {
				if inArena(a) && remaining[a] == 1 && !ret[a] {
					add(a, 1)
				}
			}
			for _, v := range r.Ops[i].Results {
				if inArena(v) {
					add(v, -1)
				}
			}
			if best < 0 || dev > bestDev || dev == bestDev && (host > bestHost || host == bestHost && i < ready[best]) {
				best, bestDev, bestHost = j, dev, host
			}
		}
		i := ready[best]
		ready = append(ready[:best], ready[best+1:]...)
		out = append(out, r.Ops[i])
		for _, a := range distinctArgs[i] {
			remaining[a]--
		}
		for _, s := range succs[i] {
			preds[s]--
			if preds[s] == 0 {
				ready = append(ready, s)
			}
		}
	}
	if len(out) != n {
		return r.Ops
	}
	return out
}
