package passes

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
)

// The asynchronous schedule of a block.
//
// A backend runs the steps of a block on four queues: compute (kernels,
// products, single ops, loops), copies into device memory, copies out of
// it, and collectives. Each queue runs its steps in block order (a CUDA
// stream; the CPU's copy workers and collective worker); the queues run
// beside each other. The schedule, computed once by Lower, says for every
// step its queue and the earlier steps of other queues it waits for: a step
// waits for an earlier step of another queue whose memory it conflicts
// with (it reads what the other writes, or writes what the other reads or
// writes: overlapping bytes of one allocation), unless that step is
// already ordered before it by its queue's order and the waits before it
// (vector clocks), so no wait is implied by the others. At the end of the
// block the compute queue waits for the last steps of the others (Final).
//
// In a scan body the schedule also plans the work that crosses iterations:
//
//   - Prefetch: a copy (or, with Options.PrefetchGathers, an all_gather) of
//     an xs slice into bytes of its own (the prefetch pass reserves them) is
//     started for the next iteration by the running one, after the step
//     After, once the readers of its destination (Wait) are complete; the
//     next iteration's step then only takes over its completion.
//   - Carried: a collective whose result is a ys slice and that nothing
//     later in the body needs (a layer's gradient reduce-scattered into the
//     stacked gradients) is not waited for at the end of its iteration: the
//     next iteration waits for it before step Before, the first that
//     writes its operand's bytes, and the loop after its last iteration.
//
// A backend that runs a queue synchronously (the CPU without asynchronous
// copies, say) treats the waits as already satisfied.

// Queue is where a step runs.
type Queue uint8

// Queues.
const (
	// QueueCompute runs kernels, products, single ops and loops (and
	// axis_index, which moves no data).
	QueueCompute Queue = iota
	// QueueToDevice runs copies into device memory.
	QueueToDevice
	// QueueToHost runs copies into pinned_host memory.
	QueueToHost
	// QueueCollective runs collectives.
	QueueCollective
)

// NumQueues is the number of queues.
const NumQueues = 4

// String names the queue as the text form prints it.
func (q Queue) String() string {
	if q < NumQueues {
		return [...]string{"compute", "to_device", "to_host", "collective"}[q]
	}
	return fmt.Sprintf("queue%d", int(q))
}

// QueueOf is the queue step st runs on.
func QueueOf(st *Step) Queue {
	switch {
	case st.Kind == StepCopy && st.To == ir.Device:
		return QueueToDevice
	case st.Kind == StepCopy:
		return QueueToHost
	case st.Kind == StepCollective && st.Op.Code != ir.AxisIndex:
		return QueueCollective
	}
	return QueueCompute
}

// Schedule is the asynchronous schedule of a block.
type Schedule struct {
	// Steps holds, per step of the block, its queue and waits.
	Steps []StepSchedule
	// Final lists the steps of queues other than compute that the compute
	// queue waits for at the end of the block (carried collectives and
	// prefetches of the next iteration aside, every step of the block is
	// then complete).
	Final []int
	// Prefetch lists, in a scan body, the steps whose next-iteration copy
	// or gather the running iteration starts.
	Prefetch []Prefetch
	// Carried lists, in a scan body, the collectives that run on into the
	// next iteration.
	Carried []Carried
	// PrefetchAfter[i] lists the prefetches (indexes into Prefetch) started
	// right after step i, in order.
	PrefetchAfter [][]int
	// CarriedBefore[i] lists the carried collectives (their steps) of the
	// previous iteration waited for before step i, i = len(Steps) at the
	// end of the iteration.
	CarriedBefore [][]int
}

// StepSchedule is the schedule of one step.
type StepSchedule struct {
	Queue Queue
	// Wait lists the earlier steps of other queues that must be complete
	// before the step starts (on a prefetched step: in the iteration that
	// started it, nothing).
	Wait []int
	// Record reports that a later step, the end of the block, a prefetch
	// or the next iteration waits for the step: a backend that orders the
	// queues with events records one after it.
	Record bool
	// Prefetched marks a step of a scan body that the previous iteration
	// started (but in the first iteration).
	Prefetched bool
}

