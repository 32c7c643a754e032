package ir

import (
	"fmt"
	"math"
	"strings"
)

// Code identifies an op.
type Code uint16

// The op set. Elementwise ops take operands of identical shape and dtype (the
// tracer broadcasts and promotes before emitting them).
const (
	InvalidCode Code = iota

	// Nullary.
	Constant // attrs: value *Literal
	Iota     // attrs: dtype, shape, dim — values along dimension dim

	// Unary elementwise.
	Neg
	Abs
	Sign
	Exp
	Log
	Log1p
	Expm1
	Sqrt
	Rsqrt
	Tanh
	Logistic
	Sin
	Cos
	Erf
	Floor
	Ceil
	Round // half to even, like jnp.round
	Not   // logical on bool, bitwise on integers

	// Binary elementwise.
	Add
	Sub
	Mul
	Div // integer division truncates toward zero
	Pow
	Max // NaN-propagating
	Min // NaN-propagating
	Rem // sign of the dividend, like C fmod and XLA rem
	And
	Or
	Xor
	ShiftLeft
	ShiftRightLogical
	ShiftRightArithmetic

	// Comparisons (result bool).
	Eq
	Ne
	Lt
	Le
	Gt
	Ge

	Select         // (pred bool, on_true, on_false), all the same shape
	Convert        // attrs: dtype
	BitcastConvert // attrs: dtype (same element size)

	// Shape ops.
	BroadcastInDim     // attrs: shape, dims (operand dim i → result dim dims[i])
	Reshape            // attrs: shape
	Transpose          // attrs: perm (result dim i = operand dim perm[i])
	Slice              // attrs: start, limit, strides
	DynamicSlice       // (operand, start scalars...) attrs: sizes; starts clamped into range
	DynamicUpdateSlice // (operand, update, start scalars...); starts clamped into range
	Concatenate        // (operands...) attrs: axis
	Pad                // (operand, pad value scalar) attrs: low, high, interior
	Gather             // (operand, int indices) attrs: axis — jnp.take; indices clamped
	ScatterAdd         // (operand, int indices, updates) attrs: axis — out-of-range dropped

	// Reductions: attrs axes (removed from the shape).
	ReduceSum
	ReduceMax
	ReduceMin
	ReduceProd
	ArgMax // attrs: axis, dtype (index dtype); first index of the maximum; NaN wins
	ArgMin // attrs: axis, dtype

	// Sort: (operands...) attrs: dimension, num_keys. A stable ascending sort of
	// every operand along dimension, ordered by the first num_keys operands
	// lexicographically (lax.sort). Floats compare in a total order in which
	// -0 equals +0 and every NaN sorts last, equal to the other NaNs.
	Sort

	// DotGeneral: attrs lhs_batch, rhs_batch, lhs_contract, rhs_contract. Result
	// dims: batch dims, then lhs free dims, then rhs free dims (as XLA).
	DotGeneral

	// Memory.
	DevicePut // attrs: space — a copy into another memory space

	// Remat.
	CheckpointName      // attrs: name — identity that tags a value for checkpoint policies
	OptimizationBarrier // (operands...) → the operands unchanged; opaque to CSE

	// Sharding.
	ShardingConstraint // attrs: sharding (NamedSharding text) — identity whose result has that sharding

	// Control flow (regions).
	Scan  // args: consts..., carry..., xs...; attrs num_consts, num_carry, length, reverse
	While // args: consts..., state...; regions cond, body; attrs num_consts
	Cond  // args: pred, operands...; regions: true branch, false branch

	// Fusion is a fused group made by the compiler: its region (params = the
	// operands, results = the op's results) runs as one kernel, and values inside
	// it never get a buffer. attrs: kind ("loop", "input" or "output").
	Fusion

	// Collectives over a named axis (see IsCollective and collectives.go):
	// attrs axis (the axis name) and size (the number of members along it).
	AllReduce         // attrs reduction ("sum", "max", "min")
	AllGather         // attrs dimension, tiled (optional)
	ReduceScatter     // attrs dimension, tiled (optional); a sum
	AllToAll          // attrs split_dimension, concat_dimension
	CollectivePermute // attrs pairs (source, target, source, target, ...)
	AxisIndex         // no operands; the member's index along the axis, an i32 scalar

	numCodes
)

// AttrKind is the kind of value an attribute holds.
type AttrKind uint8

// Attribute kinds.
const (
	AttrInt AttrKind = iota + 1
	AttrInts
	AttrFloat
	AttrBool
	AttrString
	AttrDType
	AttrSpace
	AttrLiteral
)

// AttrSpec names one attribute of an op.
type AttrSpec struct {
	Name     string
	Kind     AttrKind
	Optional bool
}

// OpClass groups ops that share a shape rule.
type OpClass uint8

// Op classes.
const (
	ClassOther OpClass = iota
	ClassUnary
	ClassBinary
	ClassCompare
	ClassReduce
	ClassRegion
)

