package cuda

import (
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
)

// CType returns the CUDA C element type of a dtype the generator supports
// (f32 → float, f64 → double, i32 → int, bool → bool).
func CType(dt ir.DType) (string, error) {
	switch dt {
	case ir.Float32:
		return "float", nil
	case ir.Float64:
		return "double", nil
	case ir.Int32:
		return "int", nil
	case ir.Bool:
		return "bool", nil
	}
	return "", fmt.Errorf("dtype %v is not supported by the CUDA generator (f32, f64, i32, bool)", dt)
}

type gen struct {
	b      strings.Builder
	names  map[string]string // value ID + "@" + index expr → C name
	idx    map[string]string // index expression key → variable
	nidx   int
	params map[*ir.Value]int
	used   []bool
}

// GenerateFusion returns the CUDA C source of a `fusion` op of kind "loop":
// one grid-stride kernel
//
//	extern "C" __global__ void name(const T0* __restrict__ p0, ..., R0* out0, ..., long long n)
//
// that computes every result element from its flat index. Elementwise ops
// (unary, binary, compare, select, convert, bitcast_convert) on f32, f64, i32
// and bool are supported, with broadcast_in_dim, reshape, iota and scalar
// constants as index maps. All results must have the same number of elements
// (n). The name is "ferry_fusion_" and a hash of the source body, so equal
// groups share a kernel. Unsupported ops or dtypes are an error naming them.
func GenerateFusion(op *ir.Op) (name, source string, err error) {
	if op == nil || op.Code != ir.Fusion || len(op.Regions) != 1 {
		return "", "", fmt.Errorf("cuda: GenerateFusion wants a fusion op")
	}
	if k := op.Attrs.String("kind"); k != "loop" {
		return "", "", fmt.Errorf("cuda: fusion kind %q is not supported (only \"loop\")", k)
	}
	r := op.Regions[0]
	if len(r.Results) == 0 {
		return "", "", fmt.Errorf("cuda: fusion has no results")
	}
	n := r.Results[0].Type.Size()
	for _, v := range r.Results {
		if v.Type.Size() != n {
			return "", "", fmt.Errorf("cuda: fusion results have different sizes (%v and %v)", r.Results[0].Type, v.Type)
		}
	}
	g := &gen{names: map[string]string{}, idx: map[string]string{}, params: map[*ir.Value]int{}, used: make([]bool, len(r.Params))}
	for i, p := range r.Params {
		g.params[p] = i
	}
	var outs []string
	for _, v := range r.Results {
		// Results are computed at the flat index i of their own shape.
		s, err := g.value(v, "i")
		if err != nil {
			return "", "", err
		}
		outs = append(outs, s)
	}
	var sig []string
	for i, p := range r.Params {
		ct, err := CType(p.Type.DType)
		if err != nil {
			return "", "", fmt.Errorf("cuda: fusion operand %d: %w", i, err)
		}
		if g.used[i] {
			sig = append(sig, fmt.Sprintf("const %s* __restrict__ p%d", ct, i))
		} else {
			sig = append(sig, fmt.Sprintf("const %s* __restrict__ p%d /* unused */", ct, i))
		}
	}
	var stores strings.Builder
	for i, v := range r.Results {
		ct, err := CType(v.Type.DType)
		if err != nil {
			return "", "", fmt.Errorf("cuda: fusion result %d: %w", i, err)
		}
		sig = append(sig, fmt.Sprintf("%s* __restrict__ out%d", ct, i))
		fmt.Fprintf(&stores, "    out%d[i] = %s;\n", i, outs[i])
	}
	sig = append(sig, "long long n")
	body := g.b.String() + stores.String()
	h := fnv.New64a()
	h.Write([]byte(strings.Join(sig, ",") + body))
	name = fmt.Sprintf("ferry_fusion_%016x", h.Sum64())
	var src strings.Builder
	fmt.Fprintf(&src, "// fused loop group of %d ops, %d elements\n", len(r.Ops), n)
	fmt.Fprintf(&src, "extern \"C\" __global__ void %s(%s) {\n", name, strings.Join(sig, ", "))
	src.WriteString("  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n")
	src.WriteString(body)
	src.WriteString("  }\n}\n")
	return name, src.String(), nil
}

func (g *gen) emit(format string, args ...any) {
	g.b.WriteString("    ")
	fmt.Fprintf(&g.b, format, args...)
	g.b.WriteString("\n")
}

// index returns a variable (or constant) holding the C expression e of type
// long long, declaring it once.
func (g *gen) index(e string) string {
	if _, err := strconv.ParseInt(e, 10, 64); err == nil || e == "i" {
		return e
	}
	if v, ok := g.idx[e]; ok {
		return v
	}
	g.nidx++
	v := fmt.Sprintf("j%d", g.nidx)
	g.idx[e] = v
	g.emit("long long %s = %s;", v, e)
	return v
}

