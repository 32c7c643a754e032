// Package eval is the reference executor of the Ferry IR: it runs an ir.Func,
// a region or a single op on host literals, op by op, with straightforward
// typed loops. It defines what every op computes; the backends are tested
// against it.
//
// Numerics, where the op table leaves a choice:
//
//   - f32 elementwise ops are computed in float32. neg, abs, sqrt, add, sub,
//     mul, div, max and min (exact) and exp, log, tanh, logistic and erf are
//     cpu/vmath's float32 vector kernels; those five transcendental
//     functions are within 2 ulp of the correctly rounded value, not
//     correctly rounded. The other transcendental functions (log1p, expm1,
//     rsqrt, sin, cos, pow, rem) go through Go's float64 math and are rounded
//     once to float32. f16 and bf16 run the same float32 kernels on their
//     float32 widening and round the result to nearest even; f64 uses Go's
//     float64 math.
//   - Integer arithmetic wraps (two's complement). Integer division truncates
//     toward zero; x/0 is -1 for signed and all ones (the maximum) for
//     unsigned dtypes, and MinInt/-1 is MinInt. Integer rem by 0 returns the
//     dividend. Shifts take the amount as unsigned; amounts ≥ the bit width
//     give 0 for shift_left and shift_right_logical and the sign fill for
//     shift_right_arithmetic, which works on the bit pattern (for unsigned
//     dtypes too), as in XLA.
//   - max and min propagate NaN. sign(NaN) = NaN, sign(±0) = ±0.
//   - convert rounds to nearest even from the exact source value (one
//     rounding, i64 → f16/bf16 included), truncates float → int toward zero
//     with saturation and NaN → 0, wraps int → int, maps x → bool as x != 0.
//   - reduce_sum and reduce_prod of f16, bf16 and f32 accumulate in float64
//     and round once; f64 in float64; integers wrap. f16, bf16 and f32 sums
//     over trailing axes add each output's run in eight lanes combined
//     pairwise (LaneSum); other float sums and products add in row-major
//     order of the reduced axes. reduce_max of nothing is
//     -inf (the minimum for integers), reduce_min +inf (the maximum).
//   - dot_general accumulates f32, f16 and bf16 in float32 (rounding f16/bf16
//     once at the end), f64 in float64, integers with wrapping; the
//     contracting index runs over the contracting pairs in the order given,
//     and the bits do not depend on the operands' layouts.
//   - scatter_add adds each update in the operand's dtype, in index order
//     (f16/bf16 through float32, rounded after every add); on bool it is a
//     logical or. gather from an empty axis into a non-empty result is an
//     error.
//
// Results of Run, RunRegion and EvalOp never share memory with arguments or
// with each other. EvalOpInto is the destination-passing form used by the
// executors: it writes results into caller-provided memory (an arena view, a
// donated buffer), and allows elementwise ops and dynamic_update_slice to
// work in place. A fusion op runs its region (the kind attribute is
// informational here).
package eval

import (
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/ir"
)

// Run executes f's body on args, one per body parameter with exactly the
// parameter's type (memory space included), and returns new literals for the
// results. Shardings are ignored: eval holds every array whole, so a
// literal matches a type whatever the type's sharding, results carry none,
// and sharding_constraint is the identity.
func Run(f *ir.Func, args []*ir.Literal) ([]*ir.Literal, error) {
	if f == nil || f.Body == nil {
		return nil, fmt.Errorf("eval: nil function")
	}
	res, err := RunRegion(f.Body, args)
	if err != nil {
		return nil, fmt.Errorf("eval %s: %w", f.Name, err)
	}
	return res, nil
}