// OpInfo is one row of the op table.
type OpInfo struct {
	Code  Code
	Name  string
	Class OpClass
	// NumArgs is the number of operands, or -1 for variadic (MinArgs applies).
	NumArgs int
	MinArgs int
	// NumRegions is the number of nested regions.
	NumRegions int
	Attrs      []AttrSpec
	// Differentiable is true when the op has (or must have) a VJP rule.
	Differentiable bool
	// Elementwise is true when output element i depends only on input elements i.
	Elementwise bool
	// DTypes is the dtype rule of a unary, binary or compare op (NoDTypeRule
	// for the others, whose Infer says it all).
	DTypes DTypeRule
	// Infer is the shape and dtype rule.
	Infer func(args []Type, attrs Attrs, regions []*Region) ([]Type, error)

	// Ref1 (unary) or Ref2 (binary) is the reference scalar function of a
	// float elementwise op, in float64: the float kernels of internal/eval
	// compute it (rounding once to the element type) where they have no
	// kernel of their own, and tests compare every backend against it. Nil
	// for ops without a float meaning (logical, shifts, comparisons).
	Ref1 func(x float64) float64
	Ref2 func(a, b float64) float64

	// Transcendental is true for the ops the cost analysis counts as
	// transcendental functions (XLA's cost_analysis "transcendentals").
	Transcendental bool

	// Lower names the op's lowerings on the backends that lower by name.
	Lower Lowering

	// View is the index rule of an op that only moves elements (its
	// result element i is operand 0's element View(op).At(i)): kernels of
	// every backend read the operand through it instead of copying (see
	// StridedView). Nil for every other op.
	View func(op *Op) StridedView

	// Shard is the sharding propagation rule (see ShardingRule), read by
	// passes.PropagateShardings. Every op has one; the ops in
	// DefaultShardedOps have ShardReplicate on purpose. The vmap batching
	// rule needs trace's types, so its slot sits beside the VJP rules in
	// trace.
	Shard ShardingRule
}

// Lowering holds the names under which backends lower an op.
type Lowering struct {
	// CUDA is the CUDA C math function of a float unary op ("expm1"); code
	// generation appends "f" for float32 operands. Empty when the CUDA
	// backend emits the op by its own rule (arithmetic, comparisons, ...).
	CUDA string
	// VMath is the name of the cpu/vmath opcode (its ops table row)
	// whose vector kernel computes the op on float32; empty when there is
	// none, and the CPU backend then runs the float64 reference.
	VMath string
}

var opTable [numCodes]OpInfo
var opByName = map[string]Code{}

// Info returns the op table row of c.
func (c Code) Info() *OpInfo {
	if c == InvalidCode || c >= numCodes {
		return &OpInfo{Name: fmt.Sprintf("op(%d)", uint16(c))}
	}
	return &opTable[c]
}

// String returns the op's name.
func (c Code) String() string { return c.Info().Name }

// AllCodes lists every valid op code.
func AllCodes() []Code {
	out := make([]Code, 0, numCodes)
	for c := Code(1); c < numCodes; c++ {
		out = append(out, c)
	}
	return out
}

// LookupCode returns the op with the given name.
func LookupCode(name string) (Code, bool) { c, ok := opByName[name]; return c, ok }

// DTypeRule says which operand dtypes an elementwise op accepts. It is the
// one dtype rule of the op: the shape rule (Infer) checks it and the tracer
// checks it before emitting the op, with the same words.
type DTypeRule uint8

// The dtype rules. The zero rule is unset: elementwise ops must name one.
const (
	NoDTypeRule   DTypeRule = iota // unset
	AnyDType                       // every dtype
	FloatDTypes                    // float dtypes
	NumericDTypes                  // any numeric dtype (not bool)
	LogicalDTypes                  // bool or integer
	IntegerDTypes                  // integer only
)

// OK reports whether the rule accepts d.
func (k DTypeRule) OK(d DType) bool {
	switch k {
	case AnyDType:
		return d.Valid()
	case FloatDTypes:
		return d.IsFloat()
	case NumericDTypes:
		return d != Bool
	case LogicalDTypes:
		return d == Bool || d.IsInteger()
	case IntegerDTypes:
		return d.IsInteger()
	}
	return false
}

// String names what the rule accepts, as error messages say it: "a float
// dtype".
func (k DTypeRule) String() string {
	switch k {
	case AnyDType:
		return "any dtype"
	case FloatDTypes:
		return "a float dtype"
	case NumericDTypes:
		return "a numeric dtype"
	case LogicalDTypes:
		return "bool or an integer dtype"
	case IntegerDTypes:
		return "an integer dtype"
	}
	return "no dtype rule"
}

func def(c Code, info OpInfo) {
	info.Code = c
	opTable[c] = info
	opByName[info.Name] = c
}

