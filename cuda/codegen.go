package cuda

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// CType returns the C type an array of dtype dt is stored as in device memory
// (f16 and bf16 as their 16-bit patterns in unsigned short).
func CType(dt ir.DType) (string, error) {
	switch dt {
	case ir.Bool:
		return "bool", nil
	case ir.Uint8:
		return "unsigned char", nil
	case ir.Int32:
		return "int", nil
	case ir.Int64:
		return "long long", nil
	case ir.Uint32:
		return "unsigned int", nil
	case ir.Float16, ir.BFloat16:
		return "unsigned short", nil
	case ir.Float32:
		return "float", nil
	case ir.Float64:
		return "double", nil
	}
	return "", fmt.Errorf("dtype %v is not supported by the CUDA generator", dt)
}

// computeType is the C type values of dt are computed in (f16 and bf16 in
// float, rounded back after every op).
func computeType(dt ir.DType) string {
	if dt == ir.Float16 || dt == ir.BFloat16 {
		return "float"
	}
	s, _ := CType(dt)
	return s
}

// unsignedOf is the unsigned C type of the same width as an integer dtype
// (unsigned int for the narrower ones, which C promotes to int anyway).
func unsignedOf(dt ir.DType) string {
	if dt == ir.Int64 {
		return "unsigned long long"
	}
	return "unsigned int"
}

func bitWidth(dt ir.DType) int { return dt.Size() * 8 }

// halfCall wraps e in the f16 or bf16 prelude function named for dt, and
// returns e itself for every other dtype.
func halfCall(dt ir.DType, e, f16, bf16 string) string {
	switch dt {
	case ir.Float16:
		return f16 + "(" + e + ")"
	case ir.BFloat16:
		return bf16 + "(" + e + ")"
	}
	return e
}

// load converts a stored value of dt to its compute type.
func load(dt ir.DType, e string) string { return halfCall(dt, e, "ferry_h2f", "ferry_b2f") }

// store converts a computed value to dt's stored representation.
func store(dt ir.DType, e string) string { return halfCall(dt, e, "ferry_f2h", "ferry_f2b") }

// roundHalf rounds a float to the nearest value of dt when dt is f16 or bf16.
func roundHalf(dt ir.DType, e string) string { return halfCall(dt, e, "ferry_rh", "ferry_rb") }

// LaunchKind says how an entry point is launched.
type LaunchKind uint8

// Launch kinds.
const (
	// LaunchLoop is a grid-stride loop over N elements.
	LaunchLoop LaunchKind = iota + 1
	// LaunchReduce is one block per output element (grid-stride over N
	// outputs), the block's threads reducing R inputs each through shared
	// memory and warp shuffles; the block size must be a multiple of 32.
	LaunchReduce
)

// Entry is one kernel entry point of a Kernel.
type Entry struct {
	Name string
	Kind LaunchKind
	// N is the loop's element count (LaunchLoop) or the number of outputs
	// (LaunchReduce); R the inputs per output of a reduction.
	N, R int64
	// Writes lists the results the entry writes.
	Writes []int
	// Product marks the entry of an output fusion that computes the
	// product into the buffer of passes.Kernel.DotResult; a backend that
	// computes the product otherwise (cuBLASLt) skips it.
	Product bool
}

// Kernel is the CUDA C of one program step. Every entry point takes the same
// arguments: a pointer per operand (const), a pointer per result, then
// `long long n` (the entry's N). Entries run in order on one stream.
type Kernel struct {
	Source  string
	Params  []ir.Type
	Results []ir.Type
	Entries []Entry
}

// GenerateOp returns the kernel of a single-op step of a compiled program.
// An op the plan describes as a kernel (passes.LowerOp: elementwise ops,
// reductions, view ops, iota, dot_general and the element-moving ops with
// an index rule) and a fusion op (passes.LowerKernel) are rendered by
// GenerateKernel, as every fused group is; scatter_add, whose atomic adds
// the kernel form does not express, has a kernel of its own. Constants,
// sort, device_put and the region ops have none: the executor runs them
// itself.
func GenerateOp(op *ir.Op) (*Kernel, error) {
	switch {
	case op == nil:
		return nil, fmt.Errorf("cuda: GenerateOp: nil op")
	case op.Code == ir.Fusion:
		pk, err := passes.LowerKernel(op)
		if err != nil {
			return nil, fmt.Errorf("cuda: %w", err)
		}
		return GenerateKernel(pk)
	case len(op.Results) == 0:
		return nil, fmt.Errorf("cuda: %v has no results", op.Code)
	}
	if pk, ok := passes.LowerOp(op); ok {
		return GenerateKernel(pk)
	}
	if op.Code != ir.ScatterAdd {
		return nil, fmt.Errorf("cuda: op %v has no generated kernel", op.Code)
	}
	s := newShared(valueTypes(op.Args), valueTypes(op.Results))
	return s.assemble(op.Code.String(), fmt.Sprintf("%v → %v", op.Code, op.Result().Type), genScatter(s, op))
}

func valueTypes(vs []*ir.Value) []ir.Type {
	ts := make([]ir.Type, len(vs))
	for i, v := range vs {
		ts[i] = v.Type
	}
	return ts
}

