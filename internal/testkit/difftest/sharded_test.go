package difftest

import (
	"bytes"
	"fmt"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/internal/settings"
	"github.com/ferryml/ferry/internal/testkit/randprog"
	"github.com/ferryml/ferry/internal/testkit/spmdref"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// shardMeshes are the meshes of the sharded test, taken in turn by seed:
// eight devices in one row, two rows of four and four rows of two.
var shardMeshes = []struct {
	shape []int
	names []string
}{
	{[]int{8}, []string{"x"}},
	{[]int{2, 4}, []string{"x", "y"}},
	{[]int{4, 2}, []string{"x", "y"}},
}

// shardMesh returns the mesh of seed; every fifth seed's lists the
// devices in a random order.
func shardMesh(seed uint64, rng *rand.Rand) *ir.Mesh {
	m := shardMeshes[seed%uint64(len(shardMeshes))]
	var devices []int
	if seed%5 == 4 {
		devices = rng.Perm(8)
	}
	mesh, err := ir.NewMesh(m.shape, m.names, devices...)
	if err != nil {
		panic(err)
	}
	return mesh
}

// randomSpec returns a random partition spec for an array of the given
// shape over m: each dimension, in random order, left whole, split over one
// mesh axis not used yet that divides it, or over two such axes whose
// product divides it; now and then the trailing whole dimensions left out
// (P("x") for a matrix).
func randomSpec(rng *rand.Rand, m *ir.Mesh, shape ir.Shape) ir.PartitionSpec {
	spec := make(ir.PartitionSpec, len(shape))
	free := m.AxisNames()
	for _, d := range rng.Perm(len(shape)) {
		var cands [][]string
		switch rng.IntN(6) {
		case 0: // whole
		case 1, 2, 3, 4:
			for _, a := range free {
				if shape[d]%m.AxisSize(a) == 0 {
					cands = append(cands, []string{a})
				}
			}
		case 5:
			for _, a := range free {
				for _, b := range free {
					if a != b && shape[d]%(m.AxisSize(a)*m.AxisSize(b)) == 0 {
						cands = append(cands, []string{a, b})
					}
				}
			}
		}
		if len(cands) == 0 {
			continue
		}
		pick := cands[rng.IntN(len(cands))]
		spec[d] = pick
		free = slices.DeleteFunc(free, func(a string) bool { return slices.Contains(pick, a) })
	}
	if rng.IntN(2) == 0 {
		for len(spec) > 0 && len(spec[len(spec)-1]) == 0 {
			spec = spec[:len(spec)-1]
		}
	}
	return spec
}

func randomSharding(rng *rand.Rand, m *ir.Mesh, shape ir.Shape) *ir.NamedSharding {
	s, err := ir.NewNamedSharding(m, randomSpec(rng, m, shape))
	if err != nil {
		panic(err) // randomSpec names every axis once
	}
	return s
}

// shardedFeatures is the generator mix of the sharded test: every family
// of ops, with dimensions the meshes divide (randprog's EvenDims), which
// newShardedCase turns off for every fourth seed.
func shardedFeatures() randprog.Features {
	f := randprog.All()
	f.EvenDims = true
	return f
}

// newShardedCase makes the sharded program of seed: the program of
// newCase's generator (randprog.New, every eighth seed a traced remat
// training step; every fourth seed without EvenDims, so that some
// dimensions are not divided by the mesh) with its parameters laid out at random over the seed's
// mesh (one in eight left unsharded for propagation to place, one in
// eight replicated, the others split where the mesh divides them), for half the seeds one to three op results annotated with
// a random sharding, and some function results constrained
// (sharding_constraint) to one.
func newShardedCase(seed uint64, feat randprog.Features) (*testCase, string, error) {
	if seed%4 == 3 {
		feat.EvenDims = false
	}
	c, desc, err := newCase(seed, feat)
	if err != nil {
		return nil, desc, err
	}
	c.opts, c.concurrent = passes.Options{}, 1
	clear(c.donated)
	rng := rand.New(rand.NewPCG(seed, 23))
	f, m := c.f, shardMesh(seed, rng)
	// The generator's sharding constraints are on one-device meshes: they
	// move to m, each with a random spec that fits its value, and region
	// parameters that took a constrained value's sharding lose it (a
	// function uses one mesh; propagation places them).
	f.Body.Walk(func(op *ir.Op) {
		if op.Code == ir.ShardingConstraint {
			s := randomSharding(rng, m, op.Args[0].Type.Shape)
			op.Attrs["sharding"] = s.String()
			op.Results[0].Type = op.Results[0].Type.WithSharding(s)
		}
		for _, r := range op.Regions {
			for _, p := range r.Params {
				if p.Type.Sharding != nil && !p.Type.Sharding.Mesh.Equal(m) {
					p.Type = p.Type.WithSharding(nil)
				}
			}
		}
	})
	sharded := false
	for _, p := range f.Body.Params {
		switch rng.IntN(8) {
		case 0: // unsharded: propagation lays it out
		case 1:
			p.Type = p.Type.WithSharding(ir.Replicated(m, p.Type.Rank()))
		default:
			p.Type = p.Type.WithSharding(randomSharding(rng, m, p.Type.Shape))
		}
		sharded = sharded || p.Type.Sharding != nil
	}
	if !sharded && len(f.Body.Params) > 0 {
		p := f.Body.Params[0]
		p.Type = p.Type.WithSharding(randomSharding(rng, m, p.Type.Shape))
	}
	if rng.IntN(2) == 0 {
		var vals []*ir.Value
		f.Body.Walk(func(op *ir.Op) {
			if op.Code != ir.ShardingConstraint { // its result has the constraint's sharding
				vals = append(vals, op.Results...)
			}
		})
		for range 1 + rng.IntN(3) {
			if len(vals) == 0 {
				break
			}
			v := vals[rng.IntN(len(vals))]
			old := v.Type
			v.Type = v.Type.WithSharding(randomSharding(rng, m, v.Type.Shape))
			if ir.Verify(f) != nil { // a region result whose type must match another's
				v.Type = old
			}
		}
	}
	for i, v := range f.Body.Results {
		if rng.IntN(4) > 0 {
			continue
		}
		s := randomSharding(rng, m, v.Type.Shape)
		op, err := f.Body.AddOp(ir.ShardingConstraint, []*ir.Value{v}, ir.Attrs{"sharding": s.String()})
		if err != nil {
			return nil, desc, fmt.Errorf("constraining result %d to %v: %w", i, s, err)
		}
		op.Results[0].Type = op.Results[0].Type.WithSharding(s)
		f.Body.Results[i] = op.Results[0]
	}
	if err := ir.Verify(f); err != nil {
		return nil, desc, fmt.Errorf("the sharded program does not verify: %w\n%s", err, f)
	}
	return c, desc, nil
}

// stripShardings drops the shardings of r's values, at every depth.
func stripShardings(r *ir.Region) {
	for _, v := range r.Params {
		v.Type = v.Type.WithSharding(nil)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			v.Type = v.Type.WithSharding(nil)
		}
		for _, sub := range op.Regions {
			stripShardings(sub)
		}
	}
}

