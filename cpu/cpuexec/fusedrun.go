package cpuexec

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ferryml/ferry/cpu/internal/parallel"
	"github.com/ferryml/ferry/cpu/vmath"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
)

// worker is the per-goroutine state of a block program: a scratch block per
// node that needs one, the literal views the kernels see, and the
// reductions' accumulators. Workers are pooled per program.
type worker struct {
	p      *blockProg
	blocks [][]byte
	lits   []ir.Literal
	args   [][]*ir.Literal
	idx    []int
	red    []reduceState
	ptrs   []*float32 // the block's values, for vmath.RunProgram
	// spans (blockProg.spans): each periodic leaf's elements repeated, and
	// each view leaf's operand index at the current span.
	reps    [][]byte
	spanOff []int
	// per run
	in, out []*ir.Literal
	inPlace bool // store results only after the whole block is computed
	spanOK  bool // spans may run (blockProg.spans, not in place, reps filled)
	nt      bool // results stored with non-temporal stores
	ntChain bool // (with nt) the compiled chain stores them in place
}

func (p *blockProg) newWorker() any {
	w := &worker{p: p, blocks: make([][]byte, len(p.nodes)), lits: make([]ir.Literal, len(p.nodes)),
		args: make([][]*ir.Literal, len(p.nodes)), idx: make([]int, blockSize), ptrs: make([]*float32, len(p.nodes)),
		spanOff: make([]int, len(p.nodes))}
	result := make([]bool, len(p.nodes))
	for _, rn := range p.results {
		result[rn[1]] = true
	}
	for i := range p.nodes {
		nd := &p.nodes[i]
		w.lits[i].Type = ir.Type{DType: nd.dt}
		// A leaf read straight from its operand that is also a result needs
		// a block too: in place, it is copied there before any result is
		// stored over the operand (block).
		if nd.invariant || nd.kind == nLeaf && (!nd.direct || result[i]) || nd.kind == nOp {
			// Blocks start at different offsets modulo 4 KiB, so that the
			// same chunk of every value does not fall in the same L1 sets.
			off := i * 320 % 4096
			w.blocks[i] = alignedBytes(off + blockSize*nd.esz)[off:]
		}
		for _, a := range nd.args {
			w.args[i] = append(w.args[i], &w.lits[a])
		}
	}
	for _, fr := range p.reduces {
		w.red = append(w.red, newReduceState(fr.dt, fr.code, fr.prefix))
	}
	return w
}

// alignedBytes allocates n bytes starting on an 8-byte boundary.
func alignedBytes(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n)
}

func isAligned(b []byte, n int) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(n) == 0
}

// buffersOK reports whether the block programs may run over these buffers
// (every buffer aligned for its dtype and of the right size, outputs sharing
// memory with no operand except, in a loop or input group, exactly the memory
// of an operand read element for element — an input group's reductions then
// read no value of that operand, as passes' buffer assignment makes sure)
// and whether some output is in place.
func (k *fusedKernel) buffersOK(args, outs []*ir.Literal) (ok, inPlace bool) {
	for _, a := range args {
		if !isAligned(a.Data, a.Type.DType.Size()) || int64(len(a.Data)) != a.Type.Bytes() {
			return false, false
		}
	}
	for i, o := range outs {
		if !isAligned(o.Data, o.Type.DType.Size()) || int64(len(o.Data)) != k.op.Results[i].Type.Bytes() {
			return false, false
		}
		for j, a := range args {
			if !eval.Overlaps(o.Data, a.Data) {
				continue
			}
			if k.mode != modeLoop && k.mode != modeInput || !k.elemOnly[j] || len(o.Data) != len(a.Data) || &o.Data[0] != &a.Data[0] {
				return false, false
			}
			inPlace = true
		}
	}
	return true, inPlace
}

