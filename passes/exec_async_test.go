package passes_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
	"github.com/stretchr/testify/require"
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

// block lowers the program: the arenas cover every temp, the outputs are
// the body's results and every parameter is donated (so aliases are
// allowed).
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
	cmp  = passes.QueueCompute
	h2d  = passes.QueueToDevice
	d2h  = passes.QueueToHost
)

// Small programs with buffer reuse across queues and the waits they need.
func TestScheduleTable(t *testing.T) {
	type want struct {
		queues []passes.Queue
		waits  [][]int
		final  []int
	}
	cases := []struct {
		name  string
		build func(p *fakeProg)
		want  want
	}{
		{"read after write", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			up := p.op(ir.DevicePut, temp(dev, 0), x) // 0 h2d
			e := p.op(ir.Exp, temp(dev, 64), w)       // 1
			p.op(ir.Add, output(dev, 0), up, e)       // 2 reads up
		}, want{[]passes.Queue{h2d, cmp, cmp}, [][]int{nil, nil, {0}}, nil}},

		// The copy out still reads a's bytes when compute reuses them for b.
		{"write after read (arena reuse)", func(p *fakeProg) {
			w := p.param(dev)
			a := p.op(ir.Exp, temp(dev, 0), w)     // 0
			p.op(ir.DevicePut, output(host, 1), a) // 1 d2h reads a
			b := p.op(ir.Neg, temp(dev, 0), w)     // 2 overwrites a's bytes
			p.op(ir.Add, output(dev, 0), b, w)     // 3
		}, want{[]passes.Queue{cmp, d2h, cmp, cmp}, [][]int{nil, {0}, {1}, nil}, nil}},

		{"write after write (partial overlap)", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			p.op(ir.DevicePut, temp(dev, 0), x)                                                    // 0 h2d, dead
			p.op(ir.Exp, passes.Buffer{Kind: passes.BufTemp, Space: dev, Offset: 32, Size: 64}, w) // 1
		}, want{[]passes.Queue{h2d, cmp}, [][]int{nil, {0}}, nil}},

		{"disjoint bytes", func(p *fakeProg) {
			x, w := p.param(host), p.param(dev)
			p.op(ir.DevicePut, temp(dev, 0), x) // 0
			p.op(ir.Exp, temp(dev, 64), w)      // 1: no hazard
		}, want{[]passes.Queue{h2d, cmp}, [][]int{nil, nil}, []int{0}}},

		{"latest conflicting step implies the earlier", func(p *fakeProg) {
			x, y := p.param(host), p.param(host)
			u1 := p.op(ir.DevicePut, temp(dev, 0), x)  // 0
			u2 := p.op(ir.DevicePut, temp(dev, 64), y) // 1
			p.op(ir.Exp, temp(dev, 128), u2)           // 2 waits 1
			p.op(ir.Exp, temp(dev, 192), u1)           // 3 ordered through 1
		}, want{[]passes.Queue{h2d, h2d, cmp, cmp}, [][]int{nil, nil, {1}, nil}, nil}},

		{"wait implied through another queue", func(p *fakeProg) {
			x := p.param(host)
			up := p.op(ir.DevicePut, temp(dev, 0), x)     // 0 h2d
			down := p.op(ir.DevicePut, temp(host, 0), up) // 1 d2h waits 0
			p.op(ir.Add, output(host, 0), down, up)       // 2 needs 0 and 1: 1 implies 0
		}, want{[]passes.Queue{h2d, d2h, cmp}, [][]int{nil, {0}, {1}}, nil}},

		{"donated argument read by a copy", func(p *fakeProg) {
			w, x := p.param(dev), p.param(dev)
			p.op(ir.DevicePut, output(host, 1), w)                                                // 0 d2h reads w
			p.op(ir.Exp, passes.Buffer{Kind: passes.BufAlias, Space: dev, Index: 0, Param: 0}, x) // 1 writes w's memory
		}, want{[]passes.Queue{d2h, cmp}, [][]int{nil, {0}}, nil}},

		{"end waits for the last copy", func(p *fakeProg) {
			w := p.param(dev)
			a := p.op(ir.Exp, temp(dev, 0), w)     // 0
			p.op(ir.DevicePut, output(host, 0), a) // 1
		}, want{[]passes.Queue{cmp, d2h}, [][]int{nil, {0}}, []int{1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newFakeProg(t)
			c.build(p)
			blk := p.block()
			sc := blk.Schedule
			recorded := map[int]bool{}
			for i, ss := range sc.Steps {
				if ss.Queue != c.want.queues[i] || !slices.Equal(ss.Wait, c.want.waits[i]) {
					t.Errorf("step %d (%v): queue %v waits %v, want %v waits %v", i, p.f.Body.Ops[i].Code, ss.Queue, ss.Wait, c.want.queues[i], c.want.waits[i])
				}
				for _, j := range ss.Wait {
					recorded[j] = true
				}
			}
			if !slices.Equal(sc.Final, c.want.final) {
				t.Errorf("final waits %v, want %v", sc.Final, c.want.final)
			}
			for _, j := range sc.Final {
				recorded[j] = true
			}
			for i, ss := range sc.Steps {
				if ss.Record != recorded[i] {
					t.Errorf("step %d records %v, but waited for: %v", i, ss.Record, recorded[i])
				}
			}
			if err := checkOrdered(blk.Accesses(), planOf(sc)); err != nil {
				t.Error(err)
			}
		})
	}
}

