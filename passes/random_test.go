package passes_test

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
	"github.com/stretchr/testify/require"
)

// progGen builds random, well-typed programs: elementwise unary and binary
// ops, comparisons and selects, constants (0, 1, -0 and others, to feed the
// canonicaliser and the folder), broadcasts, reshapes, transposes, slices,
// reductions, dot_general, converts, device_put, and scans with consts,
// carries and xs (and sometimes a cond), over f32 and i32 arrays of small
// random shapes.
type progGen struct {
	rng   *rand.Rand
	f     *ir.Func
	depth int
	// Budget of ops left for the whole program.
	budget int
}

// scope is the region being built and the values visible in it.
type scope struct {
	g    *progGen
	r    *ir.Region
	vals []*ir.Value
}

func newProgram(seed uint64) *ir.Func {
	g := &progGen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), budget: 12 + int(seed%40)}
	g.f = ir.NewFunc(fmt.Sprintf("rand%d", seed))
	s := &scope{g: g, r: g.f.Body}
	np := 1 + g.rng.IntN(4)
	for range np {
		t := g.randType()
		if g.rng.IntN(8) == 0 {
			t = t.WithSpace(ir.PinnedHost)
		}
		s.vals = append(s.vals, s.r.AddParam(t))
	}
	s.fill(g.budget)
	s.r.Results = s.pickResults(true)
	return g.f
}

func (g *progGen) randDType() ir.DType {
	if g.rng.IntN(3) == 0 {
		return ir.Int32
	}
	return ir.Float32
}

func (g *progGen) randShape() ir.Shape {
	r := g.rng.IntN(4)
	s := make(ir.Shape, r)
	for i := range s {
		s[i] = 1 + g.rng.IntN(4)
	}
	return s
}

func (g *progGen) randType() ir.Type { return ir.Type{DType: g.randDType(), Shape: g.randShape()} }

// add appends an op, or returns nil when the shape rule rejects it.
func (s *scope) add(code ir.Code, args []*ir.Value, attrs ir.Attrs, regions ...*ir.Region) []*ir.Value {
	op, err := s.r.AddOp(code, args, attrs, regions...)
	if err != nil {
		return nil
	}
	s.g.budget--
	s.vals = append(s.vals, op.Results...)
	return op.Results
}

func (s *scope) add1(code ir.Code, args []*ir.Value, attrs ir.Attrs) *ir.Value {
	if res := s.add(code, args, attrs); len(res) == 1 {
		return res[0]
	}
	return nil
}

// pick returns a random visible value on the device (most of the time the
// most recent ones, so that chains form).
func (s *scope) pick() *ir.Value {
	n := len(s.vals)
	if s.g.rng.IntN(3) > 0 && n > 3 {
		return s.vals[n-1-s.g.rng.IntN(3)]
	}
	return s.vals[s.g.rng.IntN(n)]
}

func (s *scope) pickWhere(ok func(*ir.Value) bool) *ir.Value {
	var c []*ir.Value
	for _, v := range s.vals {
		if ok(v) {
			c = append(c, v)
		}
	}
	if len(c) == 0 {
		return nil
	}
	if s.g.rng.IntN(2) == 0 {
		return c[len(c)-1]
	}
	return c[s.g.rng.IntN(len(c))]
}

// constant makes a scalar constant of dtype dt, often an identity element.
func (s *scope) constant(dt ir.DType) *ir.Value {
	vals := []float64{0, 1, -1, 2, 0.5, 3}
	x := vals[s.g.rng.IntN(len(vals))]
	l := ir.NewLiteral(ir.Type{DType: dt, Shape: ir.Shape{}})
	l.SetFloat64At(0, x)
	if dt.IsFloat() && x == 0 && s.g.rng.IntN(2) == 0 {
		l.SetFloat64At(0, math.Copysign(0, -1))
	}
	return s.add1(ir.Constant, nil, ir.Attrs{"value": l})
}

