package cuda

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// fakeProg builds a program body with a hand-made buffer plan, so that tests
// choose which values share arena bytes.
type fakeProg struct {
	t    *testing.T
	f    *ir.Func
	plan *passes.RegionPlan
}

func newFakeProg(t *testing.T) *fakeProg {
	f := ir.NewFunc("f")
	return &fakeProg{t: t, f: f, plan: &passes.RegionPlan{Region: f.Body, Values: map[*ir.Value]passes.Buffer{}}}
}

func (p *fakeProg) param(space ir.MemorySpace) *ir.Value {
	v := p.f.Body.AddParam(ir.TypeOf(ir.Float32, 16).WithSpace(space))
	p.plan.Values[v] = passes.Buffer{Kind: passes.BufParam, Space: space, Size: 64, Index: len(p.f.Body.Params) - 1}
	return v
}

// op appends an op whose result lives in b.
func (p *fakeProg) op(code ir.Code, b passes.Buffer, args ...*ir.Value) *ir.Value {
	var attrs ir.Attrs
	if code == ir.DevicePut {
		attrs = ir.Attrs{"space": b.Space}
	}
	op, err := p.f.Body.AddOp(code, args, attrs)
	if err != nil {
		p.t.Fatal(err)
	}
	if b.Size == 0 {
		b.Size = 64
	}
	p.plan.Values[op.Results[0]] = b
	return op.Results[0]
}

// block lowers the program (passes.Lower) into the block the stream planner
// reads: the arenas cover every temp, the outputs are the body's results
// and every parameter is donated (so aliases are allowed).
func (p *fakeProg) block() *passes.Block {
	donated := make([]bool, len(p.f.Body.Params))
	for i := range donated {
		donated[i] = true
	}
	for v, b := range p.plan.Values {
		switch b.Kind {
		case passes.BufTemp:
			p.plan.Arena[b.Space] = max(p.plan.Arena[b.Space], b.Offset+b.Size)
		case passes.BufOutput, passes.BufAlias:
			for len(p.f.Body.Results) <= b.Index {
				p.f.Body.Results = append(p.f.Body.Results, nil)
			}
			p.f.Body.Results[b.Index] = v
		}
	}
	ex, err := passes.Lower(&passes.Program{Func: p.f, Plan: p.plan, Donated: donated})
	if err != nil {
		p.t.Fatal(err)
	}
	return ex.Top
}

func temp(space ir.MemorySpace, off int64) passes.Buffer {
	return passes.Buffer{Kind: passes.BufTemp, Space: space, Offset: off, Size: 64}
}

func output(space ir.MemorySpace, i int) passes.Buffer {
	return passes.Buffer{Kind: passes.BufOutput, Space: space, Index: i}
}

const (
	dev  = ir.Device
	host = ir.PinnedHost
)