// run executes the group over its operand and result buffers.
func (k *fusedKernel) run(args, outs []*ir.Literal) error {
	if k.mode == modeFallback {
		return eval.EvalOpInto(k.op, args, outs)
	}
	ok, inPlace := k.buffersOK(args, outs)
	if !ok {
		return eval.EvalOpInto(k.op, args, outs)
	}
	if k.mode == modeOutput {
		d := k.dot.Result()
		prod := &ir.Literal{Type: d.Type, Data: outs[k.dotRes].Data}
		if err := k.dotK.Into([]*ir.Literal{args[k.dotArgs[0]], args[k.dotArgs[1]]}, []*ir.Literal{prod}); err != nil {
			return err
		}
	}
	for _, p := range k.progs {
		if err := p.run(args, outs, inPlace); err != nil {
			return err
		}
	}
	return nil
}

// run executes one block program.
func (p *blockProg) run(args, outs []*ir.Literal, inPlace bool) error {
	if len(p.results) == 0 && len(p.reduces) == 0 {
		return nil
	}
	if p.k.mode == modeOutput && len(p.results) == 1 && p.nodes[p.results[0][1]].kind == nDot && p.results[0][0] == p.k.dotRes {
		return nil // the product alone: already in place
	}
	if len(p.reduces) == 0 {
		return p.parallel(args, outs, p.n, 1, inPlace)
	}
	if p.n == 0 {
		w := p.pool.Get().(*worker)
		defer p.pool.Put(w)
		for i, fr := range p.reduces {
			w.red[i].fill(outs[fr.res].Data, fr.nout)
		}
		return nil
	}
	if p.prefix {
		r := p.reduces[0].r
		return p.parallel(args, outs, p.n/r, r, inPlace)
	}
	w := p.pool.Get().(*worker)
	defer p.pool.Put(w)
	for i, fr := range p.reduces {
		w.red[i].begin(fr.nout)
	}
	if err := w.runRange(args, outs, 0, p.n, inPlace); err != nil {
		return err
	}
	for i, fr := range p.reduces {
		if !fr.prefix {
			w.red[i].finish(outs[fr.res].Data)
		}
	}
	return nil
}

// parallel splits units (groups of per elements of the iteration space)
// across goroutines. inPlace: some output is the memory of an operand.
func (p *blockProg) parallel(args, outs []*ir.Literal, units, per int, inPlace bool) error {
	n := units * per
	workers := min(runtime.GOMAXPROCS(0), (n+minPerWorker-1)/minPerWorker, units)
	if workers <= 1 {
		w := p.pool.Get().(*worker)
		defer p.pool.Put(w)
		return w.runRange(args, outs, 0, n, inPlace)
	}
	// Units go out in chunks from a shared counter, several chunks per
	// worker, to the calling goroutine and the pool's workers
	// (cpu/internal/parallel): a worker whose thread wakes late (150 µs on the
	// project machine, a sixth of a 1 ms call) then takes fewer chunks
	// instead of finishing last.
	chunk := (units + workers*chunksPerWorker - 1) / (workers * chunksPerWorker)
	chunk = max(chunk, (minChunk+per-1)/per)
	if per == 1 {
		chunk = (chunk + blockSize - 1) / blockSize * blockSize
	}
	nchunks := (units + chunk - 1) / chunk
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	work := func(int) {
		w := p.pool.Get().(*worker)
		defer p.pool.Put(w)
		begun := false
		defer func() {
			if begun {
				w.end()
			}
		}()
		for {
			c := int(next.Add(1)) - 1
			if c >= nchunks {
				return
			}
			lo, hi := c*chunk, min(units, (c+1)*chunk)
			var err error
			if !begun { // set up on the first chunk this goroutine takes
				begun = true
				err = w.begin(args, outs, inPlace)
			}
			if err == nil {
				err = w.compute(lo*per, hi*per)
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				next.Store(int64(nchunks)) // the others stop at their next chunk
				return
			}
		}
	}
	parallel.Run(workers, work)
	return first
}