// RunRegion executes region r on args (one per parameter, types must match
// exactly) and returns new literals for its results. It is used for the nested
// regions of scan, while and cond.
func RunRegion(r *ir.Region, args []*ir.Literal) (res []*ir.Literal, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("internal error: %v", p)
		}
	}()
	if r == nil {
		return nil, fmt.Errorf("nil region")
	}
	if len(args) != len(r.Params) {
		return nil, fmt.Errorf("region takes %d arguments, got %d", len(r.Params), len(args))
	}
	env := make(map[*ir.Value]*ir.Literal, len(r.Params)+len(r.Ops))
	owned := make(map[*ir.Literal]bool) // literals the region made itself
	for i, p := range r.Params {
		a, err := checkArg(args[i], p.Type)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		env[p] = a
	}
	// Last use of every value, so that dead intermediates can be dropped.
	last := make(map[*ir.Value]int, len(r.Ops))
	for i, op := range r.Ops {
		for _, a := range op.Args {
			last[a] = i
		}
	}
	for _, v := range r.Results {
		last[v] = len(r.Ops)
	}
	for i, op := range r.Ops {
		if op == nil {
			return nil, fmt.Errorf("op %d is nil", i)
		}
		ins := make([]*ir.Literal, len(op.Args))
		for j, a := range op.Args {
			l, ok := env[a]
			if !ok {
				return nil, fmt.Errorf("%s: operand %d (%v) is not defined before use", op.Describe(), j, a)
			}
			ins[j] = l
		}
		outs, err := EvalOp(op, ins)
		if err != nil {
			return nil, err
		}
		for j, v := range op.Results {
			env[v] = outs[j]
			owned[outs[j]] = true
			if _, used := last[v]; !used {
				delete(env, v)
			}
		}
		for _, a := range op.Args {
			if last[a] == i {
				delete(env, a)
			}
		}
	}
	res = make([]*ir.Literal, len(r.Results))
	returned := make(map[*ir.Literal]bool, len(r.Results))
	for i, v := range r.Results {
		l, ok := env[v]
		if !ok {
			return nil, fmt.Errorf("result %d (%v) is not defined", i, v)
		}
		if !owned[l] || returned[l] {
			l = l.Clone()
		}
		returned[l] = true
		res[i] = l
	}
	return res, nil
}

// checkArg validates a literal against the type t (its sharding aside) and
// returns it, or an aligned copy when its memory is not 8-byte aligned.
func checkArg(l *ir.Literal, t ir.Type) (*ir.Literal, error) {
	if l == nil {
		return nil, fmt.Errorf("nil literal, want %v", t)
	}
	if !l.Type.EqualUnsharded(t) {
		return nil, fmt.Errorf("literal is %v, want %v", l.Type, t)
	}
	if int64(len(l.Data)) != l.Type.Bytes() {
		return nil, fmt.Errorf("literal of type %v has %d bytes, want %d", l.Type, len(l.Data), l.Type.Bytes())
	}
	if !aligned(l.Data) {
		c := ir.NewLiteral(l.Type)
		copy(c.Data, l.Data)
		return c, nil
	}
	return l, nil
}

// EvalOp executes a single op on literal operands (one per op.Args, with the
// same types) and returns new literals for its results. Errors, including
// internal panics, name the op and its location. It is EvalOpInto on freshly
// allocated results.
func EvalOp(op *ir.Op, args []*ir.Literal) (res []*ir.Literal, err error) {
	if op == nil {
		return nil, fmt.Errorf("eval: nil op")
	}
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("%s: internal error: %v", op.Describe(), p)
		}
	}()
	res, err = evalOp(op, args, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op.Describe(), err)
	}
	return res, nil
}

// EvalOpInto executes a single op like EvalOp but writes its results into
// outs, one caller-provided literal per result with exactly the result's type
// (memory space included) and Data of exactly that many bytes. The Data may be
// any memory (an arena view, say); every byte of every result is written,
// whatever it held before.
//
// Results must not share memory with each other or with operands, except:
//
//   - for an elementwise op (ir.OpInfo.Elementwise) a result may be the very
//     memory of an operand of the same byte size (same start, same length):
//     the kernels read element i of every operand before writing element i;
//   - for dynamic_update_slice the result may be the memory of the operand
//     (operand 0); then only the update window is written;
//   - for fusion a result may be the very memory of an operand (the region
//     runs on its own memory and results are copied out at the end).
//
// Other overlaps are reported as errors, as are type mismatches. Errors,
// including internal panics, name the op and its location.
func EvalOpInto(op *ir.Op, args []*ir.Literal, outs []*ir.Literal) (err error) {
	if op == nil {
		return fmt.Errorf("eval: nil op")
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s: internal error: %v", op.Describe(), p)
		}
	}()
	if outs == nil {
		outs = []*ir.Literal{}
	}
	if _, err = evalOp(op, args, outs); err != nil {
		return fmt.Errorf("%s: %w", op.Describe(), err)
	}
	return nil
}