// Prefetch is a step of a scan body started one iteration ahead.
type Prefetch struct {
	// Step is the copy or all_gather; Param the xs parameter whose next
	// slice it reads.
	Step, Param int
	// After is the step after which the running iteration starts it
	// (prefetches after one step in the order of Prefetch).
	After int
	// Wait lists the steps of other queues (the latest per queue) that read
	// the destination in the running iteration: they must be complete
	// before the next slice overwrites it.
	Wait []int
}

// Carried is a collective of a scan body waited for by the next iteration.
type Carried struct {
	// Step is the collective; the next iteration waits for it before step
	// Before (len(Steps): at its end).
	Step, Before int
}

// MemKind says which allocation of one execution an access touches.
type MemKind uint8

// Allocations of one execution.
const (
	// MemParam is the block's parameter Mem.Index (a donated argument
	// reused for a result is still its parameter: the same memory).
	MemParam MemKind = iota + 1
	// MemOutput is the buffer of function result Mem.Index.
	MemOutput
	// MemArena is the block's arena of memory space Mem.Index.
	MemArena
	// MemSlice is, in a scan body, the running iteration's slice of the ys
	// of body result Mem.Index.
	MemSlice
)

// Mem names one allocation.
type Mem struct {
	Kind  MemKind
	Index int
}

// String names the allocation.
func (m Mem) String() string {
	switch m.Kind {
	case MemParam:
		return fmt.Sprintf("param%d", m.Index)
	case MemOutput:
		return fmt.Sprintf("out%d", m.Index)
	case MemArena:
		return fmt.Sprintf("arena(%v)", ir.MemorySpace(m.Index))
	case MemSlice:
		return fmt.Sprintf("slice%d", m.Index)
	}
	return fmt.Sprintf("mem(%d,%d)", m.Kind, m.Index)
}

// Access is one byte range a step reads or writes.
type Access struct {
	Mem       Mem
	Off, Size int64
	Write     bool
}

// overlaps reports whether two accesses touch a common byte.
func (a Access) overlaps(b Access) bool {
	return a.Mem == b.Mem && a.Size > 0 && b.Size > 0 && a.Off < b.Off+b.Size && b.Off < a.Off+a.Size
}

// Conflicts reports whether two accesses touch a common byte and one of
// them writes.
func (a Access) Conflicts(b Access) bool { return (a.Write || b.Write) && a.overlaps(b) }

// StepAccess is what one step touches and the lane it runs on: a queue, or
// a lane of its own for a prefetched step (NumQueues + its index in
// Schedule.Prefetch), which runs on its queue but out of block order, so
// that no queue order covers it.
type StepAccess struct {
	Lane     int
	Accesses []Access
	// NoEnd marks a step the end of the block does not wait for (a carried
	// collective).
	NoEnd bool
}

// Conflicts reports whether two steps have conflicting accesses.
func (a *StepAccess) Conflicts(b *StepAccess) bool {
	for _, x := range a.Accesses {
		for _, y := range b.Accesses {
			if x.Conflicts(y) {
				return true
			}
		}
	}
	return false
}

// BufferAccess is the access of a slot's buffer: a donated argument's
// memory reused for a result (BufAlias) is that argument's.
func BufferAccess(b Buffer, write bool) Access {
	a := Access{Size: b.Size, Write: write}
	switch b.Kind {
	case BufParam:
		a.Mem = Mem{MemParam, b.Index}
	case BufAlias:
		a.Mem = Mem{MemParam, b.Param}
	case BufOutput:
		a.Mem = Mem{MemOutput, b.Index}
	case BufTemp:
		a.Mem, a.Off = Mem{MemArena, int(b.Space)}, b.Offset
	case BufSlice:
		a.Mem = Mem{MemSlice, b.Index}
	}
	return a
}

