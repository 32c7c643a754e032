package ir

import "fmt"

// Collectives.
//
// The collective ops (AllReduce, AllGather, ReduceScatter, AllToAll,
// CollectivePermute, AxisIndex) name an axis of a group of members by the
// string attribute "axis" and give its size, the number of members, in the
// int attribute "size". They have a meaning only where that axis is bound:
// inside a trace.Vmap with that AxisName, whose batching rules turn them into
// ordinary ops over the mapped axis (or pass them through to an enclosing
// binding), and, later, inside a ShardMap, whose per-device programs run them
// through package collective. A program that still holds one where its axis
// is unbound has no meaning: trace refuses to emit it, and the backends
// report it (naming the axis and the op's location) instead of running it.
//
// Each op's result type is the per-member type:
//
//   - all_reduce: every member gets the reduction ("sum", "max" or "min") of
//     the operands of all members; same type.
//   - all_gather: the operands of all members in member order, stacked along
//     a new dimension (result dim "dimension" of size size) or, with tiled,
//     concatenated along dimension (its size times size).
//   - reduce_scatter: the sum over members, of which member i keeps block i
//     of dimension: dimension (of size size) is removed, or with tiled,
//     divided by size.
//   - all_to_all (XLA's AllToAll, JAX's all_to_all with tiled=True): each
//     member cuts split_dimension into size blocks and sends block j to member
//     j, which concatenates the blocks it receives along concat_dimension in
//     member order: split_dimension is divided by size, concat_dimension
//     multiplied.
//   - collective_permute: member target gets the operand of member source for
//     each (source, target) of pairs (sources distinct, targets distinct);
//     members no pair targets get zeros.
//   - axis_index: the member's index, 0 to size-1, as an i32 scalar.

// IsCollective reports whether c is a collective op, whose "axis" attribute
// names an axis that must be bound where it runs.
func (c Code) IsCollective() bool { return c >= AllReduce && c <= AxisIndex }

// UnboundAxisError returns the error of a collective op whose axis is bound
// nowhere: no Vmap with that AxisName and no ShardMap over that mesh axis
// encloses it. It names the axis; callers add the op and its location
// (Op.Describe), as eval's errors do.
func UnboundAxisError(op *Op) error {
	return fmt.Errorf("unbound axis name %q: collectives run only inside a Vmap with that AxisName or a ShardMap over that mesh axis",
		op.Attrs.String("axis"))
}

func init() {
	axis := []AttrSpec{{"axis", AttrString, false}, {"size", AttrInt, false}}
	with := func(more ...AttrSpec) []AttrSpec { return append(append([]AttrSpec{}, axis...), more...) }
	def(AllReduce, OpInfo{Name: "all_reduce", NumArgs: 1, Differentiable: true, Attrs: with(AttrSpec{"reduction", AttrString, false}), Infer: inferAllReduce})
	def(AllGather, OpInfo{Name: "all_gather", NumArgs: 1, Differentiable: true, Attrs: with(AttrSpec{"dimension", AttrInt, false}, AttrSpec{"tiled", AttrBool, true}), Infer: inferAllGather})
	def(ReduceScatter, OpInfo{Name: "reduce_scatter", NumArgs: 1, Differentiable: true, Attrs: with(AttrSpec{"dimension", AttrInt, false}, AttrSpec{"tiled", AttrBool, true}), Infer: inferReduceScatter})
	def(AllToAll, OpInfo{Name: "all_to_all", NumArgs: 1, Differentiable: true, Attrs: with(AttrSpec{"split_dimension", AttrInt, false}, AttrSpec{"concat_dimension", AttrInt, false}), Infer: inferAllToAll})
	def(CollectivePermute, OpInfo{Name: "collective_permute", NumArgs: 1, Differentiable: true, Attrs: with(AttrSpec{"pairs", AttrInts, false}), Infer: inferCollectivePermute})
	def(AxisIndex, OpInfo{Name: "axis_index", NumArgs: 0, Attrs: axis, Infer: inferAxisIndex})
	installShardRules() // also run by ops.go's init: whichever runs last sees every row
}