// chunksPerWorker is how many chunks parallel cuts per worker, and
// minChunk the fewest elements of one.
const (
	chunksPerWorker = 8
	minChunk        = 4 * blockSize
)

// runRange computes [lo, hi) of the iteration space: begin, compute, end.
func (w *worker) runRange(args, outs []*ir.Literal, lo, hi int, inPlace bool) error {
	if lo >= hi {
		return nil
	}
	defer w.end()
	if err := w.begin(args, outs, inPlace); err != nil {
		return err
	}
	return w.compute(lo, hi)
}

// begin sets the worker up for one call over args and outs: the store mode,
// the invariant nodes' blocks and, for spans, the periodic leaves' repeated
// copies. Every range the worker computes in the call shares them.
func (w *worker) begin(args, outs []*ir.Literal, inPlace bool) error {
	p := w.p
	w.in, w.out, w.inPlace = args, outs, inPlace
	w.nt = false
	for _, rn := range p.results {
		if len(outs[rn[0]].Data) >= ntMinBytes {
			w.nt = true
		}
	}
	w.ntChain = w.nt && !inPlace && p.chain != nil
	for i := range p.nodes {
		nd := &p.nodes[i]
		if !nd.invariant {
			continue
		}
		blk := w.blocks[i]
		w.lits[i].Data = blk
		if nd.kind == nLeaf {
			j := nd.m.At(0)
			src := w.source(nd)
			fillElem(blk, src[j*nd.esz:(j+1)*nd.esz])
			continue
		}
		if nd.boolMask {
			boolMasks(ir.ViewBytes[float32](blk), w.args[i][0].Data[:len(blk)/4])
			continue
		}
		if err := eval.Elementwise(nd.code, nd.attrs, w.args[i], &w.lits[i]); err != nil {
			return err
		}
	}
	w.spanOK = p.spans && !inPlace && w.fillReps()
	return nil
}

// end closes a call: its results' non-temporal stores are fenced and the
// operands let go.
func (w *worker) end() {
	w.in, w.out = nil, nil
	if w.nt {
		vmath.Fence()
	}
}

// compute computes [lo, hi) in spans where it can, else by blocks.
func (w *worker) compute(lo, hi int) error {
	if w.spanOK && w.spans(lo, hi) {
		return nil
	}
	for b := lo; b < hi; b += blockSize {
		if err := w.block(b, min(hi, b+blockSize)); err != nil {
			return err
		}
	}
	return nil
}

// fillReps copies each periodic leaf's P elements into its per-worker
// buffer, repeated up to spanTarget, and reports whether every source held
// them.
func (w *worker) fillReps() bool {
	p := w.p
	if w.reps == nil {
		w.reps = make([][]byte, len(p.nodes))
	}
	for i := range p.nodes {
		nd := &p.nodes[i]
		per := nd.period
		if per == 0 {
			continue
		}
		src := w.source(nd)
		off := nd.m[0].Offset
		if 4*(off+per) > len(src) {
			return false
		}
		n := spanTarget / per * per
		if cap(w.reps[i]) < 4*n {
			w.reps[i] = alignedBytes(4 * n)
		}
		rep := w.reps[i][:4*n]
		for k := 0; k < n; k += per {
			copy(rep[4*k:], src[4*off:4*(off+per)])
		}
		w.reps[i] = rep
	}
	return true
}