// subArena is the bytes of space the nested blocks of lp use, from
// SubOffset: the largest of their arenas.
func (lp *Loop) subArena(space ir.MemorySpace) int64 {
	var size int64
	for _, b := range lp.Blocks {
		size = max(size, b.Plan.Arena[space])
	}
	return size
}

// writes lists what step i of b writes: its results' buffers, and for a
// loop the nested arenas.
func (b *Block) writes(i int) []Access {
	st := &b.Steps[i]
	var w []Access
	for _, s := range st.Outs {
		w = append(w, BufferAccess(b.Slots[s].Buf, true))
	}
	if lp := st.Loop; lp != nil {
		for sp := range lp.SubOffset {
			if size := lp.subArena(ir.MemorySpace(sp)); size > 0 {
				w = append(w, Access{Mem: Mem{MemArena, sp}, Off: lp.SubOffset[sp], Size: size, Write: true})
			}
		}
	}
	return w
}

// Accesses lists what each step of b reads and writes, from its slots'
// buffers (planned offsets and sizes, so temps that the plan packs into
// the same arena bytes conflict): its operands' buffers, its results', and
// for a loop the nested arenas it uses. Lanes are the steps' queues.
func (b *Block) Accesses() []StepAccess {
	out := make([]StepAccess, len(b.Steps))
	for i := range b.Steps {
		st, acc := &b.Steps[i], &out[i]
		acc.Lane = int(QueueOf(st))
		for _, s := range st.Args {
			acc.Accesses = append(acc.Accesses, BufferAccess(b.Slots[s].Buf, false))
		}
		acc.Accesses = append(acc.Accesses, b.writes(i)...)
	}
	return out
}

// AccessPlan is the waits PlanAccesses chooses.
type AccessPlan struct {
	// Wait[i] lists the earlier steps of other lanes step i waits for.
	Wait [][]int
	// Final lists the steps of lanes other than lane 0 that lane 0 waits
	// for at the end.
	Final []int
	// Record[j] reports that a wait names step j.
	Record []bool
}

// PlanAccesses orders every hazard between steps on different lanes:
// read-after-write, write-after-read and write-after-write on overlapping
// bytes of one allocation. Step i on lane s waits, for each other lane t,
// for the latest earlier step of t that conflicts with it, unless that step
// is already ordered before i through earlier waits (vector clocks over the
// lanes) or through another wait of i itself; so no wait is implied by the
// others, and each waits for the weakest sufficient step (the latest
// conflicting one, not the latest on t). At the end lane 0 waits likewise
// for the last step of every other lane (NoEnd steps aside).
func PlanAccesses(steps []StepAccess) AccessPlan {
	lanes := 1
	for i := range steps {
		lanes = max(lanes, steps[i].Lane+1)
	}
	ap := &accessPlanner{steps: steps, lanes: lanes, clock: make([][]int, len(steps)), of: make([][]int, lanes)}
	n := len(steps)
	p := AccessPlan{Wait: make([][]int, n), Record: make([]bool, n)}
	ap.known = make([][]int, lanes)
	for s := range ap.known {
		ap.known[s] = ap.none()
	}
	for i := range steps {
		s := steps[i].Lane
		var need []int
		for t := range lanes {
			if t == s {
				continue
			}
			for k := len(ap.of[t]) - 1; k >= 0 && ap.of[t][k] > ap.known[s][t]; k-- {
				if j := ap.of[t][k]; steps[i].Conflicts(&steps[j]) {
					need = append(need, j)
					break
				}
			}
		}
		for _, j := range ap.irreducible(need) {
			p.Wait[i] = append(p.Wait[i], j)
			p.Record[j] = true
			for t := range ap.known[s] {
				ap.known[s][t] = max(ap.known[s][t], ap.clock[j][t])
			}
		}
		slices.Sort(p.Wait[i])
		ap.known[s][s] = i
		ap.clock[i] = slices.Clone(ap.known[s])
		ap.of[s] = append(ap.of[s], i)
	}
	var need []int
	for t := 1; t < lanes; t++ {
		for k := len(ap.of[t]) - 1; k >= 0 && ap.of[t][k] > ap.known[0][t]; k-- {
			if j := ap.of[t][k]; !steps[j].NoEnd {
				need = append(need, j)
				break
			}
		}
	}
	for _, j := range ap.irreducible(need) {
		p.Final = append(p.Final, j)
		p.Record[j] = true
	}
	slices.Sort(p.Final)
	return p
}

