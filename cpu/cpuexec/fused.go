package cpuexec

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
)

// How a fused group runs.
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
//     broadcast_in_dim, transpose and slice compose a stage onto the map of
//     their operand (no node, no data movement);
//   - parameters and constants are leaves: read in place when the map is the
//     identity, gathered through the map otherwise; iota is a constant vector
//     (eval's iota of one dimension) read through a map;
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

// stage maps a flat index i of a value (of row-major shape `shape`, with
// size-1 dimensions dropped and contiguous dimensions merged) to the flat
// index off + Σ idx(i)[d]*st[d] of its operand.
type stage struct {
	shape []int
	st    []int
	off   int
}

// newStage simplifies a stage and reports whether it is the identity.
func newStage(shape, st []int, off int) (stage, bool) {
	var s stage
	s.off = off
	for d, n := range shape {
		if n == 1 {
			continue
		}
		if k := len(s.shape) - 1; k >= 0 && s.st[k] == st[d]*n {
			s.shape[k] *= n
			s.st[k] = st[d]
			continue
		}
		s.shape = append(s.shape, n)
		s.st = append(s.st, st[d])
	}
	return s, s.identity()
}

// identity reports whether the stage maps every index to itself.
func (s *stage) identity() bool {
	return s.off == 0 && (len(s.shape) == 0 || len(s.shape) == 1 && s.st[0] == 1)
}

// constant reports whether the stage maps every index to off.
func (s *stage) constant() bool {
	for _, x := range s.st {
		if x != 0 {
			return false
		}
	}
	return true
}

// apply maps one flat index.
func (s *stage) apply(i int) int {
	j := s.off
	for d := len(s.shape) - 1; d >= 0; d-- {
		n := s.shape[d]
		j += (i % n) * s.st[d]
		i /= n
	}
	return j
}

// indices writes the mapped index of every i in [lo, lo+len(out)).
func (s *stage) indices(lo int, out []int) {
	r := len(s.shape)
	if r == 0 {
		for k := range out {
			out[k] = s.off
		}
		return
	}
	var idxBuf [8]int
	idx := idxBuf[:0]
	if r > len(idxBuf) {
		idx = make([]int, 0, r)
	}
	idx = idx[:r]
	j := s.off
	rem := lo
	for d := r - 1; d >= 0; d-- {
		idx[d] = rem % s.shape[d]
		rem /= s.shape[d]
		j += idx[d] * s.st[d]
	}
	inner, ist := s.shape[r-1], s.st[r-1]
	k := 0
	for k < len(out) {
		run := min(inner-idx[r-1], len(out)-k)
		for t := 0; t < run; t++ {
			out[k+t] = j + t*ist
		}
		k += run
		j += run * ist
		idx[r-1] += run
		for d := r - 1; d > 0 && idx[d] == s.shape[d]; d-- {
			j -= idx[d] * s.st[d]
			idx[d] = 0
			idx[d-1]++
			j += s.st[d-1]
		}
	}
}

// imap is a chain of stages applied in order (empty: the identity).
type imap []stage

func (m imap) then(s stage, ident bool) imap {
	if ident {
		return m
	}
	if k := len(m) - 1; k >= 0 {
		if c, ok := compose(m[k], s); ok {
			if c.identity() {
				return slices.Clip(m[:k]) // the two stages cancel
			}
			return append(slices.Clip(m[:k]), c)
		}
	}
	return append(slices.Clip(m), s)
}

// constant reports whether m maps every index to the same place.
func (m imap) constant() bool { return len(m) > 0 && m[0].constant() }

// apply maps one flat index through every stage.
func (m imap) apply(i int) int {
	for k := range m {
		i = m[k].apply(i)
	}
	return i
}

func (m imap) key() string {
	var b strings.Builder
	for _, s := range m {
		b.WriteString(strconv.Itoa(s.off))
		for d := range s.shape {
			b.WriteByte(',')
			b.WriteString(strconv.Itoa(s.shape[d]))
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(s.st[d]))
		}
		b.WriteByte(';')
	}
	return b.String()
}

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
	m      imap
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
	prefix bool  // reduced axes are the trailing ones: outputs are runs of r
	r      int   // elements per output
	nout   int   // outputs
	ostage stage // !prefix: operand flat index → output flat index
	cols   bool  // the reduced axes lead: operand flat index i → output i mod nout
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
	b     *builder
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