// Small programs with buffer reuse across streams and the waits they need.
func TestPlanStreamsTable(t *testing.T) {
	type want struct {
		streams []Stream
		waits   [][]int
		final   []int
	}
	cases := []struct {
		name    string
		build   func(p *fakeProg)
		barrier []bool
		want    want
	}{
		{"read after write", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			up := p.op(ir.DevicePut, temp(dev, 0), x) // 0 h2d
			e := p.op(ir.Exp, temp(dev, 64), w)       // 1
			p.op(ir.Add, output(dev, 0), up, e)       // 2 reads up
			p.f.Body.Results = []*ir.Value{p.f.Body.Ops[2].Results[0]}
		}, nil, want{[]Stream{H2D, Compute, Compute}, [][]int{nil, nil, {0}}, nil}},

		// The bug of the data-dependency plan: the copy out still reads a's
		// bytes when the compute stream reuses them for b.
		{"write after read (arena reuse)", func(p *fakeProg) {
			w := p.param(dev)
			a := p.op(ir.Exp, temp(dev, 0), w)     // 0
			p.op(ir.DevicePut, output(host, 1), a) // 1 d2h reads a
			b := p.op(ir.Neg, temp(dev, 0), w)     // 2 overwrites a's bytes
			p.op(ir.Add, output(dev, 0), b, w)     // 3
		}, nil, want{[]Stream{Compute, D2H, Compute, Compute}, [][]int{nil, {0}, {1}, nil}, nil}},

		{"write after write (partial overlap)", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			p.op(ir.DevicePut, temp(dev, 0), x)                                                    // 0 h2d, dead
			p.op(ir.Exp, passes.Buffer{Kind: passes.BufTemp, Space: dev, Offset: 32, Size: 64}, w) // 1
		}, nil, want{[]Stream{H2D, Compute}, [][]int{nil, {0}}, nil}},

		{"disjoint bytes", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			p.op(ir.DevicePut, temp(dev, 0), x) // 0
			p.op(ir.Exp, temp(dev, 64), w)      // 1: no hazard
		}, nil, want{[]Stream{H2D, Compute}, [][]int{nil, nil}, []int{0}}},

		{"latest conflicting step implies the earlier", func(p *fakeProg) {
			x, y := p.param(host), p.param(host)
			u1 := p.op(ir.DevicePut, temp(dev, 0), x)  // 0
			u2 := p.op(ir.DevicePut, temp(dev, 64), y) // 1
			p.op(ir.Exp, temp(dev, 128), u2)           // 2 waits 1
			p.op(ir.Exp, temp(dev, 192), u1)           // 3 ordered through 1
		}, nil, want{[]Stream{H2D, H2D, Compute, Compute}, [][]int{nil, nil, {1}, nil}, nil}},

		{"wait implied through another stream", func(p *fakeProg) {
			x := p.param(host)
			up := p.op(ir.DevicePut, temp(dev, 0), x)     // 0 h2d
			down := p.op(ir.DevicePut, temp(host, 0), up) // 1 d2h waits 0
			p.op(ir.Add, output(host, 0), down, up)       // 2 needs 0 and 1: 1 implies 0
		}, nil, want{[]Stream{H2D, D2H, Compute}, [][]int{nil, {0}, {1}}, nil}},

		{"donated argument read by a copy", func(p *fakeProg) {
			w, x := p.param(dev), p.param(dev)
			p.op(ir.DevicePut, output(host, 1), w)                                                // 0 d2h reads w
			p.op(ir.Exp, passes.Buffer{Kind: passes.BufAlias, Space: dev, Index: 0, Param: 0}, x) // 1 writes w's memory
		}, nil, want{[]Stream{D2H, Compute}, [][]int{nil, {0}}, nil}},

		{"end waits for the last copy", func(p *fakeProg) {
			w := p.param(dev)
			a := p.op(ir.Exp, temp(dev, 0), w)     // 0
			p.op(ir.DevicePut, output(host, 0), a) // 1
		}, nil, want{[]Stream{Compute, D2H}, [][]int{nil, {0}}, []int{1}}},

		{"host step is a barrier", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			up := p.op(ir.DevicePut, temp(dev, 0), x) // 0
			s := p.op(ir.Exp, temp(dev, 64), w)       // 1 host step
			p.op(ir.Add, temp(dev, 128), up, s)       // 2 no wait
			p.op(ir.DevicePut, output(host, 0), s)    // 3 no wait
		}, []bool{false, true, false, false}, want{[]Stream{H2D, Compute, Compute, D2H}, [][]int{nil, nil, nil, nil}, []int{3}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newFakeProg(t)
			c.build(p)
			blk := p.block()
			plan := PlanStreams(blk, c.barrier)
			recorded := map[int]bool{}
			for i, sp := range plan.Steps {
				if sp.Stream != c.want.streams[i] || !slices.Equal(sp.Wait, c.want.waits[i]) {
					t.Errorf("step %d (%v): stream %v waits %v, want %v waits %v", i, p.f.Body.Ops[i].Code, sp.Stream, sp.Wait, c.want.streams[i], c.want.waits[i])
				}
				for _, j := range sp.Wait {
					recorded[j] = true
				}
			}
			if !slices.Equal(plan.Final, c.want.final) {
				t.Errorf("final waits %v, want %v", plan.Final, c.want.final)
			}
			for _, j := range plan.Final {
				recorded[j] = true
			}
			for i, sp := range plan.Steps {
				if sp.Record != recorded[i] {
					t.Errorf("step %d records %v, but waited for: %v", i, sp.Record, recorded[i])
				}
			}
			st := StepAccesses(blk, c.barrier)
			if err := checkOrdered(st, plan); err != nil {
				t.Error(err)
			}
		})
	}
}

// A value without a buffer never reaches the stream planner: lowering the
// plan, which the planner reads, fails naming it.
func TestPlanStreamsMissingBuffer(t *testing.T) {
	p := newFakeProg(t)
	w := p.param(dev)
	op, _ := p.f.Body.AddOp(ir.Exp, []*ir.Value{w}, nil)
	_, err := passes.Lower(&passes.Program{Func: p.f, Plan: p.plan})
	if err == nil || !strings.Contains(err.Error(), op.Results[0].String()) {
		t.Fatalf("lowering %v without a buffer: %v, want an error naming it", op.Results[0], err)
	}
}

