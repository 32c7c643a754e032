package cuda

import (
	"fmt"
	"slices"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Stream names the three streams of the backend.
type Stream uint8

// Streams: kernels run on Compute; copies into device memory on H2D, copies
// out of it on D2H, so that they overlap with compute. H2DNext is no stream
// of its own: it plans the copies of a scan body that the previous
// iteration issues early (double buffering, planPrefetch). They run on the
// H2D stream, but out of the body's order, so the plan must not take the
// H2D stream's order to cover them.
const (
	Compute Stream = iota
	H2D
	D2H
	H2DNext
)

const numStreams = 4

func (s Stream) String() string { return [...]string{"compute", "h2d", "d2h", "h2d-next"}[s] }

// device returns the stream s runs on.
func (s Stream) device() Stream {
	if s == H2DNext {
		return H2D
	}
	return s
}

// MemKind says which allocation of one execution an access touches.
type MemKind uint8

// Allocations of one execution.
const (
	// MemParam is argument buffer Mem.Index (a donated argument reused for a
	// result is still MemParam: it is the same memory).
	MemParam MemKind = iota + 1
	// MemOutput is the buffer the executor allocates for result Mem.Index.
	MemOutput
	// MemArena is the arena of memory space Mem.Index (ir.MemorySpace).
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

// conflicts reports whether two accesses touch a common byte and one of
// them writes.
func (a Access) conflicts(b Access) bool {
	return (a.Write || b.Write) && a.Mem == b.Mem && a.Size > 0 && b.Size > 0 &&
		a.Off < b.Off+b.Size && b.Off < a.Off+a.Size
}

// StepAccess is what one step touches and where it runs. A Barrier step runs
// on the host after every stream has drained and finishes before the next
// step is issued (the executor's host fallback): it needs no events, and
// everything before it is complete for everything after it.
type StepAccess struct {
	Stream   Stream
	Barrier  bool
	Accesses []Access
}

func stepsConflict(a, b *StepAccess) bool {
	for _, x := range a.Accesses {
		for _, y := range b.Accesses {
			if x.conflicts(y) {
				return true
			}
		}
	}
	return false
}

// StepPlan says on which stream a step runs and which earlier steps' events
// it waits for (only steps on other streams: a stream is ordered).
type StepPlan struct {
	Stream Stream
	Wait   []int
	// Record is true when a later step (or the end of execution) waits for
	// this one: the executor records an event after it.
	Record bool
}

// Plan is the stream plan of one program body.
type Plan struct {
	Steps []StepPlan
	// Final lists the steps of the copy streams that the compute stream
	// waits for at the end of execution, before the executor's trailing
	// result copies and before it synchronises the compute stream: after
	// that synchronisation no work of the execution is outstanding, so the
	// arenas, donated arguments and deleted buffers may be freed.
	Final []int
}

// PlanAccesses orders every hazard between steps on different streams:
// read-after-write, write-after-read and write-after-write on overlapping
// bytes of one allocation. Step i on stream s waits, for each other stream
// t, for the latest earlier step of t that conflicts with it — unless that
// step is already ordered before i through earlier waits (vector clocks over
// the three streams) or through a later wait of i itself; so no wait is
// implied by the others, and each waits for the weakest sufficient step
// (the latest conflicting one, not the latest on t).
func PlanAccesses(steps []StepAccess) Plan {
	n := len(steps)
	p := Plan{Steps: make([]StepPlan, n)}
	var none [numStreams]int
	for s := range none {
		none[s] = -1
	}
	var known [numStreams][numStreams]int // known[s][t]: last step of t ordered before s's next step
	for s := range known {
		known[s] = none
	}
	clock := make([][numStreams]int, n) // clock[j][t]: last step of t ordered before (or =) j
	var of [numStreams][]int            // steps per stream, in order
	last := none
	for i := range steps {
		st := &steps[i]
		s := st.Stream
		p.Steps[i].Stream = s
		if st.Barrier {
			// Everything issued so far is complete for every stream.
			for a := range known {
				known[a] = last
				known[a][s] = max(known[a][s], i)
			}
			clock[i] = known[s]
			of[s] = append(of[s], i)
			last[s] = i
			continue
		}
		var need []int
		for t := Stream(0); t < numStreams; t++ {
			if t == s {
				continue
			}
			for k := len(of[t]) - 1; k >= 0 && of[t][k] > known[s][t]; k-- {
				if j := of[t][k]; stepsConflict(st, &steps[j]) {
					need = append(need, j)
					break
				}
			}
		}
		for _, j := range need {
			implied := false
			for _, d := range need {
				if d != j && clock[d][steps[j].Stream] >= j {
					implied = true
				}
			}
			if implied {
				continue
			}
			p.Steps[i].Wait = append(p.Steps[i].Wait, j)
			p.Steps[j].Record = true
			for t := range known[s] {
				known[s][t] = max(known[s][t], clock[j][t])
			}
		}
		slices.Sort(p.Steps[i].Wait)
		known[s][s] = i
		clock[i] = known[s]
		of[s] = append(of[s], i)
		last[s] = i
	}
	// The end: compute waits for the last step of each copy stream.
	var need []int
	for t := H2D; t < numStreams; t++ {
		if last[t] > known[Compute][t] {
			need = append(need, last[t])
		}
	}
	for _, j := range need {
		implied := false
		for _, d := range need {
			if d != j && clock[d][steps[j].Stream] >= j {
				implied = true
			}
		}
		if !implied {
			p.Final = append(p.Final, j)
			p.Steps[j].Record = true
		}
	}
	slices.Sort(p.Final)
	return p
}

// StreamOf returns the stream a step runs on: a copy into device memory on
// H2D, one into pinned_host on D2H, everything else on Compute.
func StreamOf(st *passes.Step) Stream {
	switch {
	case st.Kind != passes.StepCopy:
		return Compute
	case st.To == ir.Device:
		return H2D
	}
	return D2H
}

// slotAccess is the access of a slot's buffer: a donated argument's memory
// reused for a result (BufAlias) is that argument's.
func slotAccess(b passes.Buffer, write bool) Access {
	a := Access{Size: b.Size, Write: write}
	switch b.Kind {
	case passes.BufParam:
		a.Mem = Mem{MemParam, b.Index}
	case passes.BufAlias:
		a.Mem = Mem{MemParam, b.Param}
	case passes.BufOutput:
		a.Mem = Mem{MemOutput, b.Index}
	case passes.BufTemp:
		a.Mem, a.Off = Mem{MemArena, int(b.Space)}, b.Offset
	case passes.BufSlice:
		a.Mem = Mem{MemSlice, b.Index}
	}
	return a
}

// StepAccesses lists what each step of block blk reads and writes, from its
// slots' buffers (planned offsets and sizes, so temps that the plan packs
// into the same arena bytes conflict): its operands' buffers (read), its
// results' (written; a constant reads only its own upload), and for a loop
// the nested arenas it uses. barrier[i] marks the steps the executor runs
// on the host (nil: none).
func StepAccesses(blk *passes.Block, barrier []bool) []StepAccess {
	out := make([]StepAccess, len(blk.Steps))
	for i := range blk.Steps {
		st, acc := &blk.Steps[i], &out[i]
		acc.Stream = StreamOf(st)
		acc.Barrier = i < len(barrier) && barrier[i]
		for _, s := range st.Args {
			acc.Accesses = append(acc.Accesses, slotAccess(blk.Slots[s].Buf, false))
		}
		for _, s := range st.Outs {
			acc.Accesses = append(acc.Accesses, slotAccess(blk.Slots[s].Buf, true))
		}
		if lp := st.Loop; lp != nil {
			for sp := range lp.SubOffset {
				if size := subArena(lp, ir.MemorySpace(sp)); size > 0 {
					acc.Accesses = append(acc.Accesses, Access{Mem: Mem{MemArena, sp}, Off: lp.SubOffset[sp], Size: size, Write: true})
				}
			}
		}
	}
	return out
}

// PlanStreams is the stream plan of a block: StepAccesses, then
// PlanAccesses.
func PlanStreams(blk *passes.Block, barrier []bool) Plan {
	return PlanAccesses(StepAccesses(blk, barrier))
}