// spans runs the compiled chain over [lo, hi) straight on the operands' and
// results' memory (p.spans), one span of indices at a time: a span ends
// where a leaf read through a view ends its contiguous run. A periodic
// leaf (fnode.period P) is read from the worker's copy of its P elements
// repeated up to spanTarget (fillReps), so that its spans are not cut at
// every period. Values the chain neither reads from memory nor stores
// (invariant nodes, read as uniforms, and op nodes that are not results)
// point at their blocks. It returns false when the generated code may not
// run now or some memory is shorter than a span needs; the caller then
// computes the whole range by blocks (spans already written are written
// again, with the same values).
func (w *worker) spans(lo, hi int) bool {
	p := w.p
	defer clear(w.ptrs)
	for lo < hi {
		end := hi
		for i := range p.nodes {
			nd := &p.nodes[i]
			if nd.kind != nLeaf || nd.invariant || nd.direct {
				continue
			}
			var j, n int
			if per := nd.period; per > 0 {
				j, n = lo%per, len(w.reps[i])/4-lo%per
			} else {
				j, n = viewRun(&nd.m[0], lo)
			}
			w.spanOff[i] = j
			end = min(end, lo+n)
		}
		cnt := end - lo
		for i := range p.nodes {
			nd := &p.nodes[i]
			var b []byte
			off, need := lo, cnt
			switch {
			case nd.invariant || nd.kind == nOp && nd.out < 0:
				b, off, need = w.blocks[i], 0, 1
			case nd.kind == nLeaf && nd.direct:
				b = w.source(nd)
			case nd.kind == nLeaf && nd.period > 0:
				b, off = w.reps[i], w.spanOff[i]
			case nd.kind == nLeaf:
				b, off = w.source(nd), w.spanOff[i]
			case nd.kind == nDot:
				b = w.out[p.k.dotRes].Data
			default:
				b = w.out[nd.out].Data
			}
			if 4*(off+need) > len(b) {
				return false
			}
			w.ptrs[i] = &ir.ViewBytes[float32](b[4*off:])[0]
		}
		if !w.runChain(cnt) {
			return false
		}
		lo = end
	}
	return true
}

// runChain runs the compiled chain over cnt elements of w.ptrs (results
// stored non-temporally when ntChain) and reports whether it ran.
func (w *worker) runChain(cnt int) bool {
	switch c := w.p.chain; {
	case c == nil:
		return false
	case w.ntChain:
		return c.RunNT(w.ptrs, cnt)
	default:
		return c.Run(w.ptrs, cnt)
	}
}

// ntMinBytes is the size from which a program's results are stored with
// non-temporal stores (far beyond the caches of a core: the result would not
// be read from the cache anyway, and the stores skip reading its lines).
const ntMinBytes = 8 << 20

// source returns the bytes a leaf reads.
func (w *worker) source(nd *fnode) []byte {
	if nd.src >= 0 {
		return w.in[nd.src].Data
	}
	return nd.data
}

// block computes every node over iteration indices [lo, hi), writes the
// results and feeds the reductions.
func (w *worker) block(lo, hi int) error {
	p := w.p
	cnt := hi - lo
	for i := range p.nodes {
		nd := &p.nodes[i]
		e := nd.esz
		if nd.invariant {
			w.lits[i].Data = w.blocks[i][:cnt*e]
			continue
		}
		switch nd.kind {
		case nLeaf:
			src := w.source(nd)
			if nd.direct {
				w.lits[i].Data = src[lo*e : hi*e]
				if w.inPlace && w.blocks[i] != nil {
					// A result: the results stored before it may
					// overwrite its operand's memory.
					w.lits[i].Data = w.blocks[i][:cnt*e]
					copyMem(w.lits[i].Data, src[lo*e:hi*e])
				}
				continue
			}
			dst := w.blocks[i][:cnt*e]
			gather(e, dst, src, nd.m, lo, w.idx[:cnt])
			w.lits[i].Data = dst
		case nDot:
			w.lits[i].Data = w.out[p.k.dotRes].Data[lo*e : hi*e]
		case nOp:
			if nd.out >= 0 && w.direct() {
				w.lits[i].Data = w.out[nd.out].Data[lo*e : hi*e]
			} else {
				w.lits[i].Data = w.blocks[i][:cnt*e]
			}
			if nd.boolMask {
				boolMasks(ir.ViewBytes[float32](w.lits[i].Data), w.args[i][0].Data[:cnt])
				continue
			}
			if p.code != nil && !nd.pre {
				continue // computed below
			}
			if nd.f2 != nil {
				a := w.args[i]
				nd.f2(ir.ViewBytes[float32](w.lits[i].Data), ir.ViewBytes[float32](a[0].Data), ir.ViewBytes[float32](a[1].Data))
				continue
			}
			if nd.f1 != nil {
				nd.f1(ir.ViewBytes[float32](w.lits[i].Data), ir.ViewBytes[float32](w.args[i][0].Data))
				continue
			}
			if err := eval.Elementwise(nd.code, nd.attrs, w.args[i], &w.lits[i]); err != nil {
				return err
			}
		}
	}
	if p.code != nil {
		w.runCode(cnt)
	}
	for _, rn := range p.results {
		r, n := rn[0], rn[1]
		if p.nodes[n].out == r && w.direct() {
			continue
		}
		e := p.nodes[n].esz
		if w.nt {
			vmath.StoreNT(w.out[r].Data[lo*e:hi*e], w.lits[n].Data)
			continue
		}
		copyMem(w.out[r].Data[lo*e:hi*e], w.lits[n].Data)
	}
	for i := range p.reduces {
		fr := &p.reduces[i]
		vals := w.lits[fr.node].Data
		if p.prefix || fr.prefix {
			// A trailing reduction in a group run by one worker in order
			// (other reductions need the general path) still goes by runs.
			w.red[i].prefix(vals, lo, hi, fr.r, w.out[fr.res].Data)
		} else if fr.cols {
			w.red[i].columns(vals, lo%fr.nout)
		} else {
			fr.ostage.Indices(lo, w.idx[:cnt])
			w.red[i].general(vals, w.idx[:cnt])
		}
	}
	return nil
}

