// Package randprog generates random, well-typed ferry programs for
// differential tests: the compiler's (package passes) and the CPU
// executor's (cpu/cpuexec), both checked against the reference executor
// (internal/eval).
//
// Two generators share a seed space. New builds IR directly: elementwise
// unary and binary ops over f32, f64, f16, bf16, i32, i64, u8, u32 and bool,
// comparisons and selects, constants (0, 1, -0 and others, to feed the
// canonicaliser and the folder), broadcasts, reshapes, transposes, slices,
// concatenations, pads, gathers, scatter-adds, dynamic slices and updates,
// reductions, argmax/argmin, sorts, dot_general (plain and batched), converts
// and bitcasts, checkpoint names, optimization barriers and sharding
// constraints (over meshes whose axes have size 1, so that every program
// still runs on one device), device_put between memory spaces, and scans
// (with consts, carries and xs), whiles and conds, nested up to two deep. Remat traces a small model through package
// trace — layers under trace.Checkpoint with a random policy, unrolled or
// inside a Scan, differentiated with ValueAndGrad — so that remat and offload
// are exercised the way users reach them.
//
// Features switches whole families off, so that a test can keep a known,
// not yet fixed executor bug out of its default mix and put it back with one
// flag.
//
// Values is the test packages' one random literal generator: each caller
// names its distribution (ranges for floats, signed and unsigned integers,
// per-dtype overrides, or the special values of SpecialFloat and SpecialInt)
// and draws literals (Values.Literal) or a function's arguments
// (Values.Args) from it.
package randprog

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// Features selects what the generators may produce.
type Features struct {
	// Control adds scans, whiles and conds.
	Control bool
	// HostParams makes some function parameters pinned_host arrays.
	HostParams bool
	// ScanCopies allows device_put between memory spaces inside scan bodies
	// and pinned_host scan operands (and, in Remat, offloading policies
	// inside a scanned layer).
	ScanCopies bool
	// ScanConstResults lets scan bodies return values computed from
	// constants and iotas alone (not from a body parameter).
	ScanConstResults bool
	// Extended adds the ops beyond the elementwise/shape/reduce/dot core:
	// concatenate, pad, gather, scatter_add, dynamic_slice,
	// dynamic_update_slice, sort, argmax/argmin, bitcast_convert, shifts,
	// checkpoint_name, optimization_barrier, sharding_constraint, and the
	// dtypes f64, f16, bf16, i64, u8, u32.
	Extended bool
	// EvenDims draws New's dimension sizes (of parameters, constants,
	// broadcasts, dot products and concatenated pieces) from 1, 2, 4 and 8,
	// and its long dimensions as multiples of 8, so that meshes of 2, 4
	// and 8 devices split them: the shapes of the sharded differential
	// test. It is a choice of shapes, not a family of ops: All leaves it
	// off.
	EvenDims bool
}

// All is every family of ops on (EvenDims, a choice of shapes, stays off).
func All() Features {
	return Features{Control: true, HostParams: true, ScanCopies: true, ScanConstResults: true, Extended: true}
}

// Names lists the feature names ParseFeatures understands.
var Names = []string{"control", "hostparams", "scancopies", "scanconst", "extended", "evendims"}

func (f *Features) field(name string) *bool {
	switch name {
	case "control":
		return &f.Control
	case "hostparams":
		return &f.HostParams
	case "scancopies":
		return &f.ScanCopies
	case "scanconst":
		return &f.ScanConstResults
	case "extended":
		return &f.Extended
	case "evendims":
		return &f.EvenDims
	}
	return nil
}

// ParseFeatures applies a comma-separated list of "+name" (turn on) and
// "-name" (turn off) to base; "all" and "none" set every feature.
func ParseFeatures(base Features, spec string) (Features, error) {
	f := base
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		switch item {
		case "all":
			f = All()
			continue
		case "none":
			f = Features{}
			continue
		}
		on := true
		switch item[0] {
		case '+':
			item = item[1:]
		case '-':
			on, item = false, item[1:]
		}
		p := f.field(item)
		if p == nil {
			return base, fmt.Errorf("unknown feature %q (want +name or -name with name one of %s)", item, strings.Join(Names, ", "))
		}
		*p = on
	}
	return f, nil
}

// String lists the features that are on.
func (f Features) String() string {
	var on []string
	for _, n := range Names {
		if *f.field(n) {
			on = append(on, n)
		}
	}
	if on == nil {
		return "none"
	}
	return strings.Join(on, ",")
}

type progGen struct {
	rng   *rand.Rand
	f     *ir.Func
	feat  Features
	depth int
	// scanDepth counts the scan bodies being built around the current scope.
	scanDepth int
	// Budget of ops left for the whole program.
	budget int
}

// scope is the region being built and the values visible in it.
type scope struct {
	g    *progGen
	r    *ir.Region
	vals []*ir.Value
	// dep holds the values computed from a parameter of r (not from
	// constants and iotas alone).
	dep map[*ir.Value]bool
}

// New returns the random program of seed under feat. It always verifies.
func New(seed uint64, feat Features) *ir.Func {
	g := &progGen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), feat: feat, budget: 12 + int(seed%40)}
	g.f = ir.NewFunc(fmt.Sprintf("rand%d", seed))
	s := &scope{g: g, r: g.f.Body, dep: map[*ir.Value]bool{}}
	np := 1 + g.rng.IntN(4)
	for range np {
		t := g.randType()
		if feat.HostParams && g.rng.IntN(8) == 0 {
			t = t.WithSpace(ir.PinnedHost)
		}
		s.param(t)
	}
	s.fill(g.budget)
	s.r.Results = s.pickResults()
	return g.f
}