// unsharded returns f without shardings: the global program eval runs.
func unsharded(f *ir.Func) *ir.Func {
	g := ir.Clone(f)
	stripShardings(g.Body)
	return g
}

// combines reports whether the per-device program f combines partial
// sums or products across devices (an all_reduce of "sum", a
// reduce_scatter, which always sums, or the gather and local product of a
// partial product): they then run in another order than the whole
// program's, and its float results are compared within fmaTol (see there
// for the bound). A max or min is the same in any order.
func combines(f *ir.Func) bool {
	found := false
	f.Body.Walk(func(op *ir.Op) {
		switch op.Code {
		case ir.AllReduce:
			found = found || op.Attrs.String("reduction") == "sum"
		case ir.ReduceScatter:
			found = true
		case ir.ReduceProd:
			if a := op.Args[0]; a.Op != nil && a.Op.Code == ir.AllGather {
				found = true
			}
		}
	})
	return found
}

// shardedTimeout bounds one sharded execution: devices that wait for each
// other forever (collectives that do not match) fail instead of hanging the
// test.
const shardedTimeout = 2 * time.Minute

// runSharded partitions c.f over its mesh, compiles the per-device program
// for the CPU backend (rt.CompileIR; contraction off), runs it on every
// device of the mesh on the arguments laid out as the parameters say
// (rt.DevicePut), assembles the global results from the devices' blocks
// (replicas must agree bit for bit) and compares them with eval on the
// unsharded program: bit for bit, or within fmaTol where the per-device
// program combines partial results. It returns the first failure; its
// stage says where.
func runSharded(c *testCase) (fail *failure) {
	defer func() {
		if r := recover(); r != nil {
			fail = &failure{internal: true, stage: "panic", msg: fmt.Sprintf("panic: %v\n%s", r, debug.Stack())}
		}
	}()
	internal := func(stage string, err error) *failure {
		return &failure{internal: true, stage: stage, msg: fmt.Sprintf("%s: %v", stage, err)}
	}
	args := make([]*ir.Literal, len(c.args))
	for i, a := range c.args {
		args[i] = a.Clone()
		args[i].Type = args[i].Type.WithSharding(nil)
	}
	want, err := eval.Run(unsharded(c.f), cloneAll(args))
	if err != nil {
		return internal("eval", err)
	}
	part, err := passes.Partition(c.f)
	if err != nil {
		return internal("partition", err)
	}
	prev := vmath.SetContract(false)
	comp, err := rt.CompileIR(c.f)
	vmath.SetContract(prev)
	if err != nil {
		return internal("compile", err)
	}
	got, fail := callSharded(comp, c.f, args)
	if fail != nil {
		return fail
	}
	global := make([]ir.Type, len(want))
	for i, w := range want {
		global[i] = w.Type
	}
	ref, err := spmdref.Eval(part, global, args, shardedTimeout)
	if err != nil {
		return internal("reference", err)
	}
	if err := compare(ref, got, 0); err != nil {
		return &failure{stage: "executor", msg: fmt.Sprintf("against eval of the per-device program: %v", err)}
	}
	tol := 0.0
	if combines(part.Func) {
		tol = fmaTol
	}
	if err := compare(want, got, tol); err != nil {
		if tol > 0 && discontinuous(c.f) {
			// Sums in another order through an op that is not
			// continuous (a bitcast, a comparison): the per-device
			// program's own reference agrees, which is all one can ask.
			c.orderSensitive = "an op that is not continuous"
			return nil
		}
		if tol > 0 && asAccurate(c.f, args, want, got, tol) == nil {
			// An ill-conditioned program (a chain of layers): the
			// sharded results are as close to the float64 program's
			// as the whole program's.
			c.orderSensitive = "as accurate as the whole program against float64"
			return nil
		}
		return &failure{stage: "mismatch", msg: fmt.Sprintf("tolerance %g: %v", tol, err)}
	}
	return nil
}

