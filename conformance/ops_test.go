package conformance

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	rt "github.com/ferryml/ferry/runtime"
	"github.com/ferryml/ferry/trace"
)

// opCase is one op case of testdata/ops.jsonl.gz.
type opCase struct {
	Name  string                     `json:"name"`
	Op    string                     `json:"op"`
	Attrs map[string]json.RawMessage `json:"attrs"`
	Cmp   string                     `json:"cmp"` // "exact" or "ulp"
	JAX   string                     `json:"jax"` // the jax.lax function that made the outputs
	Args  []goldenArray              `json:"args"`
	Outs  []goldenArray              `json:"outs"`
}

type opsMeta struct {
	JAX         string `json:"jax"`
	Unsupported []struct {
		Name, Op, Key, Error string
	} `json:"unsupported"`
}

// excluded lists the op codes without golden cases, each with the reason.
var excluded = map[ir.Code]string{
	// Region ops: their bodies are ordinary ops (checked here); the loop and
	// branch semantics are checked against float64 references by the
	// control-flow tests of trace, internal/eval and cpu/cpuexec, and
	// their gradients by the gradient goldens.
	ir.Scan:  "region op (lax.scan): control-flow tests in trace, internal/eval, cpu/cpuexec",
	ir.While: "region op (lax.while_loop): control-flow tests in trace, internal/eval, cpu/cpuexec",
	ir.Cond:  "region op (lax.cond): control-flow tests in trace, internal/eval, cpu/cpuexec",
	// Fusion groups are made by the compiler (passes) out of the ops checked
	// here; user programs never contain them, and JAX has no counterpart.
	ir.Fusion: "compiler-made group of checked ops; no JAX primitive (every rt.Jit run here goes through it)",
	// Collectives have a meaning only where their axis is bound (a Vmap
	// with that AxisName now, a ShardMap later): a one-op program of one
	// has none, so they have no per-op golden. The gradient goldens'
	// programs vmap_collectives, vmap_grad_collectives and vmap_minmax
	// check them under jax.vmap with an axis name, and trace's Vmap tests
	// against loops over the examples.
	ir.AllReduce:         "collective (lax.psum/pmax/pmin): only under a bound axis; Vmap tests in trace",
	ir.AllGather:         "collective (lax.all_gather): only under a bound axis; Vmap tests in trace",
	ir.ReduceScatter:     "collective (lax.psum_scatter): only under a bound axis; Vmap tests in trace",
	ir.AllToAll:          "collective (lax.all_to_all): only under a bound axis; Vmap tests in trace",
	ir.CollectivePermute: "collective (lax.ppermute): only under a bound axis; Vmap tests in trace",
	ir.AxisIndex:         "collective (lax.axis_index): only under a bound axis; Vmap tests in trace",
}

// ulpBound is the largest distance in ulps from JAX's result allowed for the
// ops compared in ulps ("cmp":"ulp": transcendental functions, float sums,
// products and matrix products of random positive values), per op and dtype.
// f16 and bf16 are computed in float32 and rounded by both, so they agree to
// within one ulp of the 16-bit type. JAX's own values of these ops may
// differ between CPUs (gen.py --check allows it per op, CHECK_ULPS); the
// bounds hold against the goldens of either host measured (AVX2 and
// AVX-512: f64 rsqrt 0 and 1 ulp, f32 dot_general 1 and 3). The "exact"
// cases, compared bit for bit here, are bit for bit in the check too.
func ulpBound(op string, dt ir.DType) int64 {
	if dt == ir.Float16 || dt == ir.BFloat16 {
		if op == "reduce_prod" || op == "reduce_sum" || op == "dot_general" {
			// XLA rounds each partial result to the 16-bit type; Ferry
			// accumulates in float32 or float64 and rounds once.
			return 8
		}
		return 1
	}
	switch op {
	case "reduce_sum", "reduce_prod", "dot_general":
		// Different summation orders (XLA's vectorised loops against
		// Ferry's float64 or blocked float32 accumulation) on 40-64
		// positive terms.
		return 8
	case "pow":
		return 4
	}
	return 3
}