// collectiveArg checks the axis attributes and the operand of a collective.
func collectiveArg(name string, args []Type, a Attrs) (Type, int, error) {
	if a.String("axis") == "" {
		return Type{}, 0, fmt.Errorf("%s: empty axis name", name)
	}
	n := a.Int("size")
	if n < 1 {
		return Type{}, 0, fmt.Errorf("%s: axis %q has size %d, want at least 1", name, a.String("axis"), n)
	}
	if len(args) == 0 {
		return Type{}, n, nil
	}
	if args[0].Space != Device {
		return Type{}, 0, fmt.Errorf("%s: operand is in %v memory, not device", name, args[0].Space)
	}
	return args[0], n, nil
}

func inferAllReduce(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	x, _, err := collectiveArg("all_reduce", args, a)
	if err != nil {
		return nil, err
	}
	switch r := a.String("reduction"); r {
	case "sum", "max", "min":
		if x.DType == Bool {
			return nil, fmt.Errorf("all_reduce: %s of bool", r)
		}
	default:
		return nil, fmt.Errorf("all_reduce: unknown reduction %q (want sum, max or min)", r)
	}
	return one(x.Clone()), nil
}

func inferAllGather(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	x, n, err := collectiveArg("all_gather", args, a)
	if err != nil {
		return nil, err
	}
	d, s := a.Int("dimension"), x.Shape.Clone()
	if a.Bool("tiled") {
		if d < 0 || d >= len(s) {
			return nil, fmt.Errorf("all_gather: dimension %d out of range for %v", d, x)
		}
		s[d] *= n
	} else {
		if d < 0 || d > len(s) {
			return nil, fmt.Errorf("all_gather: dimension %d out of range for %v (stacked)", d, x)
		}
		s = append(s[:d:d], append(Shape{n}, s[d:]...)...)
	}
	return one(x.WithShape(s)), nil
}

func inferReduceScatter(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	x, n, err := collectiveArg("reduce_scatter", args, a)
	if err != nil {
		return nil, err
	}
	if x.DType == Bool {
		return nil, fmt.Errorf("reduce_scatter: sum of bool")
	}
	d, s := a.Int("dimension"), x.Shape.Clone()
	if d < 0 || d >= len(s) {
		return nil, fmt.Errorf("reduce_scatter: dimension %d out of range for %v", d, x)
	}
	if a.Bool("tiled") {
		if s[d]%n != 0 {
			return nil, fmt.Errorf("reduce_scatter: dimension %d of %v is not divisible by the axis size %d", d, x, n)
		}
		s[d] /= n
	} else {
		if s[d] != n {
			return nil, fmt.Errorf("reduce_scatter: dimension %d of %v is not the axis size %d", d, x, n)
		}
		s = append(s[:d:d], s[d+1:]...)
	}
	return one(x.WithShape(s)), nil
}

func inferAllToAll(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	x, n, err := collectiveArg("all_to_all", args, a)
	if err != nil {
		return nil, err
	}
	sd, cd, s := a.Int("split_dimension"), a.Int("concat_dimension"), x.Shape.Clone()
	if sd < 0 || sd >= len(s) || cd < 0 || cd >= len(s) {
		return nil, fmt.Errorf("all_to_all: split_dimension %d or concat_dimension %d out of range for %v", sd, cd, x)
	}
	if s[sd]%n != 0 {
		return nil, fmt.Errorf("all_to_all: split_dimension %d of %v is not divisible by the axis size %d", sd, x, n)
	}
	s[sd] /= n
	s[cd] *= n
	return one(x.WithShape(s)), nil
}

func inferCollectivePermute(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	x, n, err := collectiveArg("collective_permute", args, a)
	if err != nil {
		return nil, err
	}
	p := a.Ints("pairs")
	if len(p)%2 != 0 {
		return nil, fmt.Errorf("collective_permute: pairs has odd length %d (want source, target, ...)", len(p))
	}
	src, dst := map[int]bool{}, map[int]bool{}
	for i := 0; i < len(p); i += 2 {
		s, t := p[i], p[i+1]
		if s < 0 || s >= n || t < 0 || t >= n {
			return nil, fmt.Errorf("collective_permute: pair (%d, %d) out of range for axis size %d", s, t, n)
		}
		if src[s] || dst[t] {
			return nil, fmt.Errorf("collective_permute: pair (%d, %d) repeats a source or a target", s, t)
		}
		src[s], dst[t] = true, true
	}
	return one(x.Clone()), nil
}

func inferAxisIndex(args []Type, a Attrs, _ []*Region) ([]Type, error) {
	if _, _, err := collectiveArg("axis_index", args, a); err != nil {
		return nil, err
	}
	return one(Type{DType: Int32}), nil
}
