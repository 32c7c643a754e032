// Package eval is the reference executor of the Ferry IR: it runs an ir.Func,
// a region or a single op on host literals, op by op, with straightforward
// typed loops. It defines what every op computes; the backends are tested
// against it.
//
// Numerics, where the op table leaves a choice:
//
//   - f16 and bf16 elementwise arithmetic is computed in float32 and rounded
//     back to nearest even. f32 is computed in float32; transcendental
//     functions of f32 (and f16/bf16) go through float64 math and are rounded
//     once to float32.
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
//     and round once; f64 in float64; integers wrap. reduce_max of nothing is
//     -inf (the minimum for integers), reduce_min +inf (the maximum).
//   - dot_general accumulates f32, f16 and bf16 in float32 (rounding f16/bf16
//     once at the end), f64 in float64, integers with wrapping.
//   - scatter_add adds each update in the operand's dtype, in index order
//     (f16/bf16 through float32, rounded after every add); on bool it is a
//     logical or. gather from an empty axis into a non-empty result is an
//     error.
//
// Results never share memory with arguments or with each other.
package eval

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Run executes f's body on args, one per body parameter with exactly the
// parameter's type (memory space included), and returns new literals for the
// results.
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
				return nil, fmt.Errorf("%s: operand %d (%v) is not defined before use", opName(op), j, a)
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

// checkArg validates a literal against the type t and returns it, or an
// aligned copy when its memory is not 8-byte aligned.
func checkArg(l *ir.Literal, t ir.Type) (*ir.Literal, error) {
	if l == nil {
		return nil, fmt.Errorf("nil literal, want %v", t)
	}
	if !l.Type.Equal(t) {
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

func opName(op *ir.Op) string {
	if op.Loc != "" {
		return fmt.Sprintf("%v (%s)", op.Code, op.Loc)
	}
	return op.Code.String()
}

// EvalOp executes a single op on literal operands (one per op.Args, with the
// same types) and returns new literals for its results. Errors, including
// internal panics, name the op and its location.
func EvalOp(op *ir.Op, args []*ir.Literal) (res []*ir.Literal, err error) {
	if op == nil {
		return nil, fmt.Errorf("eval: nil op")
	}
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("%s: internal error: %v", opName(op), p)
		}
	}()
	res, err = evalOp(op, args)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opName(op), err)
	}
	return res, nil
}

func evalOp(op *ir.Op, args []*ir.Literal) ([]*ir.Literal, error) {
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
			if v != nil && !v.Type.Equal(outTypes[i]) {
				return nil, fmt.Errorf("result %d is declared %v, its shape rule gives %v", i, v.Type, outTypes[i])
			}
		}
	}
	outs, err := dispatch(op, ins, outTypes)
	if err != nil {
		return nil, err
	}
	if len(outs) != len(outTypes) {
		return nil, fmt.Errorf("internal error: %d results, want %d", len(outs), len(outTypes))
	}
	for i, o := range outs {
		if !o.Type.Equal(outTypes[i]) || int64(len(o.Data)) != outTypes[i].Bytes() {
			return nil, fmt.Errorf("internal error: result %d is %v (%d bytes), want %v", i, o.Type, len(o.Data), outTypes[i])
		}
	}
	return outs, nil
}

// dispatch runs the kernel of op on validated operands.
func dispatch(op *ir.Op, x []*ir.Literal, outTypes []ir.Type) ([]*ir.Literal, error) {
	a := op.Attrs
	info := op.Code.Info()
	switch info.Class {
	case ir.ClassUnary:
		out := newLit(outTypes[0])
		return []*ir.Literal{out}, unaryOp(op.Code, x[0], out)
	case ir.ClassBinary:
		out := newLit(outTypes[0])
		return []*ir.Literal{out}, binaryOp(op.Code, x[0], x[1], out)
	case ir.ClassCompare:
		out := newLit(outTypes[0])
		return []*ir.Literal{out}, compare(op.Code, x[0], x[1], out)
	case ir.ClassReduce:
		out := newLit(outTypes[0])
		return []*ir.Literal{out}, reduce(op.Code, x[0], a.Ints("axes"), out)
	}
	switch op.Code {
	case ir.Scan:
		return scan(op, x, outTypes)
	case ir.While:
		return while(op, x)
	case ir.Cond:
		return cond(op, x)
	}
	out := newLit(outTypes[0])
	one := []*ir.Literal{out}
	switch op.Code {
	case ir.Constant:
		copy(out.Data, a.Literal("value").Data)
	case ir.Iota:
		return one, iotaOp(a, out)
	case ir.Select:
		selectOp(x[0], x[1], x[2], out)
	case ir.Convert:
		return one, convert(x[0], out)
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
		return one, gather(x[0], x[1], a.Int("axis"), out)
	case ir.ScatterAdd:
		return one, scatterAdd(x[0], x[1], x[2], a.Int("axis"), out)
	case ir.ArgMax, ir.ArgMin:
		return one, argReduce(op.Code, x[0], a.Int("axis"), out)
	case ir.DotGeneral:
		return one, dotGeneral(x[0], x[1], a, out)
	default:
		return nil, fmt.Errorf("no kernel for op %v", op.Code)
	}
	return one, nil
}
