package ir

import (
	"fmt"
	"math"
)

// Verify checks that f is well formed:
//
//   - every value is defined once, its ID is unique in the whole function,
//     non-negative and below f.NextID(), and its Op and Index point back at its
//     definition (a region parameter has a nil Op and its position as Index);
//   - every operand is non-nil, defined before its use and visible there:
//     regions are isolated from above, so a region sees only its own
//     parameters and the values defined in it;
//   - every op's code is known, its attributes have printable values (valid
//     dtypes, memory spaces and literals), and its result types are the ones
//     InferTypes gives now apart from shardings (Type.EqualUnsharded), which
//     also checks the region contracts of scan, while and cond;
//   - the results of every region are visible in it;
//   - every type is valid: a known dtype and memory space, no negative
//     dimension, a byte size that fits in an int64, and a sharding, if any,
//     valid for the shape (NamedSharding.Validate); literal types have none.
//
// The error names the op (with its Loc when known) and the problem.
func Verify(f *Func) error {
	if f == nil {
		return fmt.Errorf("verify: nil function")
	}
	if f.Body == nil {
		return fmt.Errorf("verify @%s: nil body", f.Name)
	}
	v := &verifier{f: f, ids: map[int]*Value{}, defined: map[*Value]bool{}, ops: map[*Op]bool{}, regions: map[*Region]bool{}}
	if err := v.region(f.Body, "function body"); err != nil {
		return fmt.Errorf("verify @%s: %w", f.Name, err)
	}
	return nil
}

type verifier struct {
	f       *Func
	ids     map[int]*Value
	defined map[*Value]bool
	ops     map[*Op]bool
	regions map[*Region]bool
	depth   int
}

// define records a new value; where says what defines it.
func (v *verifier) define(val *Value, def *Op, idx int, where string, sc map[*Value]bool) error {
	if val == nil {
		return fmt.Errorf("%s is nil", where)
	}
	if v.defined[val] {
		return fmt.Errorf("%s: value %%%d is defined twice", where, val.ID)
	}
	if prev, ok := v.ids[val.ID]; ok && prev != val {
		return fmt.Errorf("%s: value ID %%%d is used by two different values", where, val.ID)
	}
	if val.ID < 0 || val.ID >= v.f.NextID() {
		return fmt.Errorf("%s: value ID %%%d is outside [0, NextID=%d)", where, val.ID, v.f.NextID())
	}
	if val.Op != def {
		if def == nil {
			return fmt.Errorf("%s: parameter %%%d has a defining op (%v)", where, val.ID, val.Op.Code)
		}
		return fmt.Errorf("%s: value %%%d does not point back at its defining op", where, val.ID)
	}
	if val.Index != idx {
		return fmt.Errorf("%s: value %%%d has Index %d, want %d", where, val.ID, val.Index, idx)
	}
	if err := checkType(val.Type); err != nil {
		return fmt.Errorf("%s: value %%%d: %w", where, val.ID, err)
	}
	v.defined[val] = true
	v.ids[val.ID] = val
	sc[val] = true
	return nil
}

// use checks that an operand or region result is visible in scope sc.
func (v *verifier) use(val *Value, what string, sc map[*Value]bool) error {
	switch {
	case val == nil:
		return fmt.Errorf("%s is nil", what)
	case sc[val]:
		return nil
	case v.defined[val]:
		return fmt.Errorf("%s %%%d is defined outside this region (regions are isolated from above)", what, val.ID)
	}
	return fmt.Errorf("%s %%%d is used before its definition or not defined in this function", what, val.ID)
}