// shared is the state common to every scope of one kernel: its operand
// and result types, the operands read and the entries made so far.
type shared struct {
	paramTypes, resultTypes []ir.Type
	used                    []bool
	counter                 *int
	// k is the plan's kernel (nil for scatter_add).
	k       *passes.Kernel
	entries []Entry
	bodies  []string
}

func newShared(params, results []ir.Type) *shared {
	return &shared{paramTypes: params, resultTypes: results, used: make([]bool, len(params)), counter: new(int)}
}

// add appends an entry and its body.
func (s *shared) add(e Entry, body string) {
	s.entries, s.bodies = append(s.entries, e), append(s.bodies, body)
}

// assemble returns the kernel of the entries added (or err): the shared
// signature, entry names from kind and a hash of the source, and a comment
// line saying what it computes.
func (s *shared) assemble(kind, what string, err error) (*Kernel, error) {
	if err != nil {
		return nil, err
	}
	k := &Kernel{Params: s.paramTypes, Results: s.resultTypes, Entries: s.entries}
	var sig []string
	for i, p := range s.paramTypes {
		ct, err := CType(p.DType)
		if err != nil {
			return nil, fmt.Errorf("cuda: operand %d: %w", i, err)
		}
		unused := ""
		if !s.used[i] {
			unused = " /* unused */"
		}
		sig = append(sig, fmt.Sprintf("const %s* __restrict__ p%d%s", ct, i, unused))
	}
	for i, r := range s.resultTypes {
		ct, err := CType(r.DType)
		if err != nil {
			return nil, fmt.Errorf("cuda: result %d: %w", i, err)
		}
		sig = append(sig, fmt.Sprintf("%s* __restrict__ out%d", ct, i))
	}
	sig = append(sig, "long long n")
	signature := strings.Join(sig, ", ")
	h := fnv.New64a()
	h.Write([]byte(signature))
	for _, b := range s.bodies {
		h.Write([]byte(b))
	}
	base := fmt.Sprintf("ferry_%s_%016x", kind, h.Sum64())
	var src strings.Builder
	src.WriteString(Prelude)
	fmt.Fprintf(&src, "// %s\n", what)
	for i := range k.Entries {
		k.Entries[i].Name = fmt.Sprintf("%s_%d", base, i)
		fmt.Fprintf(&src, "FERRY_KERNEL %s(%s) {\n%s}\n", k.Entries[i].Name, signature, s.bodies[i])
	}
	k.Source = src.String()
	return k, nil
}

// gen emits the statements of one C scope.
type gen struct {
	*shared
	b      strings.Builder
	indent string
	names  map[string]string // value ID or node + "@" + index expr → C name
	idx    map[string]string // index expression → variable
	// prog is the plan program whose nodes the scope reads (a fusion).
	prog *passes.KernelProgram
}

func newGen(s *shared, indent string) *gen {
	return &gen{shared: s, indent: indent, names: map[string]string{}, idx: map[string]string{}}
}

// child returns a gen for a nested scope that sees this scope's names.
func (g *gen) child() *gen {
	c := newGen(g.shared, g.indent+"  ")
	c.prog = g.prog
	for k, v := range g.names {
		c.names[k] = v
	}
	for k, v := range g.idx {
		c.idx[k] = v
	}
	return c
}

func (g *gen) fresh(prefix string) string {
	*g.counter++
	return fmt.Sprintf("%s%d", prefix, *g.counter)
}

func (g *gen) emit(format string, args ...any) {
	g.b.WriteString(g.indent)
	fmt.Fprintf(&g.b, format, args...)
	g.b.WriteString("\n")
}

// index returns a variable (or constant) holding the long long expression e.
func (g *gen) index(e string) string {
	if _, err := strconv.ParseInt(e, 10, 64); err == nil || isIdent(e) {
		return e
	}
	if v, ok := g.idx[e]; ok {
		return v
	}
	v := g.fresh("j")
	g.idx[e] = v
	g.emit("long long %s = %s;", v, e)
	return v
}