// unsupported is the reason a group falls back.
type unsupported string

func (u unsupported) Error() string { return string(u) }

// compileFusion builds the block programs of a fusion op; groups it does not
// handle get modeFallback.
func compileFusion(op *ir.Op) (*fusedKernel, error) {
	if len(op.Regions) != 1 || op.Regions[0] == nil {
		return nil, fmt.Errorf("fusion needs one region")
	}
	rg := op.Regions[0]
	if len(rg.Params) != len(op.Args) || len(rg.Results) != len(op.Results) {
		return nil, fmt.Errorf("fusion region does not match the op")
	}
	k := &fusedKernel{op: op}
	if err := k.build(); err != nil {
		if u, ok := err.(unsupported); ok {
			*k = fusedKernel{op: op, mode: modeFallback, why: string(u)}
			return k, nil
		}
		return nil, err
	}
	for _, p := range k.progs {
		p.b = nil
		p.pool.New = func() any { return p.newWorker() }
	}
	return k, nil
}

// builder memoises nodes by value and map.
type builder struct {
	p      *blockProg
	params map[*ir.Value]int
	memo   map[string]int
	ids    map[*ir.Value]int
}

func (b *builder) key(v *ir.Value, m imap) string {
	id, ok := b.ids[v]
	if !ok {
		id = len(b.ids)
		b.ids[v] = id
	}
	return strconv.Itoa(id) + "|" + m.key()
}

func isReduce(c ir.Code) bool {
	return c == ir.ReduceSum || c == ir.ReduceMax || c == ir.ReduceMin || c == ir.ReduceProd
}

// prog returns the program over n elements, making it on first use.
func (k *fusedKernel) prog(n int) *blockProg {
	for _, p := range k.progs {
		if p.n == n {
			return p
		}
	}
	p := &blockProg{k: k, n: n}
	p.b = &builder{p: p, params: map[*ir.Value]int{}, memo: map[string]int{}, ids: map[*ir.Value]int{}}
	for i, prm := range k.op.Regions[0].Params {
		p.b.params[prm] = i
	}
	k.progs = append(k.progs, p)
	return p
}