// asAccurate checks that got, the sharded results of f, are about as close
// to the results of f computed in float64 (every float dtype made f64) as
// want, the whole program's: within twice want's error plus tol·(1 +
// |exact|), element by element. It returns an error when they are not, or
// when f has no float64 version (a bitcast needs its element size).
func asAccurate(f *ir.Func, args, want, got []*ir.Literal, tol float64) error {
	g := unsharded(f)
	widen(g.Body)
	if err := ir.Verify(g); err != nil {
		return err
	}
	wide := make([]*ir.Literal, len(args))
	for i, a := range args {
		wide[i] = widenLiteral(a)
	}
	exact, err := eval.Run(g, wide)
	if err != nil {
		return err
	}
	for i := range want {
		if !want[i].Type.DType.IsFloat() {
			if err := compare(want[i:i+1], got[i:i+1], 0); err != nil {
				return err
			}
			continue
		}
		for j := range want[i].Type.Size() {
			e, w, g := exact[i].Float64At(j), want[i].Float64At(j), got[i].Float64At(j)
			if w == g || math.IsNaN(w) && math.IsNaN(g) {
				continue
			}
			if math.Abs(g-e) > 2*math.Abs(w-e)+tol*(1+math.Abs(e)) {
				return fmt.Errorf("result %d element %d: %v, the whole program %v, in float64 %v", i, j, g, w, e)
			}
		}
	}
	return nil
}

