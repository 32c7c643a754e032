package trace_test

import (
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/testkit/testseed"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/trace"
)

// detStep is a training step that goes through most transformations:
// per-example gradients (Vmap of Grad) of a scan over layers, each layer a
// checkpointed call with names and a cond, and ValueAndGrad of the batch
// loss.
func detStep(policy trace.CheckpointPolicy, params []*trace.Array) []*trace.Array {
	layer := trace.Checkpoint(func(a []*trace.Array) []*trace.Array {
		h, w, b := a[0], a[1], a[2]
		z := trace.CheckpointName(trace.Add(trace.MatMul(h, w), b), "z")
		act := trace.CheckpointName(trace.Tanh(z), "a")
		y := trace.Cond(trace.Greater(trace.Sum(act), trace.FullLike(trace.Sum(act), 0)),
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Mul(o[0], o[1])} },
			func(o []*trace.Array) []*trace.Array { return []*trace.Array{trace.Sub(o[0], o[1])} },
			act, h)[0]
		return []*trace.Array{trace.Add(trace.Sin(y), trace.MatMul(act, trace.Transpose(w, 1, 0)))}
	}, policy)
	loss := func(p []*trace.Array) *trace.Array {
		x, w, b := p[0], p[1], p[2]
		carry, _ := trace.Scan(func(c, xs []*trace.Array) ([]*trace.Array, []*trace.Array) {
			return layer(c[0], xs[0], xs[1]), nil
		}, []*trace.Array{x}, []*trace.Array{w, b})
		return trace.Sum(trace.Mul(carry[0], carry[0]))
	}
	x, w, b := params[0], params[1], params[2]
	perExample := trace.Vmap(func(row *trace.Array) []*trace.Array {
		return trace.Grad(loss)([]*trace.Array{row, w, b})
	})(x)
	val, grads := trace.ValueAndGrad(func(p []*trace.Array) *trace.Array {
		return trace.Sum(trace.Vmap(func(row *trace.Array) *trace.Array {
			return loss([]*trace.Array{row, p[1], p[2]})
		})(p[0]))
	})(params)
	return append(append([]*trace.Array{val}, grads...), perExample...)
}

// detTrace traces detStep on x [n,d], W [l,d,d], b [l,d] and returns the
// function's text.
func detTrace(t *testing.T, policy trace.CheckpointPolicy, n, d, l int) string {
	t.Helper()
	tr := trace.NewFuncTracer("step")
	params := []*trace.Array{
		tr.Param(ir.TypeOf(ir.Float32, n, d)),
		tr.Param(ir.TypeOf(ir.Float32, l, d, d)),
		tr.Param(ir.TypeOf(ir.Float32, l, d)),
	}
	tr.Push()
	outs := detStep(policy, params)
	var results []*ir.Value
	for _, o := range outs {
		results = append(results, tr.Output(o))
	}
	tr.Pop()
	tr.Close()
	f := tr.Func()
	f.Body.Results = results
	if err := ir.Verify(f); err != nil {
		t.Fatal(err)
	}
	return f.String()
}

// The same function traces to the same IR every time, whatever the order
// Go's maps iterate in (randomised on every range over a map, so any order
// of ops, operands, captures or results one decides differs between
// traces).
func TestTraceDeterministic(t *testing.T) {
	rng := testseed.Rand(t, 0xde7e)
	policies := []struct {
		name string
		p    trace.CheckpointPolicy
	}{
		{"everything_saveable", trace.EverythingSaveable},
		{"nothing_saveable", trace.NothingSaveable},
		{"dots_saveable", trace.DotsSaveable},
		{"save_only_these_names(z,a)", trace.SaveOnlyTheseNames("z", "a")},
		{"save_and_offload_only_these_names([a],[z])", trace.SaveAndOffloadOnlyTheseNames([]string{"a"}, []string{"z"}, ir.Device, ir.PinnedHost)},
	}
	for _, pol := range policies {
		n, d, l := 1+rng.IntN(3), 1+rng.IntN(4), 1+rng.IntN(3)
		first := detTrace(t, pol.p, n, d, l)
		for k := 2; k <= 6; k++ {
			if got := detTrace(t, pol.p, n, d, l); got != first {
				a, b := strings.Split(first, "\n"), strings.Split(got, "\n")
				for i := range min(len(a), len(b)) {
					if a[i] != b[i] {
						t.Fatalf("%s, x [%d,%d], %d layers: trace %d differs from the first at line %d:\n  first: %s\n  now:   %s", pol.name, n, d, l, k, i+1, a[i], b[i])
					}
				}
				t.Fatalf("%s: trace %d differs from the first in length (%d against %d lines)", pol.name, k, len(b), len(a))
			}
		}
	}
}
