package passes

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
)

// LowerKernel describes a fusion op as a Kernel: its mode and, unless it is
// KernelUnsupported, one program per iteration-space size. A group is
// unsupported (Kernel.Why says why) when it holds other ops than
// elementwise ones, broadcast_in_dim, transpose, slice, reshape, iota,
// constant, device_put, reductions and one dot_general; when an op reads a
// reduction; when it mixes a product and reductions; or when the product is
// read through a view or no result fits its buffer. The error is for a
// malformed fusion op only.
func LowerKernel(op *ir.Op) (*Kernel, error) {
	if len(op.Regions) != 1 || op.Regions[0] == nil {
		return nil, fmt.Errorf("fusion needs one region")
	}
	rg := op.Regions[0]
	if len(rg.Params) != len(op.Args) || len(rg.Results) != len(op.Results) {
		return nil, fmt.Errorf("fusion region does not match the op")
	}
	k := &Kernel{Op: op}
	if err := k.build(); err != nil {
		if u, ok := err.(unsupported); ok {
			return &Kernel{Op: op, Mode: KernelUnsupported, Why: string(u)}, nil
		}
		return nil, err
	}
	return k, nil
}

// LowerOp describes op, a single op outside a fused group, as a kernel of
// one group, when the kernel form expresses it: an elementwise op, a
// reduction, a view op (broadcast_in_dim, transpose, slice, reshape), iota,
// dot_general (an output group whose epilogue is the product itself),
// arg_max and arg_min (an input group whose Reduce has their code), or an
// element-moving op with an index rule (ir.IndexRuleOf: a loop group of
// one NodeIndexed node).
// The kernel is the one a fused group of that op alone gets: its Op is
// a fusion op made for it, whose operands and results are op's and whose
// region holds a copy of op over parameters of the operands' types. ok is
// false for every other op, and for one the kernel form does not describe.
func LowerOp(op *ir.Op) (k *Kernel, ok bool) {
	if op == nil || !loneKernelOp(op.Code) || len(op.Results) == 0 {
		return nil, false
	}
	f := ir.NewFunc(op.Code.String())
	rg := f.NewRegion()
	inner := make([]*ir.Value, len(op.Args))
	for i, a := range op.Args {
		inner[i] = rg.AddParam(a.Type)
	}
	in, err := rg.AddOp(op.Code, inner, op.Attrs)
	if err != nil {
		return nil, false
	}
	rg.Results = in.Results
	fop := &ir.Op{Code: ir.Fusion, Args: op.Args, Results: op.Results, Attrs: ir.Attrs{"kind": "loop"}, Regions: []*ir.Region{rg}, Loc: op.Loc}
	switch {
	case IsReduce(op.Code), op.Code == ir.ArgMax, op.Code == ir.ArgMin:
		fop.Attrs["kind"] = "input"
	case op.Code == ir.DotGeneral:
		fop.Attrs["kind"] = "output"
	}
	if rule, ok := ir.IndexRuleOf(in); ok {
		return indexedKernel(fop, rule), true
	}
	if op.Code == ir.ArgMax || op.Code == ir.ArgMin {
		return argKernel(fop), true
	}
	k, err = LowerKernel(fop)
	if err != nil || k.Mode == KernelUnsupported {
		return nil, false
	}
	return k, true
}

// loneKernelOp reports whether a single op of code c is described as a
// kernel (LowerOp): elementwise ops, reductions (arg_max and arg_min
// included), view ops, iota, dot_general and the ops with an index rule.
func loneKernelOp(c ir.Code) bool {
	switch c {
	case ir.Iota, ir.DotGeneral, ir.DynamicSlice, ir.DynamicUpdateSlice, ir.Concatenate, ir.Pad, ir.Gather, ir.ArgMax, ir.ArgMin:
		return true
	}
	return c.Info().Elementwise || IsReduce(c) || c.Info().View != nil
}

