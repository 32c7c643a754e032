package passes

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// schedule orders the ops of every region (inner regions first; not fusion
// regions) to keep memory low. A greedy list scheduler (greedyOrder)
// repeatedly runs, among the ops whose operands are ready, the one that frees
// the most device bytes (operands it is the last reader of) minus the bytes
// it allocates (its results that get arena space), ties broken in favour of
// device→host copies, then by host bytes, then by the traced order.
// Host→device copies are not candidates of their own: each runs just before
// the first op that reads it, and counts in that op's bytes, so copied-in
// values (optimizer state, offloaded activations) reach device memory only
// when needed.
//
// At the top level, a donated parameter can be overwritten by the result of
// an op that reads it in place (a training step's update of a weight) only
// if every other reader of the parameter runs first; the scheduler adds
// those orderings as dependencies (donationEdges) wherever they make no
// cycle, so the backward pass's last matrix product reading a weight runs
// before the fused update that writes it.
//
// Each region's order is kept only when its footprint — the planned arena,
// plus at the top level the result bytes that alias no donated parameter —
// is strictly smaller than the traced order's (device bytes first, then
// pinned_host bytes, then more donated bytes reused). The result depends only on the IR. As a last guard the
// whole function's footprint is compared with the traced orders', and the
// traced orders restored if they need less.
func schedule(st *State) error {
	body := st.Func.Body
	orig := map[*ir.Region][]*ir.Op{}
	_ = walkRegions(body, false, func(r *ir.Region) error {
		orig[r] = append([]*ir.Op(nil), r.Ops...)
		return nil
	})
	donated, fip := st.Options.Donated, st.Options.FusionInPlace
	before := footprint(body, true, donated, fip)
	_ = walkRegions(body, false, func(r *ir.Region) error {
		scheduleRegion(r, r == body, donated, fip)
		return nil
	})
	if !less(footprint(body, true, donated, fip), before) {
		for r, ops := range orig {
			r.Ops = ops
		}
	}
	return nil
}

// footprint plans r in its current order and returns, per memory space, its
// arena plus (at the top level) the bytes of results that alias no donated
// parameter: the memory the order decides. Its third entry is minus the
// aliased bytes, so that of two orders needing the same memory the one that
// reuses more donated buffers compares less.
func footprint(r *ir.Region, top bool, donated []bool, fusionInPlace bool) [3]int64 {
	if !top {
		donated = nil
	}
	p := planRegion(r, top, donated, fusionInPlace, ComputeLiveness)
	out := [3]int64{p.Arena[0], p.Arena[1], 0}
	if top {
		for _, b := range p.Values {
			switch b.Kind {
			case BufOutput:
				out[b.Space] += b.Size
			case BufAlias:
				out[2] -= b.Size
			}
		}
	}
	return out
}

// less orders footprints: device bytes first, then pinned_host bytes, then
// aliased bytes (more is better).
func less(a, b [3]int64) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// scheduleRegion replaces r's order by the greedy one (with the donation
// orderings at the top level, and without) that has the smallest footprint,
// when that is smaller than the current order's.
func scheduleRegion(r *ir.Region, top bool, donated []bool, fusionInPlace bool) {
	if len(r.Ops) < 2 {
		return
	}
	orig := r.Ops
	best, bestFP := orig, footprint(r, top, donated, fusionInPlace)
	candidates := [][]*ir.Op{greedyOrder(r, top)}
	if top {
		if edges := donationEdges(r, donated, fusionInPlace); len(edges) > 0 {
			candidates = append(candidates, greedyOrderAfter(r, top, edges))
		}
	}
	for _, c := range candidates {
		if slices.Equal(c, orig) {
			continue
		}
		r.Ops = c
		if fp := footprint(r, top, donated, fusionInPlace); less(fp, bestFP) {
			best, bestFP = c, fp
		}
	}
	r.Ops = best
}

