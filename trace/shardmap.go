package trace

import (
	"slices"

	"github.com/ferryml/ferry/ir"
)

// ShardMap (jax.shard_map) is Vmap over the axes of a mesh.
//
// Every argument leaf is reshaped and transposed into its mesh-major layout:
// one leading dimension per mesh axis its spec names, in mesh axis order,
// then the shape of one device's block (a dimension split over axes a1..ak
// of sizes n1..nk becomes [n1, ..., nk, D/(n1⋯nk)] before the mesh
// dimensions move to the front). One named Vmap per mesh axis, the first
// axis outermost, then maps fn over those dimensions, a leaf being
// NotMapped for the axes its spec does not name, so fn sees exactly one
// device's blocks and the collectives over the mesh axes are those of the
// Vmaps. Results come back in their mesh-major layout (a result replicated
// along an axis its spec does not name gives member 0's value there: see
// vmapConfig.outFirst) and are transposed and reshaped into global arrays.
// The whole is an ordinary global program, exact on one device.

// ShardMap returns fn mapped over the devices of mesh, like jax.shard_map:
// fn is written for one device's blocks and the returned function (of fn's
// type) takes and returns global arrays. fn's parameters and results are
// trees of arrays, as for Vmap.
//
// in gives the PartitionSpec of each argument leaf, in the order of the
// leaves of all arguments (Flatten's order, argument by argument), or one
// spec for every leaf; out likewise for the result leaves. Dimension d of a
// leaf is split into blocks over the mesh axes spec[d] lists, the first
// major (as ir.NamedSharding places it), and fn runs once per mesh position
// on the blocks of that position, with every mesh axis name bound, so that
// PSum(x, "x"), AllGather, PPermute, AxisIndex("x") and the other
// collectives work over the devices along an axis. The blocks of each result
// leaf are concatenated back into a global array per its out spec.
//
// A result leaf whose out spec does not name a mesh axis must be the same
// for every member along that axis (replicated, as after a PSum over it);
// ShardMap returns the value of member 0 along it. JAX checks this
// replication statically (check_rep); ShardMap does not, so a result that
// differs along an unnamed axis silently gives member 0's value.
//
// A result whose out spec names an axis gets its blocks along it
// concatenated, even if they are equal (a PSum's result with out spec P("x")
// holds the sum n times).
//
// ShardMap works eagerly and under rt.Jit, and composes with Grad and Vmap
// (both ways): it is traced into ordinary ops (a nest of Vmaps, the
// collectives turned into ops over the mapped dimensions), so on one device
// it computes exactly what the mesh of devices would. The blocks are not
// placed on the mesh's devices yet: the program runs whole, on the device of
// its arguments.
//
// Errors are panics with *Error at the caller's line: a nil mesh, a wrong
// number of specs, a spec naming an axis the mesh lacks or one axis twice, a
// spec with more entries than its leaf has dimensions, a dimension the
// product of its axes' sizes does not divide.
func ShardMap[F any](fn F, mesh *ir.Mesh, in, out []ir.PartitionSpec) F {
	shardMapCheckMesh("ShardMap", mesh)
	return treeWrap("ShardMap", fn, func(flat func([]*Array) []*Array, leaves []*Array) []*Array {
		return shardMapFlat("ShardMap", flat, leaves, mesh, in, out)
	})
}

// ShardMapFlat is ShardMap on flat lists of arrays: in has one spec per
// argument and out one per result (or one for all).
func ShardMapFlat(fn func(args []*Array) []*Array, mesh *ir.Mesh, in, out []ir.PartitionSpec) func(args []*Array) []*Array {
	if fn == nil {
		panic(Errorf("ShardMapFlat", "nil function"))
	}
	shardMapCheckMesh("ShardMapFlat", mesh)
	return func(args []*Array) []*Array { return shardMapFlat("ShardMapFlat", fn, args, mesh, in, out) }
}

func shardMapCheckMesh(name string, mesh *ir.Mesh) {
	if mesh == nil {
		panic(Errorf(name, "nil mesh"))
	}
	if mesh.NumDevices() == 0 {
		panic(Errorf(name, "mesh is not initialised (build it with ir.NewMesh)"))
	}
}