// coords returns the C expressions of the coordinates of flat index at in shape.
func coords(at string, shape ir.Shape) []string {
	st := shape.Strides()
	out := make([]string, len(shape))
	for d := range shape {
		switch {
		case shape[d] == 1:
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

// value returns a C expression for v at flat index at (of v's shape), emitting
// the statements it needs.
func (g *gen) value(v *ir.Value, at string) (string, error) {
	if v.Type.Size() == 1 {
		at = "0"
	}
	key := fmt.Sprintf("%d@%s", v.ID, at)
	if s, ok := g.names[key]; ok {
		return s, nil
	}
	ct, err := CType(v.Type.DType)
	if err != nil {
		return "", fmt.Errorf("cuda: %v: %w", v, err)
	}
	var expr string
	if i, ok := g.params[v]; ok {
		g.used[i] = true
		expr = fmt.Sprintf("p%d[%s]", i, at)
	} else if v.Op == nil {
		return "", fmt.Errorf("cuda: %v is not defined in the fusion region", v)
	} else {
		expr, err = g.op(v.Op, at, ct)
		if err != nil {
			return "", err
		}
	}
	name := fmt.Sprintf("v%d", v.ID)
	if at != "i" && at != "0" {
		name = fmt.Sprintf("v%d_%s", v.ID, at)
	} else if at == "0" && v.Type.Size() != 1 {
		name = fmt.Sprintf("v%d_0", v.ID)
	}
	g.emit("%s %s = %s;", ct, name, expr)
	g.names[key] = name
	return name, nil
}

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
	}
	suffix := ""
	if dt == ir.Float32 {
		suffix = "f"
	}
	switch {
	case math.IsNaN(x):
		if dt == ir.Float32 {
			return "__int_as_float(0x7fc00000)"
		}
		return "__longlong_as_double(0x7ff8000000000000LL)"
	case math.IsInf(x, 1):
		if dt == ir.Float32 {
			return "__int_as_float(0x7f800000)"
		}
		return "__longlong_as_double(0x7ff0000000000000LL)"
	case math.IsInf(x, -1):
		if dt == ir.Float32 {
			return "__int_as_float((int)0xff800000)"
		}
		return "__longlong_as_double((long long)0xfff0000000000000ULL)"
	}
	bits := 64
	if dt == ir.Float32 {
		bits = 32
	}
	s := strconv.FormatFloat(x, 'e', -1, bits)
	return "(" + s + suffix + ")"
}

var floatFns = map[ir.Code]string{
	ir.Exp: "exp", ir.Log: "log", ir.Log1p: "log1p", ir.Expm1: "expm1", ir.Sqrt: "sqrt",
	ir.Tanh: "tanh", ir.Sin: "sin", ir.Cos: "cos", ir.Erf: "erf", ir.Floor: "floor",
	ir.Ceil: "ceil", ir.Round: "rint", ir.Abs: "fabs",
}

var cmpOps = map[ir.Code]string{ir.Eq: "==", ir.Ne: "!=", ir.Lt: "<", ir.Le: "<=", ir.Gt: ">", ir.Ge: ">="}

func (g *gen) op(op *ir.Op, at, ct string) (string, error) {
	res := op.Results[0]
	dt := res.Type.DType
	args := make([]string, len(op.Args))
	argAt := at
	switch op.Code {
	case ir.BroadcastInDim:
		in := op.Args[0].Type.Shape
		cs := coords(at, res.Type.Shape)
		dims := op.Attrs.Ints("dims")
		st := in.Strides()
		var terms []string
		for i, d := range dims {
			if in[i] == 1 || cs[d] == "0" {
				continue
			}
			if st[i] == 1 {
				terms = append(terms, cs[d])
			} else {
				terms = append(terms, fmt.Sprintf("%s * %dLL", cs[d], st[i]))
			}
		}
		e := "0"
		if len(terms) > 0 {
			e = strings.Join(terms, " + ")
		}
		return g.value(op.Args[0], g.index(e))
	case ir.Reshape:
		return g.value(op.Args[0], at) // row-major: same flat index
	case ir.Iota:
		c := coords(at, res.Type.Shape)[op.Attrs.Int("dim")]
		return fmt.Sprintf("(%s)%s", ct, c), nil
	case ir.Constant:
		l := op.Attrs.Literal("value")
		if l.Type.Size() != 1 {
			return "", fmt.Errorf("cuda: constant of type %v in a fusion: only scalar constants are supported", l.Type)
		}
		return cLiteral(l.Float64At(0), dt), nil
	}
	info := op.Info()
	if !info.Elementwise {
		return "", fmt.Errorf("cuda: op %s (%v) is not supported in a generated loop fusion", info.Name, res)
	}
	for i, a := range op.Args {
		s, err := g.value(a, argAt)
		if err != nil {
			return "", err
		}
		args[i] = s
	}
	in := op.Args[0].Type.DType
	isF := in.IsFloat()
	f := ""
	if in == ir.Float32 {
		f = "f"
	}
	one := cLiteral(1, in)
	var a, b string
	a = args[0]
	if len(args) > 1 {
		b = args[1]
	}
	switch op.Code {
	case ir.Neg:
		return "-" + a, nil
	case ir.Abs:
		if isF {
			return fmt.Sprintf("fabs%s(%s)", f, a), nil
		}
		return fmt.Sprintf("(%s < 0 ? -%s : %s)", a, a, a), nil
	case ir.Sign:
		if isF {
			return fmt.Sprintf("(%s > 0 ? %s : (%s < 0 ? -%s : %s))", a, one, a, one, a), nil
		}
		return fmt.Sprintf("(%s)((%s > 0) - (%s < 0))", ct, a, a), nil
	case ir.Rsqrt:
		return fmt.Sprintf("(%s / sqrt%s(%s))", one, f, a), nil
	case ir.Logistic:
		return fmt.Sprintf("(%s / (%s + exp%s(-%s)))", one, one, f, a), nil
	case ir.Not:
		if in == ir.Bool {
			return "!" + a, nil
		}
		return "~" + a, nil
	case ir.Add:
		return fmt.Sprintf("(%s + %s)", a, b), nil
	case ir.Sub:
		return fmt.Sprintf("(%s - %s)", a, b), nil
	case ir.Mul:
		return fmt.Sprintf("(%s * %s)", a, b), nil
	case ir.Div:
		if isF {
			return fmt.Sprintf("(%s / %s)", a, b), nil
		}
		return fmt.Sprintf("(%s == 0 ? -1 : (%s == -1 ? (int)(0u - (unsigned)%s) : %s / %s))", b, b, a, a, b), nil
	case ir.Rem:
		if isF {
			return fmt.Sprintf("fmod%s(%s, %s)", f, a, b), nil
		}
		return fmt.Sprintf("(%s == 0 ? %s : (%s == -1 ? 0 : %s %% %s))", b, a, b, a, b), nil
	case ir.Pow:
		return fmt.Sprintf("pow%s(%s, %s)", f, a, b), nil
	case ir.Max, ir.Min:
		c := ">"
		if op.Code == ir.Min {
			c = "<"
		}
		if isF {
			return fmt.Sprintf("((%s != %s || %s %s %s) ? %s : %s)", a, a, a, c, b, a, b), nil
		}
		return fmt.Sprintf("(%s %s %s ? %s : %s)", a, c, b, a, b), nil
	case ir.And, ir.Or, ir.Xor:
		o := map[ir.Code][2]string{ir.And: {"&&", "&"}, ir.Or: {"||", "|"}, ir.Xor: {"!=", "^"}}[op.Code]
		if in == ir.Bool {
			return fmt.Sprintf("(%s %s %s)", a, o[0], b), nil
		}
		return fmt.Sprintf("(%s %s %s)", a, o[1], b), nil
	case ir.ShiftLeft:
		return fmt.Sprintf("((unsigned)%s < 32u ? (int)((unsigned)%s << %s) : 0)", b, a, b), nil
	case ir.ShiftRightLogical:
		return fmt.Sprintf("((unsigned)%s < 32u ? (int)((unsigned)%s >> %s) : 0)", b, a, b), nil
	case ir.ShiftRightArithmetic:
		return fmt.Sprintf("(%s >> ((unsigned)%s < 32u ? %s : 31))", a, b, b), nil
	case ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge:
		return fmt.Sprintf("(%s %s %s)", a, cmpOps[op.Code], b), nil
	case ir.Select:
		return fmt.Sprintf("(%s ? %s : %s)", a, b, args[2]), nil
	case ir.Convert:
		switch {
		case dt == ir.Bool:
			return fmt.Sprintf("(%s != 0)", a), nil
		case dt == ir.Int32 && isF:
			return fmt.Sprintf("(%s != %s ? 0 : (%s <= -2147483648.0 ? (-2147483647 - 1) : (%s >= 2147483647.0 ? 2147483647 : (int)%s)))", a, a, a, a, a), nil
		}
		return fmt.Sprintf("(%s)%s", ct, a), nil
	case ir.BitcastConvert:
		switch {
		case in == ir.Float32 && dt == ir.Int32:
			return fmt.Sprintf("__float_as_int(%s)", a), nil
		case in == ir.Int32 && dt == ir.Float32:
			return fmt.Sprintf("__int_as_float(%s)", a), nil
		case in == dt:
			return a, nil
		}
		return "", fmt.Errorf("cuda: bitcast_convert %v → %v is not supported", in, dt)
	}
	if fn, ok := floatFns[op.Code]; ok && isF {
		return fmt.Sprintf("%s%s(%s)", fn, f, a), nil
	}
	return "", fmt.Errorf("cuda: op %s on %v is not supported in a generated loop fusion", info.Name, in)
}