// accessPlanner is the state of PlanAccesses: known[s][t] is the last step
// of lane t ordered before lane s's next step; clock[j][t] the last step of
// t ordered before (or equal to) step j; of[t] the steps of lane t.
type accessPlanner struct {
	steps []StepAccess
	lanes int
	known [][]int
	clock [][]int
	of    [][]int
}

func (ap *accessPlanner) none() []int {
	v := make([]int, ap.lanes)
	for i := range v {
		v[i] = -1
	}
	return v
}

// irreducible drops from need the steps another step of need is ordered
// after.
func (ap *accessPlanner) irreducible(need []int) []int {
	var out []int
	for _, j := range need {
		implied := false
		for _, d := range need {
			if d != j && ap.clock[d][ap.steps[j].Lane] >= j {
				implied = true
			}
		}
		if !implied {
			out = append(out, j)
		}
	}
	return out
}

// schedule computes b's schedule; xs ≥ 0 makes b a scan body whose
// parameters from xs on are xs slices.
func (b *Block) schedule(xs int) {
	sc := Schedule{Steps: make([]StepSchedule, len(b.Steps))}
	acc := b.Accesses()
	for i := range b.Steps {
		sc.Steps[i].Queue = QueueOf(&b.Steps[i])
	}
	if xs >= 0 {
		sc.Prefetch = b.prefetches(xs, acc)
		for k, p := range sc.Prefetch {
			sc.Steps[p.Step].Prefetched = true
			acc[p.Step].Lane = NumQueues + k
		}
		sc.Carried = b.carried(acc)
		for _, c := range sc.Carried {
			acc[c.Step].NoEnd = true
		}
	}
	p := PlanAccesses(acc)
	for i := range sc.Steps {
		sc.Steps[i].Wait, sc.Steps[i].Record = p.Wait[i], p.Record[i]
	}
	sc.Final = p.Final
	for _, pf := range sc.Prefetch {
		for _, j := range pf.Wait {
			sc.Steps[j].Record = true
		}
	}
	for _, c := range sc.Carried {
		sc.Steps[c.Step].Record = true
	}
	sc.PrefetchAfter, sc.CarriedBefore = make([][]int, len(sc.Steps)), make([][]int, len(sc.Steps)+1)
	for k, pf := range sc.Prefetch {
		sc.PrefetchAfter[pf.After] = append(sc.PrefetchAfter[pf.After], k)
	}
	for _, c := range sc.Carried {
		sc.CarriedBefore[c.Before] = append(sc.CarriedBefore[c.Before], c.Step)
	}
	b.Schedule = sc
}