func init() {
	def(Constant, OpInfo{Name: "constant", NumArgs: 0, Attrs: []AttrSpec{{Name: "value", Kind: AttrLiteral}}, Infer: inferConstant})
	def(Iota, OpInfo{Name: "iota", NumArgs: 0, Attrs: []AttrSpec{{"dtype", AttrDType, false}, {"shape", AttrInts, false}, {"dim", AttrInt, false}}, Infer: inferIota})

	// The rows of the elementwise ops: code, name, dtype rule, whether
	// differentiable, reference function, whether transcendental, lowerings.
	const transc, arith = true, false
	unary := func(c Code, name string, k DTypeRule, diff bool, ref func(float64) float64, tr bool, low Lowering) {
		def(c, OpInfo{Name: name, Class: ClassUnary, NumArgs: 1, Differentiable: diff, Elementwise: true, DTypes: k, Infer: inferUnary(name, k), Ref1: ref, Transcendental: tr, Lower: low})
	}
	unary(Neg, "neg", NumericDTypes, true, neg, arith, Lowering{VMath: "neg"})
	unary(Abs, "abs", NumericDTypes, true, math.Abs, arith, Lowering{CUDA: "fabs", VMath: "abs"})
	unary(Sign, "sign", NumericDTypes, true, sign, arith, Lowering{})
	unary(Exp, "exp", FloatDTypes, true, math.Exp, transc, Lowering{CUDA: "exp", VMath: "exp"})
	unary(Log, "log", FloatDTypes, true, math.Log, transc, Lowering{CUDA: "log", VMath: "log"})
	unary(Log1p, "log1p", FloatDTypes, true, math.Log1p, transc, Lowering{CUDA: "log1p"})
	unary(Expm1, "expm1", FloatDTypes, true, math.Expm1, transc, Lowering{CUDA: "expm1"})
	unary(Sqrt, "sqrt", FloatDTypes, true, math.Sqrt, transc, Lowering{CUDA: "sqrt", VMath: "sqrt"})
	unary(Rsqrt, "rsqrt", FloatDTypes, true, rsqrt, transc, Lowering{VMath: "rsqrt"})
	unary(Tanh, "tanh", FloatDTypes, true, math.Tanh, transc, Lowering{CUDA: "tanh", VMath: "tanh"})
	unary(Logistic, "logistic", FloatDTypes, true, logistic, transc, Lowering{VMath: "logistic"})
	unary(Sin, "sin", FloatDTypes, true, math.Sin, transc, Lowering{CUDA: "sin"})
	unary(Cos, "cos", FloatDTypes, true, math.Cos, transc, Lowering{CUDA: "cos"})
	unary(Erf, "erf", FloatDTypes, true, math.Erf, transc, Lowering{CUDA: "erf", VMath: "erf"})
	unary(Floor, "floor", FloatDTypes, true, math.Floor, arith, Lowering{CUDA: "floor"})
	unary(Ceil, "ceil", FloatDTypes, true, math.Ceil, arith, Lowering{CUDA: "ceil"})
	unary(Round, "round", FloatDTypes, true, math.RoundToEven, arith, Lowering{CUDA: "rint"})
	unary(Not, "not", LogicalDTypes, false, nil, arith, Lowering{})

	binary := func(c Code, name string, k DTypeRule, diff bool, ref func(a, b float64) float64, tr bool, low Lowering) {
		def(c, OpInfo{Name: name, Class: ClassBinary, NumArgs: 2, Differentiable: diff, Elementwise: true, DTypes: k, Infer: inferBinary(name, k), Ref2: ref, Transcendental: tr, Lower: low})
	}
	binary(Add, "add", NumericDTypes, true, add, arith, Lowering{VMath: "add"})
	binary(Sub, "sub", NumericDTypes, true, sub, arith, Lowering{VMath: "sub"})
	binary(Mul, "mul", NumericDTypes, true, mul, arith, Lowering{VMath: "mul"})
	binary(Div, "div", NumericDTypes, true, div, arith, Lowering{VMath: "div"})
	binary(Pow, "pow", FloatDTypes, true, math.Pow, transc, Lowering{})
	binary(Max, "max", NumericDTypes, true, maxNaN, arith, Lowering{VMath: "max"})
	binary(Min, "min", NumericDTypes, true, minNaN, arith, Lowering{VMath: "min"})
	binary(Rem, "rem", NumericDTypes, true, math.Mod, arith, Lowering{})
	binary(And, "and", LogicalDTypes, false, nil, arith, Lowering{})
	binary(Or, "or", LogicalDTypes, false, nil, arith, Lowering{})
	binary(Xor, "xor", LogicalDTypes, false, nil, arith, Lowering{})
	binary(ShiftLeft, "shift_left", IntegerDTypes, false, nil, arith, Lowering{})
	binary(ShiftRightLogical, "shift_right_logical", IntegerDTypes, false, nil, arith, Lowering{})
	binary(ShiftRightArithmetic, "shift_right_arithmetic", IntegerDTypes, false, nil, arith, Lowering{})

	for c, name := range map[Code]string{Eq: "eq", Ne: "ne", Lt: "lt", Le: "le", Gt: "gt", Ge: "ge"} {
		def(c, OpInfo{Name: name, Class: ClassCompare, NumArgs: 2, Elementwise: true, DTypes: AnyDType, Infer: inferCompare(name)})
	}

	def(Select, OpInfo{Name: "select", NumArgs: 3, Differentiable: true, Elementwise: true, Infer: inferSelect})
	def(Convert, OpInfo{Name: "convert", NumArgs: 1, Differentiable: true, Elementwise: true, Attrs: []AttrSpec{{"dtype", AttrDType, false}}, Infer: inferConvert})
	def(BitcastConvert, OpInfo{Name: "bitcast_convert", NumArgs: 1, Elementwise: true, Attrs: []AttrSpec{{"dtype", AttrDType, false}}, Infer: inferBitcast})

	def(BroadcastInDim, OpInfo{Name: "broadcast_in_dim", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"shape", AttrInts, false}, {"dims", AttrInts, false}}, Infer: inferBroadcastInDim, View: viewBroadcastInDim})
	def(Reshape, OpInfo{Name: "reshape", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"shape", AttrInts, false}}, Infer: inferReshape, View: viewReshape})
	def(Transpose, OpInfo{Name: "transpose", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"perm", AttrInts, false}}, Infer: inferTranspose, View: viewTranspose})
	def(Slice, OpInfo{Name: "slice", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"start", AttrInts, false}, {"limit", AttrInts, false}, {"strides", AttrInts, false}}, Infer: inferSlice, View: viewSlice})
	def(DynamicSlice, OpInfo{Name: "dynamic_slice", NumArgs: -1, MinArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"sizes", AttrInts, false}}, Infer: inferDynamicSlice})
	def(DynamicUpdateSlice, OpInfo{Name: "dynamic_update_slice", NumArgs: -1, MinArgs: 2, Differentiable: true, Infer: inferDynamicUpdateSlice})
	def(Concatenate, OpInfo{Name: "concatenate", NumArgs: -1, MinArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"axis", AttrInt, false}}, Infer: inferConcatenate})
	def(Pad, OpInfo{Name: "pad", NumArgs: 2, Differentiable: true, Attrs: []AttrSpec{{"low", AttrInts, false}, {"high", AttrInts, false}, {"interior", AttrInts, false}}, Infer: inferPad})
	def(Gather, OpInfo{Name: "gather", NumArgs: 2, Differentiable: true, Attrs: []AttrSpec{{"axis", AttrInt, false}}, Infer: inferGather})
	def(ScatterAdd, OpInfo{Name: "scatter_add", NumArgs: 3, Differentiable: true, Attrs: []AttrSpec{{"axis", AttrInt, false}}, Infer: inferScatterAdd})

	reduce := func(c Code, name string, diff bool) {
		def(c, OpInfo{Name: name, Class: ClassReduce, NumArgs: 1, Differentiable: diff, Attrs: []AttrSpec{{"axes", AttrInts, false}}, Infer: inferReduce(name)})
	}
	reduce(ReduceSum, "reduce_sum", true)
	reduce(ReduceMax, "reduce_max", true)
	reduce(ReduceMin, "reduce_min", true)
	reduce(ReduceProd, "reduce_prod", true)
	def(Sort, OpInfo{Name: "sort", NumArgs: -1, MinArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"dimension", AttrInt, false}, {"num_keys", AttrInt, false}}, Infer: inferSort})
	def(ArgMax, OpInfo{Name: "argmax", NumArgs: 1, Attrs: []AttrSpec{{"axis", AttrInt, false}, {"dtype", AttrDType, false}}, Infer: inferArg})
	def(ArgMin, OpInfo{Name: "argmin", NumArgs: 1, Attrs: []AttrSpec{{"axis", AttrInt, false}, {"dtype", AttrDType, false}}, Infer: inferArg})

	def(DotGeneral, OpInfo{Name: "dot_general", NumArgs: 2, Differentiable: true, Attrs: []AttrSpec{
		{"lhs_batch", AttrInts, false}, {"rhs_batch", AttrInts, false}, {"lhs_contract", AttrInts, false}, {"rhs_contract", AttrInts, false}}, Infer: inferDotGeneral})

	def(DevicePut, OpInfo{Name: "device_put", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"space", AttrSpace, false}}, Infer: inferDevicePut})

	def(CheckpointName, OpInfo{Name: "checkpoint_name", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"name", AttrString, false}}, Infer: inferIdentity})
	def(OptimizationBarrier, OpInfo{Name: "optimization_barrier", NumArgs: -1, MinArgs: 1, Differentiable: true, Infer: inferIdentity})
	def(ShardingConstraint, OpInfo{Name: "sharding_constraint", NumArgs: 1, Differentiable: true, Attrs: []AttrSpec{{"sharding", AttrString, false}}, Infer: inferShardingConstraint})

	def(Scan, OpInfo{Name: "scan", Class: ClassRegion, NumArgs: -1, NumRegions: 1, Differentiable: true, Attrs: []AttrSpec{
		{"num_consts", AttrInt, false}, {"num_carry", AttrInt, false}, {"length", AttrInt, false}, {"reverse", AttrBool, true}}, Infer: inferScan})
	def(While, OpInfo{Name: "while", Class: ClassRegion, NumArgs: -1, NumRegions: 2, Attrs: []AttrSpec{{"num_consts", AttrInt, false}}, Infer: inferWhile})
	def(Fusion, OpInfo{Name: "fusion", Class: ClassRegion, NumArgs: -1, NumRegions: 1, Attrs: []AttrSpec{{"kind", AttrString, false}}, Infer: inferFusion})
	def(Cond, OpInfo{Name: "cond", Class: ClassRegion, NumArgs: -1, MinArgs: 1, NumRegions: 2, Differentiable: true, Infer: inferCond})
	installShardRules()
}