// donationEdges returns extra orderings of the top-level region r, as
// after[i] = ops that must run before op i: for each donated parameter that
// an op may overwrite in place with a returned result of the same size and
// space (the first such op and result for each parameter, each result taken
// once), every other reader of the parameter runs before that op — unless
// the op already precedes one of those readers (the ordering would be a
// cycle) or host→device copies are involved (they are placed with their
// readers).
func donationEdges(r *ir.Region, donated []bool, fusionInPlace bool) map[int][]int {
	readers := map[*ir.Value][]int{}
	for i, op := range r.Ops {
		for _, a := range op.Args {
			if rs := readers[a]; len(rs) == 0 || rs[len(rs)-1] != i {
				readers[a] = append(readers[a], i)
			}
		}
	}
	ret := returned(r)
	after := map[int][]int{}
	before := map[int][]int{} // the orderings added so far, k → ops after k
	// reachable returns the ops some path of data dependencies and the
	// orderings added so far leads to from op i.
	reachable := func(i int) map[int]bool {
		seen := map[int]bool{i: true}
		stack := []int{i}
		push := func(q int) {
			if !seen[q] {
				seen[q] = true
				stack = append(stack, q)
			}
		}
		for len(stack) > 0 {
			k := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, v := range r.Ops[k].Results {
				for _, q := range readers[v] {
					push(q)
				}
			}
			for _, q := range before[k] {
				push(q)
			}
		}
		return seen
	}
	taken := map[*ir.Value]bool{}
	for pi, pv := range r.Params {
		if pi >= len(donated) || !donated[pi] || len(readers[pv]) < 2 {
			continue
		}
		for _, i := range readers[pv] {
			op := r.Ops[i]
			if hostToDevice(op) {
				continue
			}
			var res *ir.Value
			for _, v := range op.Results {
				if ret[v] && !taken[v] && bytesOf(v) == bytesOf(pv) && v.Type.Space == pv.Type.Space && inPlace(op, pv, v, fusionInPlace) {
					res = v
					break
				}
			}
			if res == nil {
				continue
			}
			ok, later := true, reachable(i)
			for _, j := range readers[pv] {
				ok = ok && (j == i || !hostToDevice(r.Ops[j]) && !later[j])
			}
			if !ok {
				continue
			}
			taken[res] = true
			for _, j := range readers[pv] {
				if j != i {
					after[i] = append(after[i], j)
					before[j] = append(before[j], i)
				}
			}
			break
		}
	}
	return after
}

// hostToDevice reports whether op copies a value from another memory space
// to device: such a copy only allocates device memory, so the scheduler runs
// it as late as possible, just before its first reader.
func hostToDevice(op *ir.Op) bool {
	return op.Code == ir.DevicePut && len(op.Args) == 1 && op.Result().Type.Space == ir.Device &&
		op.Args[0].Type.Space != ir.Device
}

// deviceToHost reports whether op copies a device value to another memory
// space: such a copy allocates no device memory, so the scheduler runs it as
// early as possible among ops that free as much device memory.
func deviceToHost(op *ir.Op) bool {
	return op.Code == ir.DevicePut && len(op.Args) == 1 && op.Result().Type.Space != ir.Device &&
		op.Args[0].Type.Space == ir.Device
}

// greedyOrder returns the list-scheduled order of r's ops.
//
// Rules, in order:
//
//   - a host→device copy read by some op of r (hostToDevice) is never chosen
//     on its own: it is emitted just before the first op that reads it, and
//     its bytes count in that op's score (as late as possible);
//   - among the ready ops, the one that frees the most device bytes minus
//     the device bytes it (and the copies emitted with it) allocates;
//   - ties: a device→host copy first (as early as possible), then the most
//     host bytes freed, then the traced order.
func greedyOrder(r *ir.Region, top bool) []*ir.Op { return greedyOrderAfter(r, top, nil) }

// greedyOrderAfter is greedyOrder where op i also waits for the ops after[i]
// (orderings beyond data dependencies; they must make no cycle).
func greedyOrderAfter(r *ir.Region, top bool, after map[int][]int) []*ir.Op {
	s := newListScheduler(r, top, after)
	s.releaseRoots()
	for len(s.ready) > 0 {
		i := s.pick()
		for _, p := range s.pending(i) {
			s.emit(p)
		}
		s.emit(i)
	}
	// Late copies nobody ran with (impossible: every late copy has a
	// reader) would leave the order incomplete; keep the traced order then.
	if len(s.out) != len(r.Ops) {
		return r.Ops
	}
	return s.out
}