// evalOp validates operands (and, when outs is not nil, the destinations)
// and runs op's kernel. With outs == nil it allocates the results.
func evalOp(op *ir.Op, args []*ir.Literal, outs []*ir.Literal) ([]*ir.Literal, error) {
	if op.Args != nil && len(op.Args) != len(args) {
		return nil, fmt.Errorf("op has %d operands, got %d literals", len(op.Args), len(args))
	}
	types := make([]ir.Type, len(args))
	ins := make([]*ir.Literal, len(args))
	for i, a := range args {
		if a == nil {
			return nil, fmt.Errorf("operand %d is nil", i)
		}
		want := a.Type
		if op.Args != nil && op.Args[i] != nil {
			want = op.Args[i].Type
		}
		l, err := checkArg(a, want)
		if err != nil {
			return nil, fmt.Errorf("operand %d: %w", i, err)
		}
		ins[i] = l
		types[i] = l.Type
	}
	outTypes, err := ir.InferTypes(op.Code, types, op.Attrs, op.Regions)
	if err != nil {
		return nil, err
	}
	if op.Results != nil {
		if len(op.Results) != len(outTypes) {
			return nil, fmt.Errorf("op has %d results, its shape rule gives %d", len(op.Results), len(outTypes))
		}
		for i, v := range op.Results {
			if v != nil && !v.Type.EqualUnsharded(outTypes[i]) {
				return nil, fmt.Errorf("result %d is declared %v, its shape rule gives %v", i, v.Type, outTypes[i])
			}
		}
	}
	return execute(op, args, ins, outs, outTypes)
}

// execute runs op on validated operands ins (args are the caller's, for the
// aliasing checks) into outs, or into new results when outs is nil.
func execute(op *ir.Op, args, ins, outs []*ir.Literal, outTypes []ir.Type) ([]*ir.Literal, error) {
	if outs == nil {
		if op.Code.Info().Class == ir.ClassRegion {
			// Region ops make their own results (no copy).
			res, err := runRegionOp(op, ins, outTypes, nil)
			if err != nil {
				return nil, err
			}
			if err := checkResults(res, outTypes); err != nil {
				return nil, err
			}
			return res, nil
		}
		outs = make([]*ir.Literal, len(outTypes))
		for i, t := range outTypes {
			outs[i] = newLit(t)
		}
		return outs, dispatch(op, ins, outs)
	}
	if err := checkOuts(op, args, ins, outs, outTypes); err != nil {
		return nil, err
	}
	// Unaligned destinations are computed into aligned scratch and copied.
	dst, scratch := outs, false
	for i, o := range outs {
		if aligned(o.Data) {
			continue
		}
		if !scratch {
			dst, scratch = append([]*ir.Literal(nil), outs...), true
		}
		dst[i] = newLit(o.Type)
		if len(ins) > 0 && ins[0] == o { // dynamic_update_slice in place (constant and iota have no operands)
			copy(dst[i].Data, o.Data)
			ins[0] = dst[i]
		}
	}
	if op.Code.Info().Class == ir.ClassRegion {
		if _, err := runRegionOp(op, ins, outTypes, dst); err != nil {
			return nil, err
		}
	} else if err := dispatch(op, ins, dst); err != nil {
		return nil, err
	}
	if scratch {
		for i := range dst {
			if dst[i] != outs[i] {
				copy(outs[i].Data, dst[i].Data)
			}
		}
	}
	return outs, nil
}

// checkResults verifies that kernel results have the inferred types.
func checkResults(outs []*ir.Literal, outTypes []ir.Type) error {
	if len(outs) != len(outTypes) {
		return fmt.Errorf("internal error: %d results, want %d", len(outs), len(outTypes))
	}
	for i, o := range outs {
		if !o.Type.Equal(outTypes[i]) || int64(len(o.Data)) != outTypes[i].Bytes() {
			return fmt.Errorf("internal error: result %d is %v (%d bytes), want %v", i, o.Type, len(o.Data), outTypes[i])
		}
	}
	return nil
}

// sameMem reports whether a and b are exactly the same non-empty memory.
func sameMem(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}

