package budget

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/ferryml/ferry/backend"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// Error says that no plan fits a memory budget: Minimum is the
// smallest device total the planner reached (every residual it could
// recompute or offload so), and Dominant lists what fills it.
type Error struct {
	Function         string
	Budget, Baseline int64
	Minimum          int64
	Analysis         passes.MemoryAnalysis // at the minimum
	Dominant         []string              // the largest device buffers there, with op and location
	// Mesh is the mesh of a sharded function (nil: one device): then
	// Budget, Baseline, Minimum and Analysis are per device.
	Mesh *ir.Mesh
}

func (e *Error) Error() string {
	hint := ""
	if io := e.Analysis.ArgumentBytes + e.Analysis.OutputBytes - e.Analysis.AliasBytes; 2*io > e.Minimum && e.Mesh != nil {
		hint = fmt.Sprintf("; arguments and results are %s of it, and the planner leaves a sharded function's arguments where the caller put them: split them over more devices, or donate them", fmtBytes(io))
	} else if 2*io > e.Minimum {
		hint = fmt.Sprintf("; arguments and results are %s of it, and the planner moves to pinned_host only stacked layer weights (arguments read only as scans' xs) and optimizer state (donated arguments read elementwise and returned updated at the same position): other arguments can live there by hand (rt.DevicePut, optim.InitIn, rt.OutSpace)", fmtBytes(io))
	}
	per := ""
	if e.Mesh != nil {
		per = fmt.Sprintf(" per device (the program is partitioned over %v, %d devices)", e.Mesh, len(e.Mesh.Devices()))
	}
	return fmt.Sprintf("rt.Jit: %s: no plan fits the memory budget of %s%s: the smallest budget that fits is %s, with every residual it plans recomputed or offloaded (%s with everything kept); at that plan the device total is argument %s + output %s + temp %s − alias %s; largest device buffers: %s%s",
		e.Function, exactBytes(e.Budget), per, exactBytes(e.Minimum), exactBytes(e.Baseline),
		fmtBytes(e.Analysis.ArgumentBytes), fmtBytes(e.Analysis.OutputBytes), fmtBytes(e.Analysis.TempBytes), fmtBytes(e.Analysis.AliasBytes), strings.Join(e.Dominant, "; "), hint)
}

// fmtBytes prints a byte count in the unit that fits it ("512 B", "48.1 MiB").
func fmtBytes(n int64) string { return backend.FormatBytes(n) }

// exactBytes is fmtBytes followed by the exact count where fmtBytes rounds
// it: "512 B", "4.5 KiB (4608 bytes)".
func exactBytes(n int64) string {
	if n > -1024 && n < 1024 {
		return fmtBytes(n)
	}
	return fmt.Sprintf("%s (%d bytes)", fmtBytes(n), n)
}

// newError builds the error of function name (partitioned over mesh, or
// nil) for a budget below the minimum plan t.
func newError(name string, budget, baseline int64, t *planTry, mesh *ir.Mesh) error {
	e := &Error{Function: name, Budget: budget, Baseline: baseline, Minimum: t.total, Analysis: t.prog.Analysis, Mesh: mesh}
	type buf struct {
		size int64
		what string
	}
	var bufs []buf
	seen := map[*ir.Value]bool{}
	var walk func(rp *passes.RegionPlan, top bool)
	walk = func(rp *passes.RegionPlan, top bool) {
		if rp == nil {
			return
		}
		for v, b := range rp.Values {
			// Nested regions' parameters are views of buffers counted
			// where they live.
			if b.Space != ir.Device || seen[v] || b.Kind == passes.BufSlice || !top && b.Kind == passes.BufParam {
				continue
			}
			seen[v] = true
			what := fmt.Sprintf("%s %v", b.Kind, v.Type)
			if v.Op != nil {
				what += " from " + v.Op.Code.String()
				if v.Op.Loc != "" {
					what += " at " + v.Op.Loc
				}
			} else if b.Kind == passes.BufParam {
				what += fmt.Sprintf(" (argument %d)", b.Index)
			}
			bufs = append(bufs, buf{b.Size, what})
		}
		for _, subs := range rp.Sub {
			for _, s := range subs {
				walk(s, false)
			}
		}
	}
	walk(t.prog.Plan, true)
	slices.SortFunc(bufs, func(a, b buf) int {
		return cmp.Or(cmp.Compare(b.size, a.size), strings.Compare(a.what, b.what))
	})
	for i, b := range bufs {
		if i == 5 {
			break
		}
		e.Dominant = append(e.Dominant, fmt.Sprintf("%s %s", fmtBytes(b.size), b.what))
	}
	return e
}