// like returns a value of type t: an existing one, a broadcast of a scalar
// constant, or a broadcast of a lower-rank value.
func (s *scope) like(t ir.Type) *ir.Value {
	t = t.WithSpace(ir.Device)
	if v := s.pickWhere(func(v *ir.Value) bool { return v.Type.Equal(t) }); v != nil && s.g.rng.IntN(3) > 0 {
		return v
	}
	if s.g.rng.IntN(2) == 0 {
		// A small non-scalar constant.
		if t.Size() <= 8 && s.g.rng.IntN(3) == 0 {
			return s.add1(ir.Constant, nil, ir.Attrs{"value": randomLiteral(s.g.rng, t)})
		}
		c := s.constant(t.DType)
		if t.Rank() == 0 {
			return c
		}
		return s.add1(ir.BroadcastInDim, []*ir.Value{c}, ir.Attrs{"shape": t.Shape.Clone(), "dims": []int{}})
	}
	// Broadcast a value whose shape is a suffix of t's.
	for k := 0; k <= t.Rank(); k++ {
		suffix := t.Shape[k:]
		if v := s.pickWhere(func(v *ir.Value) bool {
			return v.Type.DType == t.DType && v.Type.Space == ir.Device && v.Type.Shape.Equal(suffix)
		}); v != nil {
			if k == 0 {
				return v
			}
			dims := make([]int, len(suffix))
			for i := range dims {
				dims[i] = k + i
			}
			return s.add1(ir.BroadcastInDim, []*ir.Value{v}, ir.Attrs{"shape": t.Shape.Clone(), "dims": dims})
		}
	}
	c := s.constant(t.DType)
	if t.Rank() == 0 {
		return c
	}
	return s.add1(ir.BroadcastInDim, []*ir.Value{c}, ir.Attrs{"shape": t.Shape.Clone(), "dims": []int{}})
}

var (
	floatUnary = []ir.Code{ir.Neg, ir.Abs, ir.Sign, ir.Exp, ir.Tanh, ir.Logistic, ir.Sin, ir.Cos, ir.Erf, ir.Floor, ir.Ceil, ir.Round, ir.Log1p, ir.Sqrt, ir.Expm1}
	intUnary   = []ir.Code{ir.Neg, ir.Abs, ir.Sign, ir.Not}
	floatBin   = []ir.Code{ir.Add, ir.Sub, ir.Mul, ir.Div, ir.Max, ir.Min, ir.Pow}
	intBin     = []ir.Code{ir.Add, ir.Sub, ir.Mul, ir.Div, ir.Max, ir.Min, ir.Rem, ir.And, ir.Or, ir.Xor}
	compares   = []ir.Code{ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge}
)

func (s *scope) fill(n int) {
	for i := 0; i < n && s.g.budget > 0; i++ {
		s.step()
	}
}