// knownDiff is a documented place where Ferry differs from JAX: mismatching
// elements of the cases whose name starts with Case, at which Elem (given the
// case's arguments, Ferry's and JAX's result) is true, are reported instead
// of failing.
type knownDiff struct {
	Case string
	Elem func(args []*ir.Literal, got, want *ir.Literal, i int) bool
	Why  string
}

var knownDiffs = []knownDiff{
	{Case: "", Elem: subnormalInvolved, Why: "XLA:CPU (so JAX on CPU) flushes f32/f64/bf16 subnormal inputs and results to zero (FTZ/DAZ); " +
		"Ferry keeps IEEE 754 gradual underflow. Only elements where an input of the same shape is subnormal, or where " +
		"one side's result is subnormal and the other's is zero"},
	{Case: "sort/", Elem: zeroClass, Why: "XLA:CPU sorts with subnormals flushed, so ±0 and all subnormals compare equal and keep " +
		"their input order (stable); Ferry orders subnormals by value (-0 and +0 equal in both). Only elements where both " +
		"results are ±0 or subnormal"},
	{Case: "max/", Elem: opposedZeros, Why: "max(+0, -0): XLA orders -0 below +0 and returns +0 (min returns -0); Ferry returns " +
		"the second operand when the operands compare equal (eval, vmath kernels, CUDA codegen alike)"},
	{Case: "min/", Elem: opposedZeros, Why: "min(-0, +0): XLA orders -0 below +0 and returns -0; Ferry returns the second operand " +
		"when the operands compare equal"},
	{Case: "sin/f64", Elem: hugeInput, Why: "sin f64 beyond 2^63: Go's math.Sin (Ferry's f64 kernel) is 25 ulps off at ±MaxFloat64 " +
		"(0.004961954789184084); XLA, like glibc, gives the correctly rounded 0.004961954789184062"},
	{Case: "pow/f64", Elem: largeULP(64), Why: "pow f64: Go's math.Pow (Ferry's f64 path) is not correctly rounded; its error grows " +
		"with |y·log2 x| (18 ulps at 0.001^100, where XLA is within 1); up to 64 ulps tolerated"},
}

// zeroClass: both results at i are ±0 or subnormal.
func zeroClass(_ []*ir.Literal, got, want *ir.Literal, i int) bool {
	z := func(l *ir.Literal) bool {
		return l.Type.DType.IsFloat() && (l.Float64At(i) == 0 || isSubnormal(l, i))
	}
	return z(got) && z(want)
}

// opposedZeros: the two operands at i are zeros of opposite sign.
func opposedZeros(args []*ir.Literal, _, _ *ir.Literal, i int) bool {
	if len(args) != 2 || !args[0].Type.DType.IsFloat() {
		return false
	}
	a, b := args[0].Float64At(i), args[1].Float64At(i)
	return a == 0 && b == 0 && math.Signbit(a) != math.Signbit(b)
}

// hugeInput: the operand at i is beyond ±2^63.
func hugeInput(args []*ir.Literal, _, _ *ir.Literal, i int) bool {
	return math.Abs(args[0].Float64At(i)) > 0x1p63
}

// largeULP allows up to n ulps.
func largeULP(n int64) func([]*ir.Literal, *ir.Literal, *ir.Literal, int) bool {
	return func(_ []*ir.Literal, got, want *ir.Literal, i int) bool { return ulpDist(got, want, i) <= n }
}

// isSubnormal reports whether element i of l is a nonzero float below the
// smallest normal of its dtype (f16 excluded: XLA computes f16 in f32, where
// f16's subnormals are normal, and keeps them).
func isSubnormal(l *ir.Literal, i int) bool {
	dt := l.Type.DType
	if !dt.IsFloat() || dt == ir.Float16 {
		return false
	}
	v := math.Abs(l.Float64At(i))
	tiny := 0x1p-126 // f32 and bf16
	if dt == ir.Float64 {
		tiny = 0x1p-1022
	}
	return v != 0 && v < tiny
}