// indexedKernel is the kernel of fop, the one-op group of an op with index
// rule rule: one NodeIndexed node, result 0 at every position.
func indexedKernel(fop *ir.Op, rule *ir.IndexRule) *Kernel {
	v := fop.Results[0]
	nd := Node{Kind: NodeIndexed, DType: v.Type.DType, Operand: -1, Index: rule, Operands: make([]int, len(fop.Args))}
	for i := range nd.Operands {
		nd.Operands[i] = i
	}
	p := &KernelProgram{Size: v.Type.Size(), Nodes: []Node{nd}, Results: []KernelResult{{Result: 0, Node: 0}}}
	return &Kernel{Op: fop, Mode: KernelLoop, Programs: []*KernelProgram{p}, ElemOnly: make([]bool, len(fop.Args))}
}

// unsupported is the reason a group is not described.
type unsupported string

func (u unsupported) Error() string { return string(u) }

// IsReduce reports whether c is one of the reductions a KernelInput group
// computes.
func IsReduce(c ir.Code) bool {
	return c == ir.ReduceSum || c == ir.ReduceMax || c == ir.ReduceMin || c == ir.ReduceProd
}

// KernelNodeOp reports whether an op of code c inside a fused group is
// described by a Kernel other than as an elementwise node or a reduction:
// the view ops (broadcast_in_dim, transpose, slice, reshape, device_put),
// which become leaf views, constant and iota (NodeConst leaves) and
// dot_general (the product of an output group, NodeDot).
func KernelNodeOp(c ir.Code) bool {
	if c.Info().View != nil { // broadcast_in_dim, transpose, slice, reshape: read through views
		return true
	}
	switch c {
	case ir.DevicePut, ir.Constant, ir.Iota, ir.DotGeneral:
		return true
	}
	return false
}

// kernelBuilder memoises the nodes of one program by value and view.
type kernelBuilder struct {
	k      *Kernel
	p      *KernelProgram
	params map[*ir.Value]int
	memo   map[string]int
	ids    map[*ir.Value]int
}

// classify scans the group's ops: the product, the reductions, and whether
// every op is one the plan describes.
func (k *Kernel) classify() ([]*ir.Op, error) {
	rg := k.Op.Regions[0]
	var reduces []*ir.Op
	for _, op := range rg.Ops {
		switch {
		case op.Code == ir.DotGeneral:
			if k.Dot != nil {
				return nil, unsupported("more than one dot_general")
			}
			k.Dot = op
		case IsReduce(op.Code):
			reduces = append(reduces, op)
		case op.Info().Elementwise, KernelNodeOp(op.Code):
		default:
			return nil, unsupported(fmt.Sprintf("%v inside a fused group", op.Code))
		}
	}
	if len(rg.Results) == 0 {
		return nil, unsupported("no results")
	}
	red := map[*ir.Value]bool{}
	for _, op := range reduces {
		red[op.Result()] = true
	}
	for _, op := range rg.Ops {
		for _, a := range op.Args {
			if red[a] {
				return nil, unsupported("ops after a reduction")
			}
		}
	}
	return reduces, nil
}

// setDot makes k an output group: the result holding the product and the
// operands it multiplies.
func (k *Kernel) setDot(params map[*ir.Value]int) error {
	rg := k.Op.Regions[0]
	k.Mode = KernelOutput
	d := k.Dot.Result()
	k.DotResult = -1
	for i, v := range rg.Results {
		if v.Type.Size() == d.Type.Size() && v.Type.DType.Size() == d.Type.DType.Size() {
			k.DotResult = i
			break
		}
	}
	if k.DotResult < 0 {
		return unsupported("no output fusion result fits the product's buffer")
	}
	for j, a := range k.Dot.Args {
		p, ok := params[a]
		if !ok {
			return unsupported("dot_general operand computed inside the group")
		}
		k.DotArgs[j] = p
	}
	k.Matmul = MatmulOf(k.Dot)
	k.prog(d.Type.Size())
	return nil
}