// planOf is the waits of a schedule as an AccessPlan.
func planOf(sc passes.Schedule) passes.AccessPlan {
	p := passes.AccessPlan{Final: sc.Final}
	for _, ss := range sc.Steps {
		p.Wait = append(p.Wait, ss.Wait)
		p.Record = append(p.Record, ss.Record)
	}
	return p
}

func lanesOf(st []passes.StepAccess) int {
	n := 1
	for _, s := range st {
		n = max(n, s.Lane+1)
	}
	return n
}

// happensBefore returns, for the plan, hb[j][i] = step j completes before
// step i starts (lane order, waits), as a transitive closure; index n is
// the end, on lane 0 after Final.
func happensBefore(st []passes.StepAccess, p passes.AccessPlan) [][]bool {
	n := len(st)
	hb := make([][]bool, n+1)
	for i := range hb {
		hb[i] = make([]bool, n+1)
	}
	lastOn := make([]int, lanesOf(st))
	for i := range lastOn {
		lastOn[i] = -1
	}
	for i := 0; i <= n; i++ {
		if i == n {
			if lastOn[0] >= 0 {
				hb[lastOn[0]][n] = true
			}
			for _, j := range p.Final {
				hb[j][n] = true
			}
		} else {
			s := st[i].Lane
			if lastOn[s] >= 0 {
				hb[lastOn[s]][i] = true
			}
			for _, j := range p.Wait[i] {
				hb[j][i] = true
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
// unordered, or a step not ordered before the end.
func checkOrdered(st []passes.StepAccess, p passes.AccessPlan) error {
	hb := happensBefore(st, p)
	n := len(st)
	for i := range st {
		for j := 0; j < i; j++ {
			if st[i].Conflicts(&st[j]) && !hb[j][i] {
				return fmt.Errorf("steps %d (lane %d) and %d (lane %d) conflict but are not ordered", j, st[j].Lane, i, st[i].Lane)
			}
		}
		if !hb[i][n] && !st[i].NoEnd {
			return fmt.Errorf("step %d (lane %d) is not ordered before the end", i, st[i].Lane)
		}
	}
	return nil
}

// simulate runs one random interleaving of the lanes that the plan's waits
// allow: the host issues steps in order, each lane runs its issued steps
// one at a time in order once the steps they wait for are complete, and
// the end runs on lane 0 after Final. It returns the first conflicting
// pair found running out of program order.
func simulate(rng *rand.Rand, st []passes.StepAccess, p passes.AccessPlan) error {
	n := len(st)
	const (
		idle = iota
		queued
		running
		done
	)
	state := make([]int, n+1)
	queue := make([][]int, lanesOf(st))
	issued := 0
	start := func(i int) error {
		for j := 0; j < i; j++ {
			if state[j] != done && (i == n && !st[j].NoEnd || i < n && st[i].Conflicts(&st[j])) {
				return fmt.Errorf("step %d starts while conflicting step %d (lane %d) is not complete", i, j, st[j].Lane)
			}
		}
		state[i] = running
		return nil
	}
	waits := func(i int) []int {
		if i == n {
			return p.Final
		}
		return p.Wait[i]
	}
	for {
		type action struct{ kind, lane int } // kind 0 issue, 1 start head, 2 complete
		var acts []action
		if issued <= n {
			acts = append(acts, action{0, 0})
		}
		for s := range queue {
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
			s := 0
			if i < n {
				s = st[i].Lane
			}
			state[i] = queued
			queue[s] = append(queue[s], i)
		case 1:
			if err := start(queue[a.lane][0]); err != nil {
				return err
			}
		case 2:
			state[queue[a.lane][0]] = done
			queue[a.lane] = queue[a.lane][1:]
		}
	}
}

// randomSteps is a random program over a few allocations with overlapping
// ranges, on random lanes, a few of them not waited for at the end.
func randomSteps(rng *rand.Rand) []passes.StepAccess {
	mems := []passes.Mem{{Kind: passes.MemParam}, {Kind: passes.MemParam, Index: 1}, {Kind: passes.MemOutput}, {Kind: passes.MemArena}, {Kind: passes.MemArena, Index: 1}}
	n := 1 + rng.IntN(24)
	st := make([]passes.StepAccess, n)
	for i := range st {
		switch r := rng.IntN(12); {
		case r < 5:
			st[i].Lane = 0
		case r < 7:
			st[i].Lane = 1
		case r < 9:
			st[i].Lane = 2
		case r < 11:
			st[i].Lane = 3
		default:
			st[i].Lane = 4 + rng.IntN(3) // lanes of prefetched steps
		}
		st[i].NoEnd = st[i].Lane == 3 && rng.IntN(4) == 0
		for range 1 + rng.IntN(3) {
			st[i].Accesses = append(st[i].Accesses, passes.Access{
				Mem: mems[rng.IntN(len(mems))], Off: int64(rng.IntN(8)) * 16,
				Size: int64(rng.IntN(4)+1) * 16, Write: rng.IntN(2) == 0,
			})
		}
	}
	return st
}

// On random programs, the plan orders every conflicting pair (closure
// check), every random interleaving the waits allow runs conflicting
// accesses in program order, and no wait can be dropped.
func TestPlanAccessesRandom(t *testing.T) {
	rng := testseed.Rand(t, 7)
	waits := 0
	for it := range 300 {
		st := randomSteps(rng)
		p := passes.PlanAccesses(st)
		if err := checkOrdered(st, p); err != nil {
			t.Fatalf("program %d: %v\n%s", it, err, dumpSteps(st, p))
		}
		for range 30 {
			if err := simulate(rng, st, p); err != nil {
				t.Fatalf("program %d: %v\n%s", it, err, dumpSteps(st, p))
			}
		}
		// Minimality: without any one of its waits the plan is unsafe.
		for i := range p.Wait {
			for k := range p.Wait[i] {
				waits++
				q := clonePlan(p)
				q.Wait[i] = slices.Delete(q.Wait[i], k, k+1)
				if checkOrdered(st, q) == nil {
					t.Fatalf("program %d: step %d's wait for %d is redundant\n%s", it, i, p.Wait[i][k], dumpSteps(st, p))
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
// data dependencies, so its passing is evidence.
func TestSimulatorFindsRace(t *testing.T) {
	a := passes.Access{Mem: passes.Mem{Kind: passes.MemArena}, Size: 64}
	w := a
	w.Write = true
	st := []passes.StepAccess{
		{Lane: 0, Accesses: []passes.Access{w}}, // a = exp(w)
		{Lane: 2, Accesses: []passes.Access{a, {Mem: passes.Mem{Kind: passes.MemOutput}, Size: 64, Write: true}}},
		{Lane: 0, Accesses: []passes.Access{w}}, // reuse
	}
	dataOnly := passes.AccessPlan{Wait: [][]int{nil, {0}, nil}, Record: []bool{true, false, false}}
	rng := rand.New(rand.NewPCG(1, 2))
	found := false
	for range 2000 {
		if simulate(rng, st, dataOnly) != nil {
			found = true
			break
		}
	}
	require.True(t, found, "simulator never found the write-after-read race")
	require.Error(t, checkOrdered(st, dataOnly), "closure check accepted the race")
	p := passes.PlanAccesses(st)
	require.Equal(t, []int{1}, p.Wait[2], "the reuse step waits for the copy")
}

func clonePlan(p passes.AccessPlan) passes.AccessPlan {
	q := passes.AccessPlan{Wait: slices.Clone(p.Wait), Final: slices.Clone(p.Final), Record: p.Record}
	for i := range q.Wait {
		q.Wait[i] = slices.Clone(q.Wait[i])
	}
	return q
}

func dumpSteps(st []passes.StepAccess, p passes.AccessPlan) string {
	var s string
	for i, x := range st {
		s += fmt.Sprintf("  %d lane %d noend=%v %v waits %v\n", i, x.Lane, x.NoEnd, x.Accesses, p.Wait[i])
	}
	return s + fmt.Sprintf("  final %v\n", p.Final)
}

// An offloaded scan (hostScan: both weight slices copied to the device in
// the body): the plan's text form schedules the copies on the to_device
// queue, the w1 copy prefetched by the previous iteration after its last
// reader, its reader waiting for it, and the block's final waits.
func TestScheduleScanText(t *testing.T) {
	f := hostScan(4, 8, func(c, big *trace.Array) *trace.Array {
		return trace.Add(trace.Sum(trace.Tanh(trace.MatMul(big, big))), trace.Sum(c))
	})
	p := compile(t, f, passes.Options{})
	ex, err := passes.Lower(p)
	require.NoError(t, err)
	text := ex.String()
	var body *passes.Block
	for _, st := range ex.Top.Steps {
		if st.Loop != nil {
			body = st.Loop.Blocks[0]
		}
	}
	require.NotNil(t, body, "%s", text)
	sc := body.Schedule
	require.Len(t, sc.Prefetch, 2, "both slice copies are prefetched:\n%s", text)
	for _, pf := range sc.Prefetch {
		require.Equal(t, passes.QueueToDevice, sc.Steps[pf.Step].Queue)
		require.True(t, sc.Steps[pf.Step].Prefetched)
		require.GreaterOrEqual(t, pf.Param, 1, "an xs parameter (after the carry)")
		require.Greater(t, pf.After, pf.Step)
		require.Contains(t, text, fmt.Sprintf("prefetch step %d (param %d) after step %d", pf.Step, pf.Param, pf.After))
		require.Contains(t, text, fmt.Sprintf("step %d on to_device", pf.Step))
	}
	// A compute step waits for a prefetched copy, by the text.
	waited := false
	re := regexp.MustCompile(`step (\d+) on compute waits ([0-9]+(?:, [0-9]+)*)`)
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		for _, pf := range sc.Prefetch {
			waited = waited || slices.Contains(strings.Split(m[2], ", "), fmt.Sprint(pf.Step))
		}
	}
	require.True(t, waited, "a compute step waits for a prefetched copy:\n%s", text)
	// With the prefetched steps on lanes of their own, the waits order
	// every hazard of the body.
	acc := body.Accesses()
	for k, pf := range sc.Prefetch {
		acc[pf.Step].Lane = passes.NumQueues + k
	}
	require.NoError(t, checkOrdered(acc, planOf(sc)))
}

// The schedules of random programs (loops, copies between spaces, fused
// groups) pass CheckSchedule, and dropping any one of their waits makes it
// fail, so the check is not vacuous.
func TestScheduleRandomPrograms(t *testing.T) {
	rng := testseed.Rand(t, 43)
	dropped := 0
	for range 25 {
		seed := rng.Uint64()
		f := randprogNew(seed)
		p, err := passes.Compile(f, passes.Options{})
		require.NoError(t, err, "seed %d", seed)
		ex, err := passes.Lower(p)
		require.NoError(t, err, "seed %d", seed)
		require.NoError(t, ex.Top.CheckSchedule(), "seed %d\n%s", seed, ex)
		var blocks []*passes.Block
		var walk func(b *passes.Block)
		walk = func(b *passes.Block) {
			blocks = append(blocks, b)
			for _, st := range b.Steps {
				if st.Loop != nil {
					for _, sub := range st.Loop.Blocks {
						walk(sub)
					}
				}
			}
		}
		walk(ex.Top)
		for _, b := range blocks {
			for i := range b.Schedule.Steps {
				w := b.Schedule.Steps[i].Wait
				for k := range w {
					b.Schedule.Steps[i].Wait = slices.Delete(slices.Clone(w), k, k+1)
					require.Error(t, b.CheckSchedule(), "seed %d: step %d without its wait for %d", seed, i, w[k])
					dropped++
				}
				b.Schedule.Steps[i].Wait = w
			}
		}
	}
	t.Logf("%d waits dropped", dropped)
}

// The offloaded scan's schedule passes CheckSchedule; a prefetch started
// before its destination's last reader fails it.
func TestCheckSchedulePrefetch(t *testing.T) {
	f := hostScan(4, 8, func(c, big *trace.Array) *trace.Array { return trace.Sum(c) })
	p := compile(t, f, passes.Options{})
	ex, err := passes.Lower(p)
	require.NoError(t, err)
	require.NoError(t, ex.Top.CheckSchedule())
	var body *passes.Block
	for _, st := range ex.Top.Steps {
		if st.Loop != nil {
			body = st.Loop.Blocks[0]
		}
	}
	require.NotEmpty(t, body.Schedule.Prefetch)
	body.Schedule.Prefetch[0].After = body.Schedule.Prefetch[0].Step
	require.Error(t, ex.Top.CheckSchedule())
}

// randprogNew is the random program of seed with every feature of
// randprog.
func randprogNew(seed uint64) *ir.Func { return randprog.New(seed, randprog.All()) }
