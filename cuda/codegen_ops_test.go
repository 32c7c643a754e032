package cuda

import (
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math/rand/v2"
	"testing"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// opCase builds one op over fresh parameters.
type opCase struct {
	name   string
	params []ir.Type
	code   ir.Code
	attrs  ir.Attrs
}

func buildOp(t *testing.T, c opCase) *ir.Op {
	t.Helper()
	f := ir.NewFunc("f")
	var args []*ir.Value
	for _, p := range c.params {
		args = append(args, f.Body.AddParam(p))
	}
	op, err := f.Body.AddOp(c.code, args, c.attrs)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return op
}

var allDTypes = []ir.DType{ir.Bool, ir.Uint8, ir.Int32, ir.Int64, ir.Uint32, ir.Float16, ir.BFloat16, ir.Float32, ir.Float64}

func ty(dt ir.DType, d ...int) ir.Type { return ir.TypeOf(dt, d...) }

// opCases covers every op of the Core table the generator handles, each on
// the dtypes the op accepts.
func opCases() []opCase {
	var cs []opCase
	add := func(name string, code ir.Code, attrs ir.Attrs, params ...ir.Type) {
		cs = append(cs, opCase{name: name, params: params, code: code, attrs: attrs})
	}
	// The elementwise ops come from the op table, not a list here: a new
	// one is generated (and fails until the generator handles it) on every
	// dtype its dtype rule accepts; TestGenerateOpsHostC skips the others.
	var elementwise []ir.Code
	for _, c := range ir.AllCodes() {
		switch c.Info().Class {
		case ir.ClassUnary, ir.ClassBinary, ir.ClassCompare:
			elementwise = append(elementwise, c)
		}
	}
	for _, dt := range allDTypes {
		numeric := dt != ir.Bool
		for _, c := range elementwise {
			ps := []ir.Type{ty(dt, 4, 3)}
			if c.Info().NumArgs == 2 {
				ps = append(ps, ty(dt, 4, 3))
			}
			add(fmt.Sprintf("%v_%v", c, dt), c, nil, ps...)
		}
		add(fmt.Sprintf("select_%v", dt), ir.Select, nil, ty(ir.Bool, 2, 3), ty(dt, 2, 3), ty(dt, 2, 3))
		for _, to := range allDTypes {
			add(fmt.Sprintf("convert_%v_%v", dt, to), ir.Convert, ir.Attrs{"dtype": to}, ty(dt, 11))
		}
		// Shape ops.
		add(fmt.Sprintf("broadcast_%v", dt), ir.BroadcastInDim, ir.Attrs{"shape": []int{2, 3, 4}, "dims": []int{0, 2}}, ty(dt, 2, 4))
		add(fmt.Sprintf("reshape_%v", dt), ir.Reshape, ir.Attrs{"shape": []int{6, 2}}, ty(dt, 3, 4))
		add(fmt.Sprintf("transpose_%v", dt), ir.Transpose, ir.Attrs{"perm": []int{2, 0, 1}}, ty(dt, 2, 3, 4))
		add(fmt.Sprintf("slice_%v", dt), ir.Slice, ir.Attrs{"start": []int{1, 0}, "limit": []int{5, 7}, "strides": []int{2, 3}}, ty(dt, 6, 7))
		add(fmt.Sprintf("pad_%v", dt), ir.Pad, ir.Attrs{"low": []int{1, -1}, "high": []int{2, 1}, "interior": []int{1, 0}}, ty(dt, 3, 4), ty(dt))
		add(fmt.Sprintf("concatenate_%v", dt), ir.Concatenate, ir.Attrs{"axis": 1}, ty(dt, 2, 3), ty(dt, 2, 1), ty(dt, 2, 4))
		add(fmt.Sprintf("dynamic_slice_%v", dt), ir.DynamicSlice, ir.Attrs{"sizes": []int{2, 3}}, ty(dt, 5, 6), ty(ir.Int32), ty(ir.Int64))
		add(fmt.Sprintf("dynamic_update_slice_%v", dt), ir.DynamicUpdateSlice, nil, ty(dt, 5, 6), ty(dt, 2, 3), ty(ir.Int32), ty(ir.Int32))
		add(fmt.Sprintf("gather_%v", dt), ir.Gather, ir.Attrs{"axis": 1}, ty(dt, 3, 5, 2), ty(ir.Int32, 2, 3))
		add(fmt.Sprintf("scatter_add_%v", dt), ir.ScatterAdd, ir.Attrs{"axis": 1}, ty(dt, 3, 4, 2), ty(ir.Int32, 5), ty(dt, 3, 5, 2))
		add(fmt.Sprintf("argmax_%v", dt), ir.ArgMax, ir.Attrs{"axis": 1, "dtype": ir.Int32}, ty(dt, 3, 70, 2))
		add(fmt.Sprintf("argmin_%v", dt), ir.ArgMin, ir.Attrs{"axis": 0, "dtype": ir.Int64}, ty(dt, 37, 3))
		if numeric {
			for _, c := range []ir.Code{ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd} {
				add(fmt.Sprintf("%v_%v", c, dt), c, ir.Attrs{"axes": []int{0, 2}}, ty(dt, 9, 3, 11))
				add(fmt.Sprintf("%v_all_%v", c, dt), c, ir.Attrs{"axes": []int{0, 1}}, ty(dt, 5, 40))
			}
			add(fmt.Sprintf("dot_%v", dt), ir.DotGeneral, ir.Attrs{"lhs_batch": []int{0}, "rhs_batch": []int{1}, "lhs_contract": []int{2}, "rhs_contract": []int{0}}, ty(dt, 2, 3, 4), ty(dt, 4, 2, 5))
		}
		add(fmt.Sprintf("iota_%v", dt), ir.Iota, ir.Attrs{"dtype": dt, "shape": []int{3, 4}, "dim": 1})
	}
	for _, pair := range [][2]ir.DType{{ir.Float32, ir.Int32}, {ir.Int32, ir.Float32}, {ir.Float64, ir.Int64}, {ir.Float16, ir.BFloat16}, {ir.Uint32, ir.Int32}, {ir.Float32, ir.Uint32}} {
		add(fmt.Sprintf("bitcast_%v_%v", pair[0], pair[1]), ir.BitcastConvert, ir.Attrs{"dtype": pair[1]}, ty(pair[0], 6))
	}
	return cs
}

// fuseOp wraps op (an op over parameters of a function) in a loop fusion of
// its own, in a fresh function over the same parameter types: a fused group
// the plan describes as one elementwise node over its leaves.
func fuseOp(t *testing.T, op *ir.Op) *ir.Op {
	t.Helper()
	f := ir.NewFunc("fused")
	rg := f.NewRegion()
	var args, inner []*ir.Value
	for _, a := range op.Args {
		args, inner = append(args, f.Body.AddParam(a.Type)), append(inner, rg.AddParam(a.Type))
	}
	in, err := rg.AddOp(op.Code, inner, op.Attrs)
	if err != nil {
		t.Fatal(err)
	}
	rg.Results = in.Results
	fop, err := f.Body.AddOp(ir.Fusion, args, ir.Attrs{"kind": "loop"}, rg)
	if err != nil {
		t.Fatal(err)
	}
	return fop
}

// TestGenerateOpsHostC runs every op of the table, on every dtype it takes,
// through the generator and gcc, and compares with internal/eval on fresh
// random operands.
func TestGenerateOpsHostC(t *testing.T) {
	b := newHostBatch(needGCC(t))
	defer b.run()
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	for ci, c := range opCases() {
		f := ir.NewFunc("probe")
		var args []*ir.Value
		for _, p := range c.params {
			args = append(args, f.Body.AddParam(p))
		}
		if _, err := f.Body.AddOp(c.code, args, c.attrs); err != nil {
			continue // the op does not take this dtype
		}
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(ci)))
			op := buildOp(t, c)
			hcs := []*hostCheck{queueOnHost(t, b, rng, op)}
			if op.Info().Elementwise {
				hcs = append(hcs, queueOnHost(t, b, rng, fuseOp(t, op)))
			}
			t.Parallel()
			for _, hc := range hcs {
				hc.check(t, b)
			}
		})
	}
}