// InferTypes checks operands, attributes and regions of an op and returns its
// result types. Errors name the op and the problem. Shape rules ignore
// shardings: the result types are unsharded, and region contracts (scan,
// while, cond, fusion) compare types with Type.EqualUnsharded.
func InferTypes(code Code, args []Type, attrs Attrs, regions []*Region) ([]Type, error) {
	info := code.Info()
	if info.Infer == nil {
		return nil, fmt.Errorf("unknown op %v", code)
	}
	if info.NumArgs >= 0 && len(args) != info.NumArgs {
		return nil, fmt.Errorf("%s takes %d operands, got %d", info.Name, info.NumArgs, len(args))
	}
	if info.NumArgs < 0 && len(args) < info.MinArgs {
		return nil, fmt.Errorf("%s takes at least %d operands, got %d", info.Name, info.MinArgs, len(args))
	}
	if len(regions) != info.NumRegions {
		return nil, fmt.Errorf("%s takes %d regions, got %d", info.Name, info.NumRegions, len(regions))
	}
	for _, a := range args {
		if !a.DType.Valid() {
			return nil, fmt.Errorf("%s: operand has invalid dtype %v", info.Name, a.DType)
		}
		for _, d := range a.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%s: operand shape %v has a negative dimension", info.Name, a.Shape)
			}
		}
	}
	if err := checkAttrs(info, attrs); err != nil {
		return nil, err
	}
	out, err := info.Infer(args, attrs, regions)
	for i := range out {
		out[i].Sharding = nil // shape rules give unsharded types (see Type.Sharding)
	}
	return out, err
}

func checkAttrs(info *OpInfo, attrs Attrs) error {
	known := map[string]bool{}
	for _, s := range info.Attrs {
		known[s.Name] = true
		v, ok := attrs[s.Name]
		if !ok {
			if s.Optional {
				continue
			}
			return fmt.Errorf("%s: missing attribute %q", info.Name, s.Name)
		}
		okKind := false
		switch s.Kind {
		case AttrInt:
			_, okKind = v.(int)
		case AttrInts:
			_, okKind = v.([]int)
		case AttrFloat:
			_, okKind = v.(float64)
		case AttrBool:
			_, okKind = v.(bool)
		case AttrString:
			_, okKind = v.(string)
		case AttrDType:
			_, okKind = v.(DType)
		case AttrSpace:
			_, okKind = v.(MemorySpace)
		case AttrLiteral:
			var l *Literal
			l, okKind = v.(*Literal)
			okKind = okKind && l != nil
		}
		if !okKind {
			return fmt.Errorf("%s: attribute %q has the wrong kind (%T)", info.Name, s.Name, v)
		}
	}
	for k := range attrs {
		if !known[k] {
			return fmt.Errorf("%s: unknown attribute %q", info.Name, k)
		}
	}
	return nil
}

