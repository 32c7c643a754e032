package budget

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/trace"
)

// layers is a stack of scanned layers' weights.
type layers struct{ W1, W2 *trace.Array }

// scanned is a traced function of the planner's tests: the types of its
// argument leaves and what it computes from them.
type scanned struct {
	types []ir.Type
	defs  []*trace.TreeDef
	body  func(args []*trace.Array) []*trace.Array
	act   func(*trace.Array) *trace.Array // scannedGrad's nonlinearity
}

type scannedTrace struct {
	f    *ir.Func
	args Args
}

func (t *scannedTrace) Func() *ir.Func { return t.f }
func (t *scannedTrace) Args() Args     { return t.args }
func (t *scannedTrace) Compile() (*passes.Program, error) {
	return passes.Compile(t.f, passes.Options{Verify: true})
}

func (s *scanned) Trace(p trace.RematPlanner, host []bool) (_ Trace, err error) {
	defer trace.Recover(&err)
	tr := trace.NewFuncTracer("scanned")
	defer tr.Close()
	tr.SetRematPlanner(p)
	params := make([]*trace.Array, len(s.types))
	for i, t := range s.types {
		if i < len(host) && host[i] {
			params[i] = tr.HostParam(t)
		} else {
			params[i] = tr.Param(t)
		}
	}
	tr.Push()
	outs := s.body(params)
	tr.Pop()
	var res []*ir.Value
	for _, o := range outs {
		res = append(res, tr.Output(o))
	}
	f := tr.Func()
	f.Body.Results = res
	one := arrayDef()
	results := make([]*trace.TreeDef, len(outs))
	for i := range results {
		results[i] = one
	}
	n := len(s.types)
	return &scannedTrace{f: f, args: Args{Defs: s.defs, Results: results, Weak: make([]bool, n), Donated: make([]bool, n),
		Name: func(i int) string { return fmt.Sprintf("argument %d", i) }}}, nil
}

func arrayDef() *trace.TreeDef {
	d, err := trace.Structure(new(trace.Array))
	if err != nil {
		panic(err)
	}
	return d
}

// scannedGrad is the gradient of a stack of n tanh MLP layers of width a
// and hidden width b over a batch of m rows, scanned over the layers.
func scannedGrad(n, m, a, b int) *scanned {
	f32 := func(shape ...int) ir.Type { return ir.Type{DType: ir.Float32, Shape: shape, Space: ir.Device} }
	one := arrayDef()
	s := &scanned{
		types: []ir.Type{f32(n, a, b), f32(n, b, a), f32(m, a)},
		defs:  []*trace.TreeDef{one, one, one},
		act:   trace.Tanh,
	}
	s.body = func(args []*trace.Array) []*trace.Array {
		x := args[2]
		g := trace.Grad(func(w layers) *trace.Array {
			y, _ := trace.ScanTree(func(x *trace.Array, w layers) (*trace.Array, struct{}) {
				return trace.MatMul(s.act(trace.MatMul(x, w.W1)), w.W2), struct{}{}
			}, x, w)
			return trace.Sum(y)
		})(layers{args[0], args[1]})
		return []*trace.Array{g.W1, g.W2}
	}
	return s
}

var testRates = Rates{Flop: 1e11, Elem: 2e9, Bandwidth: 5e9}