// TestOpTableGenerates is the CUDA meta-test of the op table, and needs no
// gcc: every op the table marks elementwise generates a kernel on every
// dtype its rule accepts, alone (GenerateOp) and as the node of a fused
// group the plan describes (GenerateKernel) — a float op lacking
// Lowering.CUDA, or any op the generator lacks, fails here —, every op but
// the few listed in ownKernel is rendered from the plan's kernel of it
// alone (passes.LowerOp), and every op of the table is in opCases except
// the ones the CUDA backend runs by other means.
func TestOpTableGenerates(t *testing.T) {
	other := map[ir.Code]string{
		ir.Constant: "literals are emitted inline", ir.Sort: "run as its own step",
		ir.DevicePut: "a copy step", ir.CheckpointName: "removed before code generation",
		ir.OptimizationBarrier: "removed before code generation",
		ir.ShardingConstraint:  "removed before code generation (the partitioner drops it)",
		ir.Scan:                "a region step", ir.While: "a region step", ir.Cond: "a region step", ir.Fusion: "a kernel of its own ops",
	}
	for _, c := range ir.AllCodes() {
		if c.IsCollective() {
			// A Vmap rewrites collectives into ordinary ops; a ShardMap's
			// per-device programs run them through package collective.
			other[c] = "a collective: run through package collective, never generated"
		}
	}
	// The ops the plan's kernels do not express, which GenerateOp renders
	// by kernels of their own; every other op is rendered from the plan's
	// kernel (passes.LowerOp) by GenerateKernel.
	ownKernel := map[ir.Code]string{ir.ScatterAdd: "atomic adds"}
	covered := map[ir.Code]bool{}
	for _, c := range opCases() {
		f := ir.NewFunc("probe")
		var args []*ir.Value
		for _, p := range c.params {
			args = append(args, f.Body.AddParam(p))
		}
		op, err := f.Body.AddOp(c.code, args, c.attrs)
		if err != nil {
			continue // the op does not take this dtype
		}
		covered[c.code] = true
		if _, err := GenerateOp(op); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if _, ok := passes.LowerOp(op); ok == (ownKernel[c.code] != "") {
			t.Errorf("%s: the plan describes it as a kernel: %v; GenerateOp renders it by a kernel of its own: %q", c.name, ok, ownKernel[c.code])
		}
		if !op.Info().Elementwise {
			continue
		}
		pk, err := passes.LowerKernel(fuseOp(t, op))
		if err != nil || pk.Mode != passes.KernelLoop || len(pk.Programs) != 1 || pk.Programs[0].Nodes[len(pk.Programs[0].Nodes)-1].Code != c.code {
			t.Fatalf("%s: the plan does not describe the fused op as its node: %v", c.name, err)
		}
		if _, err := GenerateKernel(pk); err != nil {
			t.Errorf("%s fused: %v", c.name, err)
		}
	}
	for _, c := range ir.AllCodes() {
		if why, ok := other[c]; ok {
			if covered[c] {
				t.Errorf("%v has cases in opCases, but this test says it is not generated: %s", c, why)
			}
			continue
		}
		if !covered[c] {
			t.Errorf("op %v has no case in opCases on any dtype", c)
		}
	}
}