func (s *scope) step() {
	g := s.g
	rng := g.rng
	x := s.pick()
	if x.Type.Space != ir.Device && rng.IntN(2) == 0 {
		s.add1(ir.DevicePut, []*ir.Value{x}, ir.Attrs{"space": ir.Device})
		return
	}
	dt := x.Type.DType
	switch k := rng.IntN(24); {
	case k < 5: // unary
		codes := floatUnary
		if dt == ir.Int32 {
			codes = intUnary
		}
		if dt == ir.Bool {
			codes = []ir.Code{ir.Not}
		}
		s.add1(codes[rng.IntN(len(codes))], []*ir.Value{x}, nil)
	case k < 10: // binary, often with a constant
		if dt == ir.Bool {
			s.add1(ir.And, []*ir.Value{x, s.like(x.Type)}, nil)
			return
		}
		codes := floatBin
		if dt == ir.Int32 {
			codes = intBin
		}
		y := s.like(x.Type)
		if y == nil {
			return
		}
		args := []*ir.Value{x, y}
		if rng.IntN(2) == 0 {
			args[0], args[1] = y, x
		}
		s.add1(codes[rng.IntN(len(codes))], args, nil)
	case k < 11: // compare and select
		if dt == ir.Bool {
			return
		}
		y := s.like(x.Type)
		p := s.add1(compares[rng.IntN(len(compares))], []*ir.Value{x, y}, nil)
		if p != nil && rng.IntN(3) > 0 {
			s.add1(ir.Select, []*ir.Value{p, x, y}, nil)
		}
	case k < 12: // double negation, identity shape ops
		if dt == ir.Bool {
			return
		}
		switch rng.IntN(4) {
		case 0:
			if v := s.add1(ir.Neg, []*ir.Value{x}, nil); v != nil {
				s.add1(ir.Neg, []*ir.Value{v}, nil)
			}
		case 1:
			lim := []int(x.Type.Shape.Clone())
			s.add1(ir.Slice, []*ir.Value{x}, ir.Attrs{"start": make([]int, x.Type.Rank()), "limit": lim, "strides": ones(x.Type.Rank())})
		case 2:
			s.add1(ir.Convert, []*ir.Value{x}, ir.Attrs{"dtype": dt})
		default:
			s.add1(ir.Transpose, []*ir.Value{x}, ir.Attrs{"perm": iotaInts(x.Type.Rank())})
		}
	case k < 14: // broadcast to a bigger shape
		if x.Type.Rank() >= 3 {
			return
		}
		shape := append(ir.Shape{1 + rng.IntN(3)}, x.Type.Shape...)
		dims := make([]int, x.Type.Rank())
		for i := range dims {
			dims[i] = i + 1
		}
		s.add1(ir.BroadcastInDim, []*ir.Value{x}, ir.Attrs{"shape": []int(shape), "dims": dims})
	case k < 15: // reshape (twice, sometimes)
		shape := refactor(rng, x.Type.Shape)
		if v := s.add1(ir.Reshape, []*ir.Value{x}, ir.Attrs{"shape": []int(shape)}); v != nil && rng.IntN(2) == 0 {
			s.add1(ir.Reshape, []*ir.Value{v}, ir.Attrs{"shape": []int(refactor(rng, shape))})
		}
	case k < 16: // transpose (twice, sometimes)
		if x.Type.Rank() < 2 {
			return
		}
		p := rng.Perm(x.Type.Rank())
		if v := s.add1(ir.Transpose, []*ir.Value{x}, ir.Attrs{"perm": p}); v != nil && rng.IntN(2) == 0 {
			s.add1(ir.Transpose, []*ir.Value{v}, ir.Attrs{"perm": rng.Perm(x.Type.Rank())})
		}
	case k < 18: // reduction
		if x.Type.Rank() == 0 || dt == ir.Bool {
			return
		}
		var axes []int
		for i := range x.Type.Rank() {
			if rng.IntN(2) == 0 {
				axes = append(axes, i)
			}
		}
		if axes == nil {
			axes = []int{x.Type.Rank() - 1}
		}
		codes := []ir.Code{ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd}
		c := codes[rng.IntN(len(codes))]
		if dt == ir.Float32 && rng.IntN(2) == 0 {
			// Softmax-like: a reduction of an elementwise producer, reused.
			if e := s.add1(ir.Exp, []*ir.Value{x}, nil); e != nil {
				x = e
			}
		}
		s.add1(c, []*ir.Value{x}, ir.Attrs{"axes": axes})
	case k < 20: // dot_general (matrix product or batched), with an epilogue
		if x.Type.Rank() < 1 || x.Type.Rank() > 2 || dt == ir.Bool {
			return
		}
		kdim := x.Type.Shape[x.Type.Rank()-1]
		n := 1 + rng.IntN(4)
		w := s.pickWhere(func(v *ir.Value) bool {
			return v.Type.DType == dt && v.Type.Space == ir.Device && v.Type.Rank() == 2 && v.Type.Shape[0] == kdim
		})
		if w == nil {
			w = s.like(ir.Type{DType: dt, Shape: ir.Shape{kdim, n}})
		}
		d := s.add1(ir.DotGeneral, []*ir.Value{x, w}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{},
			"lhs_contract": []int{x.Type.Rank() - 1}, "rhs_contract": []int{0}})
		if d != nil && rng.IntN(2) == 0 {
			b := s.like(d.Type)
			if v := s.add1(ir.Add, []*ir.Value{d, b}, nil); v != nil && dt == ir.Float32 {
				s.add1(ir.Tanh, []*ir.Value{v}, nil)
			}
		}
	case k < 21: // convert
		to := ir.Int32
		if dt == ir.Int32 || dt == ir.Bool {
			to = ir.Float32
		}
		s.add1(ir.Convert, []*ir.Value{x}, ir.Attrs{"dtype": to})
	case k < 22: // iota feeding an elementwise op, or a device_put round trip
		if rng.IntN(2) == 0 && x.Type.Rank() > 0 && dt != ir.Bool {
			io := s.add1(ir.Iota, nil, ir.Attrs{"dtype": dt, "shape": []int(x.Type.Shape.Clone()), "dim": rng.IntN(x.Type.Rank())})
			if io != nil {
				s.add1(ir.Add, []*ir.Value{x, io}, nil)
			}
			return
		}
		if h := s.add1(ir.DevicePut, []*ir.Value{x}, ir.Attrs{"space": ir.PinnedHost}); h != nil {
			if rng.IntN(2) == 0 {
				s.add1(ir.DevicePut, []*ir.Value{h}, ir.Attrs{"space": ir.Device})
			}
		}
	default: // control flow
		if g.depth >= 2 || g.budget < 4 {
			return
		}
		if rng.IntN(4) == 0 {
			s.cond()
		} else {
			s.scan()
		}
	}
}

