package trace

import "github.com/ferryml/ferry/ir"

// Collectives over a named axis, as jax.lax.psum, all_gather, ppermute, ...
//
// A collective names the axis of a group of members: inside a Vmap with
// AxisName(name) the members are the examples of the mapped axis, and each
// collective is turned by its batching rule into ordinary ops over the batch
// (PSum under Vmap sums over the examples and gives every example the sum,
// as jax.vmap(f, axis_name=...) does). A ShardMap binds the axes of a device
// mesh, whose members are devices (as a nest of named Vmaps, one per mesh
// axis). A collective is an error (a panic
// with *Error naming the axis and the caller's line, JAX's "unbound axis
// name") where no enclosing Vmap or ShardMap binds its axis: eagerly outside
// any Vmap, or in an rt.Jit function that does not map it.
//
// Inside the function the value is the member's own: PSum(x, "i") is the sum
// of x over the members, the same value in each; AxisIndex("i") is the
// member's index.

// axisSize returns the size of the axis bound to name, or panics with an
// *Error for op when no Vmap binds it.
func axisSize(op, name string) int {
	if f := vmapFrames.lookup(name); f != nil {
		return f.size
	}
	panic(Errorf(op, "unbound axis name %q: no Vmap with AxisName(%q) nor ShardMap over a mesh with that axis encloses this call (collectives need their axis bound)", name, name))
}

// checkCollective panics when a collective op is emitted where its axis is
// bound nowhere (Apply's guard: Vmap's rules and VJP rules emit collectives
// through Apply too).
func checkCollective(code ir.Code, attrs ir.Attrs) {
	if !code.IsCollective() {
		return
	}
	name := attrs.String("axis")
	if f := vmapFrames.lookup(name); f == nil || f.size != attrs.Int("size") {
		if f != nil {
			panic(Errorf(code.String(), "axis %q has size %d here, but the op says %d", name, f.size, attrs.Int("size")))
		}
		panic(Errorf(code.String(), "unbound axis name %q: no Vmap with AxisName(%q) nor ShardMap over a mesh with that axis encloses this call (collectives need their axis bound)", name, name))
	}
}

// collective emits op code over the axis name on x with more attributes.
func collective(api string, code ir.Code, x *Array, name string, more ir.Attrs) *Array {
	if x == nil {
		panic(Errorf(api, "nil array"))
	}
	checkLive(api, x)
	attrs := ir.Attrs{"axis": name, "size": axisSize(api, name)}
	for k, v := range more {
		attrs[k] = v
	}
	if x.typ.Space != ir.Device {
		panic(Errorf(api, "operand is in %v memory; collectives read device memory (DevicePut it first)", x.typ.Space))
	}
	if _, err := ir.InferTypes(code, []ir.Type{x.typ}, attrs, nil); err != nil {
		panic(Errorf(api, "%v", err))
	}
	return Apply1(code, attrs, x)
}

// collectiveDim normalises a dimension of x (negative counts from the end)
// in [0, rank+extra).
func collectiveDim(api, what string, x *Array, d, extra int) int {
	r := x.Rank() + extra
	if d < -r || d >= r {
		panic(Errorf(api, "%s %d is out of range for %v", what, d, x.Type()))
	}
	if d < 0 {
		d += r
	}
	return d
}

// PSum returns the sum of x over the members of the axis named name
// (jax.lax.psum): the same value for every member.
func PSum(x *Array, name string) *Array {
	return collective("PSum", ir.AllReduce, x, name, ir.Attrs{"reduction": "sum"})
}

// PMax returns the elementwise maximum of x over the members of the axis
// named name (jax.lax.pmax).
func PMax(x *Array, name string) *Array {
	return collective("PMax", ir.AllReduce, x, name, ir.Attrs{"reduction": "max"})
}

