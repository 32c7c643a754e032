package main

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// BudgetFraction, when positive (-budget), trains each sharded run under
// rt.MemoryBudget of that fraction of the unconstrained step's per-device
// total: a budget per device, which the memory budget's planner meets by
// planning the per-device program.
var BudgetFraction float64

// withBudget returns opts with the memory budget of BudgetFraction of the
// per-device total of tr's step compiled with opts, and that budget and
// total (none when BudgetFraction is not positive).
func withBudget[P, S any](tr trainer[P, S], opts []rt.Option) (out []rt.Option, budget, unconstrained int64, err error) {
	if BudgetFraction <= 0 {
		return opts, 0, 0, nil
	}
	if BudgetFraction > 1 {
		return nil, 0, 0, fmt.Errorf("-budget %g: want a fraction in (0, 1] of the unconstrained per-device total", BudgetFraction)
	}
	defer trace.Recover(&err)
	b0 := tr.batches[0]
	l, err := rt.NewJitted(tr.step, append(opts, rt.Donate(0, 1))...).Lower(tr.params, tr.state, b0[0], b0[1])
	if err != nil {
		return nil, 0, 0, err
	}
	c, err := l.Compile()
	if err != nil {
		return nil, 0, 0, err
	}
	unconstrained = c.MemoryAnalysis().TotalBytes()
	budget = int64(BudgetFraction * float64(unconstrained))
	return append(append([]rt.Option{}, opts...), rt.MemoryBudget(budget)), budget, unconstrained, nil
}

// layOut returns the batches laid out as shardings says (x, then y), so
// that a sharded step finds its inputs' blocks in place: the measured
// per-device peak is then the step's own.
func layOut(batches [][2]*trace.Array, shardings []*ir.NamedSharding) ([][2]*trace.Array, error) {
	out := make([][2]*trace.Array, len(batches))
	for i, b := range batches {
		for k := range b {
			a, err := rt.DevicePut(b[k], shardings[k])
			if err != nil {
				return nil, err
			}
			out[i][k] = a
		}
	}
	return out, nil
}