func ones(n int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = 1
	}
	return o
}

func iotaInts(n int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = i
	}
	return o
}

// refactor returns a random shape with the same number of elements.
func refactor(rng *rand.Rand, s ir.Shape) ir.Shape {
	n := s.Size()
	var out ir.Shape
	for n > 1 {
		var divs []int
		for d := 2; d <= n; d++ {
			if n%d == 0 {
				divs = append(divs, d)
			}
		}
		d := divs[rng.IntN(len(divs))]
		out = append(out, d)
		n /= d
		if rng.IntN(4) == 0 {
			out = append(out, 1)
		}
	}
	if n == 0 {
		return s.Clone()
	}
	return out
}

// nested builds a region with the given parameter types, filled with random
// ops, and returns its scope.
func (s *scope) nested(types []ir.Type, budget int) *scope {
	g := s.g
	r := g.f.NewRegion()
	ns := &scope{g: g, r: r}
	for _, t := range types {
		ns.vals = append(ns.vals, r.AddParam(t))
	}
	g.depth++
	ns.fill(budget)
	g.depth--
	return ns
}

// scan adds a scan with 0–1 consts, 1–2 carries and 0–2 xs.
func (s *scope) scan() {
	rng := s.g.rng
	var consts, carry, xs []*ir.Value
	if rng.IntN(2) == 0 {
		consts = append(consts, s.pick())
	}
	for range 1 + rng.IntN(2) {
		c := s.pick()
		if c.Type.Space != ir.Device {
			continue
		}
		carry = append(carry, c)
	}
	if len(carry) == 0 {
		return
	}
	length := 1 + rng.IntN(3)
	for range rng.IntN(3) {
		x := s.pickWhere(func(v *ir.Value) bool { return v.Type.Rank() > 0 && v.Type.Shape[0] == length })
		if x == nil {
			break
		}
		xs = append(xs, x)
	}
	if len(xs) == 0 && rng.IntN(2) == 0 {
		// Make an xs by broadcasting a value to a leading axis.
		v := s.pick()
		if v.Type.Space == ir.Device && v.Type.Rank() < 3 {
			dims := make([]int, v.Type.Rank())
			for i := range dims {
				dims[i] = i + 1
			}
			if b := s.add1(ir.BroadcastInDim, []*ir.Value{v}, ir.Attrs{"shape": append([]int{length}, v.Type.Shape...), "dims": dims}); b != nil {
				xs = append(xs, b)
			}
		}
	}
	var types []ir.Type
	for _, v := range consts {
		types = append(types, v.Type)
	}
	for _, v := range carry {
		types = append(types, v.Type)
	}
	for _, v := range xs {
		types = append(types, v.Type.WithShape(v.Type.Shape[1:]))
	}
	body := s.nested(types, 2+rng.IntN(6))
	var res []*ir.Value
	for i, c := range carry {
		p := body.r.Params[len(consts)+i]
		v := body.pickWhere(func(v *ir.Value) bool { return v.Type.Equal(c.Type) && v != p })
		if v == nil || rng.IntN(5) == 0 {
			v = p
		}
		res = append(res, v)
	}
	for range rng.IntN(3) {
		res = append(res, body.pick())
	}
	body.r.Results = res
	args := slices.Concat(consts, carry, xs)
	s.add(ir.Scan, args, ir.Attrs{"num_consts": len(consts), "num_carry": len(carry), "length": length, "reverse": rng.IntN(2) == 0}, body.r)
}

// cond adds a cond on a predicate computed from a reduction.
func (s *scope) cond() {
	rng := s.g.rng
	x := s.pickWhere(func(v *ir.Value) bool { return v.Type.DType != ir.Bool && v.Type.Space == ir.Device })
	if x == nil {
		return
	}
	sum := x
	if x.Type.Rank() > 0 {
		sum = s.add1(ir.ReduceSum, []*ir.Value{x}, ir.Attrs{"axes": iotaInts(x.Type.Rank())})
	}
	if sum == nil {
		return
	}
	pred := s.add1(ir.Gt, []*ir.Value{sum, s.constant(sum.Type.DType)}, nil)
	if pred == nil {
		return
	}
	ops := []*ir.Value{s.pick(), s.pick()}
	types := []ir.Type{ops[0].Type, ops[1].Type}
	t := s.nested(types, 1+rng.IntN(4))
	f := s.nested(types, 1+rng.IntN(4))
	out := t.pick()
	fo := f.pickWhere(func(v *ir.Value) bool { return v.Type.Equal(out.Type) })
	if fo == nil {
		return
	}
	t.r.Results = []*ir.Value{out}
	f.r.Results = []*ir.Value{fo}
	s.add(ir.Cond, append([]*ir.Value{pred}, ops...), nil, t.r, f.r)
}