func one(t Type) []Type { return []Type{t} }

func dev(t Type) Type { return t.WithSpace(Device) }

func inferConstant(_ []Type, a Attrs, _ []*Region) ([]Type, error) {
	l := a.Literal("value")
	if !l.Type.DType.Valid() {
		return nil, fmt.Errorf("constant: invalid dtype %v", l.Type.DType)
	}
	if err := checkDims("constant", l.Type.Shape); err != nil {
		return nil, err
	}
	if int64(len(l.Data)) != l.Type.Bytes() {
		return nil, fmt.Errorf("constant: literal of type %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	return one(dev(l.Type)), nil
}

func inferIota(_ []Type, a Attrs, _ []*Region) ([]Type, error) {
	shape, dim, dt := Shape(a.Ints("shape")), a.Int("dim"), a.DType("dtype")
	if !dt.Valid() || dt == Bool {
		return nil, fmt.Errorf("iota: dtype %v is not numeric", dt)
	}
	if err := checkDims("iota", shape); err != nil {
		return nil, err
	}
	if dim < 0 || dim >= len(shape) {
		return nil, fmt.Errorf("iota: dim %d out of range for shape %v", dim, shape)
	}
	return one(Type{DType: dt, Shape: shape.Clone()}), nil
}

func checkDims(op string, s Shape) error {
	for _, d := range s {
		if d < 0 {
			return fmt.Errorf("%s: shape %v has a negative dimension", op, s)
		}
	}
	return nil
}

func inferUnary(name string, k DTypeRule) func([]Type, Attrs, []*Region) ([]Type, error) {
	return func(args []Type, _ Attrs, _ []*Region) ([]Type, error) {
		if !k.OK(args[0].DType) {
			return nil, fmt.Errorf("%s needs %v, got %v", name, k, args[0].DType)
		}
		return one(dev(args[0])), nil
	}
}

func sameTypes(name string, args []Type) error {
	for i := 1; i < len(args); i++ {
		if args[i].DType != args[0].DType {
			return fmt.Errorf("%s: dtypes differ: %v and %v", name, args[0].DType, args[i].DType)
		}
		if !args[i].Shape.Equal(args[0].Shape) {
			return fmt.Errorf("%s: shapes differ: %v and %v", name, args[0].Shape, args[i].Shape)
		}
	}
	return nil
}

func inferBinary(name string, k DTypeRule) func([]Type, Attrs, []*Region) ([]Type, error) {
	return func(args []Type, _ Attrs, _ []*Region) ([]Type, error) {
		if err := sameTypes(name, args); err != nil {
			return nil, err
		}
		if !k.OK(args[0].DType) {
			return nil, fmt.Errorf("%s needs %v, got %v", name, k, args[0].DType)
		}
		return one(dev(args[0])), nil
	}
}

func inferCompare(name string) func([]Type, Attrs, []*Region) ([]Type, error) {
	return func(args []Type, _ Attrs, _ []*Region) ([]Type, error) {
		if err := sameTypes(name, args); err != nil {
			return nil, err
		}
		return one(Type{DType: Bool, Shape: args[0].Shape.Clone()}), nil
	}
}

func inferSelect(args []Type, _ Attrs, _ []*Region) ([]Type, error) {
	if args[0].DType != Bool {
		return nil, fmt.Errorf("select: predicate must be bool, got %v", args[0].DType)
	}
	if !args[0].Shape.Equal(args[1].Shape) {
		return nil, fmt.Errorf("select: predicate shape %v differs from operand shape %v", args[0].Shape, args[1].Shape)
	}
	if err := sameTypes("select", args[1:]); err != nil {
		return nil, err
	}
	return one(dev(args[1])), nil
}

func inferConvert(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	dt := a.DType("dtype")
	if !dt.Valid() {
		return nil, fmt.Errorf("convert: invalid target dtype %v", dt)
	}
	return one(dev(args[0].WithDType(dt))), nil
}

func inferBitcast(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	dt := a.DType("dtype")
	if !dt.Valid() || dt.Size() != args[0].DType.Size() || dt == Bool || args[0].DType == Bool {
		return nil, fmt.Errorf("bitcast_convert: cannot reinterpret %v as %v (sizes must match, no bool)", args[0].DType, dt)
	}
	return one(dev(args[0].WithDType(dt))), nil
}

func inferBroadcastInDim(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	shape, dims := Shape(a.Ints("shape")), a.Ints("dims")
	if err := checkDims("broadcast_in_dim", shape); err != nil {
		return nil, err
	}
	in := args[0].Shape
	if len(dims) != len(in) {
		return nil, fmt.Errorf("broadcast_in_dim: %d dims for an operand of rank %d", len(dims), len(in))
	}
	prev := -1
	for i, d := range dims {
		if d < 0 || d >= len(shape) || d <= prev {
			return nil, fmt.Errorf("broadcast_in_dim: dims %v must be increasing and within rank %d", dims, len(shape))
		}
		prev = d
		if in[i] != 1 && in[i] != shape[d] {
			return nil, fmt.Errorf("broadcast_in_dim: operand dim %d (size %d) cannot broadcast to size %d", i, in[i], shape[d])
		}
	}
	return one(dev(args[0].WithShape(shape))), nil
}

func inferReshape(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	shape := Shape(a.Ints("shape"))
	if err := checkDims("reshape", shape); err != nil {
		return nil, err
	}
	if shape.Size() != args[0].Shape.Size() {
		return nil, fmt.Errorf("reshape: cannot reshape %v (%d elements) to %v (%d elements)", args[0].Shape, args[0].Shape.Size(), shape, shape.Size())
	}
	return one(dev(args[0].WithShape(shape))), nil
}

// IsPermutation reports whether p is a permutation of 0..n-1.
func IsPermutation(p []int, n int) bool {
	if len(p) != n {
		return false
	}
	seen := make([]bool, n)
	for _, x := range p {
		if x < 0 || x >= n || seen[x] {
			return false
		}
		seen[x] = true
	}
	return true
}

func inferTranspose(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	perm := a.Ints("perm")
	in := args[0].Shape
	if !IsPermutation(perm, len(in)) {
		return nil, fmt.Errorf("transpose: %v is not a permutation of %d axes", perm, len(in))
	}
	out := make(Shape, len(in))
	for i, p := range perm {
		out[i] = in[p]
	}
	return one(dev(args[0].WithShape(out))), nil
}

func inferSlice(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	start, limit, strides := a.Ints("start"), a.Ints("limit"), a.Ints("strides")
	in := args[0].Shape
	if len(start) != len(in) || len(limit) != len(in) || len(strides) != len(in) {
		return nil, fmt.Errorf("slice: start, limit and strides need %d entries each (rank of %v)", len(in), in)
	}
	out := make(Shape, len(in))
	for i := range in {
		if strides[i] < 1 || start[i] < 0 || limit[i] > in[i] || start[i] > limit[i] {
			return nil, fmt.Errorf("slice: bad range [%d:%d:%d] on axis %d of size %d", start[i], limit[i], strides[i], i, in[i])
		}
		out[i] = (limit[i] - start[i] + strides[i] - 1) / strides[i]
	}
	return one(dev(args[0].WithShape(out))), nil
}

func checkIndexScalars(name string, ts []Type, rank int) error {
	if len(ts) != rank {
		return fmt.Errorf("%s: %d start indices for rank %d", name, len(ts), rank)
	}
	for _, t := range ts {
		if t.Rank() != 0 || !t.DType.IsInteger() {
			return fmt.Errorf("%s: start indices must be integer scalars, got %v", name, t)
		}
	}
	return nil
}

func inferDynamicSlice(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	in := args[0].Shape
	sizes := Shape(a.Ints("sizes"))
	if err := checkIndexScalars("dynamic_slice", args[1:], len(in)); err != nil {
		return nil, err
	}
	if len(sizes) != len(in) {
		return nil, fmt.Errorf("dynamic_slice: %d sizes for rank %d", len(sizes), len(in))
	}
	for i := range in {
		if sizes[i] < 0 || sizes[i] > in[i] {
			return nil, fmt.Errorf("dynamic_slice: size %d on axis %d exceeds %d", sizes[i], i, in[i])
		}
	}
	return one(dev(args[0].WithShape(sizes))), nil
}

func inferDynamicUpdateSlice(args []Type, _ Attrs, _ []*Region) ([]Type, error) {
	in, up := args[0], args[1]
	if in.DType != up.DType || in.Rank() != up.Rank() {
		return nil, fmt.Errorf("dynamic_update_slice: update %v does not match operand %v", up, in)
	}
	for i := range in.Shape {
		if up.Shape[i] > in.Shape[i] {
			return nil, fmt.Errorf("dynamic_update_slice: update %v larger than operand %v on axis %d", up.Shape, in.Shape, i)
		}
	}
	if err := checkIndexScalars("dynamic_update_slice", args[2:], in.Rank()); err != nil {
		return nil, err
	}
	return one(dev(in)), nil
}

func inferConcatenate(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	axis := a.Int("axis")
	r := args[0].Rank()
	if axis < 0 || axis >= r {
		return nil, fmt.Errorf("concatenate: axis %d out of range for rank %d", axis, r)
	}
	out := args[0].Shape.Clone()
	for i, t := range args[1:] {
		if t.DType != args[0].DType || t.Rank() != r {
			return nil, fmt.Errorf("concatenate: operand %d is %v, want %v of rank %d", i+1, t, args[0].DType, r)
		}
		for d := range out {
			if d != axis && t.Shape[d] != out[d] {
				return nil, fmt.Errorf("concatenate: operand %d shape %v differs from %v off axis %d", i+1, t.Shape, args[0].Shape, axis)
			}
		}
		out[axis] += t.Shape[axis]
	}
	return one(dev(args[0].WithShape(out))), nil
}

func inferPad(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	lo, hi, in := a.Ints("low"), a.Ints("high"), a.Ints("interior")
	s := args[0].Shape
	if args[1].Rank() != 0 || args[1].DType != args[0].DType {
		return nil, fmt.Errorf("pad: padding value must be a %v scalar, got %v", args[0].DType, args[1])
	}
	if len(lo) != len(s) || len(hi) != len(s) || len(in) != len(s) {
		return nil, fmt.Errorf("pad: low, high and interior need %d entries each", len(s))
	}
	out := make(Shape, len(s))
	for i := range s {
		if in[i] < 0 {
			return nil, fmt.Errorf("pad: negative interior padding on axis %d", i)
		}
		core := s[i]
		if core > 0 {
			core += (s[i] - 1) * in[i]
		}
		out[i] = lo[i] + core + hi[i]
		if out[i] < 0 {
			return nil, fmt.Errorf("pad: axis %d would have negative size %d", i, out[i])
		}
	}
	return one(dev(args[0].WithShape(out))), nil
}

func inferGather(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	op, idx, axis := args[0], args[1], a.Int("axis")
	if axis < 0 || axis >= op.Rank() {
		return nil, fmt.Errorf("gather: axis %d out of range for rank %d", axis, op.Rank())
	}
	if !idx.DType.IsInteger() {
		return nil, fmt.Errorf("gather: indices must be integers, got %v", idx.DType)
	}
	return one(dev(op.WithShape(GatherShape(op.Shape, idx.Shape, axis)))), nil
}

// GatherShape is operand.shape[:axis] + indices.shape + operand.shape[axis+1:].
func GatherShape(operand, indices Shape, axis int) Shape {
	out := append(Shape{}, operand[:axis]...)
	out = append(out, indices...)
	return append(out, operand[axis+1:]...)
}

func inferScatterAdd(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	op, idx, up, axis := args[0], args[1], args[2], a.Int("axis")
	if axis < 0 || axis >= op.Rank() {
		return nil, fmt.Errorf("scatter_add: axis %d out of range for rank %d", axis, op.Rank())
	}
	if !idx.DType.IsInteger() {
		return nil, fmt.Errorf("scatter_add: indices must be integers, got %v", idx.DType)
	}
	want := GatherShape(op.Shape, idx.Shape, axis)
	if up.DType != op.DType || !up.Shape.Equal(want) {
		return nil, fmt.Errorf("scatter_add: updates %v must be %v%v", up, op.DType, want)
	}
	return one(dev(op)), nil
}

func checkAxes(name string, axes []int, rank int) error {
	seen := map[int]bool{}
	for _, ax := range axes {
		if ax < 0 || ax >= rank || seen[ax] {
			return fmt.Errorf("%s: bad axes %v for rank %d", name, axes, rank)
		}
		seen[ax] = true
	}
	return nil
}

// RemoveAxes returns s without the given axes.
func RemoveAxes(s Shape, axes []int) Shape {
	drop := map[int]bool{}
	for _, a := range axes {
		drop[a] = true
	}
	out := Shape{}
	for i, d := range s {
		if !drop[i] {
			out = append(out, d)
		}
	}
	return out
}

func inferReduce(name string) func([]Type, Attrs, []*Region) ([]Type, error) {
	return func(args []Type, a Attrs, _ []*Region) ([]Type, error) {
		axes := a.Ints("axes")
		if err := checkAxes(name, axes, args[0].Rank()); err != nil {
			return nil, err
		}
		if args[0].DType == Bool {
			return nil, fmt.Errorf("%s: cannot reduce bool (convert first)", name)
		}
		return one(dev(args[0].WithShape(RemoveAxes(args[0].Shape, axes)))), nil
	}
}

func inferArg(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	axis, dt := a.Int("axis"), a.DType("dtype")
	if axis < 0 || axis >= args[0].Rank() {
		return nil, fmt.Errorf("argmax/argmin: axis %d out of range for rank %d", axis, args[0].Rank())
	}
	if args[0].Shape[axis] == 0 {
		return nil, fmt.Errorf("argmax/argmin: axis %d is empty", axis)
	}
	if dt != Int32 && dt != Int64 {
		return nil, fmt.Errorf("argmax/argmin: index dtype must be i32 or i64, got %v", dt)
	}
	return one(Type{DType: dt, Shape: RemoveAxes(args[0].Shape, []int{axis})}), nil
}

func inferSort(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	dim, nk := a.Int("dimension"), a.Int("num_keys")
	if dim < 0 || dim >= args[0].Rank() {
		return nil, fmt.Errorf("sort: dimension %d out of range for rank %d", dim, args[0].Rank())
	}
	if nk < 1 || nk > len(args) {
		return nil, fmt.Errorf("sort: num_keys %d out of range for %d operands", nk, len(args))
	}
	out := make([]Type, len(args))
	for i, t := range args {
		if !t.Shape.Equal(args[0].Shape) {
			return nil, fmt.Errorf("sort: operand %d has shape %v, operand 0 has %v", i, t.Shape, args[0].Shape)
		}
		if t.Space != args[0].Space {
			return nil, fmt.Errorf("sort: operand %d is in %v, operand 0 in %v", i, t.Space, args[0].Space)
		}
		out[i] = t
	}
	return out, nil
}

// DotShape returns the result shape of dot_general.
func DotShape(lhs, rhs Shape, lb, rb, lc, rc []int) (Shape, error) {
	if len(lb) != len(rb) || len(lc) != len(rc) {
		return nil, fmt.Errorf("dot_general: batch dims %v/%v or contracting dims %v/%v differ in number", lb, rb, lc, rc)
	}
	if err := checkAxes("dot_general lhs", append(append([]int{}, lb...), lc...), len(lhs)); err != nil {
		return nil, err
	}
	if err := checkAxes("dot_general rhs", append(append([]int{}, rb...), rc...), len(rhs)); err != nil {
		return nil, err
	}
	out := Shape{}
	for i := range lb {
		if lhs[lb[i]] != rhs[rb[i]] {
			return nil, fmt.Errorf("dot_general: batch dim sizes differ: lhs %v axis %d vs rhs %v axis %d", lhs, lb[i], rhs, rb[i])
		}
		out = append(out, lhs[lb[i]])
	}
	for i := range lc {
		if lhs[lc[i]] != rhs[rc[i]] {
			return nil, fmt.Errorf("dot_general: contracting dim sizes differ: lhs %v axis %d (%d) vs rhs %v axis %d (%d)", lhs, lc[i], lhs[lc[i]], rhs, rc[i], rhs[rc[i]])
		}
	}
	out = append(out, RemoveAxes(lhs, append(append([]int{}, lb...), lc...))...)
	out = append(out, RemoveAxes(rhs, append(append([]int{}, rb...), rc...))...)
	return out, nil
}

func inferDotGeneral(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	l, r := args[0], args[1]
	if l.DType != r.DType || l.DType == Bool {
		return nil, fmt.Errorf("dot_general: operands must share a numeric dtype, got %v and %v", l.DType, r.DType)
	}
	s, err := DotShape(l.Shape, r.Shape, a.Ints("lhs_batch"), a.Ints("rhs_batch"), a.Ints("lhs_contract"), a.Ints("rhs_contract"))
	if err != nil {
		return nil, err
	}
	return one(Type{DType: l.DType, Shape: s}), nil
}

func inferDevicePut(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	sp := a.Space("space")
	if sp >= numSpaces {
		return nil, fmt.Errorf("device_put: invalid memory space %v", sp)
	}
	return one(args[0].WithSpace(sp)), nil
}

// inferIdentity: the results are the operands' types (memory space included).
func inferIdentity(args []Type, _ Attrs, _ []*Region) ([]Type, error) {
	out := make([]Type, len(args))
	for i, a := range args {
		out[i] = a.Clone()
	}
	return out, nil
}

func typesEqual(a, b []Type) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].EqualUnsharded(b[i]) {
			return false
		}
	}
	return true
}