// PMin returns the elementwise minimum of x over the members of the axis
// named name (jax.lax.pmin).
func PMin(x *Array, name string) *Array {
	return collective("PMin", ir.AllReduce, x, name, ir.Attrs{"reduction": "min"})
}

// PMean returns the mean of the float array x over the members of the axis
// named name (jax.lax.pmean): PSum divided by the axis size.
func PMean(x *Array, name string) *Array {
	if x != nil && !x.DType().IsFloat() {
		panic(Errorf("PMean", "needs a float dtype, got %v", x.DType()))
	}
	s := collective("PMean", ir.AllReduce, x, name, ir.Attrs{"reduction": "sum"})
	return adDiv(s, adFullLike(s, float64(axisSize("PMean", name))))
}

// AllGather returns the values of x of every member of the axis named name,
// in member order (jax.lax.all_gather): stacked along a new dimension dim of
// the result, or, tiled, concatenated along dimension dim of x.
// Negative dims count from the end.
func AllGather(x *Array, name string, dim int, tiled bool) *Array {
	if x != nil {
		extra := 1
		if tiled {
			extra = 0
		}
		dim = collectiveDim("AllGather", "dimension", x, dim, extra)
	}
	return collective("AllGather", ir.AllGather, x, name, ir.Attrs{"dimension": dim, "tiled": tiled})
}

// PSumScatter sums x over the members of the axis named name and gives
// member i block i of dimension dim of the sum (jax.lax.psum_scatter): dim,
// of the axis size, is removed, or, tiled, divided by the axis size.
func PSumScatter(x *Array, name string, dim int, tiled bool) *Array {
	if x != nil {
		dim = collectiveDim("PSumScatter", "dimension", x, dim, 0)
	}
	return collective("PSumScatter", ir.ReduceScatter, x, name, ir.Attrs{"dimension": dim, "tiled": tiled})
}

// ReduceScatter is PSumScatter (XLA's name for it).
func ReduceScatter(x *Array, name string, dim int, tiled bool) *Array {
	return PSumScatter(x, name, dim, tiled)
}

// AllToAll cuts dimension split of x into as many blocks as the axis named
// name has members and sends block j to member j, which concatenates the
// blocks it receives along dimension concat in member order (XLA's
// AllToAll; jax.lax.all_to_all with tiled=True). Dimension split is divided
// by the axis size and concat multiplied.
func AllToAll(x *Array, name string, split, concat int) *Array {
	if x != nil {
		split = collectiveDim("AllToAll", "split dimension", x, split, 0)
		concat = collectiveDim("AllToAll", "concat dimension", x, concat, 0)
	}
	return collective("AllToAll", ir.AllToAll, x, name, ir.Attrs{"split_dimension": split, "concat_dimension": concat})
}

// PPermute sends x of member p[0] to member p[1] for each pair p of pairs
// (jax.lax.ppermute): sources are distinct and targets are distinct; a
// member no pair targets gets zeros.
func PPermute(x *Array, name string, pairs [][2]int) *Array {
	flat := make([]int, 0, 2*len(pairs))
	for _, p := range pairs {
		flat = append(flat, p[0], p[1])
	}
	return collective("PPermute", ir.CollectivePermute, x, name, ir.Attrs{"pairs": flat})
}

// AxisIndex returns the index of the current member along the axis named
// name (jax.lax.axis_index): an i32 scalar that is 0, 1, ... across the
// members, under a Vmap with AxisName(name) the index of the example. It
// panics with *Error where no Vmap binds name.
func AxisIndex(name string) *Array {
	n := axisSize("AxisIndex", name)
	return Apply(ir.AxisIndex, ir.Attrs{"axis": name, "size": n}, nil)[0]
}

// invertPairs returns the pairs of a collective_permute with sources and
// targets swapped.
func invertPairs(p []int) []int {
	out := make([]int, len(p))
	for i := 0; i < len(p); i += 2 {
		out[i], out[i+1] = p[i+1], p[i]
	}
	return out
}
