package cuda

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryml/ferry/ir"
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

// GenerateOptions adjust GenerateOp.
type GenerateOptions struct {
	// External values are read from extra operands appended after the op's
	// own instead of being computed (the result of a dot_general that
	// cuBLASLt computes before its epilogue, for example).
	External []*ir.Value
}

// GenerateOp returns the kernel of one step of a compiled program: a fusion
// op (loop; input — loop kernels for its elementwise results and one
// parallel reduction per reduce op; output — the dot_general computed per
// element, or read from an External operand) or a single op of the Core
// table other than sort, the region ops (scan, while, cond) and device_put,
// which the executor handles itself. Constants must be scalars.
func GenerateOp(op *ir.Op, opts GenerateOptions) (*Kernel, error) {
	if op == nil {
		return nil, fmt.Errorf("cuda: GenerateOp: nil op")
	}
	var params, results []*ir.Value
	switch {
	case op.Code == ir.Fusion:
		if len(op.Regions) != 1 {
			return nil, fmt.Errorf("cuda: fusion without a region")
		}
		params, results = op.Regions[0].Params, op.Regions[0].Results
	case op.Code == ir.Sort || op.Code == ir.DevicePut || op.Code.Info().Class == ir.ClassRegion:
		return nil, fmt.Errorf("cuda: op %v has no generated kernel", op.Code)
	default:
		params, results = op.Args, op.Results
	}
	params = append(slices.Clone(params), opts.External...)
	if len(results) == 0 {
		return nil, fmt.Errorf("cuda: %v has no results", op.Code)
	}
	k := &Kernel{}
	s := &shared{params: map[*ir.Value]int{}, used: make([]bool, len(params)), counter: new(int)}
	for i, p := range params {
		if _, ok := s.params[p]; !ok {
			s.params[p] = i
		}
		k.Params = append(k.Params, p.Type)
	}
	for _, v := range results {
		k.Results = append(k.Results, v.Type)
	}
	var bodies []string
	// Reductions (of a plain op or inside an input fusion) and scatter_add
	// get their own entries; the other results are grouped by size into loop
	// entries.
	bySize := map[int64][]int{}
	var sizes []int64
	for ri, v := range results {
		if _, isParam := s.params[v]; !isParam && v.Op != nil && isReduction(v.Op.Code) && !isExternal(v, opts) {
			e, body, err := genReduce(s, v, ri)
			if err != nil {
				return nil, err
			}
			k.Entries = append(k.Entries, e)
			bodies = append(bodies, body)
			continue
		}
		if v.Op != nil && v.Op.Code == ir.ScatterAdd && !isExternal(v, opts) {
			es, bs, err := genScatter(s, v, ri)
			if err != nil {
				return nil, err
			}
			k.Entries = append(k.Entries, es...)
			bodies = append(bodies, bs...)
			continue
		}
		n := int64(v.Type.Size())
		if _, ok := bySize[n]; !ok {
			sizes = append(sizes, n)
		}
		bySize[n] = append(bySize[n], ri)
	}
	for _, n := range sizes {
		e, body, err := genLoop(s, results, bySize[n], n)
		if err != nil {
			return nil, err
		}
		k.Entries = append(k.Entries, e)
		bodies = append(bodies, body)
	}
	// The signature, shared by every entry.
	var sig []string
	for i, p := range params {
		ct, err := CType(p.Type.DType)
		if err != nil {
			return nil, fmt.Errorf("cuda: operand %d: %w", i, err)
		}
		unused := ""
		if !s.used[i] {
			unused = " /* unused */"
		}
		sig = append(sig, fmt.Sprintf("const %s* __restrict__ p%d%s", ct, i, unused))
	}
	for i, v := range results {
		ct, err := CType(v.Type.DType)
		if err != nil {
			return nil, fmt.Errorf("cuda: result %d: %w", i, err)
		}
		sig = append(sig, fmt.Sprintf("%s* __restrict__ out%d", ct, i))
	}
	sig = append(sig, "long long n")
	signature := strings.Join(sig, ", ")
	h := fnv.New64a()
	h.Write([]byte(signature))
	for _, b := range bodies {
		h.Write([]byte(b))
	}
	base := fmt.Sprintf("ferry_%s_%016x", kindName(op), h.Sum64())
	var src strings.Builder
	src.WriteString(Prelude)
	fmt.Fprintf(&src, "// %s\n", describe(op))
	for i := range k.Entries {
		k.Entries[i].Name = fmt.Sprintf("%s_%d", base, i)
		fmt.Fprintf(&src, "FERRY_KERNEL %s(%s) {\n%s}\n", k.Entries[i].Name, signature, bodies[i])
	}
	k.Source = src.String()
	return k, nil
}