func (v *verifier) region(r *Region, where string) error {
	if v.regions[r] {
		return fmt.Errorf("%s: region appears twice in the function", where)
	}
	v.regions[r] = true
	v.depth++
	defer func() { v.depth-- }()
	sc := map[*Value]bool{}
	for i, p := range r.Params {
		if err := v.define(p, nil, i, fmt.Sprintf("%s: parameter %d", where, i), sc); err != nil {
			return err
		}
	}
	for _, op := range r.Ops {
		if op == nil {
			return fmt.Errorf("%s: nil op", where)
		}
		if err := v.op(op, sc); err != nil {
			if r == v.f.Body {
				return err
			}
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	for i, res := range r.Results {
		if err := v.use(res, fmt.Sprintf("%s: result %d", where, i), sc); err != nil {
			return err
		}
	}
	return nil
}

func (v *verifier) op(op *Op, sc map[*Value]bool) error {
	name := op.Describe()
	if v.ops[op] {
		return fmt.Errorf("op %s appears twice in the function", name)
	}
	v.ops[op] = true
	if op.Code.Info().Infer == nil {
		return fmt.Errorf("op %s: unknown op code %d", name, uint16(op.Code))
	}
	argTypes := make([]Type, len(op.Args))
	for i, a := range op.Args {
		if err := v.use(a, fmt.Sprintf("op %s: operand %d", name, i), sc); err != nil {
			return err
		}
		argTypes[i] = a.Type
	}
	for _, k := range op.Attrs.Keys() {
		if err := checkAttrValue(op.Attrs[k]); err != nil {
			return fmt.Errorf("op %s: attribute %q: %w", name, k, err)
		}
	}
	for i, r := range op.Regions {
		if r == nil {
			return fmt.Errorf("op %s: region %d is nil", name, i)
		}
		if v.depth > maxRegionDepth {
			return fmt.Errorf("op %s: regions nested more than %d deep", name, maxRegionDepth)
		}
		if err := v.region(r, fmt.Sprintf("region %d", i)); err != nil {
			return fmt.Errorf("op %s: %w", name, err)
		}
	}
	want, err := inferTypesSafe(op.Code, argTypes, op.Attrs, op.Regions)
	if err != nil {
		return fmt.Errorf("op %s: %w", name, err)
	}
	if len(want) != len(op.Results) {
		return fmt.Errorf("op %s: has %d results, its shape rule gives %d", name, len(op.Results), len(want))
	}
	for i, res := range op.Results {
		if err := v.define(res, op, i, fmt.Sprintf("op %s: result %d", name, i), sc); err != nil {
			return err
		}
		if !res.Type.EqualUnsharded(want[i]) {
			return fmt.Errorf("op %s: result %d (%%%d) has type %v, its shape rule gives %v", name, i, res.ID, res.Type, want[i])
		}
	}
	return nil
}

// checkAttrValue checks that an attribute value is of a supported kind and
// holds something the printer can write and the parser read back.
func checkAttrValue(a any) error {
	switch x := a.(type) {
	case int, []int, float64, bool, string:
		return nil
	case DType:
		if !x.Valid() {
			return fmt.Errorf("invalid dtype %d", uint8(x))
		}
	case MemorySpace:
		if x >= numSpaces {
			return fmt.Errorf("invalid memory space %d", uint8(x))
		}
	case *Literal:
		if x == nil {
			return fmt.Errorf("nil literal")
		}
		if err := checkType(x.Type); err != nil {
			return fmt.Errorf("literal: %w", err)
		}
		if x.Type.Sharding != nil {
			return fmt.Errorf("literal of type %v: a literal's type has no sharding", x.Type)
		}
		if int64(len(x.Data)) != x.Type.Bytes() {
			return fmt.Errorf("literal of type %v has %d bytes, want %d", x.Type, len(x.Data), x.Type.Bytes())
		}
	default:
		return fmt.Errorf("unsupported value of type %T", a)
	}
	return nil
}

// checkType reports whether t is a valid type: a known dtype and memory space,
// no negative dimension, and a byte size (counting only non-zero dimensions)
// that fits in an int64.
func checkType(t Type) error {
	if !t.DType.Valid() {
		return fmt.Errorf("type %v has an invalid dtype", t)
	}
	if t.Space >= numSpaces {
		return fmt.Errorf("type %v has an invalid memory space", t)
	}
	n := int64(t.DType.Size())
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("type %v has a negative dimension", t)
		}
		if d == 0 {
			continue
		}
		if int64(d) > math.MaxInt64/n {
			return fmt.Errorf("type %v is too large: its byte size overflows int64", t)
		}
		n *= int64(d)
	}
	if t.Sharding != nil {
		if err := t.Sharding.Validate(t.Shape); err != nil {
			return fmt.Errorf("type %v: %w", t, err)
		}
	}
	return nil
}
