package trace

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ferryml/ferry/ir"
)

// Vectorising map (vmap), as jax.vmap.
//
// Vmap works at trace time, like Grad: the function is traced once on
// per-example arrays (the mapped axis removed) into the region of a fresh
// tracer, and the region is then interpreted in the caller's context (eagerly
// on concrete arrays, or recorded into the enclosing trace under rt.Jit, Grad,
// Scan or another Vmap) with every value carrying a batch dimension: the axis
// of its array that is the mapped one, or -1 when the value is the same for
// every example. An op none of whose operands is batched is replayed as it
// is; otherwise its batching rule (batchRules, one per op code) emits ops on
// the batched operands and says where the batch dimension of each result is.
// Rules are built from Apply, so what they emit is recorded like any other op:
// this is what makes Vmap compose with Grad (both ways), Jit, Remat and itself.
//
// A rule never returns a batched result for an op none of whose operands is
// batched (such ops are replayed), and it may return an unbatched result for
// batched operands. batchDeps is the conservative static form of that, used
// where a region's results must be known before it is interpreted (a scan's
// carry, the outputs of a cond's two branches).

// NotMapped is the axis of an input or output that Vmap does not map
// (in_axes=None in JAX): an input given whole to every example, an output that
// does not depend on the example.
const NotMapped = math.MinInt32

// VmapOption configures Vmap.
type VmapOption func(*vmapConfig)

type vmapConfig struct {
	inAxes, outAxes []int // per leaf (nil: 0 for every leaf)
	// inSpec and outSpec are the options as given, resolved into inAxes
	// and outAxes per call, against the call's tree structures.
	inSpec, outSpec *axesSpec
	// resolveOut, when set, gives the output leaves' axes once the
	// number of output leaves is known (Vmap resolves outSpec so).
	resolveOut func(n int) []int
	size       int
	hasSize    bool
	name       string
	// outFirst marks the output leaves that give example 0's value (the
	// results of a ShardMap replicated along this axis): batched ones lose
	// their batch dimension, unbatched ones stay as they are. It is set
	// while fn is traced (ShardMap learns its results' specs then); OutAxes
	// does not apply to the leaves it marks.
	outFirst []bool
}

// axesSpec is InAxes or OutAxes (ints) or their Tree forms (trees) as given.
type axesSpec struct {
	what  string // the option's name, for errors
	ints  []int
	trees []any
	tree  bool
}

// InAxes gives the mapped axis of the function's arguments, as jax.vmap's
// in_axes: an axis (negative counts from the end) or NotMapped.
//
//   - One value applies to every leaf of every argument.
//   - One value per argument applies to every leaf of that argument:
//     trace.Vmap(f, trace.InAxes(trace.NotMapped, 0)) gives f(params, batch)
//     all of params and maps axis 0 of every array of the batch.
//   - One value per leaf (all arguments' leaves in Flatten's order) is also
//     accepted when the count is not the number of arguments.
//
// InAxesTree takes a tree prefix of each argument, for finer control. The
// default maps axis 0 of every leaf.
func InAxes(axes ...int) VmapOption {
	return func(c *vmapConfig) { c.inSpec = &axesSpec{what: "InAxes", ints: slices.Clone(axes)} }
}

// InAxesTree gives the mapped axis of the function's arguments as tree
// prefixes, like jax.vmap's in_axes: one prefix per argument (or one for
// all), each an int axis or NotMapped for every leaf below it, nil for
// NotMapped, or a container mirroring the argument (a struct or a
// map[string]any of its field names, a slice of its length, a map of its
// keys; see BroadcastPrefix):
//
//	// f(p Params, batch Batch) with Params{W, B *trace.Array; Layers []Layer}
//	trace.InAxesTree(map[string]any{"W": 0, "B": nil, "Layers": trace.NotMapped}, 0)
//
// A prefix that does not fit its argument is an error naming the path.
func InAxesTree(prefixes ...any) VmapOption {
	return func(c *vmapConfig) {
		c.inSpec = &axesSpec{what: "InAxesTree", trees: slices.Clone(prefixes), tree: true}
	}
}

// OutAxes gives the axis at which the function's results get the mapped
// axis (or NotMapped for a result that must not depend on the example), as
// jax.vmap's out_axes, read as InAxes reads its values: one for every leaf,
// one per result, or one per leaf of all results. The default is 0.
func OutAxes(axes ...int) VmapOption {
	return func(c *vmapConfig) { c.outSpec = &axesSpec{what: "OutAxes", ints: slices.Clone(axes)} }
}