// shardMapSpecs expands the specs of n leaves (one for all, or one per
// leaf).
func shardMapSpecs(name, what, leaves string, specs []ir.PartitionSpec, n int) []ir.PartitionSpec {
	switch {
	case len(specs) == 1:
		out := make([]ir.PartitionSpec, n)
		for i := range out {
			out[i] = specs[0]
		}
		return out
	case len(specs) != n:
		panic(Errorf(name, "%d %s specs for %d %s leaves (give one per leaf, or one for all)", len(specs), what, n, leaves))
	}
	return specs
}

// shardMapAxes returns the mesh axes (their indices, in mesh order) that
// spec names.
func shardMapAxes(mesh *ir.Mesh, spec ir.PartitionSpec) []int {
	var ks []int
	for _, axes := range spec {
		for _, a := range axes {
			ks = append(ks, mesh.AxisIndex(a))
		}
	}
	slices.Sort(ks)
	return ks
}

// shardMapSplit returns the shape in which every dimension d of a leaf of
// the given shape is split over the axes of spec[d]: [n1, ..., nk, b], b
// the block's size (shape[d] divided by n1⋯nk, or shape[d] itself when
// shape is a block shape), with each position's mesh axis index (-1 for b).
func shardMapSplit(mesh *ir.Mesh, spec ir.PartitionSpec, shape ir.Shape, block bool) (split ir.Shape, tags []int) {
	sizes := mesh.Shape()
	for d, n := range shape {
		ways := 1
		if d < len(spec) {
			for _, a := range spec[d] {
				k := mesh.AxisIndex(a)
				split, tags = append(split, sizes[k]), append(tags, k)
				ways *= sizes[k]
			}
		}
		if !block {
			n /= ways
		}
		split, tags = append(split, n), append(tags, -1)
	}
	return split, tags
}

// shardMapPlace is applied to every argument and result leaf of a ShardMap
// in its mesh-major layout, whose dimension i is split over the mesh axis
// axes[i] (the axes, in mesh order, that the leaf's spec names) and whose
// other dimensions are one device's block: it is where the sharding
// constraint that places block i on the devices at position i along those
// axes (over mesh, spec P(axes...)), so that the partitioner runs each
// device's part of the program on that device. On concrete arrays (an
// eager ShardMap) it leaves x alone: the program is the same, computed
// whole on x's device.
func shardMapPlace(x *Array, mesh *ir.Mesh, axes []string) *Array {
	if !x.IsTraced() || len(axes) == 0 {
		return x
	}
	s, err := ir.NewNamedSharding(mesh, ir.P(axes...))
	if err != nil {
		panic(Errorf("ShardMap", "%v", err))
	}
	return constrain(x, s)
}

// shardMapNames returns the names of mesh axes ks.
func shardMapNames(mesh *ir.Mesh, ks []int) []string {
	names := mesh.AxisNames()
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = names[k]
	}
	return out
}

// shardMapBlocks returns x in its mesh-major layout for spec (checked).
func shardMapBlocks(x *Array, mesh *ir.Mesh, spec ir.PartitionSpec) *Array {
	split, tags := shardMapSplit(mesh, spec, x.typ.Shape, false)
	var perm []int
	for k := range mesh.NumAxes() {
		if p := slices.Index(tags, k); p >= 0 {
			perm = append(perm, p)
		}
	}
	for p, k := range tags {
		if k < 0 {
			perm = append(perm, p)
		}
	}
	return adTranspose(adReshape(x, split), perm)
}

// shardMapUnblocks is the inverse of shardMapBlocks: it returns the global
// array whose mesh-major layout for spec is y, of the given block shape.
func shardMapUnblocks(y *Array, mesh *ir.Mesh, spec ir.PartitionSpec, block ir.Shape) *Array {
	split, tags := shardMapSplit(mesh, spec, block, true)
	front := shardMapAxes(mesh, spec) // y's leading dimensions
	perm := make([]int, len(tags))
	d := 0
	for p, k := range tags {
		if k >= 0 {
			perm[p] = slices.Index(front, k)
		} else {
			perm[p] = len(front) + d
			d++
		}
	}
	global := block.Clone()
	for d := range global {
		if d < len(spec) {
			for _, a := range spec[d] {
				global[d] *= mesh.AxisSize(a)
			}
		}
	}
	z := adTranspose(y, perm)
	if !z.typ.Shape.Equal(split) {
		panic(Errorf("ShardMap", "internal error: result layout %v, want %v", z.typ.Shape, split))
	}
	return adReshape(z, global)
}

