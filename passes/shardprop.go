package passes

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// ShardingAnalysis is what sharding propagation finds: a sharding for every
// value of a function, and which values are partial reductions. The
// partitioner reads it to decide the communication each op needs.
type ShardingAnalysis struct {
	// Mesh is the one mesh of the function's shardings; nil when no value is
	// sharded, in which case Shardings is empty.
	Mesh *ir.Mesh
	// Shardings holds the sharding of every value, in every region.
	Shardings map[*ir.Value]*ir.NamedSharding
	// Partial holds the results that their op leaves as partial reductions
	// over mesh axes (a reduction over a split dimension, a dot_general
	// contracting dimensions split on both sides): the partitioner combines
	// each with an all-reduce of Reduction over Axes right after its op
	// (a reduce-scatter where the value's sharding splits a dimension over
	// those axes); its sharding in Shardings is the layout after that.
	Partial map[*ir.Value]ir.PartialReduction
	// Operands holds, for every op, the layouts its rule wants its operands
	// in, given the final shardings (an entry per operand; the operand's own
	// sharding where the rule proposes none). Where an entry differs from the
	// operand's sharding, the partitioner reshards the operand for this op;
	// each device then computes from its blocks of the operands alone a
	// block of the result (of the partial result, for a Partial one): in
	// the result's sharding, except where an annotation or constraint split
	// the result in a way the op cannot compute (a padded dimension, say),
	// where the op gives the layout its rule asked again gives, and the
	// partitioner reshards the result into its sharding.
	Operands map[*ir.Op][]*ir.NamedSharding
}

// PropagateShardings gives every value of f a sharding, written into its
// type (ir.Type.WithSharding), as GSPMD's sharding propagation does. It is an
// analysis for the partitioner and not part of Pipeline: a function with no
// sharded value is left unchanged. See AnalyzeShardings for the rules.
func PropagateShardings(f *ir.Func) error {
	a, err := AnalyzeShardings(f)
	if err != nil {
		return err
	}
	for v, s := range a.Shardings {
		v.Type = v.Type.WithSharding(s)
	}
	return nil
}