// direct reports whether op nodes that are results are computed straight
// into the outputs' memory (not in blocks copied there afterwards).
func (w *worker) direct() bool { return !w.inPlace && (!w.nt || w.ntChain) }

// runCode computes the block's op nodes (all f32 with a vmath opcode) with
// the compiled chain when there is one, else with vmath.RunProgram (which
// compiles the program itself where it can) and the elements it leaves
// with the nodes' kernels, which compute the same values.
func (w *worker) runCode(cnt int) {
	if cnt == 0 {
		return
	}
	p := w.p
	for i := range p.nodes {
		w.ptrs[i] = nil
		if p.nodes[i].esz == 4 && len(w.lits[i].Data) >= 4*cnt {
			w.ptrs[i] = &ir.ViewBytes[float32](w.lits[i].Data)[0]
		}
	}
	if w.runChain(cnt) {
		clear(w.ptrs)
		return
	}
	m := vmath.RunProgram(p.code, w.ptrs, cnt)
	clear(w.ptrs)
	if m == cnt {
		return
	}
	for _, in := range p.code {
		nd := &p.nodes[in.Dst]
		dst := ir.ViewBytes[float32](w.lits[in.Dst].Data)[m:cnt]
		a := ir.ViewBytes[float32](w.lits[in.A].Data)[m:cnt]
		switch {
		case nd.f3 != nil:
			nd.f3(dst, a, ir.ViewBytes[float32](w.lits[in.B].Data)[m:cnt], ir.ViewBytes[float32](w.lits[in.C].Data)[m:cnt])
		case nd.f2 != nil:
			nd.f2(dst, a, ir.ViewBytes[float32](w.lits[in.B].Data)[m:cnt])
		default:
			nd.f1(dst, a)
		}
	}
}

// ---- gathers ----

