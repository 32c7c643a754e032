package cpuexec

import (
	"fmt"
	"math"
	"sync"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// How a fused group runs.
//
// The analysis of the group (its nodes, views, reductions and product) is
// the plan's (passes.Kernel, made by passes.LowerKernel); this file renders
// it for the CPU.
//
// The fused region is compiled into block programs, one per iteration-space
// size: each computes the group's results of that many elements (and the
// reductions over operands of that many elements), a block of 1024 flat
// indices at a time, blocks split across cores. A program is a DAG of nodes;
// each node holds the values of one region value at the block's positions,
// read through an index map (iteration flat index → the value's flat index):
//
//   - elementwise ops are nodes over their operands' nodes under the same map,
//     computed by eval.Elementwise (eval's own kernels, hence its numerics;
//     f32 arithmetic and transcendental ops call the very vmath kernel eval
//     runs, eval.F32Kernels, without the dispatch) into a small per-worker
//     scratch block, or straight into the output; when every per-block op
//     of a program is such an f32 op, they form one vmath program. Where
//     the CPU allows (AVX-512, or AVX2 and FMA, on linux/amd64,
//     FERRY_CPU_JIT not 0) that program is compiled to machine code
//     (vmath.CompileChain, fusedjit.go): one loop over 16-lane
//     (AVX2: 8-lane) vectors with
//     every value in registers while needed, the same instructions per op
//     as the vmath kernels, hence the same values, except that a multiply read only by one
//     add or subtract becomes one fused multiply-add (vmath.SetContract;
//     FERRY_CPU_FMA=0 keeps them apart); results of 8 MiB and more
//     are stored with non-temporal stores (no read of the destination
//     lines): by the compiled chain straight into the output
//     (Chain.RunNT), or from scratch by vmath.StoreNT when it is not
//     compiled;
//   - reshape and device_put keep the flat index (no node);
//     broadcast_in_dim, transpose and slice compose a view onto the
//     ir.ViewChain of their operand (no node, no data movement);
//   - parameters and constants are leaves: read in place when the chain is
//     the identity, gathered through it otherwise; iota is a constant vector
//     (eval's iota of one dimension) read through a view;
//   - nodes whose map is constant (scalar broadcasts) are computed once per
//     worker, not per block.
//
// Strategies follow the region's content (the kind attribute is only a
// hint):
//
//   - loop: elementwise and index-map ops only;
//   - input (reductions): reductions are the roots; their program iterates
//     over the operand's flat indices and accumulates block by block in
//     eval's order and precision (f32/f16/bf16 sums and products in float64,
//     others in their own type). When the reduced axes are the trailing ones
//     (rows), each output is a running scalar and outputs are split across
//     cores; otherwise one accumulator per output is kept and the operand is
//     read in row-major order on one core. Other results (full-size
//     producers, values of the reduction's output size) are computed by the
//     programs of their sizes;
//   - output: the dot_general is evaluated by eval's kernel straight into the
//     buffer of a result of its size, then the elementwise epilogue runs over
//     it block by block (that result is stored after its block is computed).
//
// A loop group may write a result over an operand it reads only element for
// element (passes.Options.FusionInPlace): every node of a block is then
// computed before any block of a result is stored.
//
// Anything else (other ops inside the group, ops after a reduction,
// unaligned or otherwise overlapping buffers at run time) falls back to
// eval's EvalOpInto on the fusion op: correct, with full-size temporaries on
// the Go heap.

// blockSize is the number of elements per block.
const blockSize = 1024

// minPerWorker is the smallest number of elements worth a goroutine.
const minPerWorker = 1 << 15

type fuseMode uint8

const (
	modeFallback fuseMode = iota
	modeLoop
	modeInput
	modeOutput
)

type nodeKind uint8

const (
	nLeaf nodeKind = iota // a fusion operand or constant data read through a map
	nOp                   // an elementwise op
	nDot                  // output mode: the product, read in place from output 0
)

// fnode is one node of a fused block program.
type fnode struct {
	kind nodeKind
	dt   ir.DType
	esz  int
	// leaves
	src    int    // fusion operand index, or -1 for data
	data   []byte // constant data when src < 0
	m      ir.ViewChain
	direct bool // identity map: the block is a view of the source
	// ops
	code  ir.Code
	attrs ir.Attrs
	args  []int
	// f32 unary and binary ops: the vector kernel eval.Elementwise would
	// run (eval.F32Kernels), called directly.
	f1 func(dst, x []float32)
	f2 func(dst, a, b []float32)
	// f3: a select of f32 values by a compare's f32 mask (see
	// maskCompares), vmath.Select.
	f3 func(dst, mask, a, b []float32)
	// boolMask nodes turn their bool operand into an f32 mask for a
	// select of the code (see maskCompares); pre nodes (the per-block
	// ones, and the bool nodes they read) are computed before the code.
	boolMask, pre bool
	// vop is the opcode of the op in a vmath program (0: none).
	vop int32
	// invariant nodes have the same value at every position: computed once
	// per worker.
	invariant bool
	out       int // output written straight by this node, or -1
	period    int // spanPeriod (leaves read the same run over and over), or 0
}

// freduce is one reduction of an input-mode group.
type freduce struct {
	code   ir.Code
	node   int // the operand's node
	res    int // the fusion result it produces
	dt     ir.DType
	prefix bool           // reduced axes are the trailing ones: outputs are runs of r
	r      int            // elements per output
	nout   int            // outputs
	ostage ir.StridedView // !prefix: operand flat index → output flat index
	cols   bool           // the reduced axes lead: operand flat index i → output i mod nout
}

// blockProg computes the results of a group that share one iteration space
// size n (and the reductions over operands of n elements).
type blockProg struct {
	k       *fusedKernel
	n       int
	nodes   []fnode
	results [][2]int // (fusion result, node) pairs
	reduces []freduce
	prefix  bool // all reductions are prefix with the same r: split by outputs
	// code computes every per-block op node when all of them have a vmath
	// opcode (compiled to a chain; vmath.RunProgram where it is not).
	code []vmath.Instr
	// chain is code compiled to machine code (nil: interpreted).
	chain *vmath.Chain
	// spans: the chain may run over whole spans of contiguous elements
	// instead of blocks (see spansOK).
	spans bool
	pool  sync.Pool
}

// fusedKernel is the compiled form of one fusion op.
type fusedKernel struct {
	op      *ir.Op
	mode    fuseMode
	why     string // why the group falls back to eval
	progs   []*blockProg
	dot     *ir.Op
	dotK    *eval.Kernel
	dotArgs [2]int // fusion operands of the product
	dotRes  int    // the result whose buffer holds the product
	// elemOnly[p]: operand p is read only element for element (through
	// identity maps, in a program over its own size), so a loop group may
	// write a result over it.
	elemOnly []bool
}

// compileFusion renders the plan's kernel of a fusion op as block
// programs; groups the plan does not describe, and the kernels of single
// ops that block programs do not render (index rules, arg reductions: the
// plan makes them for op steps only, which the executor runs by the
// oracle's kernel of the op), get modeFallback.
func compileFusion(pk *passes.Kernel) (*fusedKernel, error) {
	k := &fusedKernel{op: pk.Op}
	if why := unrendered(pk); why != "" {
		k.mode, k.why = modeFallback, why
		return k, nil
	}
	switch pk.Mode {
	case passes.KernelUnsupported:
		k.mode, k.why = modeFallback, pk.Why
		return k, nil
	case passes.KernelLoop:
		k.mode = modeLoop
	case passes.KernelInput:
		k.mode = modeInput
	case passes.KernelOutput:
		k.mode = modeOutput
		k.dot, k.dotArgs, k.dotRes = pk.Dot, pk.DotArgs, pk.DotResult
		dk, err := eval.Prepare(pk.Dot)
		if err != nil {
			return nil, err
		}
		k.dotK = dk
	}
	k.elemOnly = pk.ElemOnly
	for _, pp := range pk.Programs {
		p := &blockProg{k: k, n: pp.Size}
		for _, r := range pp.Results {
			p.results = append(p.results, [2]int{r.Result, r.Node})
		}
		for _, r := range pp.Reduces {
			p.reduces = append(p.reduces, freduce{code: r.Code, node: r.Node, res: r.Result, dt: r.DType,
				prefix: r.Trailing, r: r.PerOutput, nout: r.Outputs, ostage: r.Out, cols: r.Leading})
		}
		p.nodes = make([]fnode, len(pp.Nodes))
		for i := range pp.Nodes {
			p.nodes[i] = renderNode(&pp.Nodes[i])
		}
		k.progs = append(k.progs, p)
		p.finish()
		p.pool.New = func() any { return p.newWorker() }
	}
	return k, nil
}

// unrendered says why block programs do not render pk's nodes or
// reductions, or returns "" when they do.
func unrendered(pk *passes.Kernel) string {
	for _, p := range pk.Programs {
		for _, nd := range p.Nodes {
			if nd.Kind == passes.NodeIndexed {
				return "an index rule"
			}
		}
		for _, r := range p.Reduces {
			if !passes.IsReduce(r.Code) {
				return fmt.Sprintf("a %v reduction", r.Code)
			}
		}
	}
	return ""
}

// renderNode is the block-program node of a plan node: the f32 vector
// kernels and vmath opcode of an elementwise op, and whether a leaf reads
// its source in place.
func renderNode(pn *passes.Node) fnode {
	nd := fnode{dt: pn.DType, esz: pn.DType.Size(), src: -1, out: -1, invariant: pn.Invariant}
	switch pn.Kind {
	case passes.NodeLeaf, passes.NodeConst:
		nd.kind, nd.src, nd.data, nd.m = nLeaf, pn.Operand, pn.Data, pn.View
		nd.direct = len(pn.View) == 0
	case passes.NodeDot:
		nd.kind = nDot
	case passes.NodeOp:
		nd.kind, nd.code, nd.attrs, nd.args = nOp, pn.Code, pn.Attrs, pn.Args
		if nd.dt == ir.Float32 {
			u, bin := eval.F32Kernels(pn.Code)
			switch cl := pn.Code.Info().Class; {
			case cl == ir.ClassUnary && len(nd.args) == 1:
				nd.f1 = u
			case cl == ir.ClassBinary && len(nd.args) == 2:
				nd.f2 = bin
			}
			if nd.f1 != nil || nd.f2 != nil {
				nd.vop = eval.VMathOp(pn.Code) // the op table's Lowering.VMath
			}
		}
	}
	return nd
}

// finish prepares the CPU-only parts of a program: the split by outputs,
// masks, the vmath code and its compiled chain, the results written straight
// by their nodes, periodic leaves, and spans.
func (p *blockProg) finish() {
	k := p.k
	p.prefix = len(p.reduces) > 0
	for _, fr := range p.reduces {
		p.prefix = p.prefix && fr.prefix && fr.r == p.reduces[0].r
	}
	maskCompares(p)
	p.code = progCode(p)
	p.chain = compileChain(p)
	// Results computed by an op that runs per block write straight into
	// the output (first use only), except the one holding the product,
	// which is stored after the whole block is computed.
	for _, rn := range p.results {
		nd := &p.nodes[rn[1]]
		if nd.kind == nOp && !nd.invariant && nd.out < 0 && !(k.mode == modeOutput && rn[0] == k.dotRes) {
			nd.out = rn[0]
		}
	}
	for i := range p.nodes {
		p.nodes[i].period = spanPeriod(&p.nodes[i])
	}
	p.spans = p.spansOK()
}

// spansOK reports whether the compiled chain can run straight over the
// operands' and results' memory, a span of consecutive elements at a time,
// with no block copies: every value is f32; every leaf is invariant, read
// in place (direct) or read through one stage whose innermost stride is 1
// (a span ends where that run does: a slice is read in place; a row
// broadcast along leading axes is periodic, see spanPeriod); every result
// is an op node written straight to its output; the chain never spills (the
// values it does not store then need no memory of span size); and there are
// no reductions.
func (p *blockProg) spansOK() bool {
	if p.chain == nil || !p.chain.SpillFree() || len(p.reduces) > 0 {
		return false
	}
	for i := range p.nodes {
		nd := &p.nodes[i]
		if nd.esz != 4 {
			return false
		}
		if nd.kind != nLeaf || nd.invariant || nd.direct {
			continue
		}
		if len(nd.m) != 1 || len(nd.m[0].Shape) == 0 || nd.m[0].Strides[len(nd.m[0].Strides)-1] != 1 {
			return false
		}
	}
	for _, rn := range p.results {
		if nd := &p.nodes[rn[1]]; nd.kind != nOp || nd.invariant || nd.out != rn[0] {
			return false
		}
	}
	return true
}

// spanTarget is the span length (elements) the repeated copies of periodic
// leaves allow: long enough that the per-span cost (the span loop and the
// chain's call, ~60 ns) is small, short enough that the copies stay in a
// core's L2. It equals the most one call of a chain computes. At 4096
// (16 KiB copies) the span loop and Chain.run took 4.7 % of gelu(x*w+b)'s
// samples (perf, 2 threads), at 16384 under 2 %, and
// BenchmarkFusedGeluBandwidth ran 61.7 → 65.5 GB/s (medians of 8,
// alternating; 64 KiB copies did no better).
const spanTarget = 16384

// spanPeriod (kept as fnode.period) returns P when leaf nd reads the same
// P consecutive elements over and over (a stage of shape [R, P] and strides
// [0, 1]: a row broadcast along the leading axes), 0 otherwise.
func spanPeriod(nd *fnode) int {
	if nd.kind != nLeaf || nd.invariant || nd.direct || len(nd.m) != 1 {
		return 0
	}
	s := &nd.m[0]
	if len(s.Shape) != 2 || s.Strides[0] != 0 || s.Strides[1] != 1 || s.Shape[1] >= spanTarget {
		return 0
	}
	return s.Shape[1]
}

// viewRun returns the operand index of flat index i and the number of
// consecutive indices from i that read consecutive operand elements (the
// rest of i's innermost run; the view's innermost stride is 1).
func viewRun(s *ir.StridedView, i int) (j, n int) {
	inner := s.Shape[len(s.Shape)-1]
	return s.At(i), inner - i%inner
}

// progCode returns the vmath program of the per-block op nodes, in node
// order (operands first), or nil when one of them has no opcode. An operand
// computed by the instruction just before is read from registers; a value
// read only that way, and neither a result nor reduced, is not stored.
func progCode(p *blockProg) []vmath.Instr {
	nodes := p.nodes
	uses := make([]int, len(nodes))
	for _, nd := range nodes {
		for _, a := range nd.args {
			uses[a]++
		}
	}
	for _, rn := range p.results {
		uses[rn[1]] += 2
	}
	for _, fr := range p.reduces {
		uses[fr.node] += 2
	}
	var code []vmath.Instr
	for i, nd := range nodes {
		if nd.kind != nOp || nd.invariant || nd.pre {
			continue
		}
		if nd.vop == 0 {
			return nil
		}
		in := vmath.Instr{Op: nd.vop, Dst: int32(i), A: int32(nd.args[0]), B: int32(nd.args[0])}
		if len(nd.args) >= 2 {
			in.B = int32(nd.args[1])
		}
		if len(nd.args) == 3 {
			in.C = int32(nd.args[2])
		}
		if k := len(code) - 1; k >= 0 {
			prev := code[k].Dst
			if in.A == prev {
				in.Op |= vmath.AccA
			}
			if in.B == prev {
				in.Op |= vmath.AccB
			}
			if in.Op&(vmath.AccA|vmath.AccB) != 0 && (uses[prev] == 1 || in.A == prev && in.B == prev && uses[prev] == 2) {
				code[k].Op |= vmath.NoStore
			}
		}
		code = append(code, in)
	}
	return code
}

// maskCompares lets the f32 compares of a program read only as the
// condition of f32 selects of the same program, and those selects, join its
// vmath code (compare opcodes and vmath.OpSelect): such a compare's bool
// becomes an f32 mask in its block (every bit set for true), which never
// leaves the program. A select's condition computed otherwise (a bool
// operand, a compare of integers such as a causal mask's iotas, an invariant
// bool) becomes a mask too, by a node (fnode.boolMask) computed before the
// code with the bool nodes it reads (fnode.pre), provided none of them reads
// a value the code computes. It changes nothing unless then every per-block
// op node is covered; otherwise the program stays off the code as before.
func maskCompares(p *blockProg) {
	nodes := p.nodes
	f32 := func(i int) bool { return nodes[i].dt == ir.Float32 }
	perBlock := func(i int) bool { return nodes[i].kind == nOp && !nodes[i].invariant }
	isSelect := func(i int) bool { return perBlock(i) && nodes[i].code == ir.Select && f32(i) && nodes[i].vop == 0 }
	cmp := func(i int) int32 {
		nd := &nodes[i]
		if !perBlock(i) || len(nd.args) != 2 || !f32(nd.args[0]) || !f32(nd.args[1]) {
			return 0
		}
		return vmath.CompareByName(nd.code.Info().Name)
	}
	kept := make([]bool, len(nodes))
	for _, rn := range p.results {
		kept[rn[1]] = true
	}
	for _, fr := range p.reduces {
		kept[fr.node] = true
	}
	// A compare is a mask when every read of it is a select's condition.
	mask := make([]bool, len(nodes))
	for i := range nodes {
		mask[i] = cmp(i) != 0 && !kept[i]
	}
	for i := range nodes {
		for j, a := range nodes[i].args {
			if !isSelect(i) || j != 0 {
				mask[a] = false
			}
		}
	}
	// pre marks the per-block nodes a select's other condition reads: no
	// f32 value (the code's) among them.
	pre := make([]bool, len(nodes))
	var mark func(i int) bool
	mark = func(i int) bool {
		if !perBlock(i) || pre[i] {
			return true
		}
		if f32(i) {
			return false
		}
		pre[i] = true
		for _, a := range nodes[i].args {
			if !mark(a) {
				return false
			}
		}
		return true
	}
	conds := map[int]int{} // bool node → its mask node
	var extra []fnode
	for i := range nodes {
		if !isSelect(i) || mask[nodes[i].args[0]] {
			continue
		}
		c := nodes[i].args[0]
		if _, ok := conds[c]; !ok {
			if !mark(c) {
				return
			}
			conds[c] = len(nodes) + len(extra)
			extra = append(extra, fnode{kind: nOp, dt: ir.Float32, esz: 4, src: -1, out: -1, args: []int{c},
				boolMask: true, pre: !nodes[c].invariant, invariant: nodes[c].invariant})
		}
	}
	for i := range nodes {
		if perBlock(i) && nodes[i].vop == 0 && !mask[i] && !isSelect(i) && !pre[i] {
			return // an op no code covers
		}
	}
	for i := range nodes {
		nd := &nodes[i]
		switch {
		case mask[i]:
			nd.vop, nd.esz = cmp(i), 4
			nd.f2 = vmath.CompareKernel(nd.vop)
		case pre[i]:
			nd.pre = true
		case isSelect(i):
			if m, ok := conds[nd.args[0]]; ok {
				nd.args = append([]int{m}, nd.args[1:]...)
			}
			nd.vop, nd.f3 = vmath.OpSelect, vmath.Select
		}
	}
	p.nodes = append(p.nodes, extra...)
}

// boolMasks writes the f32 mask of every bool of src to dst (every bit set
// for true, zero for false).
func boolMasks(dst []float32, src []byte) {
	for i, b := range src[:len(dst)] {
		dst[i] = 0
		if b != 0 {
			dst[i] = math.Float32frombits(0xffffffff)
		}
	}
}