// widen makes every float value, constant and dtype attribute of r f64.
func widen(r *ir.Region) {
	fix := func(v *ir.Value) {
		if v.Type.DType.IsFloat() {
			v.Type.DType = ir.Float64
		}
	}
	for _, p := range r.Params {
		fix(p)
	}
	for _, op := range r.Ops {
		for _, v := range op.Results {
			fix(v)
		}
		if d, ok := op.Attrs["dtype"].(ir.DType); ok && d.IsFloat() {
			op.Attrs["dtype"] = ir.Float64
		}
		if l, ok := op.Attrs["value"].(*ir.Literal); ok && l.Type.DType.IsFloat() {
			op.Attrs["value"] = widenLiteral(l)
		}
		for _, sub := range op.Regions {
			widen(sub)
		}
	}
}

// widenLiteral returns l in f64 when it is a float literal, else l.
func widenLiteral(l *ir.Literal) *ir.Literal {
	if !l.Type.DType.IsFloat() {
		return l
	}
	t := l.Type
	t.DType = ir.Float64
	out := ir.NewLiteral(t)
	for i := range l.Type.Size() {
		out.SetFloat64At(i, l.Float64At(i))
	}
	return out
}

// discontinuous reports whether f has an op whose result can jump when its
// float operands change in the last bit: a rounding, a sign, a comparison,
// a bitcast, a conversion of a float to an integer, a sort or an arg-max,
// a rem, control flow on values.
func discontinuous(f *ir.Func) bool {
	found := false
	f.Body.Walk(func(op *ir.Op) { found = found || jumps(op) })
	return found
}

// jumps reports whether op's result can jump when its float operands change
// in the last bit (see discontinuous).
func jumps(op *ir.Op) bool {
	switch op.Code {
	case ir.Floor, ir.Ceil, ir.Round, ir.Sign, ir.BitcastConvert, ir.Sort, ir.ArgMax, ir.ArgMin, ir.Rem, ir.While, ir.Cond,
		ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge:
		return true
	case ir.Convert:
		return op.Args[0].Type.DType.IsFloat() && !op.Results[0].Type.DType.IsFloat()
	}
	return false
}

// throughJumps reports, for each result of f, whether it depends on an op
// that jumps (see jumps): through the op's results, an op with a region
// holding one, or a value a region reads from outside.
func throughJumps(f *ir.Func) []bool {
	dep := map[*ir.Value]bool{}
	for _, op := range f.Body.Ops {
		d := jumps(op)
		for _, a := range op.Args {
			d = d || dep[a]
		}
		for _, sub := range op.Regions {
			sub.Walk(func(in *ir.Op) {
				d = d || jumps(in)
				for _, a := range in.Args {
					d = d || dep[a]
				}
			})
		}
		for _, r := range op.Results {
			dep[r] = d
		}
	}
	out := make([]bool, len(f.Body.Results))
	for i, v := range f.Body.Results {
		out[i] = dep[v]
	}
	return out
}