func isExternal(v *ir.Value, opts GenerateOptions) bool { return slices.Contains(opts.External, v) }

func isReduction(c ir.Code) bool {
	switch c {
	case ir.ReduceSum, ir.ReduceMax, ir.ReduceMin, ir.ReduceProd, ir.ArgMax, ir.ArgMin:
		return true
	}
	return false
}

func kindName(op *ir.Op) string {
	if op.Code == ir.Fusion {
		return "fusion_" + op.Attrs.String("kind")
	}
	return op.Code.String()
}

func describe(op *ir.Op) string {
	if op.Code == ir.Fusion {
		return fmt.Sprintf("fused %s group of %d ops", op.Attrs.String("kind"), len(op.Regions[0].Ops))
	}
	return fmt.Sprintf("%v → %v", op.Code, op.Results[0].Type)
}

// shared is the state common to every scope of one kernel.
type shared struct {
	params  map[*ir.Value]int
	used    []bool
	counter *int
}

// gen emits the statements of one C scope.
type gen struct {
	*shared
	b      strings.Builder
	indent string
	names  map[string]string // value ID + "@" + index expr → C name
	idx    map[string]string // index expression → variable
}

func newGen(s *shared, indent string) *gen {
	return &gen{shared: s, indent: indent, names: map[string]string{}, idx: map[string]string{}}
}