func typeList(ts []Type) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return "(" + strings.Join(s, ", ") + ")"
}

func inferScan(args []Type, a Attrs, regions []*Region) ([]Type, error) {
	nc, nk, n := a.Int("num_consts"), a.Int("num_carry"), a.Int("length")
	if nc < 0 || nk < 0 || nc > len(args) || nk > len(args)-nc || n < 0 {
		return nil, fmt.Errorf("scan: bad num_consts %d / num_carry %d / length %d for %d operands", nc, nk, n, len(args))
	}
	body := regions[0]
	xs := args[nc+nk:]
	want := append([]Type{}, args[:nc+nk]...)
	for i, x := range xs {
		if x.Rank() == 0 || x.Shape[0] != n {
			return nil, fmt.Errorf("scan: xs[%d] %v must have leading dimension %d", i, x, n)
		}
		want = append(want, x.WithShape(x.Shape[1:]))
	}
	if got := body.ParamTypes(); !typesEqual(got, want) {
		return nil, fmt.Errorf("scan: body parameters %s, want %s", typeList(got), typeList(want))
	}
	res := body.ResultTypes()
	if len(res) < nk || !typesEqual(res[:nk], args[nc:nc+nk]) {
		return nil, fmt.Errorf("scan: body must return the carry %s first, got %s", typeList(args[nc:nc+nk]), typeList(res))
	}
	out := append([]Type{}, res[:nk]...)
	for _, y := range res[nk:] {
		out = append(out, y.WithShape(append(Shape{n}, y.Shape...)))
	}
	return out, nil
}