// listScheduler is the state of greedyOrderAfter's list scheduling of one
// region: the dependence graph of its ops, the ready list, and each
// candidate's cached score.
type listScheduler struct {
	r   *ir.Region
	top bool
	// def maps each value defined in r to the index of its op.
	def map[*ir.Value]int
	ret map[*ir.Value]bool
	// remaining[v] counts the distinct ops still to run that read v.
	remaining map[*ir.Value]int
	// readers[v] lists the ops of r that read v.
	readers map[*ir.Value][]int
	// waiting[i] counts op i's predecessors that have not run and are not
	// late copies ready to be emitted with it.
	waiting      []int
	succs        [][]int
	predList     [][]int
	distinctArgs [][]*ir.Value
	// late[i]: op i is a host→device copy emitted with its first reader.
	late []bool
	done []bool
	// ready lists the ops that may be chosen next.
	ready []int
	// A candidate's score depends only on remaining[] of the values it and
	// its pending copies read, and on which of those copies are done; it
	// is cached in scores and recomputed only after one of those changed.
	scores []listScore
	out    []*ir.Op
	// reads is scoreOf's scratch list of values read.
	reads []listRead
}

// listScore is the cached score of one candidate op.
type listScore struct {
	dev, host int64
	ok        bool
}

// listRead counts the reads of v by an op and the copies emitted with it.
type listRead struct {
	v *ir.Value
	k int
}

// newListScheduler builds the dependence graph of r's ops: data
// dependencies, then the extra orderings after.
func newListScheduler(r *ir.Region, top bool, after map[int][]int) *listScheduler {
	n := len(r.Ops)
	s := &listScheduler{
		r:            r,
		top:          top,
		def:          map[*ir.Value]int{},
		remaining:    map[*ir.Value]int{},
		readers:      map[*ir.Value][]int{},
		waiting:      make([]int, n),
		succs:        make([][]int, n),
		predList:     make([][]int, n),
		distinctArgs: make([][]*ir.Value, n),
		late:         make([]bool, n),
		done:         make([]bool, n),
		scores:       make([]listScore, n),
		out:          make([]*ir.Op, 0, n),
	}
	for i, op := range r.Ops {
		for _, v := range op.Results {
			s.def[v] = i
		}
	}
	s.ret = returned(r)
	for i, op := range r.Ops {
		s.addArgs(i, op)
	}
	for i, ps := range after {
		for _, p := range ps {
			if !slices.Contains(s.predList[i], p) {
				s.addEdge(p, i)
			}
		}
	}
	for i, op := range r.Ops {
		s.late[i] = hostToDevice(op) && len(s.succs[i]) > 0
	}
	return s
}

// addArgs records op i's distinct arguments, their readers, and an edge
// from each argument's defining op.
func (s *listScheduler) addArgs(i int, op *ir.Op) {
	seen := map[*ir.Value]bool{}
	predSeen := map[int]bool{}
	for _, a := range op.Args {
		if seen[a] {
			continue
		}
		seen[a] = true
		s.distinctArgs[i] = append(s.distinctArgs[i], a)
		s.remaining[a]++
		s.readers[a] = append(s.readers[a], i)
		if p, ok := s.def[a]; ok && !predSeen[p] {
			predSeen[p] = true
			s.addEdge(p, i)
		}
	}
}

// addEdge makes op i wait for op p.
func (s *listScheduler) addEdge(p, i int) {
	s.waiting[i]++
	s.succs[p] = append(s.succs[p], i)
	s.predList[i] = append(s.predList[i], p)
}

// inArena reports whether a value defined in r takes arena bytes.
func (s *listScheduler) inArena(v *ir.Value) bool {
	_, local := s.def[v]
	return local && !(s.top && s.ret[v])
}