// checkOuts validates caller-provided destinations: types, sizes and the
// aliasing rule of EvalOpInto. args are the caller's operands, ins the
// validated (possibly realigned) ones.
func checkOuts(op *ir.Op, args, ins, outs []*ir.Literal, outTypes []ir.Type) error {
	if len(outs) != len(outTypes) {
		return fmt.Errorf("op has %d results, got %d destinations", len(outTypes), len(outs))
	}
	info := op.Code.Info()
	for i, o := range outs {
		if o == nil {
			return fmt.Errorf("destination %d is nil", i)
		}
		if !o.Type.EqualUnsharded(outTypes[i]) {
			return fmt.Errorf("destination %d is %v, want %v", i, o.Type, outTypes[i])
		}
		if int64(len(o.Data)) != outTypes[i].Bytes() {
			return fmt.Errorf("destination %d of type %v has %d bytes, want %d", i, o.Type, len(o.Data), outTypes[i].Bytes())
		}
		for j := 0; j < i; j++ {
			if Overlaps(o.Data, outs[j].Data) {
				return fmt.Errorf("destinations %d and %d share memory", j, i)
			}
		}
		for j, a := range args {
			if !Overlaps(o.Data, a.Data) {
				continue
			}
			switch {
			case (info.Elementwise || op.Code == ir.Fusion) && sameMem(o.Data, a.Data):
			case op.Code == ir.DynamicUpdateSlice && j == 0 && sameMem(o.Data, a.Data):
				// The operand is the destination: keep the caller's memory
				// even if checkArg made an aligned copy.
				ins[0] = o
			default:
				return fmt.Errorf("destination %d shares memory with operand %d", i, j)
			}
		}
	}
	return nil
}

// Overlaps reports whether two byte slices share memory.
func Overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// runRegionOp runs scan, while, cond or fusion. With outs nil it returns
// newly made results; otherwise it writes them into outs.
func runRegionOp(op *ir.Op, x []*ir.Literal, outTypes []ir.Type, outs []*ir.Literal) ([]*ir.Literal, error) {
	if op.Code == ir.Scan {
		return scan(op, x, outTypes, outs)
	}
	var res []*ir.Literal
	var err error
	switch op.Code {
	case ir.While:
		res, err = while(op, x)
	case ir.Cond:
		res, err = cond(op, x)
	case ir.Fusion:
		res, err = RunRegion(op.Regions[0], x)
		if err != nil {
			err = fmt.Errorf("fused region: %w", err)
		}
	default:
		return nil, fmt.Errorf("no kernel for op %v", op.Code)
	}
	if err != nil {
		return nil, err
	}
	if outs == nil {
		return res, nil
	}
	if err := checkResults(res, outTypes); err != nil {
		return nil, err
	}
	for i, r := range res {
		copy(outs[i].Data, r.Data)
	}
	return outs, nil
}

// dispatch runs the kernel of a non-region op on validated operands,
// writing every byte of the results into out.
func dispatch(op *ir.Op, x []*ir.Literal, outs []*ir.Literal) error {
	a := op.Attrs
	info := op.Code.Info()
	if op.Code.IsCollective() {
		// Only a Vmap or a ShardMap gives a collective a meaning; eval
		// runs one device's program and has no group to talk to.
		return ir.UnboundAxisError(op)
	}
	if isIdentityOp(op.Code) {
		identityOp(x, outs)
		return nil
	}
	out := outs[0]
	switch info.Class {
	case ir.ClassUnary:
		return unaryOp(op.Code, x[0], out)
	case ir.ClassBinary:
		return binaryOp(op.Code, x[0], x[1], out)
	case ir.ClassCompare:
		return compare(op.Code, x[0], x[1], out)
	case ir.ClassReduce:
		return reduce(op.Code, x[0], a.Ints("axes"), out)
	}
	switch op.Code {
	case ir.Constant:
		copy(out.Data, a.Literal("value").Data)
	case ir.Iota:
		return iotaOp(a, out)
	case ir.Select:
		selectOp(x[0], x[1], x[2], out)
	case ir.Convert:
		return convert(x[0], out)
	case ir.BitcastConvert, ir.Reshape, ir.DevicePut:
		copy(out.Data, x[0].Data)
	case ir.BroadcastInDim:
		broadcastInDim(x[0], a.Ints("dims"), out)
	case ir.Transpose:
		transpose(x[0], a.Ints("perm"), out)
	case ir.Slice:
		slice(x[0], a.Ints("start"), a.Ints("strides"), out)
	case ir.DynamicSlice:
		dynamicSlice(x[0], x[1:], out)
	case ir.DynamicUpdateSlice:
		dynamicUpdateSlice(x[0], x[1], x[2:], out)
	case ir.Concatenate:
		concatenate(x, a.Int("axis"), out)
	case ir.Pad:
		pad(x[0], x[1], a.Ints("low"), a.Ints("interior"), out)
	case ir.Gather:
		return gather(x[0], x[1], a.Int("axis"), out)
	case ir.ScatterAdd:
		return scatterAdd(x[0], x[1], x[2], a.Int("axis"), out)
	case ir.ArgMax, ir.ArgMin:
		return argReduce(op.Code, x[0], a.Int("axis"), out)
	case ir.Sort:
		return sortOp(x, a.Int("dimension"), a.Int("num_keys"), outs)
	case ir.DotGeneral:
		return dotGeneral(x[0], x[1], a, out)
	default:
		return fmt.Errorf("no kernel for op %v", op.Code)
	}
	return nil
}