// prefetches finds the steps of scan body b that are started one iteration
// ahead: a copy (or an all_gather) of an xs parameter whose result is a
// temp that no other value or nested arena of the body overlaps, is not
// returned, and is read, and whose parameter no earlier step writes (in
// place), as that step would write the next slice while the prefetch reads
// it. A prefetch is started after its last reader; a copy after the body's
// last copy on its queue too, so that it holds up no copy the iteration
// waits for.
func (b *Block) prefetches(xs int, acc []StepAccess) []Prefetch {
	returned := map[int]bool{}
	for _, s := range b.Results {
		returned[s] = true
	}
	var lastOn [NumQueues]int
	for q := range lastOn {
		lastOn[q] = -1
	}
	for i := range b.Steps {
		lastOn[QueueOf(&b.Steps[i])] = i
	}
	var out []Prefetch
	for k := range b.Steps {
		st := &b.Steps[k]
		gather := st.Kind == StepCollective && st.Op.Code == ir.AllGather
		if st.Kind != StepCopy && !gather || len(st.Args) != 1 || len(st.Outs) != 1 {
			continue
		}
		a, d := st.Args[0], st.Outs[0]
		ab := b.Slots[a].Buf
		if b.Slots[a].Value.Op != nil || ab.Kind != BufParam || ab.Index < xs || ab.Index >= len(b.Params) ||
			b.Slots[d].Buf.Kind != BufTemp || returned[d] {
			continue
		}
		last, ok := b.prefetchable(k)
		if !ok {
			continue
		}
		q := QueueOf(st)
		pf := Prefetch{Step: k, Param: ab.Index, After: last}
		if !gather {
			pf.After = max(last, lastOn[q])
		}
		dst := BufferAccess(b.Slots[d].Buf, false)
		latest := [NumQueues]int{-1, -1, -1, -1}
		for j := range b.Steps {
			for _, s := range b.Steps[j].Args {
				if BufferAccess(b.Slots[s].Buf, false).overlaps(dst) {
					latest[QueueOf(&b.Steps[j])] = j
				}
			}
		}
		for r, j := range latest {
			if j >= 0 && Queue(r) != q {
				pf.Wait = append(pf.Wait, j)
			}
		}
		slices.Sort(pf.Wait)
		out = append(out, pf)
	}
	return out
}

// prefetchable reports whether the destination of step k (a copy or gather
// of an xs parameter) has its bytes to itself for the whole iteration and
// no step before k writes the parameter, and returns its last reader.
func (b *Block) prefetchable(k int) (last int, ok bool) {
	st := &b.Steps[k]
	d := st.Outs[0]
	dst := BufferAccess(b.Slots[d].Buf, false)
	src := BufferAccess(b.Slots[st.Args[0]].Buf, false)
	for s := range b.Slots {
		if s != d && BufferAccess(b.Slots[s].Buf, false).overlaps(dst) {
			return 0, false
		}
	}
	last = -1
	for j := range b.Steps {
		for _, w := range b.writes(j) {
			if j != k && w.overlaps(dst) || j < k && w.overlaps(src) {
				return 0, false
			}
		}
		for _, s := range b.Steps[j].Args {
			if BufferAccess(b.Slots[s].Buf, false).overlaps(dst) {
				last = j
			}
		}
	}
	return last, last > k
}