// gather writes src[m(i)] for i in [lo, lo+len(idx)) to dst (elements of e
// bytes); idx is scratch.
func gather(e int, dst, src []byte, m ir.ViewChain, lo int, idx []int) {
	if len(m) == 1 {
		switch e {
		case 1:
			gatherStage(dst, src, &m[0], lo, len(idx))
		case 2:
			gatherStage(ir.ViewBytes[ir.F16](dst), ir.ViewBytes[ir.F16](src), &m[0], lo, len(idx))
		case 4:
			gatherStage(ir.ViewBytes[uint32](dst), ir.ViewBytes[uint32](src), &m[0], lo, len(idx))
		case 8:
			gatherStage(ir.ViewBytes[int64](dst), ir.ViewBytes[int64](src), &m[0], lo, len(idx))
		}
		return
	}
	m[0].Indices(lo, idx)
	for _, s := range m[1:] {
		for t, j := range idx {
			idx[t] = s.At(j)
		}
	}
	switch e {
	case 1:
		gatherIdx(dst, src, idx)
	case 2:
		gatherIdx(ir.ViewBytes[ir.F16](dst), ir.ViewBytes[ir.F16](src), idx)
	case 4:
		gatherIdx(ir.ViewBytes[uint32](dst), ir.ViewBytes[uint32](src), idx)
	case 8:
		gatherIdx(ir.ViewBytes[int64](dst), ir.ViewBytes[int64](src), idx)
	}
}

func gatherIdx[T any](dst, src []T, idx []int) {
	dst = dst[:len(idx)]
	for t, j := range idx {
		dst[t] = src[j]
	}
}

// gatherStage copies src[s(i)] for i in [lo, lo+cnt) to dst, a run of the
// innermost dimension at a time.
func gatherStage[T any](dst, src []T, s *ir.StridedView, lo, cnt int) {
	w := s.Runs(lo, cnt)
	for w.Next() {
		out, j := dst[w.K:w.K+w.N], w.J
		switch w.Stride {
		case 1:
			copy(out, src[j:j+w.N])
		case 0:
			fillRun(out, src[j])
		default:
			for t := range out {
				out[t] = src[j+t*w.Stride]
			}
		}
	}
}

// fillRun sets every element of out to v: eight stores a step, then
// copies of what is written, doubling (a broadcast read, the commonest
// gather of fused groups, is a run of one value).
func fillRun[T any](out []T, v T) {
	n := min(len(out), 8)
	for t := range out[:n] {
		out[t] = v
	}
	for n < len(out) {
		n += copy(out[n:], out[:n])
	}
}

// fillElem sets every element of dst to elem.
func fillElem(dst, elem []byte) {
	switch len(elem) {
	case 1:
		fillT(dst, elem[0])
	case 2:
		fillT(ir.ViewBytes[ir.F16](dst), ir.ViewBytes[ir.F16](elem)[0])
	case 4:
		fillT(ir.ViewBytes[uint32](dst), ir.ViewBytes[uint32](elem)[0])
	case 8:
		fillT(ir.ViewBytes[int64](dst), ir.ViewBytes[int64](elem)[0])
	}
}

func fillT[T any](dst []T, v T) {
	for i := range dst {
		dst[i] = v
	}
}

// ---- reductions ----

// reduceState accumulates one reduction of an input-mode group in eval's
// order and precision.
type reduceState interface {
	// prefix accumulates the operand values of flat indices [lo, hi) into
	// outputs of r elements each, carrying the running output across calls,
	// and stores each output when its last element has been added.
	prefix(vals []byte, lo, hi, r int, out []byte)
	// begin starts one accumulator per output; general adds vals[t] into
	// accumulator oidx[t]; finish stores them.
	begin(nout int)
	general(vals []byte, oidx []int)
	// columns is general for a column reduction: vals[t] goes into
	// accumulator (o0+t) mod nout.
	columns(vals []byte, o0 int)
	finish(out []byte)
	// fill stores the reduction of nothing into nout outputs.
	fill(out []byte, nout int)
}

type num interface {
	uint8 | int32 | int64 | uint32 | float32 | float64
}

// reducer accumulates values of type T (f16/bf16 widened to float32) in A.
type reducer[T, A num] struct {
	code ir.Code
	init A
	cur  A
	// lanes: an f32, f16 or bf16 sum over trailing axes adds each
	// output's run in eval.LaneSum's order (ls carries the current
	// output's lanes; T is float32).
	lanes bool
	ls    eval.LaneSum
	arr   []A
	half  func(src []byte, dst []float32) // widens f16/bf16 operands
	wide  []float32
	store func(out []byte, o int, a A)
}