// OutAxesTree is OutAxes as tree prefixes of the results, one per result (or
// one for all), as InAxesTree takes them for the arguments.
func OutAxesTree(prefixes ...any) VmapOption {
	return func(c *vmapConfig) {
		c.outSpec = &axesSpec{what: "OutAxesTree", trees: slices.Clone(prefixes), tree: true}
	}
}

// resolve expands the spec over trees of structures defs (the arguments or
// the results) into one axis per leaf.
func (sp *axesSpec) resolve(defs []*TreeDef) ([]int, error) {
	noun := "argument"
	if strings.HasPrefix(sp.what, "Out") {
		noun = "result"
	}
	if sp.tree {
		return broadcastArgs(sp.what, noun, sp.trees, defs, NotMapped)
	}
	return perArgOrLeaf(sp.what, noun, sp.ints, defs, NotMapped)
}

// perArgOrLeaf expands values given one for all, one per argument (each for
// every leaf of its argument) or one per leaf into one per leaf, as InAxes
// and rt.InShardings read them. none is what a nil prefix means; noun names
// the trees ("argument", "result").
func perArgOrLeaf[T comparable](what, noun string, vals []T, defs []*TreeDef, none T) ([]T, error) {
	leaves := 0
	for _, d := range defs {
		leaves += d.NumLeaves()
	}
	k := len(vals)
	if k == 0 {
		return make([]T, leaves), nil // the default (axis 0, no sharding)
	}
	if k == 1 || k == len(defs) {
		prefixes := make([]any, k)
		for i, v := range vals {
			prefixes[i] = v
		}
		out, err := broadcastArgs(what, noun, prefixes, defs, none)
		if err != nil {
			return nil, err
		}
		if k == leaves && !slices.Equal(out, vals) {
			return nil, fmt.Errorf("%s has %d entries, one per %s and one per leaf, and the two readings differ (the %ss have %s leaves): give them as tree prefixes with %sTree", what, k, noun, noun, leafCounts(defs), what)
		}
		return out, nil
	}
	if k == leaves {
		return slices.Clone(vals), nil
	}
	return nil, fmt.Errorf("%s has %d entries for %d %ss (with %s leaves): give one for all, one per %s (for every leaf of it), or one per leaf; %sTree takes a tree prefix of each %s", what, k, len(defs), noun, leafCounts(defs), noun, what, noun)
}

// leafCounts writes the number of leaves of each tree: "2, 0".
func leafCounts(defs []*TreeDef) string {
	s := make([]string, len(defs))
	for i, d := range defs {
		s[i] = strconv.Itoa(d.NumLeaves())
	}
	return strings.Join(s, ", ")
}

// AxisSize sets the size of the mapped axis (jax.vmap's axis_size). It is
// needed when no input is mapped, and must agree with the mapped inputs
// otherwise.
func AxisSize(n int) VmapOption {
	return func(c *vmapConfig) { c.size, c.hasSize = n, true }
}

// AxisName names the mapped axis (jax.vmap's axis_name), so that AxisIndex
// and the collectives (PSum, AllGather, PPermute, ...) can refer to it from
// inside the function: their members are the examples.
func AxisName(name string) VmapOption {
	return func(c *vmapConfig) { c.name = name }
}