// carried finds the collectives of scan body b that run on into the next
// iteration: a collective of one operand, a temp, whose results are ys
// slices and that no later step of the body conflicts with. The next
// iteration waits for it before the first step that writes its operand's
// bytes.
func (b *Block) carried(acc []StepAccess) []Carried {
	var out []Carried
	for k := range b.Steps {
		st := &b.Steps[k]
		if QueueOf(st) != QueueCollective || len(st.Args) != 1 || b.Slots[st.Args[0]].Buf.Kind != BufTemp {
			continue
		}
		ok := true
		for _, s := range st.Outs {
			ok = ok && b.Slots[s].Buf.Kind == BufSlice
		}
		for j := k + 1; ok && j < len(b.Steps); j++ {
			ok = !acc[k].Conflicts(&acc[j])
		}
		if !ok {
			continue
		}
		src := BufferAccess(b.Slots[st.Args[0]].Buf, false)
		c := Carried{Step: k, Before: len(b.Steps)}
	scan:
		for j := range b.Steps {
			for _, w := range b.writes(j) {
				if w.overlaps(src) {
					c.Before = j
					break scan
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// CheckSchedule verifies the schedules of b and of the blocks nested in it:
// every wait names an earlier step of another queue; every pair of
// conflicting steps on different lanes (a prefetched step on a lane of its
// own) is ordered by lane order and waits, transitively; every step but
// the carried collectives is ordered before the end (Final); a prefetch's
// After is at or after every reader of its destination, and a carried
// collective is waited for before any step that writes its operand.
func (b *Block) CheckSchedule() error {
	if err := b.checkSchedule(); err != nil {
		return err
	}
	for i := range b.Steps {
		if lp := b.Steps[i].Loop; lp != nil {
			for k, sub := range lp.Blocks {
				if err := sub.CheckSchedule(); err != nil {
					return fmt.Errorf("step %d, block %d: %w", i, k, err)
				}
			}
		}
	}
	return nil
}

func (b *Block) checkSchedule() error {
	sc := &b.Schedule
	n := len(b.Steps)
	if len(sc.Steps) != n {
		return fmt.Errorf("schedule of %d steps for %d", len(sc.Steps), n)
	}
	acc := b.Accesses()
	for k, p := range sc.Prefetch {
		acc[p.Step].Lane = NumQueues + k
	}
	for _, c := range sc.Carried {
		acc[c.Step].NoEnd = true
	}
	lanes := NumQueues + len(sc.Prefetch)
	// clock[i][t]: the last step of lane t ordered before (or equal to) i.
	clock := make([][]int, n+1)
	last := make([]int, lanes)
	for t := range last {
		last[t] = -1
	}
	merge := func(c []int, j int) {
		for t := range c {
			c[t] = max(c[t], clock[j][t])
		}
	}
	for i := 0; i <= n; i++ {
		c := make([]int, lanes)
		for t := range c {
			c[t] = -1
		}
		lane, waits := 0, sc.Final
		if i < n {
			lane, waits = acc[i].Lane, sc.Steps[i].Wait
		}
		if last[lane] >= 0 {
			merge(c, last[lane])
		}
		for _, j := range waits {
			if j < 0 || j >= i || i < n && sc.Steps[j].Queue == sc.Steps[i].Queue && !sc.Steps[j].Prefetched {
				return fmt.Errorf("step %d waits for step %d", i, j)
			}
			merge(c, j)
		}
		if i < n {
			c[lane], last[lane] = i, i
		}
		clock[i] = c
	}
	for i := range n {
		for j := range i {
			if acc[j].Lane != acc[i].Lane && acc[i].Conflicts(&acc[j]) && clock[i][acc[j].Lane] < j {
				return fmt.Errorf("steps %d and %d conflict but are not ordered", j, i)
			}
		}
		if !acc[i].NoEnd && acc[i].Lane != 0 && clock[n][acc[i].Lane] < i {
			return fmt.Errorf("step %d is not ordered before the end", i)
		}
	}
	return b.checkLoopCrossing(acc)
}

// checkLoopCrossing checks the prefetches and carried collectives.
func (b *Block) checkLoopCrossing(acc []StepAccess) error {
	sc := &b.Schedule
	for _, p := range sc.Prefetch {
		dst := BufferAccess(b.Slots[b.Steps[p.Step].Outs[0]].Buf, false)
		for j := range b.Steps {
			for _, s := range b.Steps[j].Args {
				if j > p.After && BufferAccess(b.Slots[s].Buf, false).overlaps(dst) {
					return fmt.Errorf("step %d reads the destination of step %d after its prefetch (after step %d)", j, p.Step, p.After)
				}
			}
		}
	}
	for _, c := range sc.Carried {
		src := BufferAccess(b.Slots[b.Steps[c.Step].Args[0]].Buf, false)
		for j := 0; j < c.Before; j++ {
			for _, w := range b.writes(j) {
				if w.overlaps(src) {
					return fmt.Errorf("step %d writes the operand of carried step %d before the wait (step %d)", j, c.Step, c.Before)
				}
			}
		}
		for j := c.Step + 1; j < len(b.Steps); j++ {
			if acc[c.Step].Conflicts(&acc[j]) {
				return fmt.Errorf("step %d conflicts with carried step %d", j, c.Step)
			}
		}
	}
	return nil
}