// releaseRoots releases the ops that wait for nothing. They are all found
// first, since release lowers waiting.
func (s *listScheduler) releaseRoots() {
	var roots []int
	for i := range s.r.Ops {
		if s.waiting[i] == 0 {
			roots = append(roots, i)
		}
	}
	for _, i := range roots {
		s.release(i)
	}
}

// release is called once op i's predecessors are done (or emitted with it):
// it makes i ready, or, for a late copy, releases its readers in its place.
func (s *listScheduler) release(i int) {
	if !s.late[i] {
		s.ready = append(s.ready, i)
		return
	}
	s.releaseSuccs(i)
}

// releaseSuccs counts op i as done for its successors.
func (s *listScheduler) releaseSuccs(i int) {
	for _, q := range s.succs[i] {
		if s.waiting[q]--; s.waiting[q] == 0 {
			s.release(q)
		}
	}
}

// pending lists the late copies op i would emit first, in traced order.
func (s *listScheduler) pending(i int) []int {
	var out []int
	for _, p := range s.predList[i] {
		if s.late[p] && !s.done[p] {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// stale drops the cached score of q, whose reads changed, and, for a late
// copy, of its readers.
func (s *listScheduler) stale(q int) {
	s.scores[q].ok = false
	if s.late[q] {
		for _, x := range s.succs[q] {
			s.scores[x].ok = false
		}
	}
}

// emit appends op i to the order.
func (s *listScheduler) emit(i int) {
	s.done[i] = true
	s.out = append(s.out, s.r.Ops[i])
	for _, a := range s.distinctArgs[i] {
		s.remaining[a]--
		for _, q := range s.readers[a] {
			s.stale(q)
		}
	}
	s.stale(i) // i's readers' pending copies, if i is a late copy
	if !s.late[i] {
		s.releaseSuccs(i)
	}
}

// pick removes from the ready list and returns the op with the best score:
// the most device bytes freed, then a device→host copy, then the most host
// bytes freed, then the traced order.
func (s *listScheduler) pick() int {
	best := -1
	var bestDev, bestHost int64
	var bestD2H bool
	for j, i := range s.ready {
		if !s.scores[i].ok {
			d, h := s.scoreOf(i)
			s.scores[i] = listScore{d, h, true}
		}
		dev, host := s.scores[i].dev, s.scores[i].host
		d2h := deviceToHost(s.r.Ops[i])
		better := best < 0 || dev > bestDev
		if !better && dev == bestDev {
			switch {
			case d2h != bestD2H:
				better = d2h
			case host != bestHost:
				better = host > bestHost
			default:
				better = i < s.ready[best]
			}
		}
		if better {
			best, bestDev, bestHost, bestD2H = j, dev, host, d2h
		}
	}
	i := s.ready[best]
	s.ready = append(s.ready[:best], s.ready[best+1:]...)
	return i
}

// noteRead counts one read of a in s.reads.
func (s *listScheduler) noteRead(a *ir.Value) {
	for j := range s.reads {
		if s.reads[j].v == a {
			s.reads[j].k++
			return
		}
	}
	s.reads = append(s.reads, listRead{a, 1})
}

// scoreOf returns the device and host bytes op i (with its pending copies)
// frees minus those it allocates.
func (s *listScheduler) scoreOf(i int) (dev, host int64) {
	add := func(v *ir.Value, sign int64) {
		if v.Type.Space == ir.Device {
			dev += sign * bytesOf(v)
		} else {
			host += sign * bytesOf(v)
		}
	}
	// Reads by the late copies emitted first count as reads of op i.
	s.reads = s.reads[:0]
	for _, p := range s.pending(i) {
		for _, a := range s.distinctArgs[p] {
			s.noteRead(a)
		}
		for _, v := range s.r.Ops[p].Results {
			if s.inArena(v) {
				add(v, -1)
			}
		}
	}
	for _, a := range s.distinctArgs[i] {
		s.noteRead(a)
	}
	for _, rd := range s.reads {
		if s.inArena(rd.v) && s.remaining[rd.v] == rd.k && !s.ret[rd.v] {
			add(rd.v, 1)
		}
	}
	for _, v := range s.r.Ops[i].Results {
		if s.inArena(v) {
			add(v, -1)
		}
	}
	return dev, host
}