func (k *Kernel) build() error {
	rg := k.Op.Regions[0]
	params := map[*ir.Value]int{}
	for i, p := range rg.Params {
		params[p] = i
	}
	reduces, err := k.classify()
	if err != nil {
		return err
	}
	k.Mode = KernelLoop
	builders := map[*KernelProgram]*kernelBuilder{}
	switch {
	case k.Dot != nil:
		if len(reduces) > 0 {
			return unsupported("dot_general and reductions in one group")
		}
		if err := k.setDot(params); err != nil {
			return err
		}
	case len(reduces) > 0:
		k.Mode = KernelInput
	}
	builder := func(n int) *kernelBuilder {
		p := k.prog(n)
		if b := builders[p]; b != nil {
			return b
		}
		b := &kernelBuilder{k: k, p: p, params: params, memo: map[string]int{}, ids: map[*ir.Value]int{}}
		builders[p] = b
		return b
	}
	done := map[*ir.Value]bool{}
	for i, v := range rg.Results {
		if v.Op != nil && IsReduce(v.Op.Code) {
			if done[v] {
				return unsupported("a reduction returned twice")
			}
			done[v] = true
			shape := v.Op.Args[0].Type.Shape
			b := builder(shape.Size())
			n, err := b.node(v.Op.Args[0], nil)
			if err != nil {
				return err
			}
			b.p.Reduces = append(b.p.Reduces, reduceOf(v, n, i))
			continue
		}
		b := builder(v.Type.Size())
		n, err := b.node(v, nil)
		if err != nil {
			return err
		}
		b.p.Results = append(b.p.Results, KernelResult{Result: i, Node: n})
	}
	for _, op := range reduces {
		if !done[op.Result()] {
			return unsupported("a reduction that is not a result")
		}
	}
	k.elemOnly()
	return nil
}

// elemOnly fills k.ElemOnly.
func (k *Kernel) elemOnly() {
	rg := k.Op.Regions[0]
	k.ElemOnly = make([]bool, len(rg.Params))
	for i := range k.ElemOnly {
		k.ElemOnly[i] = true
	}
	if k.Dot != nil {
		k.ElemOnly[k.DotArgs[0]], k.ElemOnly[k.DotArgs[1]] = false, false
	}
	for _, p := range k.Programs {
		for _, nd := range p.Nodes {
			if nd.Kind == NodeLeaf && (len(nd.View) != 0 || rg.Params[nd.Operand].Type.Size() != p.Size) {
				k.ElemOnly[nd.Operand] = false
			}
		}
	}
}

// reduceOf describes reduction result v (fusion result res) of operand node n.
func reduceOf(v *ir.Value, n, res int) Reduce {
	shape, axes := v.Op.Args[0].Type.Shape, v.Op.Attrs.Ints("axes")
	if v.Op.Code == ir.ArgMax || v.Op.Code == ir.ArgMin {
		axes = []int{v.Op.Attrs.Int("axis")}
	}
	r := Reduce{Code: v.Op.Code, Node: n, Result: res, DType: v.Type.DType, Outputs: v.Type.Size(), PerOutput: 1}
	ostr := make([]int, len(shape))
	outStr := ir.RemoveAxes(shape, axes).Strides()
	j := 0
	for d, x := range shape {
		if slices.Contains(axes, d) {
			r.PerOutput *= x
			continue
		}
		ostr[d] = outStr[j]
		j++
	}
	r.Out = ir.NewStridedView(shape, ostr, 0)
	r.Trailing = eval.TrailingReduce(shape, axes)
	r.Leading = !r.Trailing && leadingReduce(shape, axes)
	return r
}

// leadingReduce reports whether the reduced axes of shape come before
// every kept axis (size-1 axes aside).
func leadingReduce(shape ir.Shape, axes []int) bool {
	lastRed, firstKept := -1, len(shape)
	for d, n := range shape {
		if n == 1 {
			continue
		}
		if slices.Contains(axes, d) {
			lastRed = d
		} else {
			firstKept = min(firstKept, d)
		}
	}
	return lastRed < firstKept
}

// prog returns the program over n elements, making it on first use.
func (k *Kernel) prog(n int) *KernelProgram {
	for _, p := range k.Programs {
		if p.Size == n {
			return p
		}
	}
	p := &KernelProgram{Size: n}
	k.Programs = append(k.Programs, p)
	return p
}

