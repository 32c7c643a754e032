package eval

import "github.com/ferryml/ferry/ir"

// identityOp runs checkpoint_name, optimization_barrier and
// sharding_constraint: every result is a
// copy of the operand at the same position. (The compiler removes them before
// execution; a program compiled with those passes disabled runs them as copies.)
func identityOp(x, outs []*ir.Literal) {
	for i, o := range outs {
		copy(o.Data, x[i].Data)
	}
}

// isIdentityOp reports whether code is one of the identity ops of identityOp.
func isIdentityOp(code ir.Code) bool {
	return code == ir.CheckpointName || code == ir.OptimizationBarrier || code == ir.ShardingConstraint
}