func inferWhile(args []Type, a Attrs, regions []*Region) ([]Type, error) {
	nc := a.Int("num_consts")
	if nc < 0 || nc > len(args) {
		return nil, fmt.Errorf("while: bad num_consts %d for %d operands", nc, len(args))
	}
	cond, body := regions[0], regions[1]
	if got := cond.ParamTypes(); !typesEqual(got, args) {
		return nil, fmt.Errorf("while: cond parameters %s, want %s", typeList(got), typeList(args))
	}
	if r := cond.ResultTypes(); len(r) != 1 || r[0].DType != Bool || r[0].Rank() != 0 {
		return nil, fmt.Errorf("while: cond must return one bool scalar, got %s", typeList(r))
	}
	if got := body.ParamTypes(); !typesEqual(got, args) {
		return nil, fmt.Errorf("while: body parameters %s, want %s", typeList(got), typeList(args))
	}
	state := args[nc:]
	if r := body.ResultTypes(); !typesEqual(r, state) {
		return nil, fmt.Errorf("while: body returns %s, want the state %s", typeList(r), typeList(state))
	}
	return append([]Type{}, state...), nil
}

func inferCond(args []Type, _ Attrs, regions []*Region) ([]Type, error) {
	if args[0].DType != Bool || args[0].Rank() != 0 {
		return nil, fmt.Errorf("cond: predicate must be a bool scalar, got %v", args[0])
	}
	ops := args[1:]
	var out []Type
	for i, r := range regions {
		if got := r.ParamTypes(); !typesEqual(got, ops) {
			return nil, fmt.Errorf("cond: branch %d parameters %s, want %s", i, typeList(got), typeList(ops))
		}
		if i == 0 {
			out = r.ResultTypes()
		} else if got := r.ResultTypes(); !typesEqual(got, out) {
			return nil, fmt.Errorf("cond: branch results differ: %s vs %s", typeList(out), typeList(got))
		}
	}
	return out, nil
}