// Vmap returns fn vectorised over a mapped axis of its inputs, like jax.vmap:
// fn is written for one example and the returned function (of fn's type) runs
// it on a batch at once. fn's parameters and results are trees of arrays
// (structs, slices, maps of *Array, as Grad takes); InAxes and OutAxes give
// the mapped axis per leaf. Every op has a batching rule, so the batched
// program is what one would write by hand: a matmul of a batch of vectors
// becomes one dot_general, a batch of PRNG keys gives a batch of
// independent streams, bit-identical to calling fn once per key:
//
//	perExample := trace.Vmap(func(ex Example) Params {
//		return trace.Grad(func(p Params) *trace.Array { return loss(p, ex) })(params)
//	})
//	grads := perExample(batch) // every leaf of grads has a leading batch axis
//
// Vmap works eagerly and under rt.Jit, nests (Vmap of Vmap), and composes both
// ways with Grad, VJP, JVP, Remat and Scan. Arrays fn closes over are not
// mapped.
//
// Control flow is batched as in JAX. A Scan (or ForLoop) stays one scan, its
// carry batched where it depends on the examples. A Cond or While whose
// predicate does not depend on the examples stays one cond or while. A Cond
// whose predicate does computes both branches for every example and selects
// each example's result (so a branch must be safe to run on examples that do
// not take it: a While in it must end on them too); a While whose predicate
// does runs until every example's predicate is false, each example keeping
// the state of its own last step.
func Vmap[F any](fn F, opts ...VmapOption) F {
	var cfg vmapConfig
	for _, o := range opts {
		o(&cfg)
	}
	return treeWrapDefs("Vmap", fn, func(flat func([]*Array) []*Array, leaves []*Array, call *treeCall) []*Array {
		c := cfg.forCall("Vmap", call.in, func() []*TreeDef { return call.out })
		return vmapFlat("Vmap", flat, leaves, &c)
	})
}

// forCall returns the configuration for one call whose arguments have the
// structures in, and whose results have the structures out() once traced:
// the options' axes resolved per leaf.
func (cfg *vmapConfig) forCall(name string, in []*TreeDef, out func() []*TreeDef) vmapConfig {
	c := *cfg
	if c.inSpec != nil {
		ax, err := c.inSpec.resolve(in)
		if err != nil {
			panic(Errorf(name, "%v", err))
		}
		c.inAxes = ax
	}
	if c.outSpec != nil {
		sp := c.outSpec
		c.resolveOut = func(int) []int {
			ax, err := sp.resolve(out())
			if err != nil {
				panic(Errorf(name, "%v", err))
			}
			return ax
		}
	}
	return c
}