// shardMap is one call of a ShardMap'd function.
type shardMap struct {
	name   string
	fn     func([]*Array) []*Array
	mesh   *ir.Mesh
	out    []ir.PartitionSpec
	inAxes [][]int            // the mesh axes each argument leaf's spec names
	specs  []ir.PartitionSpec // of the results, known once fn is traced
	block  []ir.Shape         // the results' block shapes, likewise
}

func shardMapFlat(name string, fn func([]*Array) []*Array, args []*Array, mesh *ir.Mesh, in, out []ir.PartitionSpec) []*Array {
	specs := shardMapSpecs(name, "in", "argument", in, len(args))
	blocks := make([]*Array, len(args))
	sm := &shardMap{name: name, fn: fn, mesh: mesh, out: out, inAxes: make([][]int, len(args))}
	for i, a := range args {
		if a == nil {
			panic(Errorf(name, "argument leaf %d is nil", i))
		}
		checkLive(name, a)
		s, err := ir.NewNamedSharding(mesh, specs[i])
		if err == nil {
			err = s.Validate(a.typ.Shape)
		}
		if err != nil {
			panic(Errorf(name, "argument leaf %d (%v): %v", i, a.typ, err))
		}
		sm.inAxes[i] = shardMapAxes(mesh, specs[i])
		blocks[i] = shardMapPlace(shardMapBlocks(a, mesh, specs[i]), mesh, shardMapNames(mesh, sm.inAxes[i]))
	}
	res := sm.level(0, blocks)
	for i, r := range res {
		front := shardMapAxes(mesh, sm.specs[i])
		r = shardMapPlace(r, mesh, shardMapNames(mesh, front))
		res[i] = shardMapUnblocks(r, mesh, sm.specs[i], sm.block[i])
	}
	return res
}

// level maps the mesh axes from j on over leaves (in their mesh-major
// layout, less the axes before j): one named Vmap for axis j around the
// levels inside it, fn at the bottom.
func (sm *shardMap) level(j int, leaves []*Array) []*Array {
	names, sizes := sm.mesh.AxisNames(), sm.mesh.Shape()
	if j == len(names) {
		return sm.call(leaves)
	}
	cfg := &vmapConfig{name: names[j], size: sizes[j], hasSize: true, inAxes: make([]int, len(leaves))}
	for i := range leaves {
		// A leaf's first dimension is axis j's when its spec names it.
		if !slices.Contains(sm.inAxes[i], j) {
			cfg.inAxes[i] = NotMapped
		}
	}
	return vmapFlat(sm.name, func(ls []*Array) []*Array {
		res := sm.level(j+1, ls)
		cfg.outFirst = make([]bool, len(res))
		for i := range res {
			cfg.outFirst[i] = !slices.Contains(shardMapAxes(sm.mesh, sm.specs[i]), j)
		}
		return res
	}, leaves, cfg)
}

// call runs fn on one device's blocks and checks its results against the
// out specs.
func (sm *shardMap) call(blocks []*Array) []*Array {
	res := sm.fn(blocks)
	sm.specs = shardMapSpecs(sm.name, "out", "result", sm.out, len(res))
	sm.block = make([]ir.Shape, len(res))
	for i, r := range res {
		if r == nil {
			panic(Errorf(sm.name, "the function returned a nil array as result leaf %d", i))
		}
		checkLive(sm.name, r)
		if _, err := ir.NewNamedSharding(sm.mesh, sm.specs[i]); err != nil {
			panic(Errorf(sm.name, "result leaf %d (%v per device): %v", i, r.typ, err))
		}
		if len(sm.specs[i]) > r.Rank() {
			panic(Errorf(sm.name, "result leaf %d (%v per device): out spec %v has %d entries, more than its %d dimensions",
				i, r.typ, sm.specs[i], len(sm.specs[i]), r.Rank()))
		}
		sm.block[i] = r.typ.Shape.Clone()
	}
	return res
}