// checkPlan checks a plan Plan returned for budget against its trace,
// compiled again: the total fits, is the plan's, and the arguments the plan
// places in pinned_host are pinned_host parameters of the trace.
func checkPlan(t *testing.T, tr Trace, p *passes.MemoryPlan, budget, baseline int64) {
	t.Helper()
	prog, err := passes.Compile(tr.Func(), passes.Options{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	total := prog.Analysis.TotalBytes()
	if total > budget || total != p.TotalBytes || p.Budget != budget || p.BaselineBytes != baseline {
		t.Errorf("budget %d: the trace's total is %d; the plan says total %d, budget %d, baseline %d (want %d)", budget, total, p.TotalBytes, p.Budget, p.BaselineBytes, baseline)
	}
	params := tr.Func().Body.Params
	for i := range 3 {
		host := params[i].Type.Space == ir.PinnedHost
		if host != slices.Contains(p.HostArguments(), i) {
			t.Errorf("budget %d: argument %d is in %v; the plan's host arguments are %v", budget, i, params[i].Type.Space, p.HostArguments())
		}
	}
}

// Plan fits every budget from the smallest it reaches (which the error of a
// budget one byte below names) to the baseline, and a plan's trace has the
// total the plan says.
func TestPlanFitsFromTheMinimum(t *testing.T) {
	r := testseed.Rand(t, 1)
	f := scannedGrad(4+r.IntN(5), 8*(1+r.IntN(4)), 16*(1+r.IntN(3)), 32*(1+r.IntN(3)))
	base, err := f.Trace(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := base.Compile()
	if err != nil {
		t.Fatal(err)
	}
	baseline := prog.Analysis.TotalBytes()
	tr, p, err := Plan(f, "scanned", baseline, testRates)
	if err != nil {
		t.Fatal(err)
	}
	checkPlan(t, tr, p, baseline, baseline)
	for _, v := range p.Values {
		if v.Action != "keep" {
			t.Errorf("at the baseline, %s is planned %q, want keep", v.Op, v.Action)
		}
	}

	_, _, err = Plan(f, "scanned", 1, testRates)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("a budget of 1 byte: %v, want an *Error", err)
	}
	if e.Function != "scanned" || e.Budget != 1 || e.Baseline != baseline || e.Minimum >= baseline || e.Minimum != e.Analysis.TotalBytes() || len(e.Dominant) == 0 {
		t.Fatalf("a budget of 1 byte: %+v (baseline %d)", e, baseline)
	}
	if _, _, err := Plan(f, "scanned", e.Minimum-1, testRates); !errors.As(err, new(*Error)) {
		t.Errorf("a budget of %d, one byte below the minimum: %v, want an *Error", e.Minimum-1, err)
	}
	for _, b := range []int64{e.Minimum, e.Minimum + r.Int64N(baseline-e.Minimum+1)} {
		tr, p, err := Plan(f, "scanned", b, testRates)
		if err != nil {
			t.Fatalf("budget %d (minimum %d, baseline %d): %v", b, e.Minimum, baseline, err)
		}
		checkPlan(t, tr, p, b, baseline)
	}
}

// A function that traces differently on a retrace is an error.
func TestPlanUnstableTrace(t *testing.T) {
	f := scannedGrad(4, 8, 16, 32)
	calls := 0
	f.act = func(x *trace.Array) *trace.Array {
		if calls++; calls > 1 {
			return trace.Exp(x)
		}
		return trace.Tanh(x)
	}
	if _, _, err := Plan(f, "scanned", 1, testRates); err == nil || !strings.Contains(err.Error(), "traced differently on a retrace") {
		t.Fatalf("got %v, want an error saying the function traced differently", err)
	}
}

// traceFunc traces body over parameters of types types.
func traceFunc(t *testing.T, types []ir.Type, body func(args []*trace.Array) []*trace.Array) *ir.Func {
	t.Helper()
	s := &scanned{types: types, body: body}
	tr, err := s.Trace(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr.Func()
}

// streamedArgs finds the arguments read only as scans' xs; stateArgs the
// donated ones read only elementwise and returned at their place.
func TestHostCandidates(t *testing.T) {
	f32 := func(shape ...int) ir.Type { return ir.Type{DType: ir.Float32, Shape: shape, Space: ir.Device} }
	types := []ir.Type{f32(4, 8, 8), f32(4, 8, 8), f32(2, 8), f32(4, 8, 8), f32(4, 8, 8)}
	// 0: scanned only; 1: scanned and read whole; 2: the carry; 3: read
	// elementwise and returned at its place (state); 4: returned as it is.
	f := traceFunc(t, types, func(a []*trace.Array) []*trace.Array {
		y, _ := trace.Scan(func(c, x []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return []*trace.Array{trace.MatMul(trace.MatMul(c[0], x[0]), x[1])}, nil
		}, []*trace.Array{a[2]}, []*trace.Array{a[0], a[1]})
		s := trace.Add(trace.Sum(y[0]), trace.Sum(a[1]))
		return []*trace.Array{s, s, s, trace.Mul(a[3], a[3]), a[4]}
	})
	if got := streamedArgs(f, 5, nil); !slices.Equal(got, []int{0}) {
		t.Errorf("streamedArgs = %v, want [0]", got)
	}
	one := arrayDef()
	defs := []*trace.TreeDef{one, one, one, one, one}
	all := []bool{true, true, true, true, true}
	if got := stateArgs(f, defs, defs, all, nil); !slices.Equal(got, []int{3}) {
		t.Errorf("stateArgs = %v, want [3]", got)
	}
	if got := stateArgs(f, defs, defs, []bool{true, true, true, false, true}, nil); len(got) != 0 {
		t.Errorf("stateArgs without donation = %v, want none", got)
	}
	if got := streamedArgs(f, 5, []bool{true}); len(got) != 0 {
		t.Errorf("streamedArgs of a weak argument = %v, want none", got)
	}
}

// With copies on the cores that compute (Rates.Serial), an offloaded
// residual costs its transfers out and back in full; with copies beside
// the compute, what the scan's compute hides is free.
func TestEstimateSerialCopies(t *testing.T) {
	r := testseed.Rand(t, 2)
	iters := 2 + r.IntN(30)
	bytes := int64(1+r.IntN(1<<20)) * 4
	flops := float64(1 + r.IntN(1<<24))
	cands := map[candKey]*candInfo{
		{0, 0}: {bytes: bytes, iters: iters, dot: flops, elem: 1, device: true, needed: true},
		{0, 1}: {bytes: 4, iters: iters, elem: 1, device: true, needed: true},
	}
	dec := map[candKey]trace.RematAction{{0, 0}: trace.Offload}
	rates := testRates
	hidden := estimate(cands, dec, baseCost{}, rates)
	rates.Serial = true
	serial := estimate(cands, dec, baseCost{}, rates)
	want := 2 * float64(bytes) / rates.Bandwidth * float64(iters)
	if got := serial.step - serial.compute; math.Abs(got-want) > 1e-12*want {
		t.Errorf("serial copies: the offload adds %g s, want %g s (2 × %d bytes × %d iterations at %g B/s)", got, want, bytes, iters, rates.Bandwidth)
	}
	if got := serial.per[candKey{0, 0}]; math.Abs(got-want) > 1e-12*want {
		t.Errorf("serial copies: the offloaded value is priced %g s, want %g s", got, want)
	}
	fwd := (flops/rates.Flop + 2/rates.Elem) // the scan's forward compute per iteration
	one := float64(bytes) / rates.Bandwidth
	// Out in the forward pass, in during the backward one, each less what
	// the compute hides; the link is full duplex: the step pays the larger.
	wantHidden := math.Max(math.Max(0, one-fwd), math.Max(0, one-2*fwd)) * float64(iters)
	if got := hidden.step - hidden.compute; math.Abs(got-wantHidden) > 1e-9*want {
		t.Errorf("copies beside compute: the offload adds %g s, want %g s", got, wantHidden)
	}
}

// The host link is full duplex unless the copies share the cores: the
// step pays the larger of its copies to device and to host (the arguments'
// and a scan's offloads together), or their sum; the collectives run
// beside the arithmetic, or after it.
func TestEstimateDuplexLink(t *testing.T) {
	r := testseed.Rand(t, 5)
	iters := 1 + r.IntN(40)
	bytes := int64(1+r.IntN(1<<22)) * 4
	rates := Rates{Flop: 1e11 * (1 + r.Float64()), Elem: 2e9 * (1 + r.Float64()), Bandwidth: 5e9 * (1 + r.Float64()), Collective: 1e10}
	cands := map[candKey]*candInfo{
		{0, 0}: {bytes: bytes, iters: iters, elem: 1, device: true, needed: true}, // offloaded: its compute hides almost nothing
		{0, 1}: {bytes: 2 * bytes, iters: iters, elem: 1, fromHost: true, device: true, needed: true},
	}
	dec := map[candKey]trace.RematAction{{0, 0}: trace.Offload}
	base := baseCost{cost: passes.Cost{Flops: 1e9 * r.Float64(), DotFlops: 1e8 * r.Float64()}, collective: r.Float64() * 0.02,
		host: linkSecs{in: r.Float64() * 0.01, out: r.Float64() * 0.01}}
	base.cost.Flops += base.cost.DotFlops
	compute := base.cost.DotFlops/rates.Flop + (base.cost.Flops-base.cost.DotFlops)/rates.Elem
	fwd := 2 / rates.Elem // the scan's forward compute per iteration (one element each)
	one := float64(bytes) / rates.Bandwidth
	stream := 2 * one * float64(iters) // the pinned_host slice, copied in again
	out := math.Max(0, one-fwd) * float64(iters)
	in := math.Max(0, one-2*fwd) * float64(iters)
	for _, serial := range []bool{false, true} {
		rates.Serial = serial
		got := estimate(cands, dec, base, rates)
		want := math.Max(compute, base.collective) + math.Max(base.host.in+stream+in, base.host.out+out)
		if serial {
			want = compute + base.collective + base.host.in + stream + one*float64(iters) + base.host.out + one*float64(iters)
		}
		if math.Abs(got.step-want) > 1e-9*want || math.Abs(got.compute-compute) > 1e-9*compute {
			t.Errorf("serial %v: step %g s (compute %g s), want %g s (compute %g s)", serial, got.step, got.compute, want, compute)
		}
	}
}

// Where placing one weight stack in pinned_host is enough, the plan places
// one, not both.
func TestPlanMovesTheFewestArguments(t *testing.T) {
	r := testseed.Rand(t, 3)
	f := scannedGrad(4+r.IntN(5), 8*(1+r.IntN(4)), 32, 32) // two stacks of the same size
	s := &search{f: f, name: "scanned", budget: 1, rates: testRates}
	none, err := s.minimum(nil, linkSecs{})
	if err != nil {
		t.Fatal(err)
	}
	one, err := s.minimum([]bool{true, false, false}, linkSecs{})
	if err != nil {
		t.Fatal(err)
	}
	if one.full.total >= none.full.total {
		t.Skipf("a stack in pinned_host reaches %d bytes, no lower than %d with both on device", one.full.total, none.full.total)
	}
	budget := one.full.total
	tr, p, err := Plan(f, "scanned", budget, testRates)
	if err != nil {
		t.Fatalf("budget %d (the smallest plan with one stack in pinned_host): %v", budget, err)
	}
	checkPlan(t, tr, p, budget, p.BaselineBytes)
	if h := p.HostArguments(); len(h) != 1 {
		t.Errorf("budget %d: the plan places arguments %v in pinned_host, want one stack\n%v", budget, h, p)
	}
}

// A plan's estimate counts a recomputation once: its trace's arithmetic
// holds the recomputed ops, which the estimate prices on their own.
func TestEstimateCountsRecomputationOnce(t *testing.T) {
	r := testseed.Rand(t, 5)
	f := scannedGrad(2+r.IntN(4), 16*(1+r.IntN(3)), 32, 64*(1+r.IntN(3)))
	s := &search{f: f, name: "scanned", rates: testRates}
	p := &plan{search: s, dec: map[candKey]trace.RematAction{}}
	base, err := p.try(nil)
	if err != nil {
		t.Fatal(err)
	}
	dec := map[candKey]trace.RematAction{}
	added := 0.0
	for k, ci := range base.pt.cands {
		if ci.needed && ci.canRecompute() {
			dec[k] = trace.Recompute
			added += (ci.dot/testRates.Flop + ci.elem/testRates.Elem) * float64(ci.iters)
		}
	}
	if len(dec) == 0 {
		t.Fatal("nothing to recompute")
	}
	all, err := p.try(dec)
	if err != nil {
		t.Fatal(err)
	}
	if got := all.cost.step - base.cost.step; math.Abs(got-added) > 1e-9*added {
		t.Errorf("recomputing %d values adds %g s to the estimate, want %g s (their arithmetic once)", len(dec), got, added)
	}
}

// A layer's weights stored transposed: the body's transpose of its slice of
// the stack is a residual the backward pass reads, which the plan takes
// again from the stack (at no arithmetic) and never offloads, even where
// copies cost next to nothing and arithmetic is dear.
func TestPlanRereadsSlicesOfArguments(t *testing.T) {
	r := testseed.Rand(t, 6)
	n, m, a, b := 3+r.IntN(4), 8*(1+r.IntN(3)), 16*(1+r.IntN(3)), 32*(1+r.IntN(2))
	f := scannedGrad(n, m, a, b)
	f32 := func(shape ...int) ir.Type { return ir.Type{DType: ir.Float32, Shape: shape, Space: ir.Device} }
	f.types[0] = f32(n, b, a) // W1 stacked transposed
	f.body = func(args []*trace.Array) []*trace.Array {
		g := trace.Grad(func(w layers) *trace.Array {
			y, _ := trace.ScanTree(func(x *trace.Array, w layers) (*trace.Array, struct{}) {
				return trace.MatMul(trace.Tanh(trace.MatMul(x, trace.Transpose(w.W1, 1, 0))), w.W2), struct{}{}
			}, args[2], w)
			return trace.Sum(y)
		})(layers{args[0], args[1]})
		return []*trace.Array{g.W1, g.W2}
	}
	rates := Rates{Flop: 1e9, Elem: 1e6, Bandwidth: 1e15}
	_, _, err := Plan(f, "transposed", 1, rates)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("a budget of 1 byte: %v, want an *Error", err)
	}
	for _, budget := range []int64{e.Minimum, e.Minimum + r.Int64N(e.Baseline-e.Minimum+1)} {
		_, p, err := Plan(f, "transposed", budget, rates)
		if err != nil {
			t.Fatalf("budget %d: %v", budget, err)
		}
		seen := false
		for _, v := range p.Values {
			if v.Op != "transpose" {
				continue
			}
			seen = true
			if v.Action == "offload" || v.Action == "recompute" && (v.Seconds != 0 || v.Flops != 0) {
				t.Errorf("budget %d: the transposed slice %s is planned %q at %g s, %g FLOPs; want it kept or taken again for free", budget, v.Type, v.Action, v.Seconds, v.Flops)
			}
			if budget == e.Minimum && v.Action != "recompute" {
				t.Errorf("smallest plan: the transposed slice %s is planned %q, want recompute", v.Type, v.Action)
			}
		}
		if !seen {
			t.Fatalf("budget %d: no transpose among the residuals:\n%s", budget, p)
		}
	}
}
