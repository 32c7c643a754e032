package runtime

import (
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/ferryml/ferry/runtime/budget"
	"github.com/ferryml/ferry/trace"
)

// The memory budget's planner is package runtime/budget; this file gives it
// the jitted function to retrace and compile (budget.Function).

// MemoryBudgetError says that no plan fits a memory budget: Minimum is the
// smallest device total the planner reached (every residual it could
// recompute or offload so), and Dominant lists what fills it.
type MemoryBudgetError = budget.Error

// planFunc is a jitted function with its arguments, as the planner traces
// it.
type planFunc[F any] struct {
	j    *Jitted[F]
	args []any
	weak []bool // the argument leaves weakly typed
}

// plannedTrace is one of the planner's traces.
type plannedTrace struct {
	l       *Lowered
	outDefs []*trace.TreeDef
	weak    []bool
	exe     Executable // after Compile
}

// Trace traces the function for the planner (budget.Function).
func (f *planFunc[F]) Trace(p trace.RematPlanner, host []bool) (budget.Trace, error) {
	l, outDefs, err := f.j.lowerWith(f.args, p, host)
	if err != nil {
		return nil, err
	}
	return &plannedTrace{l: l, outDefs: outDefs, weak: f.weak}, nil
}

func (t *plannedTrace) Func() *ir.Func { return t.l.Func }

func (t *plannedTrace) Args() budget.Args {
	return budget.Args{Defs: t.l.argDefs, Results: t.outDefs, Weak: t.weak, Donated: t.l.donated, Name: t.l.leafName, Mesh: meshOf(t.l.Func)}
}

// meshOf returns the mesh of the first sharded value of f (nested regions
// included), or nil when nothing is sharded: a sharded function runs
// partitioned over it (compileFunc), so its memory budget is per device.
func meshOf(f *ir.Func) *ir.Mesh {
	var walk func(r *ir.Region) *ir.Mesh
	walk = func(r *ir.Region) *ir.Mesh {
		for _, v := range r.Params {
			if s := v.Type.Sharding; s != nil {
				return s.Mesh
			}
		}
		for _, op := range r.Ops {
			for _, v := range op.Results {
				if s := v.Type.Sharding; s != nil {
					return s.Mesh
				}
			}
			for _, sub := range op.Regions {
				if m := walk(sub); m != nil {
					return m
				}
			}
		}
		return nil
	}
	return walk(f.Body)
}

func (t *plannedTrace) Compile() (*passes.Program, error) {
	exe, err := compileFunc(DefaultBackend(), t.l.Func, CompileOptions{Donated: t.l.donated, NoDump: true})
	if err != nil {
		return nil, err
	}
	t.exe = exe
	return exe.Program(), nil
}

// lowerBudget traces and compiles the function under plans until it finds
// the fastest that fits bytes (budget.Plan), and returns its Lowered (with
// the plan).
func (j *Jitted[F]) lowerBudget(args []any, bytes int64) (*Lowered, []*trace.TreeDef, error) {
	leaves, _, _ := flattenArgs(args)
	weak := make([]bool, len(leaves))
	for i, l := range leaves {
		weak[i] = l != nil && l.IsWeak()
	}
	r := measuredRates()
	r.Serial = !copiesOverlap(DefaultBackend())
	if j.opts.rates != nil {
		r = *j.opts.rates
	}
	if o := j.opts.overlap; o != nil {
		r.Serial = !*o
	}
	if c := j.opts.collective; c != nil {
		r.Collective = *c
	}
	tr, plan, err := budget.Plan(&planFunc[F]{j: j, args: args, weak: weak}, j.opts.name, bytes, r)
	if err != nil {
		return nil, nil, err
	}
	best := tr.(*plannedTrace)
	best.l.plan = plan
	if !settings.DumpIR.IsSet() {
		// Nothing to dump: the try's executable is the one to run.
		best.exe.Program().Analysis.Plan = plan
		best.l.planned = best.exe
	}
	return best.l, best.outDefs, nil
}

// MemoryPlan returns what the memory budget decided (MemoryBudget), or nil
// for a function compiled without one.
func (c *Compiled) MemoryPlan() *passes.MemoryPlan { return c.MemoryAnalysis().Plan }