// Kernel is an op prepared for repeated execution into caller-provided
// memory: its shape rule is checked once, by Prepare, and each Into call only
// checks the operands' and destinations' types against the op's declared
// ones. Executors prepare one Kernel per op of a compiled program.
type Kernel struct {
	op       *ir.Op
	outTypes []ir.Type
}

// Prepare checks op (operands and results declared, attributes and regions
// valid for its shape rule) and returns its kernel.
func Prepare(op *ir.Op) (k *Kernel, err error) {
	if op == nil {
		return nil, fmt.Errorf("eval: nil op")
	}
	defer func() {
		if p := recover(); p != nil {
			k, err = nil, fmt.Errorf("%s: internal error: %v", op.Describe(), p)
		}
	}()
	types := make([]ir.Type, len(op.Args))
	for i, a := range op.Args {
		if a == nil {
			return nil, fmt.Errorf("%s: operand %d is nil", op.Describe(), i)
		}
		types[i] = a.Type
	}
	outTypes, err := ir.InferTypes(op.Code, types, op.Attrs, op.Regions)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op.Describe(), err)
	}
	if len(op.Results) != len(outTypes) {
		return nil, fmt.Errorf("%s: op has %d results, its shape rule gives %d", op.Describe(), len(op.Results), len(outTypes))
	}
	for i, v := range op.Results {
		if v == nil || !v.Type.EqualUnsharded(outTypes[i]) {
			return nil, fmt.Errorf("%s: result %d is not declared %v", op.Describe(), i, outTypes[i])
		}
	}
	return &Kernel{op: op, outTypes: outTypes}, nil
}

// Op returns the kernel's op.
func (k *Kernel) Op() *ir.Op { return k.op }

// Into runs the op like EvalOpInto (same destinations, same aliasing rule),
// checking only that every operand and destination has the op's declared
// type and size.
func (k *Kernel) Into(args, outs []*ir.Literal) (err error) {
	op := k.op
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s: internal error: %v", op.Describe(), p)
		}
	}()
	if len(args) != len(op.Args) {
		return fmt.Errorf("%s: op has %d operands, got %d literals", op.Describe(), len(op.Args), len(args))
	}
	var buf [4]*ir.Literal
	ins := buf[:0]
	if len(args) > len(buf) {
		ins = make([]*ir.Literal, 0, len(args))
	}
	for i, a := range args {
		if a == nil {
			return fmt.Errorf("%s: operand %d is nil", op.Describe(), i)
		}
		l, err := checkArg(a, op.Args[i].Type)
		if err != nil {
			return fmt.Errorf("%s: operand %d: %w", op.Describe(), i, err)
		}
		ins = append(ins, l)
	}
	if outs == nil {
		outs = []*ir.Literal{}
	}
	if _, err := execute(op, args, ins, outs, k.outTypes); err != nil {
		return fmt.Errorf("%s: %w", op.Describe(), err)
	}
	return nil
}