func isIdent(e string) bool {
	for i, c := range e {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return e != ""
}

// coords returns the C expressions of the coordinates of flat index at in shape.
func coords(at string, shape ir.Shape) []string {
	st := shape.Strides()
	out := make([]string, len(shape))
	for d := range shape {
		switch {
		case shape[d] <= 1 || shape.Size() == 0: // an empty shape has no index to map
			out[d] = "0"
		case d == 0:
			out[d] = fmt.Sprintf("(%s / %dLL)", at, st[d])
		case st[d] == 1:
			out[d] = fmt.Sprintf("(%s %% %dLL)", at, shape[d])
		default:
			out[d] = fmt.Sprintf("((%s / %dLL) %% %dLL)", at, st[d], shape[d])
		}
	}
	return out
}

// param is operand i (of dtype dt) at element at, in its compute type.
func (g *gen) param(i int, dt ir.DType, at string) string {
	g.used[i] = true
	return load(dt, fmt.Sprintf("p%d[%s]", i, at))
}

// viewed is the index the views of c map at to, each rendered once.
func (g *gen) viewed(c ir.ViewChain, at string) string {
	for _, w := range c {
		at = g.index(viewIndex(w, at))
	}
	return at
}

// named memoises key's C expression expr (of dtype dt) as a variable.
func (g *gen) named(key string, dt ir.DType, expr func() (string, error)) (string, error) {
	if s, ok := g.names[key]; ok {
		return s, nil
	}
	if _, err := CType(dt); err != nil {
		return "", fmt.Errorf("cuda: %s: %w", key, err)
	}
	e, err := expr()
	if err != nil {
		return "", err
	}
	name := g.fresh("v")
	g.emit("%s %s = %s;", computeType(dt), name, e)
	g.names[key] = name
	return name, nil
}

// cLiteral is x as a C literal of dt's compute type.
func cLiteral(x float64, dt ir.DType) string {
	switch dt {
	case ir.Bool:
		if x != 0 {
			return "true"
		}
		return "false"
	case ir.Int32:
		if int64(x) == math.MinInt32 {
			return "(-2147483647 - 1)"
		}
		return strconv.FormatInt(int64(x), 10)
	case ir.Int64:
		if x <= math.MinInt64 {
			return "(-9223372036854775807LL - 1)"
		}
		if x >= math.MaxInt64 {
			return "9223372036854775807LL"
		}
		return strconv.FormatInt(int64(x), 10) + "LL"
	case ir.Uint8:
		return strconv.FormatInt(int64(x), 10)
	case ir.Uint32:
		return strconv.FormatUint(uint64(x), 10) + "u"
	}
	f32 := dt != ir.Float64
	switch {
	case math.IsNaN(x):
		if f32 {
			return "ferry_bitsf(0x7fc00000u)"
		}
		return "ferry_bitsd(0x7ff8000000000000ULL)"
	case math.IsInf(x, 1):
		if f32 {
			return "ferry_bitsf(0x7f800000u)"
		}
		return "ferry_bitsd(0x7ff0000000000000ULL)"
	case math.IsInf(x, -1):
		if f32 {
			return "ferry_bitsf(0xff800000u)"
		}
		return "ferry_bitsd(0xfff0000000000000ULL)"
	}
	if f32 {
		return "(" + strconv.FormatFloat(x, 'e', -1, 32) + "f)"
	}
	return "(" + strconv.FormatFloat(x, 'e', -1, 64) + ")"
}

// literalAt is element i of a literal as a C literal (integers exactly).
func literalAt(l *ir.Literal, i int) string {
	switch l.Type.DType {
	case ir.Int64:
		v := ir.View[int64](l)[i]
		if v == math.MinInt64 {
			return "(-9223372036854775807LL - 1)"
		}
		return strconv.FormatInt(v, 10) + "LL"
	case ir.Uint32:
		return strconv.FormatUint(uint64(ir.View[uint32](l)[i]), 10) + "u"
	}
	return cLiteral(l.Float64At(i), l.Type.DType)
}

var cmpOps = map[ir.Code]string{ir.Eq: "==", ir.Ne: "!=", ir.Lt: "<", ir.Le: "<=", ir.Gt: ">", ir.Ge: ">="}

// viewIndex renders the index view v maps flat index at to, as a C
// expression: Offset + Σ_d coord_d(at)·Strides[d], coord_d the digit of at
// in v.Shape (at is within v's domain, so the outermost digit needs no
// modulo).
func viewIndex(v ir.StridedView, at string) string {
	if ir.Shape(v.Shape).Size() == 0 {
		return "0" // an empty domain has no index to map
	}
	place := ir.Shape(v.Shape).Strides()
	var terms []string
	if v.Offset != 0 {
		terms = append(terms, strconv.Itoa(v.Offset)+"LL")
	}
	for d, n := range v.Shape {
		c := at
		switch {
		case v.Strides[d] == 0:
			continue
		case place[d] == 1 && d > 0:
			c = fmt.Sprintf("(%s %% %dLL)", at, n)
		case d == 0 && place[d] != 1:
			c = fmt.Sprintf("(%s / %dLL)", at, place[d])
		case d > 0:
			c = fmt.Sprintf("((%s / %dLL) %% %dLL)", at, place[d], n)
		}
		if v.Strides[d] != 1 {
			c = fmt.Sprintf("%s * %dLL", c, v.Strides[d])
		}
		terms = append(terms, c)
	}
	if len(terms) == 0 {
		return "0"
	}
	return strings.Join(terms, " + ")
}

// dense is the view of a row-major array of shape through strides.
func dense(shape ir.Shape, strides []int) ir.StridedView { return ir.NewStridedView(shape, strides, 0) }

// bitcast reinterprets x (compute type of from) as to.
func bitcast(from, to ir.DType, x string) (string, error) {
	if from == to {
		return x, nil
	}
	var bits string
	switch from {
	case ir.Float32:
		bits = "ferry_fbits(" + x + ")"
	case ir.Float64:
		bits = "ferry_dbits(" + x + ")"
	case ir.Float16:
		bits = "ferry_f2h(" + x + ")"
	case ir.BFloat16:
		bits = "ferry_f2b(" + x + ")"
	case ir.Int64:
		bits = "(unsigned long long)" + x
	case ir.Int32, ir.Uint32:
		bits = "(unsigned int)" + x
	case ir.Uint8, ir.Bool:
		bits = "(unsigned char)" + x
	default:
		return "", fmt.Errorf("cuda: bitcast_convert from %v", from)
	}
	switch to {
	case ir.Float32:
		return "ferry_bitsf(" + bits + ")", nil
	case ir.Float64:
		return "ferry_bitsd(" + bits + ")", nil
	case ir.Float16:
		return "ferry_h2f((unsigned short)" + bits + ")", nil
	case ir.BFloat16:
		return "ferry_b2f((unsigned short)" + bits + ")", nil
	case ir.Bool:
		return "(" + bits + " != 0)", nil
	}
	return "(" + computeType(to) + ")" + bits, nil
}

// intLimits returns the C literals of the minimum and maximum of an integer
// dtype and the float thresholds at which conversion saturates.
func intLimits(dt ir.DType) (lo, hi, flo, fhi string) {
	switch dt {
	case ir.Uint8:
		return "0", "255", "0.0", "255.0"
	case ir.Int32:
		return "(-2147483647 - 1)", "2147483647", "-2147483648.0", "2147483647.0"
	case ir.Uint32:
		return "0u", "4294967295u", "0.0", "4294967295.0"
	}
	return "(-9223372036854775807LL - 1)", "9223372036854775807LL", "-9223372036854775808.0", "9223372036854775808.0"
}

// convert is x (compute type of from) converted to dtype to.
func convert(from, to ir.DType, x string) string {
	switch {
	case to == ir.Bool:
		return fmt.Sprintf("(%s != 0)", x)
	case from == to:
		return x
	case to.IsInteger() && from.IsFloat():
		lo, hi, flo, fhi := intLimits(to)
		d := "(double)" + x
		return fmt.Sprintf("(%s != %s ? (%s)0 : (%s <= %s ? %s : (%s >= %s ? %s : (%s)%s)))", x, x, computeType(to), d, flo, lo, d, fhi, hi, computeType(to), x)
	case to == ir.Float16:
		return fmt.Sprintf("ferry_h2f(ferry_d2h((double)%s))", x)
	case to == ir.BFloat16:
		return fmt.Sprintf("ferry_b2f(ferry_d2b((double)%s))", x)
	}
	return fmt.Sprintf("(%s)%s", computeType(to), x)
}

// arith are the C operators of the arithmetic binary ops.
var arith = map[ir.Code]string{ir.Add: "+", ir.Sub: "-", ir.Mul: "*", ir.Div: "/"}

// iotaAt is the value c (a long long expression) converted to dt as iota
// converts it.
func iotaAt(dt ir.DType, c string) string {
	return roundHalf(dt, fmt.Sprintf("(%s)%s", computeType(dt), c))
}

// elementwise returns the C expression of an elementwise op of the op
// table on arguments in compute types; in is the operand dtype, dt the
// result's. Unary and binary float ops round to dt when it is f16 or bf16.
func elementwise(code ir.Code, in, dt ir.DType, args []string) (string, error) {
	a, b := args[0], ""
	if len(args) > 1 {
		b = args[1]
	}
	switch code {
	case ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge:
		return fmt.Sprintf("(%s %s %s)", a, cmpOps[code], b), nil
	case ir.Select:
		return fmt.Sprintf("(%s ? %s : %s)", a, b, args[2]), nil
	case ir.Convert:
		return convert(in, dt, a), nil
	case ir.BitcastConvert:
		return bitcast(in, dt, a)
	case ir.Max, ir.Min:
		c := map[ir.Code]string{ir.Max: ">", ir.Min: "<"}[code]
		if in.IsFloat() { // a NaN operand wins
			return fmt.Sprintf("((%s != %s || %s %s %s) ? %s : %s)", a, a, a, c, b, a, b), nil
		}
		return fmt.Sprintf("(%s %s %s ? %s : %s)", a, c, b, a, b), nil
	}
	if !in.IsFloat() {
		return intOp(code, in, a, b)
	}
	e, err := floatOp(code, in, a, b)
	if cl := code.Info().Class; cl == ir.ClassUnary || cl == ir.ClassBinary {
		e = roundHalf(dt, e)
	}
	return e, err
}

// floatOp is elementwise on float operands: the op table's CUDA C math
// function (Lower.CUDA, "f" appended below float64) or a rule of its own.
func floatOp(code ir.Code, in ir.DType, a, b string) (string, error) {
	f, one := "f", cLiteral(1, in)
	if in == ir.Float64 {
		f = ""
	}
	switch code {
	case ir.Neg:
		return "-" + a, nil
	case ir.Sign:
		return fmt.Sprintf("(%s > 0 ? %s : (%s < 0 ? -%s : %s))", a, one, a, one, a), nil
	case ir.Rsqrt:
		return fmt.Sprintf("(%s / sqrt%s(%s))", one, f, a), nil
	case ir.Logistic:
		return fmt.Sprintf("(%s / (%s + exp%s(-%s)))", one, one, f, a), nil
	case ir.Add, ir.Sub, ir.Mul, ir.Div:
		return fmt.Sprintf("(%s %s %s)", a, arith[code], b), nil
	case ir.Rem:
		return fmt.Sprintf("fmod%s(%s, %s)", f, a, b), nil
	case ir.Pow:
		return fmt.Sprintf("pow%s(%s, %s)", f, a, b), nil
	}
	if fn := code.Info().Lower.CUDA; fn != "" {
		return fmt.Sprintf("%s%s(%s)", fn, f, a), nil
	}
	return "", fmt.Errorf("cuda: op %v on %v is not supported in a generated kernel", code, in)
}

// intOp is elementwise on integer or bool operands: wrapping arithmetic in
// the unsigned type of the same width, division by zero and the overflowing
// quotient as XLA defines them.
func intOp(code ir.Code, in ir.DType, a, b string) (string, error) {
	ct, ut, signed := computeType(in), unsignedOf(in), in.IsSigned()
	switch code {
	case ir.Neg:
		return fmt.Sprintf("(%s)(0u - (%s)%s)", ct, ut, a), nil
	case ir.Abs:
		if !signed {
			return a, nil
		}
		return fmt.Sprintf("(%s < 0 ? (%s)(0u - (%s)%s) : %s)", a, ct, ut, a, a), nil
	case ir.Sign:
		if !signed {
			return fmt.Sprintf("(%s)(%s > 0)", ct, a), nil
		}
		return fmt.Sprintf("(%s)((%s > 0) - (%s < 0))", ct, a, a), nil
	case ir.Not:
		if in == ir.Bool {
			return "!" + a, nil
		}
		return fmt.Sprintf("(%s)~%s", ct, a), nil
	case ir.Add, ir.Sub, ir.Mul:
		if in == ir.Bool {
			return "", fmt.Errorf("cuda: %v on bool", code)
		}
		if in == ir.Uint8 || in == ir.Uint32 {
			return fmt.Sprintf("(%s)(%s %s %s)", ct, a, arith[code], b), nil
		}
		return fmt.Sprintf("(%s)((%s)%s %s (%s)%s)", ct, ut, a, arith[code], ut, b), nil
	case ir.Div:
		if !signed {
			_, hi, _, _ := intLimits(in)
			return fmt.Sprintf("(%s == 0 ? (%s)%s : (%s)(%s / %s))", b, ct, hi, ct, a, b), nil
		}
		return fmt.Sprintf("(%s == 0 ? (%s)-1 : (%s == -1 ? (%s)(0u - (%s)%s) : %s / %s))", b, ct, b, ct, ut, a, a, b), nil
	case ir.Rem:
		if !signed {
			return fmt.Sprintf("(%s == 0 ? %s : (%s)(%s %% %s))", b, a, ct, a, b), nil
		}
		return fmt.Sprintf("(%s == 0 ? %s : (%s == -1 ? (%s)0 : %s %% %s))", b, a, b, ct, a, b), nil
	case ir.And, ir.Or, ir.Xor:
		o := map[ir.Code][2]string{ir.And: {"&&", "&"}, ir.Or: {"||", "|"}, ir.Xor: {"!=", "^"}}[code]
		if in == ir.Bool {
			return fmt.Sprintf("(%s %s %s)", a, o[0], b), nil
		}
		return fmt.Sprintf("(%s)(%s %s %s)", ct, a, o[1], b), nil
	case ir.ShiftLeft, ir.ShiftRightLogical, ir.ShiftRightArithmetic:
		return shift(code, in, a, b), nil
	}
	return "", fmt.Errorf("cuda: op %v on %v is not supported in a generated kernel", code, in)
}

// shift is a shift of a by b in in's width: a logical shift by the width or
// more gives 0, an arithmetic one the sign.
func shift(code ir.Code, in ir.DType, a, b string) string {
	w, ct := bitWidth(in), computeType(in)
	uw, st := "unsigned int", "int"
	switch in {
	case ir.Int64:
		uw, st = "unsigned long long", "long long"
	case ir.Uint8:
		st = "signed char"
	}
	amt := fmt.Sprintf("((%s)%s)", uw, b)
	ua := fmt.Sprintf("((%s)%s)", uw, a)
	if in == ir.Uint8 {
		ua = fmt.Sprintf("((unsigned int)(unsigned char)%s)", a)
		amt = fmt.Sprintf("((unsigned int)(unsigned char)%s)", b)
	}
	switch code {
	case ir.ShiftLeft:
		return fmt.Sprintf("(%s < %du ? (%s)(%s << %s) : (%s)0)", amt, w, ct, ua, amt, ct)
	case ir.ShiftRightLogical:
		return fmt.Sprintf("(%s < %du ? (%s)(%s >> %s) : (%s)0)", amt, w, ct, ua, amt, ct)
	}
	return fmt.Sprintf("(%s)((%s)%s >> (%s < %du ? %s : %du))", ct, st, a, amt, w, amt, w-1)
}

// dot emits the contraction of a dot_general for the output element at: the
// output index viewed into each operand (batch and free dimensions), plus
// the contracted index k viewed into each; the operands are kernel operands
// li and ri.
func (g *gen) dot(op *ir.Op, li, ri int, at string) (string, error) {
	l, r := op.Args[0], op.Args[1]
	res := op.Results[0]
	dt := res.Type.DType
	if dt == ir.Bool {
		return "", fmt.Errorf("cuda: dot_general on bool")
	}
	a := op.Attrs
	lb, rb, lc, rc := a.Ints("lhs_batch"), a.Ints("rhs_batch"), a.Ints("lhs_contract"), a.Ints("rhs_contract")
	lst, rst := l.Type.Shape.Strides(), r.Type.Shape.Strides()
	// Output dimensions: batch, lhs free, rhs free.
	var lout, rout []int
	for i := range lb {
		lout, rout = append(lout, lst[lb[i]]), append(rout, rst[rb[i]])
	}
	for d := range l.Type.Shape {
		if !slices.Contains(lb, d) && !slices.Contains(lc, d) {
			lout, rout = append(lout, lst[d]), append(rout, 0)
		}
	}
	for d := range r.Type.Shape {
		if !slices.Contains(rb, d) && !slices.Contains(rc, d) {
			lout, rout = append(lout, 0), append(rout, rst[d])
		}
	}
	cshape := make(ir.Shape, len(lc))
	lk, rk := make([]int, len(lc)), make([]int, len(rc))
	for i := range lc {
		cshape[i], lk[i], rk[i] = l.Type.Shape[lc[i]], lst[lc[i]], rst[rc[i]]
	}
	lbase := g.index(viewIndex(dense(res.Type.Shape, lout), at))
	rbase := g.index(viewIndex(dense(res.Type.Shape, rout), at))
	acc, kv := g.fresh("acc"), g.fresh("k")
	act := "float"
	switch {
	case dt == ir.Float64:
		act = "double"
	case dt.IsInteger():
		act = unsignedOf(dt)
	}
	g.emit("%s %s = 0;", act, acc)
	g.emit("for (long long %s = 0; %s < %dLL; %s++) {", kv, kv, cshape.Size(), kv)
	c := g.child()
	lv := c.param(li, l.Type.DType, c.index(lbase+" + "+viewIndex(dense(cshape, lk), kv)))
	rv := c.param(ri, r.Type.DType, c.index(rbase+" + "+viewIndex(dense(cshape, rk), kv)))
	if dt.IsInteger() {
		c.emit("%s += (%s)%s * (%s)%s;", acc, act, lv, act, rv)
	} else {
		c.emit("%s += %s * %s;", acc, lv, rv)
	}
	g.b.WriteString(c.b.String())
	g.emit("}")
	return roundHalf(dt, fmt.Sprintf("(%s)%s", computeType(dt), acc)), nil
}

// gridLoop wraps body (statements indented four spaces) in the grid-stride
// loop over i < n that every LaunchLoop entry runs.
func gridLoop(body string) string {
	return "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n" +
		body + "  }\n"
}

// accumulator returns the C accumulator type of a reduction and its shuffle
// suffix.
func accumulator(code ir.Code, dt ir.DType) (string, string) {
	switch dt {
	case ir.Float64:
		return "double", "f64"
	case ir.Float32, ir.Float16, ir.BFloat16:
		if code == ir.ReduceSum || code == ir.ReduceProd {
			return "double", "f64"
		}
		return "float", "f32"
	case ir.Int64:
		return "long long", "i64"
	case ir.Int32:
		return "int", "i32"
	}
	return "unsigned int", "u32"
}

// reducer is the arithmetic of one reduction entry: its accumulator, the
// identity and the combining statement.
type reducer struct {
	isArg    bool
	acc, sfx string // the accumulator's C type and shuffle suffix
	ident    string
	// combine is a format of the statement folding B into A: %[1]s, %[2]s
	// the values of A and B, %[3]s, %[4]s their indices (arg ops), %[5]s R.
	combine string
	r       string // R as a C literal
}

// newReducer returns the reducer of code over operand dtype dt reducing r
// elements per output.
func newReducer(code ir.Code, dt ir.DType, r int64) (*reducer, error) {
	rd := &reducer{isArg: code == ir.ArgMax || code == ir.ArgMin, r: strconv.FormatInt(r, 10) + "LL"}
	if dt == ir.Bool && !rd.isArg {
		return nil, fmt.Errorf("cuda: %v on bool", code)
	}
	rd.acc, rd.sfx = accumulator(code, dt)
	c := "<"
	if code == ir.ReduceMax || code == ir.ArgMax {
		c = ">"
	}
	switch code {
	case ir.ReduceSum, ir.ReduceProd:
		rd.ident, c = "0", "+"
		if code == ir.ReduceProd {
			rd.ident, c = "1", "*"
		}
		rd.combine = "%[1]s = %[1]s " + c + " %[2]s;"
		if u := unsignedOf(dt); dt.IsInteger() {
			rd.combine = "%[1]s = (" + rd.acc + ")((" + u + ")%[1]s " + c + " (" + u + ")%[2]s);"
		}
	case ir.ReduceMax, ir.ReduceMin:
		rd.combine = "%[1]s = %[1]s " + c + " %[2]s ? %[1]s : %[2]s;"
		lo, hi, _, _ := intLimits(dt)
		rd.ident = map[bool]string{true: lo, false: hi}[c == ">"]
		if dt.IsFloat() {
			idt := map[bool]ir.DType{true: ir.Float64, false: ir.Float32}[rd.acc == "double"]
			rd.ident = cLiteral(map[bool]float64{true: math.Inf(-1), false: math.Inf(1)}[c == ">"], idt)
			rd.combine = "%[1]s = (%[1]s != %[1]s || %[1]s " + c + " %[2]s) ? %[1]s : %[2]s;"
		}
	case ir.ArgMax, ir.ArgMin:
		rd.acc, rd.sfx = "double", "f64"
		if dt == ir.Int64 {
			rd.acc, rd.sfx = "long long", "i64"
		}
		// B (value %[2]s, index %[4]s) beats A (%[1]s, %[3]s) when it is a NaN
		// and A is not, or it is strictly better, or equal (or both NaN)
		// with a smaller index; indices ≥ R are empty slots.
		rd.ident = "0"
		rd.combine = "if (%[4]s < %[5]s && (%[3]s >= %[5]s || (%[2]s != %[2]s && %[1]s == %[1]s) || (%[1]s == %[1]s && %[2]s " + c + " %[1]s) || ((%[2]s == %[1]s || (%[2]s != %[2]s && %[1]s != %[1]s)) && %[4]s < %[3]s))) { %[1]s = %[2]s; %[3]s = %[4]s; }"
	default:
		return nil, fmt.Errorf("cuda: %v is not a reduction", code)
	}
	return rd, nil
}

// comb is the statement folding (b, bi) into (a, ai).
func (rd *reducer) comb(a, b, ai, bi string) string {
	if rd.isArg {
		return fmt.Sprintf(rd.combine, a, b, ai, bi, rd.r)
	}
	return fmt.Sprintf(rd.combine, a, b)
}

// shuffle emits the warp's tree reduction of acc (and acci) through shuffles.
func (rd *reducer) shuffle(g *gen) {
	g.emit("for (int d = 16; d > 0; d >>= 1) {")
	g.emit("  %s e = ferry_shfl_down_%s(acc, d);", rd.acc, rd.sfx)
	if rd.isArg {
		g.emit("  long long ei = ferry_shfl_down_i64(acci, d);")
	}
	g.emit("  if (lane + d < 32) { %s }", rd.comb("acc", "e", "acci", "ei"))
	g.emit("}")
}

// finish emits the combination of the warps' partial results by warp 0 and
// the store of output o into out<ri> (of dtype odt).
func (rd *reducer) finish(g *gen, ri int, odt ir.DType) {
	if rd.isArg {
		g.emit("if (lane == 0) { ferry_sm[warp] = acc; ferry_smi[warp] = acci; }")
	} else {
		g.emit("if (lane == 0) ferry_sm[warp] = acc;")
	}
	g.emit("__syncthreads();")
	g.emit("if (warp == 0) {")
	w0 := g.child()
	w0.emit("acc = lane < nwarps ? ferry_sm[lane] : (%s)%s;", rd.acc, rd.ident)
	if rd.isArg {
		w0.emit("acci = lane < nwarps ? ferry_smi[lane] : %s;", rd.r)
	}
	rd.shuffle(w0)
	out := fmt.Sprintf("(%s)acc", computeType(odt))
	switch {
	case rd.isArg:
		out = fmt.Sprintf("(%s)(acci < %s ? acci : 0LL)", computeType(odt), rd.r)
	case odt.IsFloat():
		accDT := map[bool]ir.DType{true: ir.Float64, false: ir.Float32}[rd.acc == "double"]
		out = store(odt, convert(accDT, odt, "acc"))
	}
	w0.emit("if (lane == 0) out%d[o] = %s;", ri, out)
	g.b.WriteString(w0.b.String())
	g.emit("}")
	g.emit("__syncthreads();")
}

// reduction is what one reduction entry computes: code over the values of
// node node of program prog (of dtype in) into result ri (of dtype out);
// output o reduces the r values at flat indices kept(o) + red(k), k < r.
type reduction struct {
	code      ir.Code
	in, out   ir.DType
	kept, red ir.StridedView
	nOut, r   int64
	ri, node  int
	prog      *passes.KernelProgram
}

// splitReduced returns the views of the flat index of an operand of shape
// (row-major) through its kept dimensions, over the outputs, and through
// its reduced ones, over one output's elements, with their sizes.
func splitReduced(shape ir.Shape, reduced func(d int) bool) (kept, red ir.StridedView, nOut, r int64) {
	var ks, rs ir.Shape
	var kst, rst []int
	st := shape.Strides()
	for d, n := range shape {
		if reduced(d) {
			rs, rst = append(rs, n), append(rst, st[d])
		} else {
			ks, kst = append(ks, n), append(kst, st[d])
		}
	}
	return dense(ks, kst), dense(rs, rst), int64(ks.Size()), int64(rs.Size())
}

// reduce adds the entry of a block-level tree reduction. Each block
// reduces one output row (grid-stride over rows): every thread accumulates
// a strided share of the row, warps combine through shuffles, warp leaders
// through shared memory, warp 0 finishes.
func (s *shared) reduce(rdn reduction) error {
	rd, err := newReducer(rdn.code, rdn.in, rdn.r)
	if err != nil {
		return err
	}
	g := newGen(s, "    ")
	g.prog = rdn.prog
	var b strings.Builder
	b.WriteString("  __shared__ " + rd.acc + " ferry_sm[32];\n")
	if rd.isArg {
		b.WriteString("  __shared__ long long ferry_smi[32];\n")
	}
	b.WriteString("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;\n")
	b.WriteString("  for (long long o = blockIdx.x; o < n; o += gridDim.x) {\n")
	base := g.index(viewIndex(rdn.kept, "o"))
	g.emit("%s acc = %s;", rd.acc, rd.ident)
	if rd.isArg {
		g.emit("long long acci = %s;", rd.r)
	}
	g.emit("for (long long k = threadIdx.x; k < %s; k += blockDim.x) {", rd.r)
	c := g.child()
	xv, err := c.node(rdn.node, c.index(base+" + "+viewIndex(rdn.red, "k")))
	if err != nil {
		return err
	}
	c.emit("%s e = (%s)%s;", rd.acc, rd.acc, xv)
	if rd.isArg {
		c.emit("long long ei = k;")
	}
	c.emit("%s", rd.comb("acc", "e", "acci", "ei"))
	g.b.WriteString(c.b.String())
	g.emit("}")
	rd.shuffle(g)
	rd.finish(g, rdn.ri, rdn.out)
	b.WriteString(g.b.String())
	b.WriteString("  }\n")
	s.add(Entry{Kind: LaunchReduce, N: rdn.nOut, R: rdn.r, Writes: []int{rdn.ri}}, b.String())
	return nil
}

// atomicKind returns how an element of dt is atomically added: a native
// atomicAdd on a C type, or the word-sized CAS loop of the prelude (kind).
func atomicAdd(dt ir.DType, ptr, val string) string {
	switch dt {
	case ir.Float32, ir.Float64, ir.Int32, ir.Uint32:
		return fmt.Sprintf("atomicAdd(%s, %s);", ptr, val)
	case ir.Int64:
		return fmt.Sprintf("atomicAdd((unsigned long long*)%s, (unsigned long long)%s);", ptr, val)
	case ir.Uint8:
		return fmt.Sprintf("ferry_atomic_add_word((void*)%s, 1, 0, (double)%s);", ptr, val)
	case ir.Bool:
		return fmt.Sprintf("ferry_atomic_add_word((void*)%s, 1, 1, (double)%s);", ptr, val)
	case ir.Float16:
		return fmt.Sprintf("ferry_atomic_add_word((void*)%s, 2, 2, (double)%s);", ptr, val)
	}
	return fmt.Sprintf("ferry_atomic_add_word((void*)%s, 2, 3, (double)%s);", ptr, val)
}

// genScatter emits scatter_add as two entries: a copy of the operand into the
// result, then one thread per update element adding it atomically (updates
// whose index is out of range are dropped).
func genScatter(s *shared, op *ir.Op) error {
	v, x, ix, u := op.Result(), op.Args[0], op.Args[1], op.Args[2]
	axis := op.Attrs.Int("axis")
	shape := x.Type.Shape
	n := shape[axis]
	inner := ir.Shape(shape[axis+1:]).Size()
	ni := ix.Type.Size()
	g := newGen(s, "    ")
	xv, err := g.operand(0, "i")
	if err != nil {
		return err
	}
	copyBody := gridLoop(g.b.String() + fmt.Sprintf("    out0[i] = %s;\n", store(v.Type.DType, xv)))
	g2 := newGen(s, "    ")
	j := g2.index(fmt.Sprintf("(i / %dLL) %% %dLL", inner, ni))
	kv, err := g2.operand(1, j)
	if err != nil {
		return err
	}
	uv, err := g2.operand(2, "i")
	if err != nil {
		return err
	}
	dst := g2.index(fmt.Sprintf("((i / %dLL) * %dLL + (long long)%s) * %dLL + i %% %dLL", int64(inner)*int64(ni), n, kv, inner, inner))
	dt := x.Type.DType
	val := uv
	if dt == ir.Bool {
		val = "(" + uv + " ? 1 : 0)"
	}
	g2.emit("if ((long long)%s >= 0 && (long long)%s < %dLL) %s", kv, kv, n, atomicAdd(dt, fmt.Sprintf("&out0[%s]", dst), val))
	s.add(Entry{Kind: LaunchLoop, N: int64(x.Type.Size()), Writes: []int{0}}, copyBody)
	s.add(Entry{Kind: LaunchLoop, N: int64(u.Type.Size()), Writes: []int{0}}, gridLoop(g2.b.String()))
	return nil
}
