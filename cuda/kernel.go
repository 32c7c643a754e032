package cuda

import (
	"fmt"
	"strings"

	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// GenerateKernel returns the kernel of a fused group of the executable
// plan (a passes.Kernel; the operands and results are the fusion op's).
// Per program it has a loop entry computing the program's results, each
// node rendered once per index: leaves and constants read through their
// views (viewIndex), elementwise nodes by the op table's lowering
// (elementwise), indexed nodes by their index rule (indexed); and one
// reduction entry per Reduce (arg_max and arg_min included), over the
// layout the plan states. An output fusion's first entry, marked Product, computes the
// dot_general into the buffer of result DotResult, where the epilogue reads
// it in place; a backend that computes the product by cuBLASLt skips that
// entry. A KernelUnsupported group has no kernel.
func GenerateKernel(pk *passes.Kernel) (*Kernel, error) {
	if pk == nil || pk.Op == nil || len(pk.Op.Regions) != 1 {
		return nil, fmt.Errorf("cuda: GenerateKernel: no fused group")
	}
	if pk.Mode == passes.KernelUnsupported {
		return nil, fmt.Errorf("cuda: the plan does not describe the fused group: %s", pk.Why)
	}
	rg := pk.Op.Regions[0]
	s := newShared(valueTypes(rg.Params), valueTypes(rg.Results))
	s.k = pk
	if pk.Mode == passes.KernelOutput {
		if err := s.product(); err != nil {
			return nil, err
		}
	}
	for _, p := range pk.Programs {
		if err := s.program(p); err != nil {
			return nil, err
		}
	}
	kind := pk.Mode.String()
	return s.assemble("fusion_"+kind, fmt.Sprintf("fused %s group of %d ops", kind, len(rg.Ops)), nil)
}

// product adds the Product entry: the dot_general of operands DotArgs,
// computed per element into result DotResult.
func (s *shared) product() error {
	k := s.k
	d := k.Dot.Result()
	g := newGen(s, "    ")
	x, err := g.dot(k.Dot, k.DotArgs[0], k.DotArgs[1], "i")
	if err != nil {
		return err
	}
	body := gridLoop(g.b.String() + fmt.Sprintf("    %s = %s;\n", s.productAt("i"), store(d.Type.DType, x)))
	s.add(Entry{Kind: LaunchLoop, N: int64(d.Type.Size()), Writes: []int{k.DotResult}, Product: true}, body)
	return nil
}

// productAt is element at of the product in the buffer of result
// DotResult, whose elements are the product's dtype whatever the result's.
func (s *shared) productAt(at string) string {
	dt := s.k.Dot.Result().Type.DType
	if s.resultTypes[s.k.DotResult].DType == dt {
		return fmt.Sprintf("out%d[%s]", s.k.DotResult, at)
	}
	ct, _ := CType(dt)
	return fmt.Sprintf("((%s*)out%d)[%s]", ct, s.k.DotResult, at)
}

// program adds the entries of one program: a loop computing its results,
// and a reduction per Reduce.
func (s *shared) program(p *passes.KernelProgram) error {
	if len(p.Results) > 0 {
		g := newGen(s, "    ")
		g.prog = p
		var stores strings.Builder
		var writes []int
		for _, r := range p.Results {
			if p.Nodes[r.Node].Kind == passes.NodeDot && r.Result == s.k.DotResult {
				continue // the product is already in its buffer
			}
			x, err := g.node(r.Node, "i")
			if err != nil {
				return err
			}
			fmt.Fprintf(&stores, "    out%d[i] = %s;\n", r.Result, store(s.resultTypes[r.Result].DType, x))
			writes = append(writes, r.Result)
		}
		if len(writes) > 0 {
			s.add(Entry{Kind: LaunchLoop, N: int64(p.Size), Writes: writes}, gridLoop(g.b.String()+stores.String()))
		}
	}
	for _, r := range p.Reduces {
		if r.Outputs == 0 {
			continue
		}
		rd := reduction{code: r.Code, in: p.Nodes[r.Node].DType, out: r.DType, ri: r.Result, node: r.Node, prog: p}
		rd.kept, rd.red, rd.nOut, rd.r = splitReduced(r.Out.Shape, func(d int) bool { return r.Out.Strides[d] == 0 })
		if rd.nOut != int64(r.Outputs) || rd.r != int64(r.PerOutput) {
			return fmt.Errorf("cuda: reduction into result %d: layout %v does not give %d outputs of %d", r.Result, r.Out, r.Outputs, r.PerOutput)
		}
		if err := s.reduce(rd); err != nil {
			return err
		}
	}
	return nil
}

// node returns a C expression (in its compute type) for node n of the
// scope's program at iteration index at; an invariant node is computed at
// index 0, once per scope.
func (g *gen) node(n int, at string) (string, error) {
	nd := &g.prog.Nodes[n]
	if nd.Invariant {
		at = "0"
	}
	return g.named(fmt.Sprintf("n%d@%s", n, at), nd.DType, func() (string, error) {
		switch nd.Kind {
		case passes.NodeLeaf:
			return g.param(nd.Operand, nd.DType, g.viewed(nd.View, at)), nil
		case passes.NodeConst:
			return constAt(nd, g.viewed(nd.View, at))
		case passes.NodeDot:
			return load(nd.DType, g.productAt(at)), nil
		case passes.NodeIndexed:
			return g.indexed(nd, g.viewed(nd.View, at))
		case passes.NodeOp:
			args := make([]string, len(nd.Args))
			for i, a := range nd.Args {
				var err error
				if args[i], err = g.node(a, at); err != nil {
					return "", err
				}
			}
			return elementwise(nd.Code, g.prog.Nodes[nd.Args[0]].DType, nd.DType, args)
		}
		return "", fmt.Errorf("cuda: node %d of kind %d", n, nd.Kind)
	})
}

// constAt is element idx of a constant node's data: a literal when the
// data is one element, idx converted to the dtype when the data is the
// vector of an iota (Node.Iota).
func constAt(nd *passes.Node, idx string) (string, error) {
	switch {
	case nd.Iota:
		return iotaAt(nd.DType, idx), nil
	case len(nd.Data) == nd.DType.Size():
		return literalAt(&ir.Literal{Type: ir.TypeOf(nd.DType), Data: nd.Data}, 0), nil
	}
	return "", fmt.Errorf("cuda: a constant of %d elements inside a fused group", len(nd.Data)/max(nd.DType.Size(), 1))
}

// indexed is a NodeIndexed node at element at of its rule's iteration
// space: the pieces' guards and operand indices rendered from the rule
// (ir.IndexRule), every piece's operand read (at index 0 where its guard
// fails) and the first piece whose guard holds chosen.
func (g *gen) indexed(nd *passes.Node, at string) (string, error) {
	r := nd.Index
	cs := coords(at, r.Shape)
	expr := ""
	for pi := len(r.Pieces) - 1; pi >= 0; pi-- {
		pc := r.Pieces[pi]
		var conds, terms []string
		last := pi == len(r.Pieces)-1 // it gives every element it is tried for: no conditions
		for d, dim := range pc.Dims {
			if dim.Stride == 0 && (last || dim.Size < 0) {
				continue // its position is neither tested nor read
			}
			t := g.position(nd, dim, cs[d])
			if dim.Size >= 0 && !last {
				c := fmt.Sprintf("%s >= 0 && %s / %dLL < %dLL", t, t, dim.Step, dim.Size)
				if dim.Step > 1 {
					c += fmt.Sprintf(" && %s %% %dLL == 0", t, dim.Step)
				}
				conds = append(conds, c)
			}
			switch {
			case dim.Stride == 0:
			case dim.Step > 1:
				terms = append(terms, fmt.Sprintf("(%s / %dLL) * %dLL", t, dim.Step, dim.Stride))
			default:
				terms = append(terms, fmt.Sprintf("%s * %dLL", t, dim.Stride))
			}
		}
		idx := "0LL"
		if len(terms) > 0 {
			idx = strings.Join(terms, " + ")
		}
		guarded := len(conds) > 0
		in := ""
		if guarded {
			in = g.index("(" + strings.Join(conds, ") && (") + ")")
			idx = fmt.Sprintf("(%s ? %s : 0LL)", in, idx)
		}
		v, err := g.operand(nd.Operands[pc.Operand], g.index(idx))
		if err != nil {
			return "", err
		}
		if guarded {
			v = fmt.Sprintf("(%s ? %s : %s)", in, v, expr)
		}
		expr = v
	}
	if expr == "" {
		return "0", nil // no pieces: the result is empty
	}
	return expr, nil
}

// position is the C expression of dimension dim's position at coordinate
// c (IndexDim): c − Lo ± the start read from its operand, clamped.
func (g *gen) position(nd *passes.Node, dim ir.IndexDim, c string) string {
	var t []string
	if dim.Coord {
		t = append(t, c)
	}
	if dim.Lo != 0 {
		t = append(t, fmt.Sprintf("%dLL", -dim.Lo))
	}
	if s := dim.Start; s != nil {
		at := "0"
		if s.AtCoord {
			at = g.index(c)
		}
		v, _ := g.operand(nd.Operands[s.Operand], at)
		st := g.index(fmt.Sprintf("((long long)%s < 0 ? 0LL : ((long long)%s > %dLL ? %dLL : (long long)%s))", v, v, s.Max, s.Max, v))
		if s.Neg {
			st = "-" + st
		}
		t = append(t, st)
	}
	if len(t) == 0 {
		return "0LL"
	}
	return g.index(strings.Join(t, " + "))
}

// operand is element at of fusion operand k, in its compute type, read
// once per scope.
func (g *gen) operand(k int, at string) (string, error) {
	dt := g.paramTypes[k].DType
	return g.named(fmt.Sprintf("p%d@%s", k, at), dt, func() (string, error) { return g.param(k, dt, at), nil })
}