func (r *reducer[T, A]) vals(b []byte) []T {
	if r.half == nil {
		return ir.ViewBytes[T](b)
	}
	n := len(b) / 2
	if cap(r.wide) < n {
		r.wide = make([]float32, max(n, blockSize))
	}
	w := r.wide[:n]
	r.half(b, w)
	return any(w).([]T)
}

// add folds vals into acc: sums and products in order, max and min with the
// first NaN winning (as eval).
func (r *reducer[T, A]) add(acc A, vals []T) A {
	switch r.code {
	case ir.ReduceSum:
		for _, v := range vals {
			acc += A(v)
		}
	case ir.ReduceProd:
		for _, v := range vals {
			acc *= A(v)
		}
	case ir.ReduceMax:
		if acc != acc {
			return acc
		}
		for _, v := range vals {
			a := A(v)
			if a != a {
				return a
			}
			if a > acc {
				acc = a
			}
		}
	case ir.ReduceMin:
		if acc != acc {
			return acc
		}
		for _, v := range vals {
			a := A(v)
			if a != a {
				return a
			}
			if a < acc {
				acc = a
			}
		}
	}
	return acc
}

func (r *reducer[T, A]) prefix(b []byte, lo, hi, rr int, out []byte) {
	v := r.vals(b)
	if r.lanes {
		r.prefixLanes(v, lo, hi, rr, out)
		return
	}
	for pos := lo; pos < hi; {
		o := pos / rr
		start := o * rr
		end := min(hi, start+rr)
		if pos == start {
			r.cur = r.init
		}
		r.cur = r.add(r.cur, v[pos-lo:end-lo])
		if end == start+rr {
			r.store(out, o, r.cur)
		}
		pos = end
	}
}

// prefixLanes is prefix for a float sum in eval.LaneSum's order.
func (r *reducer[T, A]) prefixLanes(v []T, lo, hi, rr int, out []byte) {
	for pos := lo; pos < hi; {
		o := pos / rr
		start := o * rr
		end := min(hi, start+rr)
		if pos == start {
			r.ls = eval.LaneSum{}
		}
		r.ls.AddF32(any(v[pos-lo : end-lo]).([]float32))
		if end == start+rr {
			r.store(out, o, A(r.ls.Sum()))
		}
		pos = end
	}
}

func (r *reducer[T, A]) begin(nout int) {
	if cap(r.arr) < nout {
		r.arr = make([]A, nout)
	}
	r.arr = r.arr[:nout]
	for i := range r.arr {
		r.arr[i] = r.init
	}
}

func (r *reducer[T, A]) general(b []byte, oidx []int) {
	v := r.vals(b)[:len(oidx)]
	arr := r.arr
	switch r.code {
	case ir.ReduceSum:
		for t, o := range oidx {
			arr[o] += A(v[t])
		}
	case ir.ReduceProd:
		for t, o := range oidx {
			arr[o] *= A(v[t])
		}
	default:
		for t, o := range oidx {
			arr[o] = r.add(arr[o], v[t:t+1])
		}
	}
}

func (r *reducer[T, A]) columns(b []byte, o0 int) {
	v := r.vals(b)
	arr := r.arr
	for len(v) > 0 {
		run := min(len(v), len(arr)-o0)
		a, x := arr[o0:o0+run], v[:run]
		switch r.code {
		case ir.ReduceSum:
			for t, xv := range x {
				a[t] += A(xv)
			}
		case ir.ReduceProd:
			for t, xv := range x {
				a[t] *= A(xv)
			}
		default:
			for t := range x {
				a[t] = r.add(a[t], x[t:t+1])
			}
		}
		v, o0 = v[run:], 0
	}
}