func (s *scope) param(t ir.Type) *ir.Value {
	p := s.r.AddParam(t)
	s.vals = append(s.vals, p)
	s.dep[p] = true
	return p
}

func (g *progGen) randDType() ir.DType {
	if g.feat.Extended && g.rng.IntN(6) == 0 {
		return []ir.DType{ir.Float64, ir.Float16, ir.BFloat16, ir.Uint8, ir.Int64, ir.Uint32}[g.rng.IntN(6)]
	}
	if g.rng.IntN(3) == 0 {
		return ir.Int32
	}
	return ir.Float32
}

func (g *progGen) randShape() ir.Shape {
	r := g.rng.IntN(4)
	s := make(ir.Shape, r)
	for i := range s {
		s[i] = g.dim(4)
		if g.rng.IntN(40) == 0 {
			// Now and then a dimension long enough for several blocks,
			// spans and workers.
			s[i] = g.long(100 + g.rng.IntN(1500))
		}
	}
	if s.Size() > 1<<14 {
		return s[:1]
	}
	return s
}

// dim draws a dimension size from 1 to n, or with EvenDims from 1, 2, 4
// and 8 (mostly 2 and 4).
func (g *progGen) dim(n int) int {
	if g.feat.EvenDims {
		return []int{1, 2, 2, 4, 4, 8}[g.rng.IntN(6)]
	}
	return 1 + g.rng.IntN(n)
}

// long returns n, or with EvenDims n rounded down to a multiple of 8.
func (g *progGen) long(n int) int {
	if g.feat.EvenDims {
		return max(8, n&^7)
	}
	return n
}

func (g *progGen) randType() ir.Type { return ir.Type{DType: g.randDType(), Shape: g.randShape()} }

// add appends an op, or returns nil when the shape rule rejects it.
func (s *scope) add(code ir.Code, args []*ir.Value, attrs ir.Attrs, regions ...*ir.Region) []*ir.Value {
	for _, a := range args {
		if a == nil {
			return nil
		}
	}
	op, err := s.r.AddOp(code, args, attrs, regions...)
	if err != nil {
		return nil
	}
	s.g.budget--
	d := slices.ContainsFunc(args, func(a *ir.Value) bool { return s.dep[a] })
	for i, v := range op.Results {
		s.dep[v] = d
		if code == ir.OptimizationBarrier {
			s.dep[v] = s.dep[args[i]] // the compiler removes barriers
		}
	}
	s.vals = append(s.vals, op.Results...)
	return op.Results
}

func (s *scope) add1(code ir.Code, args []*ir.Value, attrs ir.Attrs) *ir.Value {
	if res := s.add(code, args, attrs); len(res) == 1 {
		return res[0]
	}
	return nil
}

// pick returns a random visible value (most of the time one of the most
// recent ones, so that chains form).
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

func onDevice(v *ir.Value) bool { return v.Type.Space == ir.Device }

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

// splat broadcasts a scalar constant to t.
func (s *scope) splat(t ir.Type) *ir.Value {
	c := s.constant(t.DType)
	if t.Rank() == 0 || c == nil {
		return c
	}
	return s.add1(ir.BroadcastInDim, []*ir.Value{c}, ir.Attrs{"shape": t.Shape.Clone(), "dims": []int{}})
}