func (b *kernelBuilder) key(v *ir.Value, m ir.ViewChain) string {
	id, ok := b.ids[v]
	if !ok {
		id = len(b.ids)
		b.ids[v] = id
	}
	return strconv.Itoa(id) + "|" + m.String()
}

// node returns the node of value v read through view m (from iteration flat
// index to v's flat index), building it and its operands on first use.
func (b *kernelBuilder) node(v *ir.Value, m ir.ViewChain) (int, error) {
	key := b.key(v, m)
	if n, ok := b.memo[key]; ok {
		return n, nil
	}
	nd := Node{DType: v.Type.DType, Operand: -1}
	if prm, ok := b.params[v]; ok {
		nd.Kind, nd.Operand, nd.View = NodeLeaf, prm, m
	} else if v.Op == nil {
		return 0, fmt.Errorf("%v is neither a parameter nor defined in the group", v)
	} else {
		op := v.Op
		if view, ok := ir.ViewOf(op); ok || op.Code == ir.DevicePut {
			n, err := b.node(op.Args[0], m.Then(view))
			if err != nil {
				return 0, err
			}
			b.memo[key] = n
			return n, nil
		}
		if err := b.opNode(&nd, op, m); err != nil {
			return 0, err
		}
	}
	if nd.Kind == NodeLeaf || nd.Kind == NodeConst {
		nd.Invariant = nd.View.IsConstant()
	}
	b.p.Nodes = append(b.p.Nodes, nd)
	b.memo[key] = len(b.p.Nodes) - 1
	return len(b.p.Nodes) - 1, nil
}

// opNode fills nd for op (not a view op) read through m.
func (b *kernelBuilder) opNode(nd *Node, op *ir.Op, m ir.ViewChain) error {
	a := op.Attrs
	switch {
	case op == b.k.Dot:
		if len(m) != 0 || b.p.Size != op.Result().Type.Size() {
			return unsupported("the product is read through an index map")
		}
		nd.Kind = NodeDot
	case op.Code == ir.Constant:
		nd.Kind, nd.Data, nd.View = NodeConst, a.Literal("value").Data, m
	case op.Code == ir.Iota:
		// The values along dim, converted like eval does, read through a
		// view that ignores the other dims.
		shape, dim := ir.Shape(a.Ints("shape")), a.Int("dim")
		vec, err := eval.EvalOp(&ir.Op{Code: ir.Iota, Attrs: ir.Attrs{"dtype": a.DType("dtype"), "shape": []int{shape[dim]}, "dim": 0}}, nil)
		if err != nil {
			return err
		}
		st := make([]int, len(shape))
		st[dim] = 1
		nd.Kind, nd.Data, nd.Iota, nd.View = NodeConst, vec[0].Data, true, m.Then(ir.NewStridedView(shape, st, 0))
	case op.Info().Elementwise:
		nd.Kind, nd.Code, nd.Attrs = NodeOp, op.Code, op.Attrs
		nd.Invariant = true
		for _, x := range op.Args {
			c, err := b.node(x, m)
			if err != nil {
				return err
			}
			nd.Args = append(nd.Args, c)
			nd.Invariant = nd.Invariant && b.p.Nodes[c].Invariant
		}
	default:
		return unsupported(fmt.Sprintf("%v inside a fused group", op.Code))
	}
	return nil
}

// argKernel is the kernel of fop, the one-op group of an arg_max or
// arg_min: an input group whose Reduce of that code reads operand 0.
func argKernel(fop *ir.Op) *Kernel {
	x, v := fop.Args[0], fop.Regions[0].Results[0]
	p := &KernelProgram{Size: x.Type.Size(), Nodes: []Node{{Kind: NodeLeaf, DType: x.Type.DType, Operand: 0}}}
	p.Reduces = []Reduce{reduceOf(v, 0, 0)}
	return &Kernel{Op: fop, Mode: KernelInput, Programs: []*KernelProgram{p}, ElemOnly: []bool{true}}
}
