package passes

import (
	"testing"

	"github.com/ferryml/ferry/ir"
)

// TestLoneKernelOps is the meta-test of single-op steps: every op of the
// table that lowers to a plain op step either is described as a kernel of
// one group (LowerOp: elementwise, reduction, view, iota, dot_general, an
// index rule) or is listed here with the reason backends run it by other
// means. A new op lacking both fails, named.
func TestLoneKernelOps(t *testing.T) {
	other := map[ir.Code]string{
		ir.Constant:            "a literal the backend uploads",
		ir.Sort:                "a sort: the backend's own kernel",
		ir.ScatterAdd:          "atomic adds: the backend's own kernel",
		ir.DevicePut:           "a copy (within one space, a plain copy)",
		ir.CheckpointName:      "an identity the compiler removes",
		ir.OptimizationBarrier: "an identity of several operands: a copy",
		ir.ShardingConstraint:  "an identity the partitioner removes",
	}
	for _, c := range ir.AllCodes() {
		if StepKindOf(c) != StepOp && c != ir.DevicePut && c != ir.DotGeneral {
			continue
		}
		why, listed := other[c]
		switch {
		case loneKernelOp(c) && listed:
			t.Errorf("%v is described as a kernel, but listed as run by other means: %s", c, why)
		case !loneKernelOp(c) && !listed:
			t.Errorf("%v is a plain op step the plan does not describe as a kernel: give it an index rule (ir.IndexRuleOf) or a view rule, or list why backends run it by other means", c)
		}
	}
}