func (r *reducer[T, A]) finish(out []byte) {
	for o, a := range r.arr {
		r.store(out, o, a)
	}
	if cap(r.arr) > 1<<16 {
		r.arr = nil // do not keep large accumulators in the pool
	}
}

func (r *reducer[T, A]) fill(out []byte, nout int) {
	for o := 0; o < nout; o++ {
		r.store(out, o, r.init)
	}
}

func storeAs[D, A num](out []byte, o int, a A) { ir.ViewBytes[D](out)[o] = D(a) }

func widenF16(src []byte, dst []float32) {
	for i, h := range ir.ViewBytes[ir.F16](src)[:len(dst)] {
		dst[i] = h.Float32()
	}
}

func widenBF16(src []byte, dst []float32) {
	for i, h := range ir.ViewBytes[ir.BF16](src)[:len(dst)] {
		dst[i] = h.Float32()
	}
}

// intReducer accumulates an integer reduction in its own type (wrapping).
func intReducer[T uint8 | int32 | int64 | uint32](code ir.Code, lo, hi T) reduceState {
	r := &reducer[T, T]{code: code, store: storeAs[T, T]}
	switch code {
	case ir.ReduceProd:
		r.init = 1
	case ir.ReduceMax:
		r.init = lo
	case ir.ReduceMin:
		r.init = hi
	}
	return r
}

// floatInit is the start of a float reduction: 0, 1, -inf or +inf.
func floatInit(code ir.Code) float64 {
	switch code {
	case ir.ReduceProd:
		return 1
	case ir.ReduceMax:
		return math.Inf(-1)
	case ir.ReduceMin:
		return math.Inf(1)
	}
	return 0
}

// newReduceState returns the accumulator of a reduction of dtype dt;
// trailing says the reduced axes are the trailing ones (f32, f16 and bf16
// sums then add in eval.LaneSum's order, as eval does).
func newReduceState(dt ir.DType, code ir.Code, trailing bool) reduceState {
	wide := code == ir.ReduceSum || code == ir.ReduceProd
	lanes := code == ir.ReduceSum && trailing
	init := floatInit(code)
	switch dt {
	case ir.Float64:
		return &reducer[float64, float64]{code: code, init: init, store: storeAs[float64, float64]}
	case ir.Float32:
		if wide {
			return &reducer[float32, float64]{code: code, init: init, lanes: lanes, store: storeAs[float32, float64]}
		}
		return &reducer[float32, float32]{code: code, init: float32(init), store: storeAs[float32, float32]}
	case ir.Float16, ir.BFloat16:
		half := widenF16
		if dt == ir.BFloat16 {
			half = widenBF16
		}
		if wide {
			st := func(out []byte, o int, a float64) { ir.ViewBytes[ir.F16](out)[o] = ir.F16FromFloat64(a) }
			if dt == ir.BFloat16 {
				st = func(out []byte, o int, a float64) { ir.ViewBytes[ir.BF16](out)[o] = ir.BF16FromFloat64(a) }
			}
			return &reducer[float32, float64]{code: code, init: init, lanes: lanes, half: half, store: st}
		}
		st := func(out []byte, o int, a float32) { ir.ViewBytes[ir.F16](out)[o] = ir.F16FromFloat32(a) }
		if dt == ir.BFloat16 {
			st = func(out []byte, o int, a float32) { ir.ViewBytes[ir.BF16](out)[o] = ir.BF16FromFloat32(a) }
		}
		return &reducer[float32, float32]{code: code, init: float32(init), half: half, store: st}
	case ir.Uint8:
		return intReducer[uint8](code, 0, math.MaxUint8)
	case ir.Int32:
		return intReducer[int32](code, math.MinInt32, math.MaxInt32)
	case ir.Int64:
		return intReducer[int64](code, math.MinInt64, math.MaxInt64)
	case ir.Uint32:
		return intReducer[uint32](code, 0, math.MaxUint32)
	}
	return &reducer[float64, float64]{code: code, store: func([]byte, int, float64) {}}
}
