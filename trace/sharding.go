package trace

import (
	"github.com/ferryml/ferry/ir"
)

// ShardingPlacer is implemented by an eager Executor that can lay a concrete
// array out over a mesh (the runtime's, through rt.DevicePut):
// WithShardingConstraint on a concrete array calls it.
type ShardingPlacer interface {
	// PutSharded returns x laid out with sharding s.
	PutSharded(x *Array, s *ir.NamedSharding) (*Array, error)
}

// WithShardingConstraint returns x with sharding s
// (jax.lax.with_sharding_constraint). While tracing, it records a
// sharding_constraint op: sharding propagation starts from it, as from the
// shardings of a jitted function's arguments and results, and the
// partitioner lays x out as s there (resharding it when the computation
// gave it another layout). On a concrete array it is rt.DevicePut(x, s).
//
// s must fit x: every mesh axis it names must divide the dimensions it
// splits; otherwise it panics with *Error at the caller's line. Under Vmap,
// the batch dimension is left unsplit. Its cotangent under Grad is
// constrained to s too.
func WithShardingConstraint(x *Array, s *ir.NamedSharding) *Array {
	const op = "WithShardingConstraint"
	checkLive(op, x)
	if s == nil {
		panic(Errorf(op, "nil sharding"))
	}
	if err := s.Validate(x.Shape()); err != nil {
		panic(Errorf(op, "cannot shard %v: %v", x.Type().WithSharding(nil), err))
	}
	return constrain(x, s)
}

// constrain records the sharding_constraint op of WithShardingConstraint,
// or, on a concrete array outside any trace (WithShardingConstraint, or its
// batching and VJP rules run eagerly), lays it out as s with the executor's
// PutSharded. A concrete array's type must be its buffer's: an unsharded
// buffer typed as sharded would run through eager ops compiled for other
// types.
func constrain(x *Array, s *ir.NamedSharding) *Array {
	const op = "WithShardingConstraint"
	if !x.IsTraced() && current() == nil {
		p, ok := exec(op).(ShardingPlacer)
		if !ok {
			panic(Errorf(op, "the registered executor cannot place arrays on a mesh"))
		}
		y, err := p.PutSharded(x, s)
		if err != nil {
			panic(WrapError(op, err))
		}
		return y
	}
	y := Apply1(ir.ShardingConstraint, ir.Attrs{"sharding": s.String()}, x)
	y.typ = y.typ.WithSharding(s)
	if y.val != nil {
		y.val.Type = y.typ
	}
	return y
}

// vjpShardingConstraint constrains the cotangent to the primal's sharding,
// as JAX's transpose rule of sharding_constraint does.
func vjpShardingConstraint(c *vjpCall) []*Array {
	s, err := ir.ConstraintSharding(c.op)
	if err != nil {
		panic(Errorf("WithShardingConstraint", "%v", err))
	}
	return []*Array{constrain(c.ct, s)}
}

// batchShardingConstraint constrains a batched operand with the batch
// dimension unsplit (jax.vmap without spmd_axis_name).
func batchShardingConstraint(c *batchCall) ([]*Array, []int) {
	s, err := ir.ConstraintSharding(c.op)
	if err != nil {
		panic(Errorf("WithShardingConstraint", "%v", err))
	}
	d := c.dims[0]
	if d < 0 {
		return []*Array{constrain(c.args[0], s)}, []int{-1}
	}
	spec := make(ir.PartitionSpec, 0, len(s.Spec)+1)
	spec = append(spec, s.Spec[:min(d, len(s.Spec))]...)
	for len(spec) < d {
		spec = append(spec, nil)
	}
	spec = append(spec, nil)
	if d < len(s.Spec) {
		spec = append(spec, s.Spec[d:]...)
	}
	bs, err := ir.NewNamedSharding(s.Mesh, spec)
	if err != nil {
		panic(Errorf("WithShardingConstraint", "batched constraint: %v", err))
	}
	return []*Array{constrain(c.args[0], bs)}, []int{d}
}