// FusionKinds are the kinds of fused group: elementwise loops, elementwise
// producers feeding reductions, and a matrix product with an elementwise epilogue.
var FusionKinds = []string{"loop", "input", "output"}

func inferFusion(args []Type, a Attrs, regions []*Region) ([]Type, error) {
	kind := a.String("kind")
	ok := false
	for _, k := range FusionKinds {
		ok = ok || k == kind
	}
	if !ok {
		return nil, fmt.Errorf("fusion: kind %q is not one of %v", kind, FusionKinds)
	}
	body := regions[0]
	if got := body.ParamTypes(); !typesEqual(got, args) {
		return nil, fmt.Errorf("fusion: region parameters %s, want the operands %s", typeList(got), typeList(args))
	}
	return body.ResultTypes(), nil
}

// Reference scalar functions of the elementwise ops that package math lacks.

func neg(x float64) float64    { return -x }
func rsqrt(x float64) float64  { return 1 / math.Sqrt(x) }
func add(a, b float64) float64 { return a + b }
func sub(a, b float64) float64 { return a - b }
func mul(a, b float64) float64 { return a * b }
func div(a, b float64) float64 { return a / b }

// sign is -1, 0 or 1 by the sign of x; ±0 and NaN stay as they are.
func sign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return x
}

// logistic is 1/(1+e**-x), without overflow for large |x|.
func logistic(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// maxNaN and minNaN propagate NaN (math.Max does as well, but prefers +0
// over -0 where the kernels return the first operand).
func maxNaN(a, b float64) float64 {
	if a != a || a > b {
		return a
	}
	return b
}

func minNaN(a, b float64) float64 {
	if a != a || a < b {
		return a
	}
	return b
}