func (k *fusedKernel) build() error {
	rg := k.op.Regions[0]
	params := map[*ir.Value]int{}
	for i, p := range rg.Params {
		params[p] = i
	}
	var reduces []*ir.Op
	for _, op := range rg.Ops {
		switch {
		case op.Code == ir.DotGeneral:
			if k.dot != nil {
				return unsupported("more than one dot_general")
			}
			k.dot = op
		case isReduce(op.Code):
			reduces = append(reduces, op)
		case op.Info().Elementwise, op.Code == ir.BroadcastInDim, op.Code == ir.Reshape, op.Code == ir.Transpose,
			op.Code == ir.Slice, op.Code == ir.Iota, op.Code == ir.Constant, op.Code == ir.DevicePut:
		default:
			return unsupported(fmt.Sprintf("%v inside a fused group", op.Code))
		}
	}
	if len(rg.Results) == 0 {
		return unsupported("no results")
	}
	red := map[*ir.Value]bool{}
	for _, op := range reduces {
		red[op.Result()] = true
	}
	for _, op := range rg.Ops {
		for _, a := range op.Args {
			if red[a] {
				return unsupported("ops after a reduction")
			}
		}
	}
	k.mode = modeLoop
	switch {
	case k.dot != nil:
		if len(reduces) > 0 {
			return unsupported("dot_general and reductions in one group")
		}
		k.mode = modeOutput
		d := k.dot.Result()
		k.dotRes = -1
		for i, v := range rg.Results {
			if v.Type.Size() == d.Type.Size() && v.Type.DType.Size() == d.Type.DType.Size() {
				k.dotRes = i
				break
			}
		}
		if k.dotRes < 0 {
			return unsupported("no output fusion result fits the product's buffer")
		}
		dk, err := eval.Prepare(k.dot)
		if err != nil {
			return err
		}
		k.dotK = dk
		for j, a := range k.dot.Args {
			p, ok := params[a]
			if !ok {
				return unsupported("dot_general operand computed inside the group")
			}
			k.dotArgs[j] = p
		}
		k.prog(d.Type.Size())
	case len(reduces) > 0:
		k.mode = modeInput
	}
	done := map[*ir.Value]bool{}
	for i, v := range rg.Results {
		if red[v] {
			if done[v] {
				return unsupported("a reduction returned twice")
			}
			done[v] = true
			shape := v.Op.Args[0].Type.Shape
			p := k.prog(shape.Size())
			n, err := p.b.node(v.Op.Args[0], nil)
			if err != nil {
				return err
			}
			fr := freduce{code: v.Op.Code, node: n, res: i, dt: v.Type.DType, nout: v.Type.Size()}
			fr.prefix, fr.r, fr.ostage = reduceLayout(shape, v.Op.Attrs.Ints("axes"))
			fr.cols = !fr.prefix && leadingReduce(shape, v.Op.Attrs.Ints("axes"))
			p.reduces = append(p.reduces, fr)
			continue
		}
		p := k.prog(v.Type.Size())
		n, err := p.b.node(v, nil)
		if err != nil {
			return err
		}
		p.results = append(p.results, [2]int{i, n})
	}
	for _, op := range reduces {
		if !done[op.Result()] {
			return unsupported("a reduction that is not a result")
		}
	}
	k.elemOnly = make([]bool, len(rg.Params))
	for i := range k.elemOnly {
		k.elemOnly[i] = true
	}
	if k.dot != nil {
		k.elemOnly[k.dotArgs[0]], k.elemOnly[k.dotArgs[1]] = false, false
	}
	for _, p := range k.progs {
		p.prefix = len(p.reduces) > 0
		for _, fr := range p.reduces {
			p.prefix = p.prefix && fr.prefix && fr.r == p.reduces[0].r
		}
		maskCompares(p)
		p.code = progCode(p)
		p.chain = compileChain(p)
		for _, nd := range p.nodes {
			if nd.kind == nLeaf && nd.src >= 0 && (!nd.direct || rg.Params[nd.src].Type.Size() != p.n) {
				k.elemOnly[nd.src] = false
			}
		}
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
	return nil
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
		if len(nd.m) != 1 || len(nd.m[0].shape) == 0 || nd.m[0].st[len(nd.m[0].st)-1] != 1 {
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
	if len(s.shape) != 2 || s.st[0] != 0 || s.st[1] != 1 || s.shape[1] >= spanTarget {
		return 0
	}
	return s.shape[1]
}

// run returns the operand index of flat index i and the number of
// consecutive indices from i that read consecutive operand elements (the
// rest of i's innermost run; the stage's innermost stride is 1).
func (s *stage) run(i int) (j, n int) {
	inner := s.shape[len(s.shape)-1]
	return s.apply(i), inner - i%inner
}

// leadingReduce reports whether the reduced axes of shape come before
// every kept axis (size-1 axes aside): operand flat index i then goes into
// output i mod (outputs), a column sum.
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

// reduceLayout describes reducing axes of shape: whether the reduced axes
// are the trailing ones (ignoring size-1 dims), how many elements go into
// each output, and the map from operand to output flat index.
func reduceLayout(shape ir.Shape, axes []int) (prefix bool, r int, ost stage) {
	r = 1
	ostr := make([]int, len(shape))
	outShape := ir.RemoveAxes(shape, axes)
	outStr := outShape.Strides()
	k := 0
	for d, n := range shape {
		if slices.Contains(axes, d) {
			r *= n
			continue
		}
		ostr[d] = outStr[k]
		k++
	}
	ost, _ = newStage(shape, ostr, 0)
	return eval.TrailingReduce(shape, axes), r, ost
}

// node returns the node of value v read through map m (from iteration flat
// index to v's flat index), building it and its operands on first use.
func (b *builder) node(v *ir.Value, m imap) (int, error) {
	key := b.key(v, m)
	if n, ok := b.memo[key]; ok {
		return n, nil
	}
	k, p := b.p.k, b.p
	nd := fnode{dt: v.Type.DType, esz: v.Type.DType.Size(), src: -1, out: -1}
	if prm, ok := b.params[v]; ok {
		nd.kind, nd.src, nd.m = nLeaf, prm, m
	} else if v.Op == nil {
		return 0, fmt.Errorf("%v is neither a parameter nor defined in the group", v)
	} else {
		op := v.Op
		a := op.Attrs
		switch {
		case op == k.dot:
			if len(m) != 0 || p.n != op.Result().Type.Size() {
				return 0, unsupported("the product is read through an index map")
			}
			nd.kind = nDot
		case op.Code == ir.Reshape || op.Code == ir.DevicePut:
			return b.alias(key, op.Args[0], m)
		case op.Code == ir.BroadcastInDim:
			in := op.Args[0].Type.Shape
			ist := in.Strides()
			st := make([]int, v.Type.Rank())
			for i, d := range a.Ints("dims") {
				if in[i] != 1 {
					st[d] = ist[i]
				}
			}
			return b.alias(key, op.Args[0], m.then(newStage(v.Type.Shape, st, 0)))
		case op.Code == ir.Transpose:
			ist := op.Args[0].Type.Shape.Strides()
			st := make([]int, v.Type.Rank())
			for i, p := range a.Ints("perm") {
				st[i] = ist[p]
			}
			return b.alias(key, op.Args[0], m.then(newStage(v.Type.Shape, st, 0)))
		case op.Code == ir.Slice:
			ist := op.Args[0].Type.Shape.Strides()
			st := make([]int, v.Type.Rank())
			off := 0
			start, strides := a.Ints("start"), a.Ints("strides")
			for i := range st {
				st[i] = ist[i] * strides[i]
				off += start[i] * ist[i]
			}
			return b.alias(key, op.Args[0], m.then(newStage(v.Type.Shape, st, off)))
		case op.Code == ir.Constant:
			nd.kind, nd.data, nd.m = nLeaf, a.Literal("value").Data, m
		case op.Code == ir.Iota:
			// The values along dim, converted like eval does, read through a
			// map that ignores the other dims.
			shape, dim := ir.Shape(a.Ints("shape")), a.Int("dim")
			vec, err := eval.EvalOp(&ir.Op{Code: ir.Iota, Attrs: ir.Attrs{"dtype": a.DType("dtype"), "shape": []int{shape[dim]}, "dim": 0}}, nil)
			if err != nil {
				return 0, err
			}
			st := make([]int, len(shape))
			st[dim] = 1
			nd.kind, nd.data, nd.m = nLeaf, vec[0].Data, m.then(newStage(shape, st, 0))
		case op.Info().Elementwise:
			nd.kind, nd.code, nd.attrs = nOp, op.Code, op.Attrs
			nd.invariant = true
			for _, x := range op.Args {
				c, err := b.node(x, m)
				if err != nil {
					return 0, err
				}
				nd.args = append(nd.args, c)
				nd.invariant = nd.invariant && p.nodes[c].invariant
			}
			if nd.dt == ir.Float32 {
				u, bin := eval.F32Kernels(op.Code)
				switch cl := op.Info().Class; {
				case cl == ir.ClassUnary && len(nd.args) == 1:
					nd.f1 = u
				case cl == ir.ClassBinary && len(nd.args) == 2:
					nd.f2 = bin
				}
				if nd.f1 != nil || nd.f2 != nil {
					nd.vop = eval.VMathOp(op.Code) // the op table's Lowering.VMath
				}
			}
		default:
			return 0, unsupported(fmt.Sprintf("%v inside a fused group", op.Code))
		}
	}
	if nd.kind == nLeaf {
		nd.direct = len(nd.m) == 0
		nd.invariant = nd.m.constant()
	}
	p.nodes = append(p.nodes, nd)
	b.memo[key] = len(p.nodes) - 1
	return len(p.nodes) - 1, nil
}

// alias builds the node of x through m and records it under key too.
func (b *builder) alias(key string, x *ir.Value, m imap) (int, error) {
	n, err := b.node(x, m)
	if err != nil {
		return 0, err
	}
	b.memo[key] = n
	return n, nil
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