// happensBefore returns, for the plan, hb[j][i] = step j completes before
// step i starts (stream order, events, barriers), as a transitive closure.
func happensBefore(st []StepAccess, p Plan) [][]bool {
	n := len(st)
	hb := make([][]bool, n+1) // n: the end of execution
	for i := range hb {
		hb[i] = make([]bool, n+1)
	}
	lastOn := [numStreams]int{-1, -1, -1, -1}
	lastBarrier := -1
	for i := 0; i <= n; i++ {
		if i == n {
			// End: on compute, after Final.
			if lastOn[Compute] >= 0 {
				hb[lastOn[Compute]][n] = true
			}
			for _, j := range p.Final {
				hb[j][n] = true
			}
			if lastBarrier >= 0 {
				hb[lastBarrier][n] = true
			}
		} else {
			s := st[i].Stream
			if st[i].Barrier {
				for j := 0; j < i; j++ {
					hb[j][i] = true
				}
				lastBarrier = i
			} else {
				if lastOn[s] >= 0 {
					hb[lastOn[s]][i] = true
				}
				for _, j := range p.Steps[i].Wait {
					hb[j][i] = true
				}
			}
			if lastBarrier >= 0 && lastBarrier < i {
				hb[lastBarrier][i] = true
			}
			lastOn[s] = i
		}
		for j := 0; j < i; j++ {
			if hb[j][i] {
				for k := 0; k < j; k++ {
					if hb[k][j] {
						hb[k][i] = true
					}
				}
			}
		}
	}
	return hb
}

// checkOrdered reports a pair of conflicting steps that the plan leaves
// unordered, or a step of another stream not ordered before the end.
func checkOrdered(st []StepAccess, p Plan) error {
	hb := happensBefore(st, p)
	n := len(st)
	for i := range st {
		for j := 0; j < i; j++ {
			if stepsConflict(&st[i], &st[j]) && !hb[j][i] {
				return fmt.Errorf("steps %d (%v) and %d (%v) conflict but are not ordered", j, st[j].Stream, i, st[i].Stream)
			}
		}
		if !hb[i][n] {
			return fmt.Errorf("step %d (%v) is not ordered before the end of execution", i, st[i].Stream)
		}
	}
	return nil
}

// simulate runs one random interleaving of the streams that the plan's
// events allow: the host issues steps in order (a barrier step waits for
// everything issued), each stream runs its issued steps one at a time in
// order once the events they wait for are recorded (their steps complete),
// and the end of execution runs on compute after Final. It returns the
// first conflicting pair found running out of program order.
func simulate(rng *rand.Rand, st []StepAccess, p Plan) error {
	n := len(st)
	const (
		idle = iota
		queued
		running
		done
	)
	state := make([]int, n+1)
	var queue [numStreams][]int
	issued := 0
	allDone := func(upto int) bool {
		for j := 0; j < upto; j++ {
			if state[j] != done {
				return false
			}
		}
		return true
	}
	start := func(i int) error {
		for j := 0; j < i; j++ {
			if state[j] != done && (i == n || stepsConflict(&st[i], &st[j])) {
				return fmt.Errorf("step %d (%v) starts while conflicting step %d (%v) is not complete", i, streamOr(st, i), j, st[j].Stream)
			}
		}
		state[i] = running
		return nil
	}
	waits := func(i int) []int {
		if i == n {
			return p.Final
		}
		return p.Steps[i].Wait
	}
	for {
		type action struct {
			kind int // 0 issue, 1 start head, 2 complete
			s    Stream
		}
		var acts []action
		if issued <= n && (issued == n || !st[issued].Barrier || allDone(issued)) {
			acts = append(acts, action{0, 0})
		}
		for s := Stream(0); s < numStreams; s++ {
			if len(queue[s]) == 0 {
				continue
			}
			h := queue[s][0]
			switch state[h] {
			case queued:
				ok := true
				for _, j := range waits(h) {
					ok = ok && state[j] == done
				}
				if ok {
					acts = append(acts, action{1, s})
				}
			case running:
				acts = append(acts, action{2, s})
			}
		}
		if len(acts) == 0 {
			if state[n] == done {
				return nil
			}
			return fmt.Errorf("deadlock: issued %d of %d", issued, n)
		}
		a := acts[rng.IntN(len(acts))]
		switch a.kind {
		case 0:
			i := issued
			issued++
			if i < n && st[i].Barrier {
				if err := start(i); err != nil {
					return err
				}
				state[i] = done
				continue
			}
			s := Compute
			if i < n {
				s = st[i].Stream
			}
			state[i] = queued
			queue[s] = append(queue[s], i)
		case 1:
			if err := start(queue[a.s][0]); err != nil {
				return err
			}
		case 2:
			state[queue[a.s][0]] = done
			queue[a.s] = queue[a.s][1:]
		}
	}
}

func streamOr(st []StepAccess, i int) string {
	if i == len(st) {
		return "end"
	}
	return st[i].Stream.String()
}