// leafDefs returns n structures of a single array: the arguments or
// results of a function of flat lists.
func leafDefs(n int) []*TreeDef {
	d := &TreeDef{root: &treeNode{kind: tkLeaf, typ: treeArrayType}, numLeaves: 1}
	out := make([]*TreeDef, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// VmapFlat is Vmap on flat lists of arrays: it returns fn(args) mapped over
// the axes the options give.
func VmapFlat(fn func(args []*Array) []*Array, args []*Array, opts ...VmapOption) []*Array {
	if fn == nil {
		panic(Errorf("VmapFlat", "nil function"))
	}
	var cfg vmapConfig
	for _, o := range opts {
		o(&cfg)
	}
	var nOut int
	c := cfg.forCall("VmapFlat", leafDefs(len(args)), func() []*TreeDef { return leafDefs(nOut) })
	if c.resolveOut != nil {
		resolve := c.resolveOut
		c.resolveOut = func(n int) []int { nOut = n; return resolve(n) }
	}
	return vmapFlat("VmapFlat", fn, args, &c)
}

// vmapAxes expands per-leaf axes (one value for all, or one per leaf).
func vmapAxes(name, what string, axes []int, n int) []int {
	switch {
	case axes == nil:
		return make([]int, n)
	case len(axes) == 1:
		out := make([]int, n)
		for i := range out {
			out[i] = axes[0]
		}
		return out
	case len(axes) != n:
		panic(Errorf(name, "%s has %d entries for %d leaves (give one per leaf, or one for all)", what, len(axes), n))
	}
	return slices.Clone(axes)
}

// vmapFrame is one active Vmap with an axis name, for AxisIndex and the
// collectives.
type vmapFrame struct {
	name string
	t    *Tracer
	size int // the size of the mapped axis
}

// vmapFlat maps fn over the flat input leaves args: it traces fn on one
// example and interprets the traced region on the whole batch.
func vmapFlat(name string, fn func([]*Array) []*Array, args []*Array, cfg *vmapConfig) []*Array {
	v := &vmapState{name: name, args: args, cfg: cfg}
	v.mapInputs()
	v.traceExample(fn)
	// Interpret it on the batch.
	in := append(append([]*Array{}, args...), v.t.Captures()...)
	dims := v.dims
	for len(dims) < len(in) {
		dims = append(dims, -1)
	}
	outs, odims := vmapRegion(v.t.region, in, dims, v.size, cfg.name)
	v.placeOutputs(outs, odims)
	return outs
}

// vmapState is the state of one vmapFlat: the mapped axis of every input
// leaf, the batch size and the tracer of one example.
type vmapState struct {
	name string
	args []*Array
	cfg  *vmapConfig
	// dims[i] is the mapped axis of input leaf i, -1 if it is not mapped.
	dims []int
	size int
	t    *Tracer
}

// mapInputs resolves the mapped axis of every input leaf and the batch
// size, checking that the mapped axes agree.
func (v *vmapState) mapInputs() {
	name, args, cfg := v.name, v.args, v.cfg
	inAxes := vmapAxes(name, "InAxes", cfg.inAxes, len(args))
	size := -1
	if cfg.hasSize {
		if cfg.size < 0 {
			panic(Errorf(name, "negative AxisSize %d", cfg.size))
		}
		size = cfg.size
	}
	dims := make([]int, len(args))
	first := -1 // the first mapped leaf
	for i, a := range args {
		if a == nil {
			panic(Errorf(name, "input leaf %d is nil", i))
		}
		checkLive(name, a)
		ax := inAxes[i]
		if ax == NotMapped {
			dims[i] = -1
			continue
		}
		r := a.Rank()
		if ax < -r || ax >= r {
			panic(Errorf(name, "InAxes: axis %d is out of range for input leaf %d of type %v", ax, i, a.Type()))
		}
		if ax < 0 {
			ax += r
		}
		dims[i] = ax
		n := a.typ.Shape[ax]
		if size >= 0 && n != size {
			if cfg.hasSize {
				panic(Errorf(name, "input leaf %d (%v) has %d examples on axis %d, but AxisSize is %d", i, a.Type(), n, ax, size))
			}
			panic(Errorf(name, "input leaves map axes of different sizes: leaf %d (%v) has %d on axis %d, but leaf %d has %d on axis %d",
				i, a.Type(), n, ax, first, size, dims[first]))
		}
		if first < 0 {
			first = i
		}
		size = n
	}
	if size < 0 {
		panic(Errorf(name, "no input is mapped: give the size of the mapped axis with AxisSize"))
	}
	v.dims, v.size = dims, size
}

// traceExample traces fn on one example into v.t.
func (v *vmapState) traceExample(fn func([]*Array) []*Array) {
	v.t = NewFuncTracer("vmap")
	defer v.t.Close()
	adWith(v.t, func() { v.traceBody(fn) })
}

// traceBody runs fn on parameters of one example's types and records its
// outputs as the region's results.
func (v *vmapState) traceBody(fn func([]*Array) []*Array) {
	t, name := v.t, v.name
	params := make([]*Array, len(v.args))
	for i, a := range v.args {
		pt := a.Type()
		if v.dims[i] >= 0 {
			pt = pt.WithShape(slices.Delete(pt.Shape.Clone(), v.dims[i], v.dims[i]+1))
		}
		params[i] = t.Param(pt)
		params[i].weak = a.weak && v.dims[i] < 0
	}
	if v.cfg.name != "" {
		vmapFrames.push(&vmapFrame{name: v.cfg.name, t: t, size: v.size})
		defer vmapFrames.pop()
	}
	res := fn(params)
	vals := make([]*ir.Value, len(res))
	for i, r := range res {
		if r == nil {
			panic(Errorf(name, "the function returned a nil array as output leaf %d", i))
		}
		checkLive(name, r)
		vals[i] = t.Output(r)
	}
	t.region.Results = vals
}

// placeOutputs moves the mapped axis of every output leaf (odims[i], -1
// if not mapped) to where OutAxes puts it, in place in outs.
func (v *vmapState) placeOutputs(outs []*Array, odims []int) {
	name, cfg := v.name, v.cfg
	var outAxes []int
	if cfg.resolveOut != nil {
		outAxes = cfg.resolveOut(len(outs))
		if len(outAxes) != len(outs) {
			panic(Errorf(name, "OutAxes: %d axes for %d output leaves", len(outAxes), len(outs)))
		}
	} else {
		outAxes = vmapAxes(name, "OutAxes", cfg.outAxes, len(outs))
	}
	for i, o := range outs {
		if cfg.outFirst != nil && cfg.outFirst[i] {
			if odims[i] >= 0 {
				outs[i] = batchFirst(o, odims[i])
			}
			continue
		}
		ax := outAxes[i]
		if ax == NotMapped {
			if odims[i] >= 0 {
				panic(Errorf(name, "output leaf %d (%v per example) depends on the mapped inputs, but OutAxes says NotMapped", i, o.Type()))
			}
			continue
		}
		r := o.Rank()
		if odims[i] >= 0 {
			r--
		}
		if ax < -(r+1) || ax > r {
			panic(Errorf(name, "OutAxes: axis %d is out of range for output leaf %d of rank %d (plus the mapped axis)", ax, i, r))
		}
		if ax < 0 {
			ax += r + 1
		}
		// A pinned_host output whose mapped axis must move (or be made)
		// takes a round trip through device memory (batchOnDevice).
		outs[i] = batchMove(batchMaterialize(o, odims[i], v.size), max(odims[i], 0), ax)
	}
}

// vmapFrames holds the named Vmaps being traced, per goroutine.
var vmapFrames frameStack

type frameStack struct {
	mu sync.Mutex
	fs map[uintptr][]*vmapFrame // by gkey
}

func (s *frameStack) push(f *vmapFrame) {
	id := gkey()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fs == nil {
		s.fs = map[uintptr][]*vmapFrame{}
	}
	s.fs[id] = append(s.fs[id], f)
}

func (s *frameStack) pop() {
	id := gkey()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.fs[id][:len(s.fs[id])-1]
	if len(st) == 0 {
		delete(s.fs, id)
	} else {
		s.fs[id] = st
	}
}

func (s *frameStack) lookup(name string) *vmapFrame {
	id := gkey()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.fs[id]
	for i := len(st) - 1; i >= 0; i-- {
		if st[i].name == name && st[i].t.active.Load() {
			return st[i]
		}
	}
	return nil
}

// ---- the interpreter

// batchCall is the input of a batching rule.
type batchCall struct {
	op   *ir.Op
	args []*Array
	dims []int  // batch dimension of each operand, -1 if not batched
	size int    // the size of the batch dimension
	name string // the Vmap's axis name ("" when it has none)
}

// batchRule emits the batched form of an op and returns its results with
// their batch dimensions (-1: not batched).
type batchRule func(c *batchCall) (outs []*Array, dims []int)

// batchRules holds the batching rule of every op (see the files batch_*.go,
// and TestBatchRuleCoverage).
var batchRules = map[ir.Code]batchRule{}

// vmapRegion interprets region r on args batched at dims (-1: not batched),
// in the current context, and returns its results and their batch dims.
// name is the Vmap's axis name: collectives over it always go through their
// batching rules (they compute over the batch even on unbatched operands).
func vmapRegion(r *ir.Region, args []*Array, dims []int, size int, name string) ([]*Array, []int) {
	env := make(map[*ir.Value]*Array, len(r.Params)+len(r.Ops))
	bd := make(map[*ir.Value]int, len(r.Params)+len(r.Ops))
	for i, p := range r.Params {
		env[p], bd[p] = args[i], dims[i]
	}
	get := func(vs []*ir.Value) ([]*Array, []int, bool) {
		as, ds, any := make([]*Array, len(vs)), make([]int, len(vs)), false
		for i, v := range vs {
			a, ok := env[v]
			if !ok {
				panic(Errorf("vmap", "internal error: value %v is not defined", v))
			}
			as[i], ds[i] = a, bd[v]
			any = any || ds[i] >= 0
		}
		return as, ds, any
	}
	bind := func(vs []*ir.Value, outs []*Array, ds []int) {
		for i, v := range vs {
			env[v], bd[v] = outs[i], ds[i]
		}
	}
	ops := r.Ops
	for k := 0; k < len(ops); k++ {
		op := ops[k]
		m := adMarkOfOp(op)
		if m != nil && m.group != nil && m.index == 0 {
			k = batchCustomGroup(ops, k, m.group, get, bind, size, name) - 1
			continue
		}
		args, ds, anyB := get(op.Args)
		var outs []*Array
		var od []int
		own := name != "" && usesAxis(op, name)
		if !anyB && !own {
			outs = adReplay(op, args)
			od = make([]int, len(outs))
			for i := range od {
				od[i] = -1
			}
		} else {
			rule := batchRules[op.Code]
			if rule == nil {
				panic(Errorf(op.Code.String(), "vmap: no batching rule for op %v", op.Code))
			}
			t := current()
			mark := 0
			if t != nil {
				mark = len(t.region.Ops)
			}
			outs, od = rule(&batchCall{op: op, args: args, dims: ds, size: size, name: name})
			if t != nil && op.Loc != "" {
				// The ops the rule emitted stand for the user's op.
				for _, e := range t.region.Ops[mark:] {
					e.Loc = op.Loc
				}
			}
		}
		if m != nil && m.stop {
			adMarkStop(outs[0])
		}
		bind(op.Results, outs, od)
	}
	out, ds, _ := get(r.Results)
	return out, ds
}

// usesAxis reports whether op is a collective over the axis name, or a
// region op holding one.
func usesAxis(op *ir.Op, name string) bool {
	if op.Code.IsCollective() && op.Attrs.String("axis") == name {
		return true
	}
	for _, r := range op.Regions {
		for _, o := range r.Ops {
			if usesAxis(o, name) {
				return true
			}
		}
	}
	return false
}

// batchCustomGroup interprets the markers of a custom_vjp call starting at
// ops[k] (its inputs and residuals are already interpreted) and records the
// batched call as a custom_vjp call whose backward function is the original
// one mapped over the batch. It returns the index after the markers.
func batchCustomGroup(ops []*ir.Op, k int, g *adGroup, get func([]*ir.Value) ([]*Array, []int, bool),
	bind func([]*ir.Value, []*Array, []int), size int, name string) int {
	n := len(g.outputs)
	ins, inDims, _ := get(g.inputs)
	res, resDims, _ := get(g.residuals)
	srcs := make([]*ir.Value, n)
	for i := 0; i < n; i++ {
		if k+i >= len(ops) || ops[k+i].Results[0] != g.outputs[i] {
			panic(Errorf("CustomVJP", "internal error: custom_vjp markers out of order"))
		}
		srcs[i] = ops[k+i].Args[0]
	}
	vals, outDims, _ := get(srcs)
	t, inVals, resVals := adCustomPrepare(ins, res)
	if t == nil {
		// Eager: nothing records the call, so there is nothing to mark.
		bind(g.outputs, vals, outDims)
		return k + n
	}
	outs := make([]*Array, n)
	for i, a := range vals {
		outs[i] = Apply1(ir.DevicePut, ir.Attrs{"space": a.Space()}, a)
	}
	bwd := g.bwd
	if slices.ContainsFunc(append(append(slices.Clone(inDims), resDims...), outDims...), func(d int) bool { return d >= 0 }) {
		bwd = batchBwd(g.bwd, ins, inDims, resDims, outDims, size, name)
	}
	adCustomFinish(t, inVals, resVals, outs, bwd)
	bind(g.outputs, outs, outDims)
	return k + n
}

// batchBwd maps a custom_vjp backward function over the batch: residuals and
// cotangents batched at their dims; the cotangent of an unbatched input is
// the sum over the batch of the per-example ones.
//
// The cotangent of an unbatched output is the sum of the examples' (the
// output stands for one copy per example), not each example's own: it goes
// to example 0 and the others get zero, so that, bwd being linear in the
// cotangents, the sum over the batch counts it once. (Giving it to every
// example would count it once per example.)
//
// The backward function is mapped with the Vmap's axis name, so that the
// collectives over it (those of a Remat's recomputed forward, and their
// transposes) are bound there too.
func batchBwd(bwd func(res, cts []*Array) []*Array, ins []*Array, inDims, resDims, outDims []int, size int, name string) func(res, cts []*Array) []*Array {
	return func(res, cts []*Array) []*Array {
		nr := len(res)
		cts = slices.Clone(cts)
		ctDims := slices.Clone(outDims)
		for i, d := range outDims {
			if d < 0 {
				cts[i], ctDims[i] = batchFirstOnly(cts[i], size), 0
			}
		}
		args := append(append([]*Array{}, res...), cts...)
		dims := append(append([]int{}, resDims...), ctDims...)
		axes := make([]int, len(args))
		for i, d := range dims {
			axes[i] = d
			if d < 0 {
				axes[i] = NotMapped
			}
		}
		oaxes := make([]int, len(ins))
		per := func(flat []*Array) []*Array {
			got := bwd(flat[:nr], flat[nr:])
			if len(got) != len(ins) {
				panic(Errorf("CustomVJP", "bwd returned %d cotangents for %d arguments", len(got), len(ins)))
			}
			out := make([]*Array, len(ins))
			for i, g := range got {
				t := ins[i].Type()
				if inDims[i] >= 0 {
					t = t.WithShape(slices.Delete(t.Shape.Clone(), inDims[i], inDims[i]+1))
				}
				if g == nil || !t.DType.IsFloat() {
					g = adZeros(adCtType(t))
				}
				out[i] = adConvert(g, t.DType)
			}
			return out
		}
		cfg := &vmapConfig{inAxes: axes, outAxes: oaxes, size: size, hasSize: true, name: name}
		for i, d := range inDims {
			oaxes[i] = max(d, 0)
		}
		got := vmapFlat("CustomVJP", per, args, cfg)
		for i, d := range inDims {
			if d < 0 {
				got[i] = adReduceSum(got[i], []int{0})
			}
		}
		return got
	}
}

// batchFirstOnly returns x batched at axis 0: x for example 0, zeros for
// the others.
func batchFirstOnly(x *Array, size int) *Array {
	r := x.Rank()
	shape := append(ir.Shape{1}, x.typ.Shape...)
	lo, hi := make([]int, r+1), make([]int, r+1)
	hi[0] = size - 1
	return Apply1(ir.Pad, ir.Attrs{"low": lo, "high": hi, "interior": make([]int, r+1)},
		adReshape(x, shape), adScalar(0, x.DType()))
}

// batchRegionDeps holds, for region ops, which results their batching rule
// returns batched given which operands are (see batchDeps).
var batchRegionDeps = map[ir.Code]func(op *ir.Op, args []bool) []bool{}

// batchDeps returns which results of r may be batched given which of its
// parameters are: a result is if it depends on a batched parameter. The
// results of a region op are those its batchRegionDeps entry says (all of
// them, conservatively, when it has none and an operand is batched).
func batchDeps(r *ir.Region, params []bool) []bool {
	b := make(map[*ir.Value]bool, len(r.Params)+len(r.Ops))
	for i, p := range r.Params {
		b[p] = params[i]
	}
	for _, op := range r.Ops {
		any := false
		for _, v := range op.Args {
			any = any || b[v]
		}
		// A collective over the Vmap's own axis may give a batched result
		// for unbatched operands (axis_index, ppermute, ...).
		any = any || op.Code.IsCollective()
		if dep := batchRegionDeps[op.Code]; dep != nil && any {
			args := make([]bool, len(op.Args))
			for i, v := range op.Args {
				args[i] = b[v]
			}
			for i, d := range dep(op, args) {
				b[op.Results[i]] = d
			}
			continue
		}
		if m := adMarkOfOp(op); m != nil && m.group != nil {
			for _, v := range m.group.inputs {
				any = any || b[v]
			}
			for _, v := range m.group.residuals {
				any = any || b[v]
			}
		}
		for _, v := range op.Results {
			b[v] = any
		}
	}
	out := make([]bool, len(r.Results))
	for i, v := range r.Results {
		out[i] = b[v]
	}
	return out
}

// ---- helpers for rules

// batchOnDevice applies f to x, which ops can read on device only: a
// pinned_host x (the result of a DevicePut to host) is moved to device for f,
// and f's result back to x's space.
func batchOnDevice(x *Array, f func(*Array) *Array) *Array {
	if x.typ.Space == ir.Device {
		return f(x)
	}
	y := f(Apply1(ir.DevicePut, ir.Attrs{"space": ir.Device}, x))
	return Apply1(ir.DevicePut, ir.Attrs{"space": x.typ.Space}, y)
}

// batchMove moves the batch dimension of x from axis from to axis to.
func batchMove(x *Array, from, to int) *Array {
	if from == to {
		return x
	}
	if x.typ.Space != ir.Device {
		return batchOnDevice(x, func(x *Array) *Array { return batchMove(x, from, to) })
	}
	r := x.Rank()
	perm := make([]int, 0, r)
	for i := 0; i < r; i++ {
		if i != from {
			perm = append(perm, i)
		}
	}
	perm = slices.Insert(perm, to, from)
	return adTranspose(x, perm)
}

// batchFirst returns example 0 of x, batched at axis d (which is not
// empty).
func batchFirst(x *Array, d int) *Array {
	if x.typ.Space != ir.Device {
		return batchOnDevice(x, func(x *Array) *Array { return batchFirst(x, d) })
	}
	limit := slices.Clone([]int(x.typ.Shape))
	limit[d] = 1
	one := adSlice(x, make([]int, len(limit)), limit, dimsAll(len(limit), 1))
	return adReshape(one, slices.Delete(x.typ.Shape.Clone(), d, d+1))
}

// batchMaterialize returns x batched: itself when it is (d >= 0), else x
// broadcast along a new leading batch axis of the given size.
func batchMaterialize(x *Array, d, size int) *Array {
	if d >= 0 {
		return x
	}
	if x.typ.Space != ir.Device {
		return batchOnDevice(x, func(x *Array) *Array { return batchMaterialize(x, d, size) })
	}
	shape := append(ir.Shape{size}, x.typ.Shape...)
	dims := make([]int, x.Rank())
	for i := range dims {
		dims[i] = i + 1
	}
	return Apply1(ir.BroadcastInDim, ir.Attrs{"shape": []int(shape), "dims": dims}, x)
}

// front returns operand i with its batch dimension at axis 0, broadcasting
// it if it is not batched.
func (c *batchCall) front(i int) *Array {
	if c.dims[i] < 0 {
		return batchMaterialize(c.args[i], -1, c.size)
	}
	return batchMove(c.args[i], c.dims[i], 0)
}

// frontAll returns every operand batched at axis 0.
func (c *batchCall) frontAll() []*Array {
	out := make([]*Array, len(c.args))
	for i := range c.args {
		out[i] = c.front(i)
	}
	return out
}

// sameDim returns the common batch dimension when every operand is batched
// at the same axis, else -1.
func (c *batchCall) sameDim() int {
	d := c.dims[0]
	for _, x := range c.dims {
		if x != d || x < 0 {
			return -1
		}
	}
	return d
}

// batched reports, per operand, whether it is batched.
func (c *batchCall) batched() []bool {
	out := make([]bool, len(c.dims))
	for i, d := range c.dims {
		out[i] = d >= 0
	}
	return out
}

// apply emits the op's code with attrs on args (its regions are not
// carried: rules of region ops build their own).
func (c *batchCall) apply(attrs ir.Attrs, args ...*Array) []*Array {
	return Apply(c.op.Code, attrs, nil, args...)
}

// dimsAll returns n copies of d.
func dimsAll(n, d int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// shiftAxes returns axes with every axis at or after d moved up by one (the
// axes of an operand that gained a batch dimension at d).
func shiftAxes(axes []int, d int) []int {
	out := make([]int, len(axes))
	for i, a := range axes {
		out[i] = a
		if a >= d {
			out[i] = a + 1
		}
	}
	return out
}

// ---- elementwise and identity-like ops

// batchElementwise is the rule of elementwise ops of any arity (and of
// identities such as device_put and checkpoint_name): operands batched at the
// same axis stay there, others are moved to (or broadcast along) axis 0.
func batchElementwise(c *batchCall) ([]*Array, []int) {
	attrs := maps.Clone(c.op.Attrs)
	if d := c.sameDim(); d >= 0 {
		outs := c.apply(attrs, c.args...)
		return outs, dimsAll(len(outs), d)
	}
	outs := c.apply(attrs, c.frontAll()...)
	return outs, dimsAll(len(outs), 0)
}

// batchReplay is the rule of ops without operands (constant, iota): their
// value is the same for every example, so they are replayed unbatched.
func batchReplay(c *batchCall) ([]*Array, []int) {
	outs := adReplay(c.op, c.args)
	return outs, dimsAll(len(outs), -1)
}

// batchEach is the rule of ops that map each operand to a result on its own
// (optimization_barrier): every operand keeps its batch dimension.
func batchEach(c *batchCall) ([]*Array, []int) {
	outs := c.apply(maps.Clone(c.op.Attrs), c.args...)
	return outs, append([]int(nil), c.dims...)
}

func init() {
	for _, code := range ir.AllCodes() {
		if code.Info().Elementwise {
			batchRules[code] = batchElementwise
		}
	}
	batchRules[ir.Select] = batchElementwise
	batchRules[ir.Convert] = batchElementwise
	batchRules[ir.BitcastConvert] = batchElementwise
	batchRules[ir.DevicePut] = batchElementwise
	batchRules[ir.CheckpointName] = batchElementwise
	batchRules[ir.OptimizationBarrier] = batchEach
	batchRules[ir.ShardingConstraint] = batchShardingConstraint
	// Nullary ops have no operand to be batched: the same for every example.
	batchRules[ir.Constant] = batchReplay
	batchRules[ir.Iota] = batchReplay
}