// AnalyzeShardings computes the shardings PropagateShardings writes, without
// changing f.
//
// f must verify (ir.Verify). Propagation starts from the shardings already
// on value types (the function's parameters and results, and any annotated
// value), which must all use one mesh (else the error names two values on
// different meshes) and fit their shapes. It then sweeps the body in op
// order and in reverse op order, asking every op's rule (ir.OpInfo.Shard)
// for proposals for its operands and results given the shardings known so
// far, until a pair of sweeps adds nothing. A value keeps the first sharding
// it gets, which fixes the priorities: annotations first; then, in op order,
// what the first op able to say anything proposes — for an op's result its
// operands' layout (the defining op comes before the users), for a value
// several users disagree on the earliest user's. The one exception is
// GSPMD's preference for the more specific sharding: a later proposal that
// splits an unannotated value further while keeping its splits (refines)
// replaces its sharding, provided the value's defining op, asked again,
// gives that layout (a broadcast of a replicated scalar first proposed
// whole takes the split its users want; a sort result is not split along
// its sorted dimension). Within one op the rule settles conflicting
// operands (the elementwise rule takes the sharding most operands share,
// ties going to the one splitting into more blocks, then to the first
// operand); the operands that then disagree with the op are the
// partitioner's to reshard. The axes of a proposed dimension that they do
// not divide are dropped.
//
// Scan bodies: before the scan's rule runs in a forward sweep, the body's
// parameters take the shardings of the scan's operands (consts and carry
// alike, xs without their leading dimension) and the body is solved the same
// way; the scan's carry results share the carry operands' shardings, and its
// stacked results take the body results' shardings behind a whole leading
// dimension. Nothing flows from a body back out to the scan's operands. The
// regions of while, cond and fusion are not entered: their values become
// replicated.
//
// Values that nothing reaches become replicated on the mesh.
func AnalyzeShardings(f *ir.Func) (*ShardingAnalysis, error) {
	if err := ir.Verify(f); err != nil { // the rules read attributes the verifier checks
		return nil, fmt.Errorf("sharding propagation: %w", err)
	}
	a := &ShardingAnalysis{Shardings: map[*ir.Value]*ir.NamedSharding{}, Partial: map[*ir.Value]ir.PartialReduction{},
		Operands: map[*ir.Op][]*ir.NamedSharding{}}
	var first *ir.Value
	var err error
	forEachValue(f.Body, func(v *ir.Value) {
		s := v.Type.Sharding
		if s == nil || err != nil {
			return
		}
		if e := s.Validate(v.Type.Shape); e != nil {
			err = fmt.Errorf("sharding propagation: %v %v: %w", v, v.Type, e)
			return
		}
		if first == nil {
			first, a.Mesh = v, s.Mesh
		} else if !s.Mesh.Equal(a.Mesh) {
			err = fmt.Errorf("sharding propagation: %v is on %v but %v is on %v; a function may use one mesh", first, a.Mesh, v, s.Mesh)
			return
		}
		a.Shardings[v] = s
	})
	if err != nil || a.Mesh == nil {
		return a, err
	}
	p := &propagator{a: a, fixed: map[*ir.Value]bool{}}
	for v := range a.Shardings {
		p.fixed[v] = true
	}
	// Broadcasts propose their results from their operands only once
	// nothing else says how to split them: a broadcast's users know best
	// (its operand, smaller, is then the one resharded).
	p.defer_ = true
	p.solve(f.Body)
	p.defer_ = false
	p.solve(f.Body)
	forEachValue(f.Body, func(v *ir.Value) {
		if a.Shardings[v] == nil {
			a.Shardings[v] = ir.Replicated(a.Mesh, v.Type.Rank())
		}
	})
	f.Body.Walk(func(op *ir.Op) {
		prop := op.Info().Shard(op, p.get(op.Args), p.get(op.Results))
		for i, pr := range prop.Partial {
			if i < len(op.Results) && len(pr.Axes) > 0 {
				a.Partial[op.Results[i]] = pr
			}
		}
		want := p.get(op.Args)
		for i, s := range prop.Args {
			if i < len(want) && s != nil && s.Mesh.Equal(a.Mesh) {
				want[i] = fit(s, op.Args[i].Type.Shape)
			}
		}
		a.Operands[op] = want
	})
	return a, nil
}

type propagator struct {
	a      *ShardingAnalysis
	fixed  map[*ir.Value]bool // annotated values
	defer_ bool               // broadcasts do not propose their results yet
}

func (p *propagator) get(vs []*ir.Value) []*ir.NamedSharding {
	out := make([]*ir.NamedSharding, len(vs))
	for i, v := range vs {
		out[i] = p.a.Shardings[v]
	}
	return out
}

// set gives v the sharding s (fitted to v's shape) unless v has one, or
// refines v's sharding to s where s splits further (refines); it reports
// whether v changed. Annotated values never change.
func (p *propagator) set(v *ir.Value, s *ir.NamedSharding) bool {
	if s == nil || !s.Mesh.Equal(p.a.Mesh) || p.fixed[v] {
		return false
	}
	s = fit(s, v.Type.Shape)
	if cur := p.a.Shardings[v]; cur != nil && (!refines(s, cur) || !p.produces(v, s)) {
		return false
	}
	p.a.Shardings[v] = s
	return true
}

// produces reports whether v's defining op, asked with v laid out as s,
// gives v that layout (its rule proposes s for it): only then is a refined
// sharding of an op result one the op computes locally. Region parameters
// take any layout (their operands are resharded to it).
func (p *propagator) produces(v *ir.Value, s *ir.NamedSharding) bool {
	op := v.Op
	if op == nil {
		return true
	}
	res := p.get(op.Results)
	res[v.Index] = s
	prop := op.Info().Shard(op, p.get(op.Args), res)
	if v.Index >= len(prop.Results) || prop.Results[v.Index] == nil {
		return false
	}
	return fit(prop.Results[v.Index], v.Type.Shape).EquivalentTo(s, v.Type.Rank())
}