// subnormalInvolved: an elementwise input at i is subnormal, or one result
// is subnormal where the other is ±0 (reductions, dot products).
func subnormalInvolved(args []*ir.Literal, got, want *ir.Literal, i int) bool {
	for _, a := range args {
		if a.Type.Shape.Equal(want.Type.Shape) && isSubnormal(a, i) {
			return true
		}
	}
	zero := func(l *ir.Literal) bool { return l.Type.DType.IsFloat() && l.Float64At(i) == 0 }
	return isSubnormal(got, i) && zero(want) || isSubnormal(want, i) && zero(got)
}

// decodeAttrs converts a case's attributes to ir.Attrs by the kinds in the
// op table.
func decodeAttrs(code ir.Code, raw map[string]json.RawMessage) (ir.Attrs, error) {
	attrs := ir.Attrs{}
	specs := map[string]ir.AttrKind{}
	for _, s := range code.Info().Attrs {
		specs[s.Name] = s.Kind
	}
	for k, v := range raw {
		kind, ok := specs[k]
		if !ok {
			return nil, fmt.Errorf("%v has no attribute %q", code, k)
		}
		var err error
		switch kind {
		case ir.AttrInt:
			var x int
			err = json.Unmarshal(v, &x)
			attrs[k] = x
		case ir.AttrInts:
			x := []int{}
			err = json.Unmarshal(v, &x)
			attrs[k] = x
		case ir.AttrBool:
			var x bool
			err = json.Unmarshal(v, &x)
			attrs[k] = x
		case ir.AttrFloat:
			var x float64
			err = json.Unmarshal(v, &x)
			attrs[k] = x
		case ir.AttrString:
			var x string
			err = json.Unmarshal(v, &x)
			attrs[k] = x
		case ir.AttrDType:
			var s string
			if err = json.Unmarshal(v, &s); err == nil {
				attrs[k], err = ir.ParseDType(s)
			}
		case ir.AttrSpace:
			var s string
			if err = json.Unmarshal(v, &s); err == nil {
				attrs[k], err = ir.ParseMemorySpace(s)
			}
		case ir.AttrLiteral:
			var g goldenArray
			if err = json.Unmarshal(v, &g); err == nil {
				attrs[k], err = g.literal()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %v", k, err)
		}
	}
	return attrs, nil
}

func cloneAttrs(a ir.Attrs) ir.Attrs {
	out := ir.Attrs{}
	for k, v := range a {
		out[k] = v
	}
	return out
}

// runEval runs the one-op function through the reference executor. A
// sharding_constraint's result carries its sharding, as the tracer gives it.
func runEval(code ir.Code, attrs ir.Attrs, args []*ir.Literal) ([]*ir.Literal, error) {
	f := ir.NewFunc(code.String())
	var ps []*ir.Value
	for _, a := range args {
		ps = append(ps, f.Body.AddParam(a.Type))
	}
	op, err := f.Body.AddOp(code, ps, cloneAttrs(attrs))
	if err != nil {
		return nil, err
	}
	op.Loc = "conformance"
	if code == ir.ShardingConstraint {
		s, err := ir.ConstraintSharding(op)
		if err != nil {
			return nil, err
		}
		op.Results[0].Type = op.Results[0].Type.WithSharding(s)
	}
	f.Body.Results = op.Results
	return eval.Run(f, args)
}

// opFunc returns the function that applies code to its operands the way a
// user reaches it: sharding_constraint through trace.WithShardingConstraint
// (its result carries the sharding, so that rt.Jit partitions the function
// over the sharding's mesh — here of one device — and eagerly it is a
// rt.DevicePut onto that mesh), every other op through trace.Apply.
func opFunc(code ir.Code, attrs ir.Attrs) (func(xs []*trace.Array) []*trace.Array, error) {
	if code == ir.ShardingConstraint {
		s, err := ir.ParseSharding(attrs.String("sharding"))
		if err != nil {
			return nil, err
		}
		return func(xs []*trace.Array) []*trace.Array {
			return []*trace.Array{trace.WithShardingConstraint(xs[0], s)}
		}, nil
	}
	return func(xs []*trace.Array) []*trace.Array { return trace.Apply(code, cloneAttrs(attrs), nil, xs...) }, nil
}

// runJit runs the op through rt.Jit on the default (CPU) backend: traced,
// compiled by the pass pipeline and executed by the compiled code.
func runJit(code ir.Code, attrs ir.Attrs, args []*ir.Literal) (out []*ir.Literal, err error) {
	defer trace.Recover(&err)
	xs := make([]*trace.Array, len(args))
	for i, a := range args {
		if xs[i], err = rt.FromLiteral(a); err != nil {
			return nil, err
		}
	}
	fn, err := opFunc(code, attrs)
	if err != nil {
		return nil, err
	}
	j := rt.NewJitted(fn, rt.WithName(code.String()))
	res, err := j.Call(xs)
	if err != nil {
		return nil, err
	}
	if st := j.Stats(); st.Misses != 1 {
		return nil, fmt.Errorf("rt.Jit compiled %d times, want once", st.Misses)
	}
	for _, r := range res[0].([]*trace.Array) {
		l, err := r.Literal()
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// ulpStat is the largest ulp distance seen for one op, dtype and path.
type ulpStat struct {
	op, dtype, path string
	max             int64
	n               int
}

// knownHits counts the elements each knownDiffs entry excused, with the
// cases and one example.
type knownHits struct {
	elems   int
	cases   map[string]bool
	example string
}

// compareOuts compares got with want; it returns the mismatching elements
// outside knownDiffs (as messages), counts the known ones in hits, and
// records ulp distances in stats.
func compareOuts(c *opCase, path string, args, got, want []*ir.Literal, stats map[string]*ulpStat, hits map[int]*knownHits) (bad []string) {
	if len(got) != len(want) {
		return []string{fmt.Sprintf("%d results, JAX has %d", len(got), len(want))}
	}
	for r := range want {
		g, w := got[r], want[r]
		if g.Type.DType != w.Type.DType || !g.Type.Shape.Equal(w.Type.Shape) {
			bad = append(bad, fmt.Sprintf("result %d is %v%v, JAX's is %v%v", r, g.Type.DType, g.Type.Shape, w.Type.DType, w.Type.Shape))
			continue
		}
		ulp := c.Cmp == "ulp" && w.Type.DType.IsFloat()
		var st *ulpStat
		if ulp {
			key := c.Op + "/" + w.Type.DType.String() + "/" + path
			if st = stats[key]; st == nil {
				st = &ulpStat{op: c.Op, dtype: w.Type.DType.String(), path: path}
				stats[key] = st
			}
		}
		bound := ulpBound(c.Op, w.Type.DType)
		for i := 0; i < w.Type.Size(); i++ {
			ok := sameElem(g, w, i)
			var d int64
			if ulp {
				d = ulpDist(g, w, i)
				ok = d <= bound
			}
			msg := func() string {
				return fmt.Sprintf("result %d element %d: got %s, JAX %s (inputs %s)", r, i, elemString(g, i), elemString(w, i), inputsAt(args, w, i))
			}
			if !ok {
				if k := findKnown(c.Name, args, g, w, i); k >= 0 {
					h := hits[k]
					if h == nil {
						h = &knownHits{cases: map[string]bool{}, example: c.Name + " [" + path + "]: " + msg()}
						hits[k] = h
					}
					h.elems++
					h.cases[c.Name] = true
					continue
				}
				bad = append(bad, msg())
			}
			if ulp {
				// The measured maximum is over the elements that are not
				// known differences.
				st.max = max(st.max, d)
				st.n++
			}
		}
	}
	return bad
}

// inputsAt formats the argument elements an elementwise result element i
// came from (or nothing for other ops).
func inputsAt(args []*ir.Literal, out *ir.Literal, i int) string {
	var s []string
	for _, a := range args {
		if a.Type.Shape.Equal(out.Type.Shape) {
			s = append(s, elemString(a, i))
		}
	}
	return strings.Join(s, ", ")
}

// findKnown returns the index of the knownDiffs entry that excuses element
// i of a case, or -1.
func findKnown(name string, args []*ir.Literal, got, want *ir.Literal, i int) int {
	for k, kd := range knownDiffs {
		if strings.HasPrefix(name, kd.Case) && kd.Elem(args, got, want, i) {
			return k
		}
	}
	return -1
}

func loadOps(t *testing.T) (*opsMeta, []*opCase) {
	meta := new(opsMeta)
	cases := readGolden[opCase](t, "ops.jsonl.gz", meta)
	if len(cases) == 0 {
		t.Fatal("ops.jsonl.gz has no cases")
	}
	return meta, cases
}

// TestOpsMatchJAX runs every golden op case through the reference executor
// and rt.Jit and compares with JAX.
func TestOpsMatchJAX(t *testing.T) {
	meta, cases := loadOps(t)
	t.Logf("golden cases from JAX %s: %d", meta.JAX, len(cases))
	if be := rt.DefaultBackend().Name(); be != "cpu" {
		t.Fatalf("rt.Jit would run on the %s backend; these goldens check the CPU backend", be)
	}
	stats := map[string]*ulpStat{}
	hits := map[int]*knownHits{}
	for _, c := range cases {
		code, ok := ir.LookupCode(c.Op)
		if !ok {
			t.Errorf("%s: Ferry has no op %q", c.Name, c.Op)
			continue
		}
		attrs, err := decodeAttrs(code, c.Attrs)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		args, err := literals(c.Args)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		want, err := literals(c.Outs)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		for _, path := range []string{"eval", "jit"} {
			run := runEval
			if path == "jit" {
				run = runJit
			}
			got, err := run(code, attrs, args)
			if err != nil {
				t.Errorf("%s [%s]: %v", c.Name, path, err)
				continue
			}
			bad := compareOuts(c, path, args, got, want, stats, hits)
			for n, b := range bad {
				if n == 4 {
					t.Errorf("%s [%s]: ... %d mismatching elements in all", c.Name, path, len(bad))
					break
				}
				t.Errorf("%s [%s] (jax.lax.%s): %s", c.Name, path, c.JAX, b)
			}
		}
	}
	logULPTable(t, stats)
	t.Logf("known differences from JAX (knownDiffs), elements excused over both paths:")
	for k, kd := range knownDiffs {
		h := hits[k]
		if h == nil {
			t.Errorf("knownDiffs[%d] (%s...) excused nothing: remove it", k, kd.Case)
			continue
		}
		names := make([]string, 0, len(h.cases))
		for n := range h.cases {
			names = append(names, n)
		}
		sort.Strings(names)
		if len(names) > 6 {
			names = append(names[:6], fmt.Sprintf("... (%d cases)", len(h.cases)))
		}
		t.Logf("- %s\n    %d elements in %s\n    e.g. %s", kd.Why, h.elems, strings.Join(names, ", "), h.example)
	}
}

// logULPTable prints the measured maximum ulp distance from JAX per op and
// dtype, for the reference executor and rt.Jit, beside the bound.
func logULPTable(t *testing.T, stats map[string]*ulpStat) {
	type row struct {
		op, dtype string
		eval, jit int64
		n         int
	}
	rows := map[string]*row{}
	for _, s := range stats {
		k := s.op + "/" + s.dtype
		r := rows[k]
		if r == nil {
			r = &row{op: s.op, dtype: s.dtype}
			rows[k] = r
		}
		if s.path == "jit" {
			r.jit = s.max
		} else {
			r.eval, r.n = s.max, s.n
		}
	}
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t.Logf("ulps from JAX (cmp=ulp cases; known differences excluded):")
	t.Logf("%-12s %-5s %9s %9s %6s %9s", "op", "dtype", "eval max", "jit max", "bound", "elements")
	for _, k := range keys {
		r := rows[k]
		dt, _ := ir.ParseDType(r.dtype)
		t.Logf("%-12s %-5s %9d %9d %6d %9d", r.op, r.dtype, r.eval, r.jit, ulpBound(r.op, dt), r.n)
	}
}

func literals(gs []goldenArray) ([]*ir.Literal, error) {
	out := make([]*ir.Literal, len(gs))
	for i, g := range gs {
		l, err := g.literal()
		if err != nil {
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}