// TestIndexRulesHostC runs the edge cases of the element-moving ops the plan
// reads through index rules (a scalar and an empty operand of pad, empty
// pieces of a concatenation, indices of rank 2, starts of every integer
// dtype) through the generator and gcc against internal/eval on fresh
// random operands.
func TestIndexRulesHostC(t *testing.T) {
	b := newHostBatch(needGCC(t))
	rng := testseed.Rand(t, 23)
	f32, i32 := ir.Float32, ir.Int32
	cases := []opCase{
		{"pad_scalar", []ir.Type{ty(f32), ty(f32)}, ir.Pad, ir.Attrs{"low": []int{}, "high": []int{}, "interior": []int{}}},
		{"pad_empty", []ir.Type{ty(f32, 0, 3), ty(f32)}, ir.Pad, ir.Attrs{"low": []int{2, 0}, "high": []int{1, 1}, "interior": []int{0, 2}}},
		{"pad_interior", []ir.Type{ty(ir.Float16, 3, 4), ty(ir.Float16)}, ir.Pad, ir.Attrs{"low": []int{-2, 3}, "high": []int{2, -1}, "interior": []int{2, 1}}},
		{"concatenate_empty", []ir.Type{ty(i32, 0, 3), ty(i32, 2, 3), ty(i32, 0, 3), ty(i32, 1, 3)}, ir.Concatenate, ir.Attrs{"axis": 0}},
		{"gather_rank2", []ir.Type{ty(ir.Float64, 4, 3), ty(i32, 2, 5)}, ir.Gather, ir.Attrs{"axis": 0}},
		{"gather_inner", []ir.Type{ty(ir.Bool, 2, 6), ty(ir.Int64, 7)}, ir.Gather, ir.Attrs{"axis": 1}},
		{"dynamic_slice_u32", []ir.Type{ty(f32, 4, 5, 6), ty(ir.Uint32), ty(ir.Int64), ty(i32)}, ir.DynamicSlice, ir.Attrs{"sizes": []int{4, 2, 1}}},
		{"dynamic_update_slice_3d", []ir.Type{ty(ir.BFloat16, 3, 4, 5), ty(ir.BFloat16, 1, 4, 2), ty(i32), ty(ir.Int64), ty(ir.Uint8)}, ir.DynamicUpdateSlice, nil},
	}
	var hcs []*hostCheck
	for _, c := range cases {
		hcs = append(hcs, queueOnHost(t, b, rng, buildOp(t, c)))
	}
	b.run()
	for i, hc := range hcs {
		t.Run(cases[i].name, func(t *testing.T) { hc.check(t, b) })
	}
}