// like returns a value of type t (on the device): an existing one, a
// constant, or a broadcast of a lower-rank value.
func (s *scope) like(t ir.Type) *ir.Value {
	t = t.WithSpace(ir.Device).WithSharding(nil) // literals have no sharding
	if v := s.pickWhere(func(v *ir.Value) bool { return v.Type.EqualUnsharded(t) }); v != nil && s.g.rng.IntN(3) > 0 {
		return v
	}
	if s.g.rng.IntN(2) == 0 {
		if t.Size() <= 8 && s.g.rng.IntN(3) == 0 {
			return s.add1(ir.Constant, nil, ir.Attrs{"value": RandomLiteral(s.g.rng, t)})
		}
		return s.splat(t)
	}
	// Broadcast a value whose shape is a suffix of t's.
	for k := 0; k <= t.Rank(); k++ {
		suffix := t.Shape[k:]
		if v := s.pickWhere(func(v *ir.Value) bool {
			return v.Type.DType == t.DType && onDevice(v) && v.Type.Shape.Equal(suffix)
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
	return s.splat(t)
}

// The elementwise ops the generator draws from, read from the op table by
// class and dtype rule, so that a new op is drawn without an edit here.
var (
	floatUnary = tableOps(ir.ClassUnary, func(k ir.DTypeRule) bool { return k.OK(ir.Float32) })
	intUnary   = tableOps(ir.ClassUnary, func(k ir.DTypeRule) bool { return k.OK(ir.Int32) })
	floatBin   = tableOps(ir.ClassBinary, func(k ir.DTypeRule) bool { return k.OK(ir.Float32) })
	intBin     = tableOps(ir.ClassBinary, func(k ir.DTypeRule) bool { return k.OK(ir.Int32) && k != ir.IntegerDTypes })
	shifts     = tableOps(ir.ClassBinary, func(k ir.DTypeRule) bool { return k == ir.IntegerDTypes })
	compares   = tableOps(ir.ClassCompare, func(ir.DTypeRule) bool { return true })
)

// tableOps lists the ops of class cl whose dtype rule satisfies keep.
func tableOps(cl ir.OpClass, keep func(ir.DTypeRule) bool) []ir.Code {
	var out []ir.Code
	for _, c := range ir.AllCodes() {
		if info := c.Info(); info.Class == cl && keep(info.DTypes) {
			out = append(out, c)
		}
	}
	return out
}

func (s *scope) fill(n int) {
	for i := 0; i < n && s.g.budget > 0; i++ {
		s.step()
	}
}

// copiesAllowed reports whether device_put between spaces may be emitted
// here.
func (s *scope) copiesAllowed() bool { return s.g.scanDepth == 0 || s.g.feat.ScanCopies }

// step adds one random op (or a few chained ones) built on a picked value.
func (s *scope) step() {
	x := s.pick()
	if !onDevice(x) {
		if s.g.rng.IntN(2) == 0 && s.copiesAllowed() {
			s.add1(ir.DevicePut, []*ir.Value{x}, ir.Attrs{"space": ir.Device})
			return
		}
		if x = s.pickWhere(onDevice); x == nil {
			return
		}
	}
	n := 24
	if s.g.feat.Extended {
		n = 34
	}
	switch k := s.g.rng.IntN(n); {
	case k < 5:
		s.unary(x)
	case k < 10:
		s.binary(x)
	case k < 11:
		s.compareSelect(x)
	case k < 12:
		s.identity(x)
	case k < 14:
		s.broadcast(x)
	case k < 15:
		s.reshape(x)
	case k < 16:
		s.transpose(x)
	case k < 18:
		s.reduce(x)
	case k < 20:
		s.dot(x)
	case k < 21:
		s.convert(x)
	case k < 22:
		s.iotaOrRoundTrip(x)
	case k < 24:
		s.control()
	default:
		s.extended(x)
	}
}

// unary adds an elementwise unary op of x.
func (s *scope) unary(x *ir.Value) {
	dt := x.Type.DType
	codes := floatUnary
	if !dt.IsFloat() {
		codes = intUnary
	}
	if dt == ir.Bool {
		codes = []ir.Code{ir.Not}
	}
	s.add1(codes[s.g.rng.IntN(len(codes))], []*ir.Value{x}, nil)
}

// binary adds an elementwise binary op of x and a value of its type (often
// a constant), in either order.
func (s *scope) binary(x *ir.Value) {
	rng := s.g.rng
	dt := x.Type.DType
	if dt == ir.Bool {
		s.add1([]ir.Code{ir.And, ir.Or, ir.Xor}[rng.IntN(3)], []*ir.Value{x, s.like(x.Type)}, nil)
		return
	}
	codes := floatBin
	if !dt.IsFloat() {
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
}

// compareSelect adds a comparison of x with a value of its type, and
// usually a select on it.
func (s *scope) compareSelect(x *ir.Value) {
	rng := s.g.rng
	if x.Type.DType == ir.Bool {
		return
	}
	y := s.like(x.Type)
	p := s.add1(compares[rng.IntN(len(compares))], []*ir.Value{x, y}, nil)
	if p != nil && rng.IntN(3) > 0 {
		s.add1(ir.Select, []*ir.Value{p, x, y}, nil)
	}
}

// identity adds ops that leave x unchanged: a double negation, a full
// slice, a convert to its own dtype or an identity transpose.
func (s *scope) identity(x *ir.Value) {
	dt := x.Type.DType
	if dt == ir.Bool {
		return
	}
	switch s.g.rng.IntN(4) {
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
}

// broadcast adds a broadcast of x to a bigger shape: a new leading
// dimension, or a size-1 dimension grown.
func (s *scope) broadcast(x *ir.Value) {
	rng := s.g.rng
	if x.Type.Rank() >= 3 {
		return
	}
	shape := append(ir.Shape{s.g.dim(3)}, x.Type.Shape...)
	dims := make([]int, x.Type.Rank())
	for i := range dims {
		dims[i] = i + 1
	}
	if d := slices.Index(x.Type.Shape, 1); d >= 0 && rng.IntN(2) == 0 {
		// Broadcast along a size-1 dimension (dims the identity).
		shape = x.Type.Shape.Clone()
		shape[d] = 2 + rng.IntN(3)
		if s.g.feat.EvenDims {
			shape[d] = 2 << rng.IntN(3)
		}
		dims = iotaInts(x.Type.Rank())
	}
	if shape.Size() > 1<<15 {
		return
	}
	s.add1(ir.BroadcastInDim, []*ir.Value{x}, ir.Attrs{"shape": []int(shape), "dims": dims})
}

// reshape adds a reshape of x (twice, sometimes).
func (s *scope) reshape(x *ir.Value) {
	rng := s.g.rng
	shape := refactor(rng, x.Type.Shape)
	if v := s.add1(ir.Reshape, []*ir.Value{x}, ir.Attrs{"shape": []int(shape)}); v != nil && rng.IntN(2) == 0 {
		s.add1(ir.Reshape, []*ir.Value{v}, ir.Attrs{"shape": []int(refactor(rng, shape))})
	}
}

// transpose adds a transpose of x (twice, sometimes).
func (s *scope) transpose(x *ir.Value) {
	rng := s.g.rng
	if x.Type.Rank() < 2 {
		return
	}
	p := rng.Perm(x.Type.Rank())
	if v := s.add1(ir.Transpose, []*ir.Value{x}, ir.Attrs{"perm": p}); v != nil && rng.IntN(2) == 0 {
		s.add1(ir.Transpose, []*ir.Value{v}, ir.Attrs{"perm": rng.Perm(x.Type.Rank())})
	}
}

// reduce adds a reduction of x over random axes, sometimes of an exp of x
// (softmax-like).
func (s *scope) reduce(x *ir.Value) {
	rng := s.g.rng
	dt := x.Type.DType
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
	if dt.IsFloat() && rng.IntN(2) == 0 {
		// Softmax-like: a reduction of an elementwise producer, reused.
		if e := s.add1(ir.Exp, []*ir.Value{x}, nil); e != nil {
			x = e
		}
	}
	s.add1(c, []*ir.Value{x}, ir.Attrs{"axes": axes})
}

// convert adds a convert of x between float and integer (with Extended,
// to any dtype).
func (s *scope) convert(x *ir.Value) {
	rng := s.g.rng
	to := ir.Int32
	if !x.Type.DType.IsFloat() {
		to = ir.Float32
	}
	if s.g.feat.Extended && rng.IntN(2) == 0 {
		to = []ir.DType{ir.Float32, ir.Float64, ir.Float16, ir.BFloat16, ir.Int32, ir.Uint8, ir.Int64, ir.Uint32, ir.Bool}[rng.IntN(9)]
	}
	s.add1(ir.Convert, []*ir.Value{x}, ir.Attrs{"dtype": to})
}

// iotaOrRoundTrip adds an iota feeding an add with x, or a device_put of x
// to pinned_host (and back, sometimes).
func (s *scope) iotaOrRoundTrip(x *ir.Value) {
	rng := s.g.rng
	dt := x.Type.DType
	if rng.IntN(2) == 0 && x.Type.Rank() > 0 && dt != ir.Bool {
		io := s.add1(ir.Iota, nil, ir.Attrs{"dtype": dt, "shape": []int(x.Type.Shape.Clone()), "dim": rng.IntN(x.Type.Rank())})
		if io != nil {
			s.add1(ir.Add, []*ir.Value{x, io}, nil)
		}
		return
	}
	if !s.copiesAllowed() {
		return
	}
	if h := s.add1(ir.DevicePut, []*ir.Value{x}, ir.Attrs{"space": ir.PinnedHost}); h != nil {
		if rng.IntN(2) == 0 {
			s.add1(ir.DevicePut, []*ir.Value{h}, ir.Attrs{"space": ir.Device})
		}
	}
}

// control adds a cond, a while or (most often) a scan, when Control is on,
// the nesting is shallow and the budget allows.
func (s *scope) control() {
	g := s.g
	if !g.feat.Control || g.depth >= 2 || g.budget < 4 {
		return
	}
	switch g.rng.IntN(6) {
	case 0:
		s.cond()
	case 1:
		s.while()
	default:
		s.scan()
	}
}

// dot adds a dot_general of x (rank 1–3) with a matching operand: a matrix
// product, or a batched one for rank 3, sometimes with an epilogue.
func (s *scope) dot(x *ir.Value) {
	rng := s.g.rng
	dt := x.Type.DType
	r := x.Type.Rank()
	if r < 1 || r > 3 || dt == ir.Bool {
		return
	}
	kdim := x.Type.Shape[r-1]
	n := s.g.dim(4)
	if rng.IntN(10) == 0 {
		n = s.g.long(20 + rng.IntN(60))
	}
	attrs := ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{r - 1}, "rhs_contract": []int{0}}
	var wt ir.Type
	if r == 3 {
		// Batched: [b,m,k]·[b,k,n] or [b,k,n] transposed as [b,n,k].
		b := x.Type.Shape[0]
		attrs["lhs_batch"], attrs["rhs_batch"] = []int{0}, []int{0}
		wt = ir.Type{DType: dt, Shape: ir.Shape{b, kdim, n}}
		attrs["rhs_contract"] = []int{1}
		if rng.IntN(2) == 0 {
			wt.Shape = ir.Shape{b, n, kdim}
			attrs["rhs_contract"] = []int{2}
		}
	} else {
		wt = ir.Type{DType: dt, Shape: ir.Shape{kdim, n}}
		if rng.IntN(3) == 0 {
			// Contract the rhs's last dimension (x·wᵀ).
			wt.Shape = ir.Shape{n, kdim}
			attrs["rhs_contract"] = []int{1}
		}
	}
	w := s.pickWhere(func(v *ir.Value) bool { return onDevice(v) && v.Type.Equal(wt) })
	if w == nil {
		w = s.like(wt)
	}
	d := s.add1(ir.DotGeneral, []*ir.Value{x, w}, attrs)
	if d != nil && rng.IntN(2) == 0 {
		b := s.like(d.Type)
		if v := s.add1(ir.Add, []*ir.Value{d, b}, nil); v != nil && dt.IsFloat() {
			s.add1([]ir.Code{ir.Tanh, ir.Logistic, ir.Exp, ir.Neg}[rng.IntN(4)], []*ir.Value{v}, nil)
		}
	}
}

// extended adds one of the less common ops.
func (s *scope) extended(x *ir.Value) {
	rng := s.g.rng
	switch rng.IntN(11) {
	case 0:
		s.concatenate(x)
	case 1:
		s.pad(x)
	case 2:
		s.gather(x)
	case 3:
		s.scatterAdd(x)
	case 4:
		s.dynamicSlice(x)
	case 5:
		s.sort(x)
	case 6:
		s.argMinMax(x)
	case 7:
		s.bitcastOrShift(x)
	case 8:
		s.add1(ir.CheckpointName, []*ir.Value{x}, ir.Attrs{"name": fmt.Sprintf("n%d", rng.IntN(3))})
	case 9: // sharding_constraint over a one-device mesh
		s.constrain(x)
	default:
		s.barrier(x)
	}
}

// concatenate adds a concatenation of x with a value of another length
// along a random axis (and x again, sometimes).
func (s *scope) concatenate(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 {
		return
	}
	axis := rng.IntN(r)
	t := x.Type.WithShape(x.Type.Shape).WithSpace(ir.Device)
	t.Shape[axis] = s.g.dim(3)
	y := s.like(t)
	args := []*ir.Value{x, y}
	if rng.IntN(2) == 0 {
		args = append(args, x)
	}
	s.add1(ir.Concatenate, args, ir.Attrs{"axis": axis})
}

// pad adds a pad of x (low, high, interior; negative low/high crop).
func (s *scope) pad(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 {
		return
	}
	low, high, in := make([]int, r), make([]int, r), make([]int, r)
	for i := range r {
		low[i], high[i], in[i] = rng.IntN(3)-rng.IntN(2), rng.IntN(3)-rng.IntN(2), rng.IntN(2)
	}
	s.add1(ir.Pad, []*ir.Value{x, s.constant(x.Type.DType)}, ir.Attrs{"low": low, "high": high, "interior": in})
}

// gather adds a gather (jnp.take) from x, its indices a constant or an
// existing int32 value (out-of-range values clamped).
func (s *scope) gather(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 {
		return
	}
	axis := rng.IntN(r)
	if x.Type.Shape[axis] == 0 {
		return // an error at run time, as in JAX
	}
	it := ir.Type{DType: ir.Int32, Shape: s.g.randShape()}
	if it.Rank() > 2 {
		it.Shape = it.Shape[:2]
	}
	idx := s.add1(ir.Constant, nil, ir.Attrs{"value": indexLiteral(rng, it, x.Type.Shape[axis])})
	if v := s.pickWhere(func(v *ir.Value) bool { return onDevice(v) && v.Type.DType == ir.Int32 && v.Type.Rank() <= 2 }); v != nil && rng.IntN(2) == 0 {
		idx = v // out-of-range values are clamped
	}
	s.add1(ir.Gather, []*ir.Value{x, idx}, ir.Attrs{"axis": axis})
}

// scatterAdd adds a scatter_add into x along a random axis.
func (s *scope) scatterAdd(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 || x.Type.DType == ir.Bool {
		return
	}
	axis := rng.IntN(r)
	it := ir.Type{DType: ir.Int32, Shape: ir.Shape{1 + rng.IntN(4)}}
	idx := s.add1(ir.Constant, nil, ir.Attrs{"value": indexLiteral(rng, it, x.Type.Shape[axis]+1)})
	ut := x.Type.WithShape(x.Type.Shape).WithSpace(ir.Device)
	ut.Shape = slices.Concat(x.Type.Shape[:axis], it.Shape, x.Type.Shape[axis+1:])
	ut.Space = ir.Device
	s.add1(ir.ScatterAdd, []*ir.Value{x, idx, s.like(ut)}, ir.Attrs{"axis": axis})
}

// dynamicSlice adds a dynamic_slice of x or a dynamic_update_slice into x,
// with scalar starts (constants, some out of range, or existing values).
func (s *scope) dynamicSlice(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 {
		return
	}
	sizes := make([]int, r)
	var starts []*ir.Value
	for i := range r {
		sizes[i] = min(x.Type.Shape[i], 1+rng.IntN(x.Type.Shape[i]+1))
		st := s.pickWhere(func(v *ir.Value) bool { return onDevice(v) && v.Type.DType == ir.Int32 && v.Type.Rank() == 0 })
		if st == nil || rng.IntN(2) == 0 {
			l := ir.NewLiteral(ir.Type{DType: ir.Int32, Shape: ir.Shape{}})
			l.SetFloat64At(0, float64(rng.IntN(x.Type.Shape[i]+2)-1))
			st = s.add1(ir.Constant, nil, ir.Attrs{"value": l})
		}
		starts = append(starts, st)
	}
	if rng.IntN(2) == 0 {
		s.add1(ir.DynamicSlice, append([]*ir.Value{x}, starts...), ir.Attrs{"sizes": sizes})
		return
	}
	up := s.like(ir.Type{DType: x.Type.DType, Shape: ir.Shape(sizes)})
	s.add1(ir.DynamicUpdateSlice, append([]*ir.Value{x, up}, starts...), nil)
}

// sort adds a sort of x, alone or with an iota as a second operand.
func (s *scope) sort(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 || x.Type.DType == ir.Bool {
		return
	}
	args := []*ir.Value{x}
	nk := 1
	if rng.IntN(2) == 0 {
		args = append(args, s.add1(ir.Iota, nil, ir.Attrs{"dtype": ir.Int32, "shape": []int(x.Type.Shape.Clone()), "dim": rng.IntN(r)}))
	}
	s.add(ir.Sort, args, ir.Attrs{"dimension": rng.IntN(r), "num_keys": nk})
}

// argMinMax adds an argmax or argmin of x along a random axis.
func (s *scope) argMinMax(x *ir.Value) {
	rng := s.g.rng
	r := x.Type.Rank()
	if r == 0 || x.Type.DType == ir.Bool {
		return
	}
	c := []ir.Code{ir.ArgMax, ir.ArgMin}[rng.IntN(2)]
	s.add1(c, []*ir.Value{x}, ir.Attrs{"axis": rng.IntN(r), "dtype": ir.Int32})
}

// bitcastOrShift adds a bitcast_convert of x between same-size dtypes (and
// back, sometimes), or a shift when x is an integer.
func (s *scope) bitcastOrShift(x *ir.Value) {
	rng := s.g.rng
	switch dt := x.Type.DType; dt {
	case ir.Float32, ir.Float64:
		to := []ir.DType{ir.Int32, ir.Uint32}[rng.IntN(2)]
		if dt == ir.Float64 {
			to = ir.Int64
		}
		if v := s.add1(ir.BitcastConvert, []*ir.Value{x}, ir.Attrs{"dtype": to}); v != nil && rng.IntN(2) == 0 {
			s.add1(ir.BitcastConvert, []*ir.Value{v}, ir.Attrs{"dtype": dt})
		}
	case ir.Int32, ir.Uint8, ir.Int64, ir.Uint32:
		amt := s.like(x.Type)
		s.add1(shifts[rng.IntN(len(shifts))], []*ir.Value{x, amt}, nil)
	case ir.Float16:
		s.add1(ir.BitcastConvert, []*ir.Value{x}, ir.Attrs{"dtype": ir.BFloat16})
	}
}

// barrier adds an optimization_barrier of x (and another value,
// sometimes), and a use of its first result.
func (s *scope) barrier(x *ir.Value) {
	args := []*ir.Value{x}
	if y := s.pickWhere(onDevice); y != nil && s.g.rng.IntN(2) == 0 {
		args = append(args, y)
	}
	res := s.add(ir.OptimizationBarrier, args, nil)
	if len(res) > 0 && x.Type.DType.IsFloat() {
		s.add1(ir.Mul, []*ir.Value{res[0], res[0]}, nil)
	}
}

// constrain adds a sharding_constraint of x to a random sharding over a
// mesh whose axes all have size 1 (mesh[x=1] or mesh[x=1,y=1]): every
// dimension is split over x, y, both or neither, so the program still runs
// on one device. The result's type carries the sharding, as the tracer's
// does (trace.WithShardingConstraint).
func (s *scope) constrain(x *ir.Value) {
	rng := s.g.rng
	shape, names := []int{1}, []string{"x"}
	if rng.IntN(2) == 0 {
		shape, names = []int{1, 1}, []string{"x", "y"}
	}
	mesh, err := ir.NewMesh(shape, names)
	if err != nil {
		panic(err)
	}
	spec := make(ir.PartitionSpec, rng.IntN(x.Type.Rank()+1))
	free := slices.Clone(names)
	for d := range spec {
		for _, a := range rng.Perm(len(free)) {
			if rng.IntN(2) == 0 {
				spec[d] = append(spec[d], free[a])
			}
		}
		free = slices.DeleteFunc(free, func(a string) bool { return slices.Contains(spec[d], a) })
	}
	sh, err := ir.NewNamedSharding(mesh, spec)
	if err != nil {
		panic(err)
	}
	if v := s.add1(ir.ShardingConstraint, []*ir.Value{x}, ir.Attrs{"sharding": sh.String()}); v != nil {
		v.Type = v.Type.WithSharding(sh)
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
		for d := 2; d <= n && d <= 64; d++ {
			if n%d == 0 {
				divs = append(divs, d)
			}
		}
		if len(divs) == 0 {
			divs = []int{n}
		}
		d := divs[rng.IntN(len(divs))]
		out = append(out, d)
		n /= d
		if rng.IntN(4) == 0 {
			out = append(out, 1)
		}
	}
	if n == 0 || len(out) > 6 {
		return s.Clone()
	}
	return out
}

// nested builds a region with the given parameter types, filled with random
// ops, and returns its scope.
func (s *scope) nested(types []ir.Type, budget int, inScan bool) *scope {
	return s.nestedWith(types, budget, inScan, nil)
}

// nestedWith is nested with prelude run on the new scope before its random
// ops.
func (s *scope) nestedWith(types []ir.Type, budget int, inScan bool, prelude func(*scope)) *scope {
	g := s.g
	r := g.f.NewRegion()
	ns := &scope{g: g, r: r, dep: map[*ir.Value]bool{}}
	for _, t := range types {
		ns.param(t)
	}
	g.depth++
	if inScan {
		g.scanDepth++
	}
	if prelude != nil {
		prelude(ns)
	}
	ns.fill(budget)
	g.depth--
	if inScan {
		g.scanDepth--
	}
	return ns
}

// operandOK reports whether v may be a scan operand here.
func (s *scope) operandOK(v *ir.Value) bool { return onDevice(v) || s.g.feat.ScanCopies }

// result picks a value of the body for a scan result: with
// ScanConstResults off, one computed from a body parameter.
func (s *scope) result(ok func(*ir.Value) bool) *ir.Value {
	return s.pickWhere(func(v *ir.Value) bool {
		return ok(v) && (s.g.feat.ScanConstResults || s.dep[v])
	})
}

// scanGen is the state of one scan being generated: its operands, the
// stacking carry pair if any, and its body.
type scanGen struct {
	s                 *scope
	consts, carry, xs []*ir.Value
	// stack is the index in carry of the counter of a stacked buffer
	// (the buffer follows it), or -1.
	stack  int
	length int
	body   *scope
	// trip is a ys that made a round trip between memory spaces in the
	// body, or nil.
	trip *ir.Value
}

// scan adds a scan with 0–1 consts, 1–2 carries and 0–2 xs.
func (s *scope) scan() {
	sg := &scanGen{s: s, stack: -1}
	if !sg.pickCarry() {
		return
	}
	sg.pickXs()
	sg.body = s.nestedWith(sg.paramTypes(), 2+s.g.rng.IntN(6), true, sg.roundTrip)
	sg.body.r.Results = sg.results()
	args := slices.Concat(sg.consts, sg.carry, sg.xs)
	s.add(ir.Scan, args, ir.Attrs{"num_consts": len(sg.consts), "num_carry": len(sg.carry), "length": sg.length, "reverse": s.g.rng.IntN(2) == 0}, sg.body.r)
}

// pickCarry picks the consts and the carries (now and then with a stacking
// counter and buffer), and reports whether there is a carry.
func (sg *scanGen) pickCarry() bool {
	s := sg.s
	rng := s.g.rng
	if rng.IntN(2) == 0 {
		if c := s.pick(); s.operandOK(c) {
			sg.consts = append(sg.consts, c)
		}
	}
	for range 1 + rng.IntN(2) {
		c := s.pick()
		if !onDevice(c) {
			continue
		}
		sg.carry = append(sg.carry, c)
	}
	if len(sg.carry) == 0 {
		return false
	}
	// Now and then a counter and a buffer the body writes one row of per
	// iteration (dynamic_update_slice at the counter, in place into its
	// carry), as a scan stacking by hand does.
	if rng.IntN(4) == 0 {
		buf := s.pickWhere(func(v *ir.Value) bool { return onDevice(v) && v.Type.Rank() >= 1 && v.Type.Size() > 0 })
		if zero := s.add1(ir.Constant, nil, ir.Attrs{"value": ir.Scalar(int32(0))}); buf != nil && zero != nil {
			sg.stack = len(sg.carry)
			sg.carry = append(sg.carry, zero, buf)
		}
	}
	return true
}

// pickXs draws the length and picks the xs: values whose leading
// dimension is the length, or else now and then a broadcast to one.
func (sg *scanGen) pickXs() {
	s := sg.s
	rng := s.g.rng
	sg.length = 1 + rng.IntN(3)
	if rng.IntN(8) == 0 {
		sg.length = 4 + rng.IntN(8)
	}
	for range rng.IntN(3) {
		x := s.pickWhere(func(v *ir.Value) bool { return v.Type.Rank() > 0 && v.Type.Shape[0] == sg.length && s.operandOK(v) })
		if x == nil {
			break
		}
		sg.xs = append(sg.xs, x)
	}
	if len(sg.xs) == 0 && rng.IntN(2) == 0 {
		sg.broadcastXs()
	}
}

// broadcastXs makes an xs by broadcasting a value to a leading axis.
func (sg *scanGen) broadcastXs() {
	s := sg.s
	v := s.pick()
	if !onDevice(v) || v.Type.Rank() >= 3 {
		return
	}
	dims := make([]int, v.Type.Rank())
	for i := range dims {
		dims[i] = i + 1
	}
	b := s.add1(ir.BroadcastInDim, []*ir.Value{v}, ir.Attrs{"shape": append([]int{sg.length}, v.Type.Shape...), "dims": dims})
	if b == nil {
		return
	}
	if s.g.feat.ScanCopies && s.g.rng.IntN(3) == 0 {
		// A pinned_host stack streamed in one slice per iteration.
		b = s.add1(ir.DevicePut, []*ir.Value{b}, ir.Attrs{"space": ir.PinnedHost})
	}
	if b != nil {
		sg.xs = append(sg.xs, b)
	}
}

// paramTypes returns the types of the body's parameters: consts, carries
// and one slice of each xs.
func (sg *scanGen) paramTypes() []ir.Type {
	var types []ir.Type
	for _, v := range sg.consts {
		types = append(types, v.Type)
	}
	for _, v := range sg.carry {
		types = append(types, v.Type)
	}
	for _, v := range sg.xs {
		types = append(types, v.Type.WithShape(v.Type.Shape[1:]))
	}
	return types
}

// roundTrip, run on the new body b before its random ops, sometimes moves
// an xs slice to the other memory space and back, to be returned as a ys:
// the double-buffered prefetch of the next slice must wait for the copy
// that still reads this one.
func (sg *scanGen) roundTrip(b *scope) {
	rng := sg.s.g.rng
	if !sg.s.g.feat.ScanCopies || len(sg.xs) == 0 || rng.IntN(3) > 0 {
		return
	}
	x := b.r.Params[len(sg.consts)+len(sg.carry)+rng.IntN(len(sg.xs))]
	other := ir.PinnedHost
	if x.Type.Space == ir.PinnedHost {
		other = ir.Device
	}
	if there := b.add1(ir.DevicePut, []*ir.Value{x}, ir.Attrs{"space": other}); there != nil {
		sg.trip = b.add1(ir.DevicePut, []*ir.Value{there}, ir.Attrs{"space": x.Type.Space})
	}
}

// results picks the body's results: the next carries, then 0–2 ys, the
// round trip's ys, and now and then a constant or iota ys.
func (sg *scanGen) results() []*ir.Value {
	body := sg.body
	rng := sg.s.g.rng
	feat := sg.s.g.feat
	var res []*ir.Value
	for i, c := range sg.carry {
		p := body.r.Params[len(sg.consts)+i]
		if sg.stack >= 0 && (i == sg.stack || i == sg.stack+1) {
			if i == sg.stack {
				res = append(res, body.stackRows(p, body.r.Params[len(sg.consts)+i+1])...)
			}
			continue
		}
		v := body.result(func(v *ir.Value) bool { return v.Type.Equal(c.Type) && v != p })
		if v == nil || rng.IntN(5) == 0 {
			v = p
		}
		res = append(res, v)
	}
	for range rng.IntN(3) {
		if v := body.result(func(*ir.Value) bool { return true }); v != nil {
			if !onDevice(v) && !feat.ScanCopies {
				continue
			}
			res = append(res, v)
		}
	}
	if sg.trip != nil {
		res = append(res, sg.trip)
	}
	if feat.ScanConstResults && rng.IntN(4) == 0 {
		if v := sg.constYs(); v != nil {
			res = append(res, v)
		}
	}
	return res
}

// constYs adds to the body a ys that is a constant or an iota.
func (sg *scanGen) constYs() *ir.Value {
	rng := sg.s.g.rng
	t := ir.Type{DType: ir.Float32, Shape: sg.s.g.randShape()}
	if t.Rank() > 0 && rng.IntN(2) == 0 {
		return sg.body.add1(ir.Iota, nil, ir.Attrs{"dtype": ir.Float32, "shape": []int(t.Shape), "dim": rng.IntN(t.Rank())})
	}
	return sg.body.add1(ir.Constant, nil, ir.Attrs{"value": RandomLiteral(rng, t)})
}

// stackRows returns the next counter and buffer of a scan body that writes
// a row of buf at counter i per iteration.
func (s *scope) stackRows(i, buf *ir.Value) []*ir.Value {
	rt := buf.Type.WithShape(append(ir.Shape{1}, buf.Type.Shape[1:]...)).WithSpace(ir.Device)
	row := s.like(rt)
	one := s.add1(ir.Constant, nil, ir.Attrs{"value": ir.Scalar(int32(1))})
	next := s.add1(ir.Add, []*ir.Value{i, one}, nil)
	args := []*ir.Value{buf, row, i}
	for range buf.Type.Rank() - 1 {
		args = append(args, s.add1(ir.Constant, nil, ir.Attrs{"value": ir.Scalar(int32(0))}))
	}
	nb := s.add1(ir.DynamicUpdateSlice, args, nil)
	if next == nil || nb == nil {
		return []*ir.Value{i, buf}
	}
	return []*ir.Value{next, nb}
}

// while adds a counted loop: state (i, x...), cond i < n, body i+1 and new
// values of x.
func (s *scope) while() {
	rng := s.g.rng
	x := s.pickWhere(onDevice)
	if x == nil {
		return
	}
	zero := ir.NewLiteral(ir.Type{DType: ir.Int32, Shape: ir.Shape{}})
	i0 := s.add1(ir.Constant, nil, ir.Attrs{"value": zero})
	if i0 == nil {
		return
	}
	var consts []*ir.Value
	if c := s.pickWhere(onDevice); c != nil && rng.IntN(2) == 0 {
		consts = append(consts, c)
	}
	n := rng.IntN(4)
	state := []*ir.Value{i0, x}
	types := slices.Concat(typesOf(consts), typesOf(state))
	// cond: i < n.
	cr := s.g.f.NewRegion()
	for _, t := range types {
		cr.AddParam(t)
	}
	nl := ir.NewLiteral(ir.Type{DType: ir.Int32, Shape: ir.Shape{}})
	nl.SetFloat64At(0, float64(n))
	nc, err := cr.AddOp(ir.Constant, nil, ir.Attrs{"value": nl})
	if err != nil {
		return
	}
	lt, err := cr.AddOp(ir.Lt, []*ir.Value{cr.Params[len(consts)], nc.Result()}, nil)
	if err != nil {
		return
	}
	cr.Results = []*ir.Value{lt.Result()}
	body := s.nested(types, 1+rng.IntN(5), false)
	one := body.add1(ir.Constant, nil, ir.Attrs{"value": ir.Scalar(int32(1))})
	inc := body.add1(ir.Add, []*ir.Value{body.r.Params[len(consts)], one}, nil)
	p := body.r.Params[len(consts)+1]
	nx := body.pickWhere(func(v *ir.Value) bool { return v.Type.Equal(x.Type) && v != p })
	if nx == nil {
		nx = p
	}
	if inc == nil {
		return
	}
	body.r.Results = []*ir.Value{inc, nx}
	s.add(ir.While, slices.Concat(consts, state), ir.Attrs{"num_consts": len(consts)}, cr, body.r)
}

func typesOf(vs []*ir.Value) []ir.Type {
	out := make([]ir.Type, len(vs))
	for i, v := range vs {
		out[i] = v.Type
	}
	return out
}

// cond adds a cond on a predicate computed from a reduction.
func (s *scope) cond() {
	rng := s.g.rng
	x := s.pickWhere(func(v *ir.Value) bool { return v.Type.DType != ir.Bool && onDevice(v) })
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
	if s.g.scanDepth > 0 && !s.g.feat.ScanCopies && (!onDevice(ops[0]) || !onDevice(ops[1])) {
		return
	}
	types := []ir.Type{ops[0].Type, ops[1].Type}
	t := s.nested(types, 1+rng.IntN(4), false)
	f := s.nested(types, 1+rng.IntN(4), false)
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
// same value), and now and then one of a parameter's type, so that a donated
// parameter can be aliased.
func (s *scope) pickResults() []*ir.Value {
	rng := s.g.rng
	var out []*ir.Value
	out = append(out, s.vals[len(s.vals)-1])
	for range rng.IntN(3) {
		out = append(out, s.vals[rng.IntN(len(s.vals))])
	}
	if rng.IntN(2) == 0 {
		p := s.r.Params[rng.IntN(len(s.r.Params))]
		if onDevice(p) && p.Type.DType != ir.Bool {
			code := ir.Add
			if !p.Type.DType.IsFloat() {
				code = ir.Xor
			}
			if v := s.add1(code, []*ir.Value{p, s.like(p.Type)}, nil); v != nil {
				out = append(out, v)
			}
		}
	}
	return out
}

// indexLiteral returns int32 indices mostly in [0, n), some out of range.
func indexLiteral(rng *rand.Rand, t ir.Type, n int) *ir.Literal {
	l := ir.NewLiteral(t)
	for i := range t.Size() {
		l.SetFloat64At(i, float64(rng.IntN(n+2)-1))
	}
	return l
}

// RandomLiteral returns a literal of type t drawn from Default: small
// integers for integer dtypes, 0/1 for bool, and for floats mostly uniform
// values in [-2, 2) with a quarter of small integers.
func RandomLiteral(rng *rand.Rand, t ir.Type) *ir.Literal { return Default.Literal(rng, t) }

// Args returns one random literal per parameter of f, drawn from Default.
func Args(rng *rand.Rand, f *ir.Func) []*ir.Literal { return Default.Args(rng, f) }

// Large returns a random program of about n ops at the top level (no
// control flow), over six parameters, with eight results: for compile-time
// benchmarks.
func Large(seed uint64, n int, feat Features) *ir.Func {
	feat.Control = false
	g := &progGen{rng: rand.New(rand.NewPCG(seed, 1)), feat: feat, budget: n}
	g.f = ir.NewFunc("large")
	s := &scope{g: g, r: g.f.Body, dep: map[*ir.Value]bool{}}
	for range 6 {
		s.param(g.randType())
	}
	s.fill(n)
	s.r.Results = s.vals[len(s.vals)-8:]
	return g.f
}