// child returns a gen for a nested scope that sees this scope's names.
func (g *gen) child() *gen {
	c := newGen(g.shared, g.indent+"  ")
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

// linear returns Σ cs[d]·strides[d] as a C expression ("0" when empty).
func linear(cs []string, strides []int) string {
	var terms []string
	for d, c := range cs {
		if c == "0" || strides[d] == 0 {
			continue
		}
		if strides[d] == 1 {
			terms = append(terms, c)
		} else {
			terms = append(terms, fmt.Sprintf("%s * %dLL", c, strides[d]))
		}
	}
	if len(terms) == 0 {
		return "0"
	}
	return "(" + strings.Join(terms, " + ") + ")"
}

// value returns a C expression (in v's compute type) for v at flat index at,
// emitting the statements it needs.
func (g *gen) value(v *ir.Value, at string) (string, error) {
	if v.Type.Size() == 1 {
		at = "0"
	}
	key := fmt.Sprintf("%d@%s", v.ID, at)
	if s, ok := g.names[key]; ok {
		return s, nil
	}
	if _, err := CType(v.Type.DType); err != nil {
		return "", fmt.Errorf("cuda: %v: %w", v, err)
	}
	ct := computeType(v.Type.DType)
	var expr string
	var err error
	if i, ok := g.params[v]; ok {
		g.used[i] = true
		expr = load(v.Type.DType, fmt.Sprintf("p%d[%s]", i, at))
	} else if v.Op == nil {
		return "", fmt.Errorf("cuda: %v is not defined in the generated region", v)
	} else {
		expr, err = g.op(v, at)
		if err != nil {
			return "", err
		}
	}
	name := g.fresh("v")
	g.emit("%s %s = %s;", ct, name, expr)
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

// startOf returns the clamped start of a dynamic slice along one dimension:
// max(0, min(s, dim-size)).
func (g *gen) startOf(v *ir.Value, dim, size int) (string, error) {
	s, err := g.value(v, "0")
	if err != nil {
		return "", err
	}
	hi := dim - size
	return g.index(fmt.Sprintf("((long long)%s < 0 ? 0LL : ((long long)%s > %dLL ? %dLL : (long long)%s))", s, s, hi, hi, s)), nil
}

// op returns the C expression of v (a result of v.Op) at flat index at.
func (g *gen) op(v *ir.Value, at string) (string, error) {
	op := v.Op
	res := v
	dt := res.Type.DType
	ct := computeType(dt)
	a := op.Attrs
	switch op.Code {
	case ir.BroadcastInDim:
		in := op.Args[0].Type.Shape
		cs := coords(at, res.Type.Shape)
		st := in.Strides()
		var terms []string
		for i, d := range a.Ints("dims") {
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
	case ir.Reshape, ir.BitcastConvert, ir.CheckpointName, ir.OptimizationBarrier, ir.ShardingConstraint:
		src := op.Args[0]
		if op.Code == ir.OptimizationBarrier {
			src = op.Args[slices.Index(op.Results, v)]
		}
		x, err := g.value(src, at) // row-major: same flat index
		if err != nil || op.Code != ir.BitcastConvert {
			return x, err
		}
		return bitcast(src.Type.DType, dt, x)
	case ir.Transpose:
		cs := coords(at, res.Type.Shape)
		ist := op.Args[0].Type.Shape.Strides()
		st := make([]int, len(cs))
		for i, p := range a.Ints("perm") {
			st[i] = ist[p]
		}
		return g.value(op.Args[0], g.index(linear(cs, st)))
	case ir.Slice:
		cs := coords(at, res.Type.Shape)
		ist := op.Args[0].Type.Shape.Strides()
		start, strides := a.Ints("start"), a.Ints("strides")
		off := 0
		st := make([]int, len(cs))
		for d := range cs {
			off += start[d] * ist[d]
			st[d] = ist[d] * strides[d]
		}
		return g.value(op.Args[0], g.index(fmt.Sprintf("%dLL + %s", off, linear(cs, st))))
	case ir.DynamicSlice:
		x := op.Args[0]
		cs := coords(at, res.Type.Shape)
		ist := x.Type.Shape.Strides()
		var terms []string
		for d := range cs {
			s, err := g.startOf(op.Args[1+d], x.Type.Shape[d], res.Type.Shape[d])
			if err != nil {
				return "", err
			}
			terms = append(terms, fmt.Sprintf("(%s + %s) * %dLL", s, cs[d], ist[d]))
		}
		return g.value(x, g.index(sumOr0(terms)))
	case ir.DynamicUpdateSlice:
		x, u := op.Args[0], op.Args[1]
		cs := coords(at, res.Type.Shape)
		ust := u.Type.Shape.Strides()
		var conds, uterms []string
		for d := range cs {
			s, err := g.startOf(op.Args[2+d], x.Type.Shape[d], u.Type.Shape[d])
			if err != nil {
				return "", err
			}
			r := g.index(fmt.Sprintf("%s - %s", cs[d], s))
			conds = append(conds, fmt.Sprintf("%s >= 0 && %s < %dLL", r, r, u.Type.Shape[d]))
			uterms = append(uterms, fmt.Sprintf("%s * %dLL", r, ust[d]))
		}
		in := g.index(andOr1(conds))
		ui := g.index(fmt.Sprintf("(%s ? %s : 0LL)", in, sumOr0(uterms)))
		uv, err := g.value(u, ui)
		if err != nil {
			return "", err
		}
		xv, err := g.value(x, at)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("(%s ? %s : %s)", in, uv, xv), nil
	case ir.Concatenate:
		axis := a.Int("axis")
		cs := coords(at, res.Type.Shape)
		off := 0
		expr := ""
		for _, x := range op.Args {
			n := x.Type.Shape[axis]
			if n == 0 {
				continue
			}
			c2 := slices.Clone(cs)
			in := fmt.Sprintf("(%s >= %dLL && %s < %dLL)", cs[axis], off, cs[axis], off+n)
			c2[axis] = fmt.Sprintf("(%s ? %s - %dLL : 0LL)", in, cs[axis], off)
			xv, err := g.value(x, g.index(linear(c2, x.Type.Shape.Strides())))
			if err != nil {
				return "", err
			}
			if expr == "" {
				expr = xv
			} else {
				expr = fmt.Sprintf("(%s ? %s : %s)", in, xv, expr)
			}
			off += n
		}
		return expr, nil
	case ir.Pad:
		x, pv := op.Args[0], op.Args[1]
		cs := coords(at, res.Type.Shape)
		low, interior := a.Ints("low"), a.Ints("interior")
		var conds, terms []string
		ist := x.Type.Shape.Strides()
		if x.Type.Size() == 0 {
			return g.value(pv, "0")
		}
		for d := range cs {
			step := interior[d] + 1
			t := g.index(fmt.Sprintf("%s - %dLL", cs[d], low[d]))
			c := fmt.Sprintf("%s >= 0 && %s / %dLL < %dLL", t, t, step, x.Type.Shape[d])
			if step > 1 {
				c += fmt.Sprintf(" && %s %% %dLL == 0", t, step)
			}
			conds = append(conds, c)
			terms = append(terms, fmt.Sprintf("(%s / %dLL) * %dLL", t, step, ist[d]))
		}
		in := g.index(andOr1(conds))
		xi := g.index(fmt.Sprintf("(%s ? %s : 0LL)", in, sumOr0(terms)))
		xv, err := g.value(x, xi)
		if err != nil {
			return "", err
		}
		pvv, err := g.value(pv, "0")
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("(%s ? %s : %s)", in, xv, pvv), nil
	case ir.Gather:
		x, ix := op.Args[0], op.Args[1]
		axis := a.Int("axis")
		shape := x.Type.Shape
		n := shape[axis]
		if n == 0 {
			return "", fmt.Errorf("cuda: gather from an empty axis %d of %v", axis, x.Type)
		}
		inner := ir.Shape(shape[axis+1:]).Size()
		ni := ix.Type.Size()
		j := g.index(fmt.Sprintf("(%s / %dLL) %% %dLL", at, inner, ni))
		kv, err := g.value(ix, j)
		if err != nil {
			return "", err
		}
		kc := g.index(fmt.Sprintf("((long long)%s < 0 ? 0LL : ((long long)%s > %dLL ? %dLL : (long long)%s))", kv, kv, n-1, n-1, kv))
		o := fmt.Sprintf("(%s / %dLL)", at, int64(inner)*int64(ni))
		return g.value(x, g.index(fmt.Sprintf("(%s * %dLL + %s) * %dLL + %s %% %dLL", o, n, kc, inner, at, inner)))
	case ir.Iota:
		c := coords(at, res.Type.Shape)[a.Int("dim")]
		if dt.IsFloat() {
			return roundHalf(dt, fmt.Sprintf("(%s)%s", ct, c)), nil
		}
		return fmt.Sprintf("(%s)%s", ct, c), nil
	case ir.Constant:
		l := a.Literal("value")
		if l.Type.Size() != 1 {
			return "", fmt.Errorf("cuda: constant of type %v: only scalar constants are generated (the executor uploads the others)", l.Type)
		}
		return literalAt(l, 0), nil
	case ir.DotGeneral:
		return g.dot(op, at)
	}
	info := op.Info()
	if !info.Elementwise {
		return "", fmt.Errorf("cuda: op %s (%v) is not supported in a generated kernel", info.Name, res)
	}
	args := make([]string, len(op.Args))
	for i, x := range op.Args {
		s, err := g.value(x, at)
		if err != nil {
			return "", err
		}
		args[i] = s
	}
	e, err := elementwise(op.Code, op.Args[0].Type.DType, dt, args)
	if err != nil {
		return "", err
	}
	if info.Class == ir.ClassUnary || info.Class == ir.ClassBinary {
		e = roundHalf(dt, e)
	}
	return e, nil
}

func sumOr0(terms []string) string {
	if len(terms) == 0 {
		return "0LL"
	}
	return strings.Join(terms, " + ")
}

func andOr1(conds []string) string {
	if len(conds) == 0 {
		return "1"
	}
	return "(" + strings.Join(conds, ") && (") + ")"
}

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

// elementwise returns the C expression of an elementwise op on arguments in
// compute types; in is the operand dtype, dt the result's.
func elementwise(code ir.Code, in, dt ir.DType, args []string) (string, error) {
	isF := in.IsFloat()
	f := ""
	if in != ir.Float64 {
		f = "f"
	}
	ct := computeType(in)
	one := cLiteral(1, in)
	a := args[0]
	var b string
	if len(args) > 1 {
		b = args[1]
	}
	signed := in.IsSigned()
	ut := unsignedOf(in)
	wrap := func(opr string) string {
		if in == ir.Uint8 || in == ir.Uint32 {
			return fmt.Sprintf("(%s)(%s %s %s)", ct, a, opr, b)
		}
		return fmt.Sprintf("(%s)((%s)%s %s (%s)%s)", ct, ut, a, opr, ut, b)
	}
	switch code {
	case ir.Neg:
		if isF {
			return "-" + a, nil
		}
		return fmt.Sprintf("(%s)(0u - (%s)%s)", ct, ut, a), nil
	case ir.Abs:
		if isF {
			return fmt.Sprintf("fabs%s(%s)", f, a), nil
		}
		if !signed {
			return a, nil
		}
		return fmt.Sprintf("(%s < 0 ? (%s)(0u - (%s)%s) : %s)", a, ct, ut, a, a), nil
	case ir.Sign:
		if isF {
			return fmt.Sprintf("(%s > 0 ? %s : (%s < 0 ? -%s : %s))", a, one, a, one, a), nil
		}
		if !signed {
			return fmt.Sprintf("(%s)(%s > 0)", ct, a), nil
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
		return fmt.Sprintf("(%s)~%s", ct, a), nil
	case ir.Add, ir.Sub, ir.Mul:
		o := map[ir.Code]string{ir.Add: "+", ir.Sub: "-", ir.Mul: "*"}[code]
		if isF {
			return fmt.Sprintf("(%s %s %s)", a, o, b), nil
		}
		if in == ir.Bool {
			return "", fmt.Errorf("cuda: %v on bool", code)
		}
		return wrap(o), nil
	case ir.Div:
		if isF {
			return fmt.Sprintf("(%s / %s)", a, b), nil
		}
		if !signed {
			_, hi, _, _ := intLimits(in)
			return fmt.Sprintf("(%s == 0 ? (%s)%s : (%s)(%s / %s))", b, ct, hi, ct, a, b), nil
		}
		return fmt.Sprintf("(%s == 0 ? (%s)-1 : (%s == -1 ? (%s)(0u - (%s)%s) : %s / %s))", b, ct, b, ct, ut, a, a, b), nil
	case ir.Rem:
		if isF {
			return fmt.Sprintf("fmod%s(%s, %s)", f, a, b), nil
		}
		if !signed {
			return fmt.Sprintf("(%s == 0 ? %s : (%s)(%s %% %s))", b, a, ct, a, b), nil
		}
		return fmt.Sprintf("(%s == 0 ? %s : (%s == -1 ? (%s)0 : %s %% %s))", b, a, b, ct, a, b), nil
	case ir.Pow:
		return fmt.Sprintf("pow%s(%s, %s)", f, a, b), nil
	case ir.Max, ir.Min:
		c := ">"
		if code == ir.Min {
			c = "<"
		}
		if isF {
			return fmt.Sprintf("((%s != %s || %s %s %s) ? %s : %s)", a, a, a, c, b, a, b), nil
		}
		return fmt.Sprintf("(%s %s %s ? %s : %s)", a, c, b, a, b), nil
	case ir.And, ir.Or, ir.Xor:
		o := map[ir.Code][2]string{ir.And: {"&&", "&"}, ir.Or: {"||", "|"}, ir.Xor: {"!=", "^"}}[code]
		if in == ir.Bool {
			return fmt.Sprintf("(%s %s %s)", a, o[0], b), nil
		}
		return fmt.Sprintf("(%s)(%s %s %s)", ct, a, o[1], b), nil
	case ir.ShiftLeft, ir.ShiftRightLogical, ir.ShiftRightArithmetic:
		w := bitWidth(in)
		uw := "unsigned int"
		st := "int"
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
			return fmt.Sprintf("(%s < %du ? (%s)(%s << %s) : (%s)0)", amt, w, ct, ua, amt, ct), nil
		case ir.ShiftRightLogical:
			return fmt.Sprintf("(%s < %du ? (%s)(%s >> %s) : (%s)0)", amt, w, ct, ua, amt, ct), nil
		}
		return fmt.Sprintf("(%s)((%s)%s >> (%s < %du ? %s : %du))", ct, st, a, amt, w, amt, w-1), nil
	case ir.Eq, ir.Ne, ir.Lt, ir.Le, ir.Gt, ir.Ge:
		return fmt.Sprintf("(%s %s %s)", a, cmpOps[code], b), nil
	case ir.Select:
		return fmt.Sprintf("(%s ? %s : %s)", a, b, args[2]), nil
	case ir.Convert:
		return convert(in, dt, a), nil
	}
	if fn := code.Info().Lower.CUDA; fn != "" && isF { // the op table's CUDA C math function
		return fmt.Sprintf("%s%s(%s)", fn, f, a), nil
	}
	return "", fmt.Errorf("cuda: op %v on %v is not supported in a generated kernel", code, in)
}

// dot emits the contraction of a dot_general for the output element at.
func (g *gen) dot(op *ir.Op, at string) (string, error) {
	l, r := op.Args[0], op.Args[1]
	res := op.Results[0]
	a := op.Attrs
	lb, rb, lc, rc := a.Ints("lhs_batch"), a.Ints("rhs_batch"), a.Ints("lhs_contract"), a.Ints("rhs_contract")
	free := func(rank int, batch, contract []int) []int {
		var out []int
		for d := 0; d < rank; d++ {
			if !slices.Contains(batch, d) && !slices.Contains(contract, d) {
				out = append(out, d)
			}
		}
		return out
	}
	lf, rf := free(l.Type.Rank(), lb, lc), free(r.Type.Rank(), rb, rc)
	cs := coords(at, res.Type.Shape)
	lst, rst := l.Type.Shape.Strides(), r.Type.Shape.Strides()
	var lterms, rterms []string
	for i := range lb {
		lterms = append(lterms, fmt.Sprintf("%s * %dLL", cs[i], lst[lb[i]]))
		rterms = append(rterms, fmt.Sprintf("%s * %dLL", cs[i], rst[rb[i]]))
	}
	for i, d := range lf {
		lterms = append(lterms, fmt.Sprintf("%s * %dLL", cs[len(lb)+i], lst[d]))
	}
	for i, d := range rf {
		rterms = append(rterms, fmt.Sprintf("%s * %dLL", cs[len(lb)+len(lf)+i], rst[d]))
	}
	lbase, rbase := g.index(sumOr0(lterms)), g.index(sumOr0(rterms))
	cshape := make(ir.Shape, len(lc))
	for i, d := range lc {
		cshape[i] = l.Type.Shape[d]
	}
	dt := res.Type.DType
	acc := g.fresh("acc")
	act := "float"
	switch {
	case dt == ir.Float64:
		act = "double"
	case dt.IsInteger():
		act = unsignedOf(dt)
		if dt == ir.Int64 {
			act = "unsigned long long"
		}
	case dt == ir.Bool:
		return "", fmt.Errorf("cuda: dot_general on bool")
	}
	kv := g.fresh("k")
	g.emit("%s %s = 0;", act, acc)
	g.emit("for (long long %s = 0; %s < %dLL; %s++) {", kv, kv, cshape.Size(), kv)
	c := g.child()
	kc := coords(kv, cshape)
	lcs, rcs := make([]int, len(lc)), make([]int, len(rc))
	for i := range lc {
		lcs[i], rcs[i] = lst[lc[i]], rst[rc[i]]
	}
	li := c.index(fmt.Sprintf("%s + %s", lbase, linear(kc, lcs)))
	ri := c.index(fmt.Sprintf("%s + %s", rbase, linear(kc, rcs)))
	lv, err := c.value(l, li)
	if err != nil {
		return "", err
	}
	rv, err := c.value(r, ri)
	if err != nil {
		return "", err
	}
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

// genLoop emits a grid-stride loop computing results[ris] at every index.
func genLoop(s *shared, results []*ir.Value, ris []int, n int64) (Entry, string, error) {
	g := newGen(s, "    ")
	var stores strings.Builder
	for _, ri := range ris {
		v := results[ri]
		x, err := g.value(v, "i")
		if err != nil {
			return Entry{}, "", err
		}
		fmt.Fprintf(&stores, "    out%d[i] = %s;\n", ri, store(v.Type.DType, x))
	}
	body := gridLoop(g.b.String() + stores.String())
	return Entry{Kind: LaunchLoop, N: n, Writes: ris}, body, nil
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

// genReduce emits a block-level tree reduction for results[ri] (a reduce or
// arg op). Each block reduces one output row (grid-stride over rows): every
// thread accumulates a strided share of the row, warps combine through
// shuffles, warp leaders through shared memory, warp 0 finishes.
func genReduce(s *shared, v *ir.Value, ri int) (Entry, string, error) {
	op := v.Op
	x := op.Args[0]
	xs := x.Type.Shape
	var axes []int
	isArg := op.Code == ir.ArgMax || op.Code == ir.ArgMin
	if isArg {
		axes = []int{op.Attrs.Int("axis")}
	} else {
		axes = slices.Clone(op.Attrs.Ints("axes"))
		slices.Sort(axes)
	}
	var kept ir.Shape
	var keptSt []int
	red := make(ir.Shape, len(axes))
	redSt := make([]int, len(axes))
	xst := xs.Strides()
	for d := range xs {
		if j := slices.Index(axes, d); j >= 0 {
			red[j], redSt[j] = xs[d], xst[d]
		} else {
			kept = append(kept, xs[d])
			keptSt = append(keptSt, xst[d])
		}
	}
	nOut, r := int64(kept.Size()), int64(red.Size())
	dt := x.Type.DType
	if dt == ir.Bool && !isArg {
		return Entry{}, "", fmt.Errorf("cuda: %v on bool", op.Code)
	}
	acc, sfx := accumulator(op.Code, dt)
	if isArg {
		acc, sfx = "double", "f64"
		if dt == ir.Int64 {
			acc, sfx = "long long", "i64"
		}
	}
	var ident, combine string // combine(A, B) with A, B C names: the result in A
	isMax := op.Code == ir.ReduceMax || op.Code == ir.ArgMax
	switch op.Code {
	case ir.ReduceSum:
		ident = "0"
		combine = "%[1]s = %[1]s + %[2]s;"
		if dt.IsInteger() {
			u := unsignedOf(dt)
			if dt == ir.Int64 {
				u = "unsigned long long"
			}
			combine = "%[1]s = (" + acc + ")((" + u + ")%[1]s + (" + u + ")%[2]s);"
		}
	case ir.ReduceProd:
		ident = "1"
		combine = "%[1]s = %[1]s * %[2]s;"
		if dt.IsInteger() {
			u := unsignedOf(dt)
			if dt == ir.Int64 {
				u = "unsigned long long"
			}
			combine = "%[1]s = (" + acc + ")((" + u + ")%[1]s * (" + u + ")%[2]s);"
		}
	case ir.ReduceMax, ir.ReduceMin:
		c := ">"
		if !isMax {
			c = "<"
		}
		if dt.IsFloat() {
			inf, idt := math.Inf(1), ir.Float32
			if isMax {
				inf = math.Inf(-1)
			}
			if acc == "double" {
				idt = ir.Float64
			}
			ident = cLiteral(inf, idt)
			combine = "%[1]s = (%[1]s != %[1]s || %[1]s " + c + " %[2]s) ? %[1]s : %[2]s;"
		} else {
			lo, hi, _, _ := intLimits(dt)
			ident = hi
			if isMax {
				ident = lo
			}
			combine = "%[1]s = %[1]s " + c + " %[2]s ? %[1]s : %[2]s;"
		}
	case ir.ArgMax, ir.ArgMin:
		c := ">"
		if !isMax {
			c = "<"
		}
		// B (value %[2]s, index %[4]s) beats A (%[1]s, %[3]s) when it is a NaN
		// and A is not, or it is strictly better, or equal (or both NaN)
		// with a smaller index; indices ≥ R are empty slots.
		ident = "0"
		combine = "if (%[4]s < %[5]s && (%[3]s >= %[5]s || (%[2]s != %[2]s && %[1]s == %[1]s) || (%[1]s == %[1]s && %[2]s " + c + " %[1]s) || ((%[2]s == %[1]s || (%[2]s != %[2]s && %[1]s != %[1]s)) && %[4]s < %[3]s))) { %[1]s = %[2]s; %[3]s = %[4]s; }"
	default:
		return Entry{}, "", fmt.Errorf("cuda: %v is not a reduction", op.Code)
	}
	comb := func(a1, b1, ai, bi string) string {
		if isArg {
			return fmt.Sprintf(combine, a1, b1, ai, bi, strconv.FormatInt(r, 10)+"LL")
		}
		return fmt.Sprintf(combine, a1, b1)
	}
	g := newGen(s, "    ")
	var b strings.Builder
	b.WriteString("  __shared__ " + acc + " ferry_sm[32];\n")
	if isArg {
		b.WriteString("  __shared__ long long ferry_smi[32];\n")
	}
	b.WriteString("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;\n")
	b.WriteString("  for (long long o = blockIdx.x; o < n; o += gridDim.x) {\n")
	base := g.index(linear(coords("o", kept), keptSt))
	g.emit("%s acc = %s;", acc, ident)
	if isArg {
		g.emit("long long acci = %dLL;", r)
	}
	g.emit("for (long long k = threadIdx.x; k < %dLL; k += blockDim.x) {", r)
	c := g.child()
	xi := c.index(fmt.Sprintf("%s + %s", base, linear(coords("k", red), redSt)))
	xv, err := c.value(x, xi)
	if err != nil {
		return Entry{}, "", err
	}
	c.emit("%s e = (%s)%s;", acc, acc, xv)
	if isArg {
		c.emit("long long ei = k;")
	}
	c.emit("%s", comb("acc", "e", "acci", "ei"))
	g.b.WriteString(c.b.String())
	g.emit("}")
	shfl := func(dst *gen) {
		dst.emit("for (int d = 16; d > 0; d >>= 1) {")
		dst.emit("  %s e = ferry_shfl_down_%s(acc, d);", acc, sfx)
		if isArg {
			dst.emit("  long long ei = ferry_shfl_down_i64(acci, d);")
		}
		dst.emit("  if (lane + d < 32) { %s }", comb("acc", "e", "acci", "ei"))
		dst.emit("}")
	}
	shfl(g)
	if isArg {
		g.emit("if (lane == 0) { ferry_sm[warp] = acc; ferry_smi[warp] = acci; }")
	} else {
		g.emit("if (lane == 0) ferry_sm[warp] = acc;")
	}
	g.emit("__syncthreads();")
	g.emit("if (warp == 0) {")
	w0 := g.child()
	w0.emit("acc = lane < nwarps ? ferry_sm[lane] : (%s)%s;", acc, ident)
	if isArg {
		w0.emit("acci = lane < nwarps ? ferry_smi[lane] : %dLL;", r)
	}
	shfl(w0)
	odt := v.Type.DType
	switch {
	case isArg:
		w0.emit("if (lane == 0) out%d[o] = (%s)(acci < %dLL ? acci : 0LL);", ri, computeType(odt), r)
	case odt.IsFloat():
		accDT := ir.Float32
		if acc == "double" {
			accDT = ir.Float64
		}
		w0.emit("if (lane == 0) out%d[o] = %s;", ri, store(odt, convert(accDT, odt, "acc")))
	default:
		w0.emit("if (lane == 0) out%d[o] = (%s)acc;", ri, computeType(odt))
	}
	g.b.WriteString(w0.b.String())
	g.emit("}")
	g.emit("__syncthreads();")
	b.WriteString(g.b.String())
	b.WriteString("  }\n")
	return Entry{Kind: LaunchReduce, N: nOut, R: r, Writes: []int{ri}}, b.String(), nil
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
func genScatter(s *shared, v *ir.Value, ri int) ([]Entry, []string, error) {
	op := v.Op
	x, ix, u := op.Args[0], op.Args[1], op.Args[2]
	axis := op.Attrs.Int("axis")
	shape := x.Type.Shape
	n := shape[axis]
	inner := ir.Shape(shape[axis+1:]).Size()
	ni := ix.Type.Size()
	g := newGen(s, "    ")
	xv, err := g.value(x, "i")
	if err != nil {
		return nil, nil, err
	}
	copyBody := gridLoop(g.b.String() + fmt.Sprintf("    out%d[i] = %s;\n", ri, store(v.Type.DType, xv)))
	g2 := newGen(s, "    ")
	j := g2.index(fmt.Sprintf("(i / %dLL) %% %dLL", inner, ni))
	kv, err := g2.value(ix, j)
	if err != nil {
		return nil, nil, err
	}
	uv, err := g2.value(u, "i")
	if err != nil {
		return nil, nil, err
	}
	dst := g2.index(fmt.Sprintf("((i / %dLL) * %dLL + (long long)%s) * %dLL + i %% %dLL", int64(inner)*int64(ni), n, kv, inner, inner))
	dt := x.Type.DType
	val := uv
	if dt == ir.Bool {
		val = "(" + uv + " ? 1 : 0)"
	}
	g2.emit("if ((long long)%s >= 0 && (long long)%s < %dLL) %s", kv, kv, n, atomicAdd(dt, fmt.Sprintf("&out%d[%s]", ri, dst), val))
	scatterBody := gridLoop(g2.b.String())
	return []Entry{
			{Kind: LaunchLoop, N: int64(x.Type.Size()), Writes: []int{ri}},
			{Kind: LaunchLoop, N: int64(u.Type.Size()), Writes: []int{ri}},
		},
		[]string{copyBody, scatterBody}, nil
}
