package budget

import (
	"errors"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// inputStack is the gradient of a stack of n scanned tanh MLP layers
// (width a, hidden width b) over the rows of tanh(e)·out, where e is an m×h
// input (embeddings, say) and out an h×a projection: tanh(e) is a residual
// of the top level, read before the forward scan and again after the
// backward scan.
func inputStack(n, m, a, b, h int) *scanned { return inputStackAct(n, m, a, b, h, trace.Tanh) }

// inputStackAct is inputStack with act in place of the input's tanh.
func inputStackAct(n, m, a, b, h int, act func(*trace.Array) *trace.Array) *scanned {
	f32 := func(shape ...int) ir.Type { return ir.Type{DType: ir.Float32, Shape: shape, Space: ir.Device} }
	one := arrayDef()
	s := &scanned{
		types: []ir.Type{f32(n, a, b), f32(n, b, a), f32(m, h), f32(h, a)},
		defs:  []*trace.TreeDef{one, one, one, one},
		act:   trace.Tanh,
	}
	type params struct {
		L      layers
		E, Out *trace.Array
	}
	s.body = func(args []*trace.Array) []*trace.Array {
		g := trace.Grad(func(w params) *trace.Array {
			u := act(w.E)
			y, _ := trace.ScanTree(func(x *trace.Array, w layers) (*trace.Array, struct{}) {
				return trace.MatMul(s.act(trace.MatMul(x, w.W1)), w.W2), struct{}{}
			}, trace.MatMul(u, w.Out), w.L)
			return trace.Sum(y)
		})(params{layers{args[0], args[1]}, args[2], args[3]})
		return []*trace.Array{g.L.W1, g.L.W2, g.E, g.Out}
	}
	return s
}

// The top level's residual is planned with the scans': a budget below the
// smallest plan that keeps it fits, and the plan says what it did with it.
func TestPlanTopLevelResiduals(t *testing.T) {
	r := testseed.Rand(t, 4)
	f := inputStack(3+r.IntN(3), 32*(1+r.IntN(2)), 16, 32, 512*(1+r.IntN(2)))
	minimum := func() int64 {
		_, _, err := Plan(f, "inputStack", 1, testRates)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("a budget of 1 byte: %v, want an *Error", err)
		}
		return e.Minimum
	}
	withTop := minimum()
	planTopLevel = false
	withoutTop := minimum()
	planTopLevel = true
	if withTop >= withoutTop {
		t.Fatalf("the smallest plan is %d bytes with the top level planned, %d without", withTop, withoutTop)
	}
	// At the minimum, and halfway to the smallest plan that keeps it: with
	// slow copies and fast arithmetic the planner recomputes it there.
	mid := (withTop + withoutTop) / 2
	for _, c := range []struct {
		budget int64
		rates  Rates
		want   string
	}{
		{withTop, testRates, ""},
		{withTop, Rates{Flop: 1e9, Elem: 1e8, Bandwidth: 1e12}, ""},
		{mid, Rates{Flop: 1e9, Elem: 1e8, Bandwidth: 1e12}, "offload"},
		{mid, Rates{Flop: 1e13, Elem: 1e12, Bandwidth: 1e8, Serial: true}, "recompute"},
	} {
		tr, p, err := Plan(f, "inputStack", c.budget, c.rates)
		if err != nil {
			t.Fatalf("budget %d: %v", c.budget, err)
		}
		checkPlan(t, tr, p, c.budget, p.BaselineBytes)
		action := ""
		for _, v := range p.Values {
			if v.Op == "tanh" && v.Iterations == 1 {
				action = v.Action
			}
		}
		if c.want == "" && action != "offload" && action != "recompute" || c.want != "" && action != c.want {
			t.Errorf("budget %d, rates %+v: the top level's tanh is planned %q, want %q (or offload or recompute):\n%v", c.budget, c.rates, action, c.want, p)
		}
	}
}

// A user's checkpoint at the top level wins: its values are not planned
// there.
func TestPlanTopLevelUserAnnotations(t *testing.T) {
	for name, act := range map[string]func(*trace.Array) *trace.Array{
		"checkpoint": func(x *trace.Array) *trace.Array {
			return trace.Checkpoint(func(a []*trace.Array) []*trace.Array { return []*trace.Array{trace.Tanh(a[0])} }, trace.EverythingSaveable)(x)[0]
		},
	} {
		tr, err := inputStackAct(3, 32, 16, 32, 512, act).Trace(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range topCands(tr.Func()) {
			if c.v.Type.Size() == 32*512 {
				t.Errorf("%s: the top level's %s %v is a candidate", name, c.v.Op.Code, c.v.Type)
			}
		}
	}
	// Without them it is one.
	tr, err := inputStack(3, 32, 16, 32, 512).Trace(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range topCands(tr.Func()) {
		found = found || c.v.Op.Code == ir.Tanh && c.seg != nil
	}
	if !found {
		t.Error("tanh(e) is not a recomputable candidate of the top level")
	}
}