// TestIndexRulesRandomHostC draws random dynamic_slice,
// dynamic_update_slice, concatenate, pad and gather ops (starts and indices
// out of range included) and runs their kernels through gcc against
// internal/eval on fresh random operands.
func TestIndexRulesRandomHostC(t *testing.T) {
	b := newHostBatch(needGCC(t))
	rng := testseed.Rand(t, 29)
	var hcs []*hostCheck
	for len(hcs) < 40 {
		if op := randomIndexOp(rng); op != nil {
			hcs = append(hcs, queueOnHost(t, b, rng, op))
		}
	}
	b.run()
	for _, hc := range hcs {
		hc.check(t, b)
	}
}

// randomIndexOp is a random op read through an index rule on f32 or i64
// data with i32 starts and indices, or nil when the draw is no valid op.
func randomIndexOp(rng *rand.Rand) *ir.Op {
	dt := []ir.DType{ir.Float32, ir.Int64}[rng.IntN(2)]
	shape := func(lo int) ir.Shape {
		s := make(ir.Shape, 1+rng.IntN(3))
		for d := range s {
			s[d] = lo + rng.IntN(4)
		}
		return s
	}
	xs := shape(1)
	c := opCase{params: []ir.Type{ty(dt, xs...)}, attrs: ir.Attrs{}}
	starts := func() {
		for range xs {
			c.params = append(c.params, ty(ir.Int32))
		}
	}
	switch rng.IntN(5) {
	case 0:
		c.code = ir.DynamicSlice
		sizes := make([]int, len(xs))
		for d := range xs {
			sizes[d] = rng.IntN(xs[d] + 1)
		}
		c.attrs["sizes"] = sizes
		starts()
	case 1:
		c.code = ir.DynamicUpdateSlice
		us := make(ir.Shape, len(xs))
		for d := range xs {
			us[d] = rng.IntN(xs[d] + 1)
		}
		c.params = append(c.params, ty(dt, us...))
		starts()
	case 2:
		c.code, c.attrs["axis"] = ir.Concatenate, rng.IntN(len(xs))
		for range rng.IntN(3) {
			s := append(ir.Shape(nil), xs...)
			s[c.attrs.Int("axis")] = rng.IntN(3)
			c.params = append(c.params, ty(dt, s...))
		}
	case 3:
		c.code = ir.Pad
		c.params = append(c.params, ty(dt))
		low, high, interior := make([]int, len(xs)), make([]int, len(xs)), make([]int, len(xs))
		for d := range xs {
			low[d], high[d], interior[d] = rng.IntN(5)-2, rng.IntN(4)-1, rng.IntN(3)
		}
		c.attrs["low"], c.attrs["high"], c.attrs["interior"] = low, high, interior
	default:
		c.code, c.attrs["axis"] = ir.Gather, rng.IntN(len(xs))
		c.params = append(c.params, ty(ir.Int32, shape(0)[:1]...))
	}
	f := ir.NewFunc("f")
	var args []*ir.Value
	for _, p := range c.params {
		args = append(args, f.Body.AddParam(p))
	}
	op, err := f.Body.AddOp(c.code, args, c.attrs)
	if err != nil {
		return nil
	}
	return op
}