// randomSteps is a random program over a few allocations with overlapping
// ranges, on random streams, with a few barriers.
func randomSteps(rng *rand.Rand) []StepAccess {
	mems := []Mem{{MemParam, 0}, {MemParam, 1}, {MemOutput, 0}, {MemArena, 0}, {MemArena, 1}}
	n := 1 + rng.IntN(24)
	st := make([]StepAccess, n)
	for i := range st {
		switch r := rng.IntN(10); {
		case r < 5:
			st[i].Stream = Compute
		case r < 7:
			st[i].Stream = H2D
		default:
			st[i].Stream = D2H
		}
		st[i].Barrier = rng.IntN(15) == 0
		for range 1 + rng.IntN(3) {
			st[i].Accesses = append(st[i].Accesses, Access{
				Mem: mems[rng.IntN(len(mems))], Off: int64(rng.IntN(8)) * 16,
				Size: int64(rng.IntN(4)+1) * 16, Write: rng.IntN(2) == 0,
			})
		}
	}
	return st
}

// On random programs, the plan orders every conflicting pair (closure
// check), every random interleaving the events allow runs conflicting
// accesses in program order, and no wait can be dropped.
func TestPlanAccessesRandom(t *testing.T) {
	rng := testseed.Rand(t, 7)
	waits := 0
	for it := range 300 {
		st := randomSteps(rng)
		p := PlanAccesses(st)
		if err := checkOrdered(st, p); err != nil {
			t.Fatalf("program %d: %v\n%s", it, err, dumpSteps(st, p))
		}
		for range 30 {
			if err := simulate(rng, st, p); err != nil {
				t.Fatalf("program %d: %v\n%s", it, err, dumpSteps(st, p))
			}
		}
		// Minimality: without any one of its waits the plan is unsafe.
		for i := range p.Steps {
			for k := range p.Steps[i].Wait {
				waits++
				q := clonePlan(p)
				q.Steps[i].Wait = slices.Delete(q.Steps[i].Wait, k, k+1)
				if checkOrdered(st, q) == nil {
					t.Fatalf("program %d: step %d's wait for %d is redundant\n%s", it, i, p.Steps[i].Wait[k], dumpSteps(st, p))
				}
			}
		}
		for k := range p.Final {
			q := clonePlan(p)
			q.Final = slices.Delete(q.Final, k, k+1)
			if checkOrdered(st, q) == nil {
				t.Fatalf("program %d: final wait for %d is redundant\n%s", it, p.Final[k], dumpSteps(st, p))
			}
		}
	}
	if waits == 0 {
		t.Fatal("random programs produced no waits")
	}
}

// The simulator finds the write-after-read race of a plan that only follows
// data dependencies (the previous PlanStreams), so its passing is evidence.
func TestSimulatorFindsRace(t *testing.T) {
	a := Access{Mem: Mem{MemArena, 0}, Size: 64}
	st := []StepAccess{
		{Stream: Compute, Accesses: []Access{{Mem: a.Mem, Size: 64, Write: true}}}, // a = exp(w)
		{Stream: D2H, Accesses: []Access{a, {Mem: Mem{MemOutput, 0}, Size: 64, Write: true}}},
		{Stream: Compute, Accesses: []Access{{Mem: a.Mem, Size: 64, Write: true}}}, // reuse
	}
	dataOnly := Plan{Steps: []StepPlan{{Stream: Compute, Record: true}, {Stream: D2H, Wait: []int{0}}, {Stream: Compute}}}
	rng := rand.New(rand.NewPCG(1, 2))
	found := false
	for range 2000 {
		if simulate(rng, st, dataOnly) != nil {
			found = true
			break
		}
	}
	if !found {
		t.Fatal("simulator never found the write-after-read race")
	}
	if checkOrdered(st, dataOnly) == nil {
		t.Fatal("closure check accepted the race")
	}
	p := PlanAccesses(st)
	if !slices.Equal(p.Steps[2].Wait, []int{1}) {
		t.Fatalf("reuse step waits %v, want [1]", p.Steps[2].Wait)
	}
}

func clonePlan(p Plan) Plan {
	q := Plan{Steps: slices.Clone(p.Steps), Final: slices.Clone(p.Final)}
	for i := range q.Steps {
		q.Steps[i].Wait = slices.Clone(q.Steps[i].Wait)
	}
	return q
}

func dumpSteps(st []StepAccess, p Plan) string {
	var s string
	for i, x := range st {
		s += fmt.Sprintf("  %d %v barrier=%v %v waits %v\n", i, x.Stream, x.Barrier, x.Accesses, p.Steps[i].Wait)
	}
	return s + fmt.Sprintf("  final %v\n", p.Final)
}