// refines reports whether s splits an array into more blocks than cur and
// keeps every split of cur: each dimension's axes in cur are a prefix of
// its axes in s. Propagation refines a value's sharding so, as GSPMD
// prefers the more specific of two proposals: a broadcast of a replicated
// scalar, say, first proposed whole, takes the split its users need.
func refines(s, cur *ir.NamedSharding) bool {
	if s.NumShards() <= cur.NumShards() {
		return false
	}
	for d, axes := range cur.Spec {
		if len(axes) == 0 {
			continue
		}
		if d >= len(s.Spec) || len(s.Spec[d]) < len(axes) {
			return false
		}
		for i, a := range axes {
			if s.Spec[d][i] != a {
				return false
			}
		}
	}
	return true
}

// fit drops the axes of s that do not divide their dimension of shape, and
// spec entries past its rank.
func fit(s *ir.NamedSharding, shape ir.Shape) *ir.NamedSharding {
	spec := make(ir.PartitionSpec, len(shape))
	for d := range spec {
		if d < len(s.Spec) && len(s.Spec[d]) > 0 {
			n := 1
			for _, a := range s.Spec[d] {
				n *= s.Mesh.AxisSize(a)
			}
			if shape[d]%n == 0 {
				spec[d] = append([]string{}, s.Spec[d]...)
			}
		}
	}
	return &ir.NamedSharding{Mesh: s.Mesh, Spec: spec}
}

// solve sweeps r forward and backward until nothing changes; it reports
// whether anything did.
func (p *propagator) solve(r *ir.Region) bool {
	anyChange := false
	for {
		changed := false
		for _, op := range r.Ops {
			changed = p.visit(op, true) || changed
		}
		for i := len(r.Ops) - 1; i >= 0; i-- {
			changed = p.visit(r.Ops[i], false) || changed
		}
		if !changed {
			return anyChange
		}
		anyChange = true
	}
}

// visit applies op's rule; forward also enters a scan body first.
func (p *propagator) visit(op *ir.Op, forward bool) bool {
	changed := false
	if forward && op.Code == ir.Scan {
		changed = p.scanBody(op)
	}
	prop := op.Info().Shard(op, p.get(op.Args), p.get(op.Results))
	for i, s := range prop.Results {
		if i < len(op.Results) && !(p.defer_ && op.Code == ir.BroadcastInDim) {
			changed = p.set(op.Results[i], s) || changed
		}
	}
	for i, s := range prop.Args {
		if i < len(op.Args) {
			changed = p.set(op.Args[i], s) || changed
		}
	}
	return changed
}

// scanBody carries the scan operands' shardings into its body, solves the
// body, and gives the stacked results the body results' shardings.
func (p *propagator) scanBody(op *ir.Op) bool {
	body := op.Regions[0]
	nc, nk := op.Attrs.Int("num_consts"), op.Attrs.Int("num_carry")
	changed := false
	for i, v := range body.Params {
		if i >= len(op.Args) {
			break
		}
		s := p.a.Shardings[op.Args[i]]
		if s != nil && i >= nc+nk {
			var spec ir.PartitionSpec
			if len(s.Spec) > 1 {
				spec = s.Spec[1:]
			}
			s = &ir.NamedSharding{Mesh: s.Mesh, Spec: spec}
		}
		changed = p.set(v, s) || changed
	}
	changed = p.solve(body) || changed
	for j := nk; j < len(body.Results) && j < len(op.Results); j++ {
		if s := p.a.Shardings[body.Results[j]]; s != nil {
			spec := append(ir.PartitionSpec{nil}, s.Spec...)
			changed = p.set(op.Results[j], &ir.NamedSharding{Mesh: s.Mesh, Spec: spec}) || changed
		}
	}
	return changed
}

// forEachValue calls fn on every parameter and op result of r and its nested
// regions.
func forEachValue(r *ir.Region, fn func(*ir.Value)) {
	for _, v := range r.Params {
		fn(v)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			fn(v)
		}
		for _, sub := range op.Regions {
			forEachValue(sub, fn)
		}
	}
}