// pickResults chooses 1–3 results (sometimes a parameter, sometimes twice the
// same value).
func (s *scope) pickResults(top bool) []*ir.Value {
	rng := s.g.rng
	var out []*ir.Value
	out = append(out, s.vals[len(s.vals)-1])
	for range rng.IntN(3) {
		out = append(out, s.vals[rng.IntN(len(s.vals))])
	}
	return out
}

// seedOf turns fuzz bytes into a seed.
func seedOf(data []byte) uint64 {
	if len(data) == 8 {
		return binary.LittleEndian.Uint64(data)
	}
	h := fnv.New64a()
	h.Write(data)
	return h.Sum64()
}

var optionalPasses = []string{"canonicalize", "constant-fold", "cse", "dce", "fusion", "schedule"}

// checkProgram compiles the random program of seed (with some passes
// disabled and some parameters donated, chosen by the seed) and checks that
// the compiled function and the plan-following run give the original's
// results bit for bit.
func checkProgram(t testing.TB, seed uint64) {
	t.Helper()
	f := newProgram(seed)
	require.NoError(t, ir.Verify(f), "generated program\n%s", f)
	text := f.String()
	rng := rand.New(rand.NewPCG(seed, 7))
	opts := passes.Options{Verify: true, FusionInPlace: rng.IntN(2) == 0}
	if rng.IntN(3) == 0 {
		for _, name := range optionalPasses {
			if rng.IntN(3) == 0 {
				opts.Disable = append(opts.Disable, name)
			}
		}
	}
	opts.Donated = make([]bool, len(f.Body.Params))
	for i := range opts.Donated {
		opts.Donated[i] = rng.IntN(2) == 0
	}
	p, err := passes.Compile(f, opts)
	require.NoError(t, err, "seed %d, options %+v, program\n%s", seed, opts, text)
	require.Equal(t, text, f.String(), "Compile changed its input")
	require.NoError(t, passes.CheckPlan(p), "seed %d\n%s\n%s", seed, p.Func, p.PlanString())
	again, err := passes.Compile(f, opts)
	require.NoError(t, err)
	require.Equal(t, p.Func.String()+p.PlanString(), again.Func.String()+again.PlanString(), "seed %d: compiling is deterministic", seed)

	args := randomArgs(rng, f)
	want, err := eval.Run(f, args)
	require.NoError(t, err, "seed %d: original\n%s", seed, text)
	got, err := eval.Run(p.Func, args)
	require.NoError(t, err, "seed %d: compiled\n%s", seed, p.Func)
	require.NoError(t, sameResults(want, got), "seed %d, options %+v\noriginal\n%s\ncompiled\n%s", seed, opts, text, p.Func)
	planned, err := runPlan(p, args)
	require.NoError(t, err, "seed %d: plan run\n%s", seed, p.Func)
	require.NoError(t, sameResults(want, planned), "seed %d, options %+v: running by the plan\noriginal\n%s\ncompiled\n%s\nplan\n%s", seed, opts, text, p.Func, p.PlanString())
}

// TestPipelineRandom compiles random programs for a fixed time and checks
// that every pass keeps the results and that the plan is valid and correct.
func TestPipelineRandom(t *testing.T) {
	budget := 3 * time.Second
	if testing.Short() {
		budget = time.Second
	}
	start := time.Now()
	n := 0
	for seed := uint64(1); time.Since(start) < budget; seed++ {
		checkProgram(t, seed)
		n++
	}
	t.Logf("%d random programs", n)
}

// FuzzPipeline is TestPipelineRandom driven by the fuzzer: the input bytes
// seed the program generator.
func FuzzPipeline(f *testing.F) {
	for _, s := range []uint64{0, 1, 42, 1234567} {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], s)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkProgram(t, seedOf(data))
	})
}
