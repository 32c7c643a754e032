package cuda

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// GenerateKernel returns the kernel of a fused group of the executable
// plan (a passes.Kernel; the operands and results are the fusion op's).
// Per program it has a loop entry computing the program's results, each
// node rendered once per index: leaves and constants read through their
// views (viewIndex), elementwise nodes by the op table's lowering
// (elementwise); and one reduction entry per Reduce, over the layout the
// plan states. An output fusion's first entry, marked Product, computes the
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
		rd := reduction{code: r.Code, in: p.Nodes[r.Node].DType, out: r.DType, ri: r.Result, prog: p,
			read: func(g *gen, at string) (string, error) { return g.node(r.Node, at) }}
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
// vector of an iota (0, 1, ... converted as iota converts them).
func constAt(nd *passes.Node, idx string) (string, error) {
	n := len(nd.Data) / max(nd.DType.Size(), 1)
	if n == 1 {
		return literalAt(&ir.Literal{Type: ir.TypeOf(nd.DType), Data: nd.Data}, 0), nil
	}
	iota, err := eval.EvalOp(&ir.Op{Code: ir.Iota, Attrs: ir.Attrs{"dtype": nd.DType, "shape": []int{n}, "dim": 0}}, nil)
	if err == nil && bytes.Equal(iota[0].Data, nd.Data) {
		return iotaAt(nd.DType, idx), nil
	}
	return "", fmt.Errorf("cuda: a constant of %d elements inside a fused group", n)
}