// callSharded runs comp on args, each laid out as f's parameter says, and
// returns the global results assembled from every device's block.
func callSharded(comp *rt.Compiled, f *ir.Func, args []*ir.Literal) (got []*ir.Literal, fail *failure) {
	var arrays []*trace.Array
	defer func() {
		for _, a := range arrays {
			a.Delete()
		}
	}()
	internal := func(stage string, format string, a ...any) *failure {
		return &failure{internal: true, stage: stage, msg: stage + ": " + fmt.Sprintf(format, a...)}
	}
	in := make([]any, len(args))
	for i, l := range args {
		x, err := rt.FromLiteral(l)
		if err != nil {
			return nil, internal("arguments", "argument %d: %v", i, err)
		}
		arrays = append(arrays, x)
		if s := f.Body.Params[i].Type.Sharding; s != nil {
			if x, err = rt.DevicePut(x, s); err != nil {
				return nil, internal("arguments", "argument %d: %v", i, err)
			}
			arrays = append(arrays, x)
		}
		in[i] = x
	}
	type result struct {
		outs []any
		err  error
	}
	done := make(chan result, 1)
	go func() {
		outs, err := comp.Call(in...)
		done <- result{outs, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(shardedTimeout):
		arrays = nil // the call may still use them
		return nil, internal("execute", "no result after %v: devices waiting for each other?", shardedTimeout)
	}
	if r.err != nil {
		return nil, internal("execute", "%v", r.err)
	}
	for i, o := range r.outs {
		x := o.(*trace.Array)
		arrays = append(arrays, x)
		l, err := assemble(x)
		if err != nil {
			return nil, &failure{internal: true, stage: "replicas", msg: fmt.Sprintf("result %d (%v): %v", i, x.Type(), err)}
		}
		got = append(got, l)
	}
	return got, nil
}

// assemble builds the global array of x from its devices' blocks
// (rt.Shards), checking that the blocks cover it and that devices holding
// the same elements agree bit for bit.
func assemble(x *trace.Array) (*ir.Literal, error) {
	t := x.Type()
	out := ir.NewLiteral(t.WithSharding(nil))
	es := t.DType.Size()
	seen := make([]bool, t.Size())
	owner := make([]int, t.Size())
	shards, err := rt.Shards(x)
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		l, err := sh.Array.Literal()
		if err != nil {
			return nil, fmt.Errorf("block on %v: %w", sh.Device, err)
		}
		for d := range sh.Start {
			if l.Type.Shape[d] != sh.Limit[d]-sh.Start[d] {
				return nil, fmt.Errorf("block on %v is %v for the range %v:%v", sh.Device, l.Type, sh.Start, sh.Limit)
			}
		}
		var bad error
		spmdref.ForBlock(sh.Start, sh.Limit, t.Shape, func(j, at int) {
			b := l.Data[j*es : (j+1)*es]
			if !seen[at] {
				seen[at], owner[at] = true, sh.Device.ID
				copy(out.Data[at*es:], b)
			} else if bad == nil && !bytes.Equal(out.Data[at*es:(at+1)*es], b) {
				bad = fmt.Errorf("element %d: cpu:%d has %v, cpu:%d has %v", at, sh.Device.ID, l.Float64At(j), owner[at], out.Float64At(at))
			}
		})
		if bad != nil {
			return nil, bad
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		return nil, fmt.Errorf("no device holds element %d", i)
	}
	return out, nil
}

// shardedValues lists the values of f with a sharding: parameters, then op
// results in walk order.
func shardedValues(f *ir.Func) []*ir.Value {
	var out []*ir.Value
	for _, p := range f.Body.Params {
		if p.Type.Sharding != nil {
			out = append(out, p)
		}
	}
	f.Body.Walk(func(op *ir.Op) {
		for _, v := range op.Results {
			if v.Type.Sharding != nil {
				out = append(out, v)
			}
		}
	})
	return out
}

// unshard drops the shardings of c's values one at a time while same
// holds.
func unshard(c *testCase, same func(*testCase) bool) *testCase {
	for i := 0; i < len(shardedValues(c.f)); {
		n := c.clone()
		v := shardedValues(n.f)[i]
		v.Type = v.Type.WithSharding(nil)
		if ir.Verify(n.f) == nil && same(n) {
			c = n
			continue
		}
		i++
	}
	return c
}

// minimizeSharded shrinks c (shrink, then unshard) while it fails at the
// same stage.
func minimizeSharded(c *testCase, fail *failure) *testCase {
	same := func(n *testCase) bool {
		f := runSharded(n)
		return f != nil && f.stage == fail.stage
	}
	return unshard(shrink(c, same), same)
}

// describeSharded prints a sharded case: the mesh, the parameters' layouts,
// the global program, the per-device program and the arguments.
func describeSharded(c *testCase) string {
	var b strings.Builder
	if vals := shardedValues(c.f); len(vals) > 0 {
		fmt.Fprintf(&b, "mesh: %v\n", vals[0].Type.Sharding.Mesh)
	}
	for i, p := range c.f.Body.Params {
		fmt.Fprintf(&b, "parameter %d: %v\n", i, p.Type.Sharding)
	}
	fmt.Fprintf(&b, "global program:\n%s", c.f)
	if part, err := passes.Partition(c.f); err != nil {
		fmt.Fprintf(&b, "partition: %v\n", err)
	} else {
		fmt.Fprintf(&b, "per-device program (results laid out as %v):\n%s", part.Results, part.Func)
	}
	writeArgs(&b, c.args)
	return b.String()
}

// TestShardedRandom is the sharded mode of the differential test: random
// programs whose parameters (and some op results and function results)
// have random shardings over an 8-device mesh ([8], [2,4] or [4,2], by
// seed), partitioned (passes.Partition), compiled for the CPU backend and
// run on its 8 virtual devices, against eval on the unsharded program. See
// the package documentation for its environment.
func TestShardedRandom(t *testing.T) {
	n := envInt(t, settings.ShardedPrograms, 60)
	if testing.Short() && !settings.ShardedPrograms.IsSet() {
		n = 20
	}
	first := envInt(t, settings.RandomSeed, 1)
	feat, err := randprog.ParseFeatures(shardedFeatures(), settings.RandomFeatures.Get())
	if err != nil {
		t.Fatalf("FERRY_RANDOM_FEATURES: %v", err)
	}
	var mismatches, internal, combined, orderSensitive, shown int
	for seed := first; seed < first+n; seed++ {
		c, desc, err := newShardedCase(seed, feat)
		if err != nil {
			internal++
			t.Errorf("seed %d: generating: %v", seed, err)
			continue
		}
		fail := runSharded(c)
		if fail == nil {
			if part, err := passes.Partition(c.f); err == nil && combines(part.Func) {
				combined++
			}
			if c.orderSensitive != "" {
				orderSensitive++
				t.Logf("seed %d: results beyond the tolerance through sums in another order (%s); the per-device program's eval agrees bit for bit", seed, c.orderSensitive)
			}
			continue
		}
		if fail.internal {
			internal++
		} else {
			mismatches++
		}
		msg := fmt.Sprintf("FERRY_RANDOM_SEED=%d FERRY_SHARDED_PROGRAMS=1 FERRY_RANDOM_FEATURES=%s: %v\nprogram: %s\n%s", seed, feat, fail, desc, describeSharded(c))
		if shown < 5 {
			shown++
			small := minimizeSharded(c, fail)
			msg += fmt.Sprintf("\nsmaller reproduction (%v):\n%s", runSharded(small), describeSharded(small))
		}
		t.Error(msg)
	}
	t.Logf("%d sharded programs (seeds %d..%d; %d combining partial sums across devices, %d of them off by more than the tolerance, explained), features %s: %d mismatches, %d internal errors",
		n, first, first+n-1, combined, orderSensitive, feat, mismatches, internal)
}

// asAccurate accepts sharded results about as far from the float64
// program's as the whole program's, on either side, and refuses results
// further off or other integers.
func TestAsAccurate(t *testing.T) {
	f, err := ir.Parse(`func @f(%0: f32[4096]) -> (f32[], i32[]) {
  %1 = reduce_sum(%0) {axes=[0]} : f32[]
  %2 = constant() {value=dense<i32[], 7>} : i32[]
  return %1, %2
}`)
	if err != nil {
		t.Fatal(err)
	}
	// Small integers: the float64 sum is exact, and so are the f32 values
	// a few units from it.
	rng := testseed.Rand(t, 5)
	x := ir.NewLiteral(f.Body.Params[0].Type)
	exact := 0.0
	for i := range x.Type.Size() {
		v := float64(rng.IntN(1000))
		x.SetFloat64At(i, v)
		exact += v
	}
	results := func(sum float64, n int32) []*ir.Literal {
		l := ir.NewLiteral(f.Body.Results[0].Type)
		l.SetFloat64At(0, sum)
		return []*ir.Literal{l, ir.Scalar(n)}
	}
	args := []*ir.Literal{x}
	want := results(exact+4, 7) // the whole program 4 off
	if err := asAccurate(f, args, want, results(exact-6, 7), 0); err != nil {
		t.Errorf("6 off the other way: %v", err)
	}
	if err := asAccurate(f, args, want, results(exact+12, 7), 0); err == nil {
		t.Error("12 off accepted")
	}
	if err := asAccurate(f, args, want, results(exact+4, 8), 0); err == nil {
		t.Error("another integer result accepted")
	}
}

// A reduce_scatter sums partial results across devices as an all_reduce of
// "sum" does: both are compared within the tolerance; gathers and max
// reductions are exact in any order.
func TestCombines(t *testing.T) {
	for _, c := range []struct {
		op   string
		want bool
	}{
		{`reduce_scatter(%0) {axis="x", dimension=0, size=2, tiled=true} : f32[2]`, true},
		{`all_reduce(%0) {axis="x", reduction="sum", size=2} : f32[4]`, true},
		{`all_reduce(%0) {axis="x", reduction="max", size=2} : f32[4]`, false},
		{`all_gather(%0) {axis="x", dimension=0, size=2, tiled=true} : f32[8]`, false},
	} {
		typ := c.op[strings.LastIndex(c.op, ": ")+2:]
		f, err := ir.Parse("func @f(%0: f32[4]) -> (" + typ + ") {\n  %1 = " + c.op + "\n  return %1\n}")
		if err != nil {
			t.Fatalf("%s: %v", c.op, err)
		}
		if got := combines(f); got != c.want {
			t.Errorf("combines(%s) = %v, want %v", c.op, got, c.want)
		}
	}
}

// Contraction may change a result through a bitcast beyond any tolerance;
// only such results are spared the tolerance, the others are still held
// to it.
func TestThroughJumps(t *testing.T) {
	f, err := ir.Parse(`func @f(%0: f32[2], %1: f32[2]) -> (f32[2], i32[2], f32[2]) {
  %2 = mul(%0, %1) : f32[2]
  %3 = add(%2, %0) : f32[2]
  %4 = bitcast_convert(%3) {dtype=i32} : i32[2]
  %5 = bitcast_convert(%4) {dtype=f32} : f32[2]
  return %3, %4, %5
}`)
	if err != nil {
		t.Fatal(err)
	}
	skip := throughJumps(f)
	if want := []bool{false, true, true}; !slices.Equal(skip, want) {
		t.Fatalf("throughJumps = %v, want %v", skip, want)
	}
	lit := func(dt ir.DType, vs ...float64) *ir.Literal {
		l := ir.NewLiteral(ir.TypeOf(dt, len(vs)))
		for i, v := range vs {
			l.SetFloat64At(i, v)
		}
		return l
	}
	want := []*ir.Literal{lit(ir.Float32, 1, 2), lit(ir.Int32, 1065353216, 7), lit(ir.Float32, 1, 2)}
	// The bitcast results one unit in the last place off: beyond any
	// tolerance for the integers, spared.
	got := []*ir.Literal{lit(ir.Float32, 1, 2), lit(ir.Int32, 1065353217, 7), lit(ir.Float32, 1.0000001, 2)}
	if err := compare(want, got, fmaTol); err == nil {
		t.Fatal("compare accepted an integer one off")
	}
	if err := compareExcept(want, got, fmaTol, skip); err != nil {
		t.Fatalf("the results through a bitcast are not spared: %v", err)
	}
	// A result that does not go through one is still held to the
	// tolerance.
	got[0] = lit(ir.Float32, 1.1, 2)
	if err := compareExcept(want, got, fmaTol, skip); err == nil {
		t.Fatal("a float result off by 10% was accepted")
	}
}
