package vmath

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	e "github.com/ferryml/ferry/cpu/internal/amd64enc"
	"github.com/ferryml/ferry/internal/settings"
)

// Run-time code generation for chains of ops.
//
// CompileChain turns a program (a list of Instr) into straight-line
// AVX-512 machine code (or AVX2 code, below): one loop over 16-lane vectors
// with a masked tail, every op's result kept in a vector register for as
// long as a later op reads it, constants (and operands the caller marks
// uniform) held in registers across the loop when registers allow. Every op
// is emitted with the instruction sequence of its row in ops (its body),
// and the package's own kernels are these chains compiled one op at a time
// (jitimpl.go), so the accuracy of the transcendental functions is that of
// the kernels. The one liberty is contraction (SetContract, on by default):
// a multiply read only by one add or subtract is computed with it by one
// fused multiply-add. With contraction off, a chain computes, bit for bit,
// what the kernels compute one after the other.
//
// AVX2 (the generator's VEX mode, where the CPU has AVX2 and FMA but no
// AVX-512): the same loop and allocator over 8-lane YMM vectors and 16
// registers, the same op bodies with AVX2 stand-ins for what has no VEX
// form: compares into vector masks and VBLENDVPS for opmask blends,
// AND/OR for VPTERNLOGD, two 8-entry VPERMPS and a blend for the 16-entry
// tables, integer exponent construction for VSCALEFPS (expCoreVEX) and
// bit manipulation for VGETMANTPS/VGETEXPPS (logReduceVEX). Its code
// computes whole vectors only; Chain.run passes the last partial vector
// through zero-padded scratch, so every element goes through the same
// instructions.
//
// Registers: the generated code uses RAX (byte offset), RCX (elements left),
// RDX (scratch), RDI (argument block), RBX, RSI and R8–R13 (operand
// pointers), Z0–Z31 and K1–K2 (Y0–Y15 in AVX2 code). It never touches
// RSP, RBP, R14 or R15 and
// pushes nothing beyond the return address of the trampoline's CALL (which
// is within the stack guard every NOSPLIT Go function may use), so it needs
// no stack frame of its own.
//
// Go runtime: the trampoline (callChain, NOSPLIT assembly) calls the code
// with the argument block in RDI. Asynchronous preemption signals that land
// in the generated code find a PC outside any Go function, which the runtime
// treats as not preemptible: it resumes the code, which returns within one
// call (a call covers at most chainMaxPerCall elements; the caller splits
// larger ranges), and the goroutine is preempted later at a safe point. The
// kernel saves and restores the vector and mask registers around the signal
// handler, so the handler does not disturb the code. The pointers in the
// argument block are kept alive by the caller's vals slice.

// chainMaxPerCall bounds the elements one call of generated code computes,
// so that it returns to Go often.
const chainMaxPerCall = 1 << 14

// ErrNoJIT is returned by CompileChain when run-time code generation is not
// available: another architecture or OS, neither AVX-512 nor AVX2 and FMA,
// the pure-Go kernels in use (FERRY_VMATH=go), or FERRY_CPU_JIT=0.
var ErrNoJIT = errors.New("vmath: run-time code generation not available")

var jitOff atomic.Bool

func init() { jitOff.Store(!settings.CPUJIT.Get()) }

// SetJIT turns run-time code generation on or off (FERRY_CPU_JIT=0 starts
// with it off) and returns the previous setting. Compiled chains refuse to
// run while it is off (Chain.Run returns false). For tests and benchmarks.
func SetJIT(on bool) bool { return !jitOff.Swap(!on) }

// JITAvailable reports whether CompileChain can compile code now: the
// AVX-512 or the AVX2 kernels are in use (see Impl) and the JIT is on.
func JITAvailable() bool {
	return jitExecOK && !jitOff.Load() && (cur == avx512Impl || cur == avx2Impl)
}

// Chain is a program compiled to machine code by CompileChain.
type Chain struct {
	code    []byte   // machine code and constant pool (before mapping)
	exec    *execMem // code
	execNT  *execMem // code with non-temporal stores of the stored values
	used    []int32  // vals indices in slot order
	uniform []bool   // by slot
	stored  []bool   // by slot: a result the code stores
	input   []bool   // by slot: an input (not computed by the code)
	lanes   int      // 16 (AVX-512, masked tail) or 8 (AVX2, whole vectors only)
	spills  int      // registers evicted while generating (for tests)
	hoisted int      // constants and uniform inputs held in registers
	unroll  int      // vectors per main-loop iteration
	fused   int      // multiplies contracted into fused multiply-adds
}

// SpillFree reports whether the code keeps every NoStore value in
// registers: it then never touches their memory, and a caller may pass any
// valid pointer for them whatever the element count.
func (c *Chain) SpillFree() bool { return c.spills == 0 }

// Fused returns the number of multiplies contracted into fused
// multiply-adds (see SetContract).
func (c *Chain) Fused() int { return c.fused }

// Size returns the bytes of machine code and constants.
func (c *Chain) Size() int { return len(c.code) }

// Code returns a copy of the machine code and constant pool (for tests and
// disassembly).
func (c *Chain) Code() []byte { return slices.Clone(c.code) }

// CompileChain compiles code (as RunProgram takes it: vals[Dst] =
// Op(vals[A], vals[B]) in order) to machine code for the kernels in use:
// AVX-512 over 16-lane vectors, or AVX2 and FMA over 8-lane vectors (see
// Impl).
// Values are SSA: every Dst is written by one instruction, after the
// instructions that compute its operands; operands not computed by code are
// inputs. nvals bounds the vals indices. uniform[i] (optional) says input i
// holds the same value in every element (only its first element is read).
// AccA and AccB are ignored (every value stays in registers while needed);
// NoStore values are not stored, but their vals memory may be used to spill
// them, so every vals index code names must point to memory at run time.
func CompileChain(code []Instr, nvals int, uniform []bool) (*Chain, error) {
	if !JITAvailable() {
		return nil, ErrNoJIT
	}
	return compileChain(code, nvals, uniform, cur == avx2Impl, !contractOff.Load())
}

// compileChain is CompileChain for AVX2 (vex) or AVX-512 code, with
// multiplies contracted into multiply-adds when fuse (see SetContract).
func compileChain(code []Instr, nvals int, uniform []bool, vex, fuse bool) (*Chain, error) {
	vals, err := checkChain(code, nvals, uniform)
	if err != nil {
		return nil, err
	}
	cc, fused := contract(code, vals, fuse)
	c, err := generateChain(cc, vals, vex)
	if err != nil {
		return nil, err
	}
	c.exec, err = mapExec(c.code)
	if err != nil {
		return nil, err
	}
	c.fused = fused
	nt, err := generateUnrolled(cc, vals, true, c.unroll, vex) // the same code but its stores
	if err != nil {
		return nil, err
	}
	c.execNT, err = mapExec(nt.code)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Run computes the chain over elements [0, n) of vals (all of them: the
// last partial vector is masked, or in AVX2 code computed in a zero-padded
// scratch vector by the same instructions) and returns true, or returns false without
// computing anything when generated code may not run now (SetJIT(false) or
// the pure-Go kernels selected): the caller then runs the program another
// way. Every vals index the code names must point to n float32 elements (one
// for uniform inputs).
func (c *Chain) Run(vals []*float32, n int) bool { return c.run(vals, n, false) }

// RunNT is Run with the stored values written by non-temporal stores (past
// the caches, without reading their lines first: for results far larger
// than the caches) when every stored value's memory starts on a 64-byte
// boundary, by ordinary stores otherwise. The caller runs Fence before the
// results are read by another goroutine.
func (c *Chain) RunNT(vals []*float32, n int) bool { return c.run(vals, n, true) }

func (c *Chain) run(vals []*float32, n int, nt bool) bool {
	if jitOff.Load() || cur == goImpl || c.exec == nil {
		return false
	}
	ex := c.exec
	if nt && c.execNT != nil {
		ex = c.execNT
		for s, v := range c.used {
			if c.stored[s] && int(v) < len(vals) && uintptrOf(vals[v])%64 != 0 {
				ex = c.exec
				break
			}
		}
	}
	if n <= 0 {
		return true
	}
	var buf [40]uint64
	args := buf[:0]
	if 1+len(c.used) > len(buf) {
		args = make([]uint64, 0, 1+len(c.used))
	}
	args = args[:1+len(c.used)]
	for _, v := range c.used {
		if int(v) >= len(vals) || vals[v] == nil {
			panic(fmt.Sprintf("vmath: chain value %d has no memory", v))
		}
	}
	whole := c.whole(n)
	for off := 0; off < whole; off += chainMaxPerCall {
		c.bodyArgs(vals, off, min(whole-off, chainMaxPerCall), args)
		ex.call(&args[0])
	}
	if whole < n {
		c.runTail(vals, whole, n-whole, args)
	}
	keepAlive(vals)
	return true
}

// tailScratch holds the zero-padded vectors of runTail (heap memory, which
// never moves while generated code holds its address).
var tailScratch = sync.Pool{New: func() any { return new([]float32) }}

// runTail computes elements [off, off+r) (r below one vector) of AVX2 code:
// each streamed value gets a zero-padded vector of scratch (inputs copied
// in), the code runs over that one vector, and the stored values' first r
// elements are copied out.
func (c *Chain) runTail(vals []*float32, off, r int, args []uint64) {
	sp := tailScratch.Get().(*[]float32)
	defer tailScratch.Put(sp)
	if len(*sp) < c.lanes*len(c.used) {
		*sp = make([]float32, c.lanes*len(c.used))
	}
	buf := *sp
	clear(buf)
	c.tailArgs(vals, off, r, args, buf)
	c.exec.call(&args[0])
	c.tailStore(vals, off, r, buf)
	keepAlive(buf)
}

// whole is how many of n elements the code computes in place: all of them
// (AVX-512, masked), or the whole vectors (AVX2; runTail does the rest).
func (c *Chain) whole(n int) int {
	if c.lanes == 16 {
		return n
	}
	return n &^ (c.lanes - 1)
}

// bodyArgs sets args for one call of the code over cnt elements from off.
func (c *Chain) bodyArgs(vals []*float32, off, cnt int, args []uint64) {
	args[0] = uint64(cnt)
	for s, v := range c.used {
		p := uintptrOf(vals[v])
		if !c.uniform[s] {
			p += uintptr(4 * off)
		}
		args[1+s] = uint64(p)
	}
}

// tailArgs sets args for the call of runTail over elements [off, off+r):
// streamed values point into buf (c.lanes floats each, zeroed), inputs
// copied in.
func (c *Chain) tailArgs(vals []*float32, off, r int, args []uint64, buf []float32) {
	args[0] = uint64(c.lanes)
	for s, v := range c.used {
		if c.uniform[s] {
			args[1+s] = uint64(uintptrOf(vals[v]))
			continue
		}
		sc := buf[c.lanes*s : c.lanes*(s+1)]
		if c.input[s] {
			copy(sc, tailOf(vals[v], off, r))
		}
		args[1+s] = uint64(uintptrOf(&sc[0]))
	}
}

// tailStore copies the stored values' first r elements out of buf to
// [off, off+r) of their memory.
func (c *Chain) tailStore(vals []*float32, off, r int, buf []float32) {
	for s, v := range c.used {
		if c.stored[s] {
			copy(tailOf(vals[v], off, r), buf[c.lanes*s:])
		}
	}
}

// tailOf is elements [off, off+r) of the value at p.
func tailOf(p *float32, off, r int) []float32 {
	return unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(p), 4*off)), r)
}

// ---- code generation ----

// streamRegs hold operand pointers (the first streams in slot order); later
// streams are reloaded into RDX at each access.
var streamRegs = []e.Reg{e.RBX, e.RSI, e.R8, e.R9, e.R10, e.R11, e.R12, e.R13}

// valInfo is what the generator knows of one vals index.
type valInfo struct {
	def     int   // instruction defining it, -1 for inputs
	uses    []int // instructions reading it (ascending, repeated per operand)
	store   bool  // stored (defined and not NoStore)
	uniform bool
	slot    int
}

// gen emits one chain.
type gen struct {
	a      e.Asm
	code   []cins
	vals   []valInfo
	used   []int32
	hoist  map[hkey]e.Z // constants and uniform inputs held in registers
	counts map[hkey]int // uses of each (first pass)
	// per body
	sreg   []int // slot → index in streamRegs, -1: reloaded into RDX
	acc    []int // memory accesses per slot (first pass)
	nv     int
	reg    []int   // virtual value → register, -1
	owner  [32]int // register → virtual value, -1 free, -2 temp or hoisted (the first nregs used)
	pinned [32]bool
	stored []bool
	xuses  [][]int
	pos    int
	mask   e.K  // 0, or K1 in the tail
	unroll int  // vectors per main-loop iteration
	km     e.K  // the opmask register op bodies use: K2, or K2+i in woven stream i
	nt     bool // stored values (not spills) written with VMOVNTPS
	peak   int
	spills int
	// the instruction set: AVX-512 (EVEX, 32 ZMM registers of 16 lanes,
	// opmasks) or, with vex, AVX2+FMA (16 YMM registers of 8 lanes, no
	// opmasks: whole vectors only, vector-mask compares and blends)
	vex   bool
	nregs int
	lanes int
}

// hkey names a hoistable constant: float bits, or (with val >= 0) a uniform
// input.
type hkey struct {
	bits uint32
	val  int
}

// checkChain checks code as CompileChain documents it and returns what the
// generator knows of each vals index.
func checkChain(code []Instr, nvals int, uniform []bool) ([]valInfo, error) {
	if len(code) == 0 {
		return nil, fmt.Errorf("vmath: empty chain")
	}
	vals := make([]valInfo, nvals)
	for i := range vals {
		vals[i].def, vals[i].slot = -1, -1
		vals[i].uniform = i < len(uniform) && uniform[i]
	}
	for k, in := range code {
		if !in.valid(nvals) {
			return nil, fmt.Errorf("vmath: bad chain instruction %d: %+v", k, in)
		}
		for _, x := range (cins{Instr: in}).operands() {
			vals[x].uses = append(vals[x].uses, k)
		}
		d := &vals[in.Dst]
		if d.def >= 0 || len(d.uses) > 0 {
			return nil, fmt.Errorf("vmath: chain value %d written twice or read before written", in.Dst)
		}
		d.def, d.store, d.uniform = k, in.Op&NoStore == 0, false
	}
	return vals, nil
}

// generateChain generates the chain (ordinary stores) with the largest of
// chainUnrolls that does not spill, or the one that spills least.
func generateChain(code []cins, vals []valInfo, vex bool) (*Chain, error) {
	var best *Chain
	var err error
	for _, u := range chainUnrolls {
		c, e := generateUnrolled(code, vals, false, u, vex)
		if e != nil {
			err = e
			continue
		}
		if best == nil || c.spills < best.spills {
			best = c
		}
		if c.spills == 0 {
			break
		}
	}
	if best == nil {
		return nil, err
	}
	return best, nil
}

// generateUnrolled generates the chain with u vectors per main-loop
// iteration (vals as checkChain made them), its results stored
// non-temporally when nt, as AVX2 code (else AVX-512) when vex.
func generateUnrolled(code []cins, vals []valInfo, nt bool, u int, vex bool) (c *Chain, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("%v (%d vectors per iteration)", r, u)
		}
	}()
	for i := range vals {
		vals[i].slot = -1
	}
	g := &gen{code: code, vals: vals, nt: nt, km: 2, unroll: u, vex: vex, nregs: 32, lanes: 16}
	if vex {
		g.nregs, g.lanes = 16, 8
	}
	g.a.VEX = vex
	for k := range code {
		for _, x := range append(code[k].operands(), int(code[k].Dst)) {
			if vals[x].slot < 0 {
				vals[x].slot = len(g.used)
				g.used = append(g.used, int32(x))
			}
		}
	}
	// First pass: count constant uses and memory accesses, and measure
	// register pressure.
	g.hoist = map[hkey]e.Z{}
	g.counts = map[hkey]int{}
	g.sreg = make([]int, len(g.used))
	for s := range g.sreg {
		g.sreg[s] = -1
	}
	g.acc = make([]int, len(g.used))
	g.emit()
	// The most accessed slots get pointer registers.
	order := make([]int, len(g.used))
	for s := range order {
		order[s] = s
	}
	slices.SortStableFunc(order, func(x, y int) int { return g.acc[y] - g.acc[x] })
	for i, s := range order {
		if i < len(streamRegs) && g.acc[s] > 0 {
			g.sreg[s] = i
		}
	}
	g.acc = nil
	free := g.nregs - g.peak
	type kc struct {
		k hkey
		n int
	}
	var cands []kc
	for k, n := range g.counts {
		cands = append(cands, kc{k, n})
	}
	slices.SortFunc(cands, func(x, y kc) int {
		if x.n != y.n {
			return y.n - x.n
		}
		if x.k.val != y.k.val {
			return x.k.val - y.k.val
		}
		return int(x.k.bits) - int(y.k.bits)
	})
	hoist := map[hkey]e.Z{}
	for i := 0; i < len(cands) && i < free; i++ {
		hoist[cands[i].k] = e.Z(g.nregs - 1 - i)
	}
	// Second pass: the code.
	g.a = e.Asm{VEX: vex}
	g.hoist, g.counts, g.spills = hoist, nil, 0
	g.emit()
	out, err := g.a.Finish()
	if err != nil {
		return nil, err
	}
	c = &Chain{code: out, used: g.used, uniform: make([]bool, len(g.used)),
		stored: make([]bool, len(g.used)), input: make([]bool, len(g.used)),
		spills: g.spills, hoisted: len(hoist), unroll: u, lanes: g.lanes}
	for s, v := range g.used {
		c.uniform[s] = vals[v].uniform
		c.stored[s] = vals[v].store
		c.input[s] = vals[v].def < 0
	}
	return c, nil
}

func (in cins) operands() []int {
	switch cd := in.Code(); {
	case cd == opCmpSel:
		return []int{int(in.A), int(in.B), int(in.C), int(in.D)}
	case cd == OpSelect:
		return []int{int(in.A), int(in.B), int(in.C)}
	case isCompare(cd):
		return []int{int(in.A), int(in.B)}
	case !validOp(cd):
		return []int{int(in.A), int(in.B), int(in.C)} // contracted multiply-add
	case ops[cd].arity == 2:
		return []int{int(in.A), int(in.B)}
	}
	return []int{int(in.A)}
}

// reuse returns the result register of step in (virtual values off
// onward, operands loaded in regs): for a contracted multiply-add, the
// register of an operand read for the last time here (the addend first),
// which the one instruction then overwrites; a free register otherwise.
func (g *gen) reuse(in cins, off int, regs []e.Z) e.Z {
	d := int(in.Dst) + off
	switch in.Code() {
	case opFMA, opFMS, opFNMA:
		ops := in.operands()
		for _, i := range []int{2, 0, 1} {
			x, z := ops[i]+off, regs[i]
			if g.owner[z] == x && g.nextUse(x) < 0 {
				g.reg[x] = -1 // stored already if it is ever stored
				g.owner[z] = d
				return z
			}
		}
	}
	return g.alloc(d)
}

// cins is a chain instruction as the generator sees it: an Instr, a
// multiply-add contracted from a multiply and the add or subtract that
// reads it (opFMA: A*B + C, opFMS: A*B - C, opFNMA: C - A*B), or a compare
// joined to the one select that reads its mask (opCmpSel: Pred(A, B) ? C :
// D), whose mask then never becomes a value: it stays in an opmask
// (AVX-512) or in the result register (AVX2).
type cins struct {
	Instr
	D    int32 // opCmpSel's false operand
	Pred int32 // opCmpSel's compare opcode
}

// Opcodes of contracted multiply-adds (generator only; never in an Instr
// a caller passes).
const (
	opFMA int32 = 0x40 + iota
	opFMS
	opFNMA
	opCmpSel
)

var contractOff atomic.Bool

func init() { contractOff.Store(!settings.CPUFMA.Get()) }

// SetContract turns the contraction of multiplies into fused multiply-adds
// on or off for chains compiled from now on (FERRY_CPU_FMA=0 starts with it
// off) and returns the previous setting. With it on (the default, as in
// XLA's CPU backend, whose LLVM target options always allow FMA fusion), a
// multiply whose result is not stored and is read only by one add or
// subtract is computed with it by one fused multiply-add: one rounding
// instead of two, so results may differ from the kernels' op-by-op results
// in the last bits. With it off, compiled chains compute the kernels'
// results bit for bit.
func SetContract(on bool) bool { return !contractOff.Swap(!on) }

// contract returns code as the generator sees it and the number of
// multiplies contracted (none unless on): every OpMul whose result is
// NoStore and read only once, by an OpAdd or OpSub, is dropped and that
// add or subtract becomes a multiply-add of the multiply's operands.
func contract(code []Instr, vals []valInfo, on bool) ([]cins, int) {
	// product returns the OpMul defining x when x is NoStore and read
	// once, -1 otherwise.
	product := func(x int32) int {
		v := vals[x]
		if v.def < 0 || v.store || len(v.uses) != 1 || code[v.def].Code() != OpMul {
			return -1
		}
		return v.def
	}
	out := make([]cins, len(code))
	drop := make([]bool, len(code))
	n := 0
	for k, in := range code {
		out[k] = cins{Instr: in}
		cd := in.Code()
		if !on || cd != OpAdd && cd != OpSub {
			continue
		}
		m, c, fop := product(in.A), in.B, opFMA // A*B ± C
		if cd == OpSub {
			fop = opFMS
		}
		if m < 0 {
			m, c, fop = product(in.B), in.A, opFMA // C ± A*B
			if cd == OpSub {
				fop = opFNMA
			}
		}
		if m < 0 {
			continue
		}
		out[k] = cins{Instr: Instr{Op: fop | in.Op&^0xff, Dst: in.Dst, A: code[m].A, B: code[m].B, C: c}}
		drop[m] = true
		n++
	}
	// A compare whose mask is NoStore and read once, as a select's
	// mask, joins the select (exact: no rounding is involved).
	for k, in := range code {
		if in.Code() != OpSelect {
			continue
		}
		v := vals[in.A]
		if v.def < 0 || v.store || len(v.uses) != 1 || !isCompare(code[v.def].Code()) {
			continue
		}
		cm := code[v.def]
		out[k] = cins{Instr: Instr{Op: opCmpSel | in.Op&^0xff, Dst: in.Dst, A: cm.A, B: cm.B, C: in.B}, D: in.C, Pred: cm.Code()}
		drop[v.def] = true
	}
	kept := out[:0]
	for k, in := range out {
		if !drop[k] {
			kept = append(kept, in)
		}
	}
	return kept, n
}

// chainUnrolls are the numbers of vectors the main loop may compute per
// iteration, each op over all of them before the next op, tried largest
// first: the first whose code keeps every value in registers is taken (the
// smallest if all spill). Independent work for the out-of-order core: a
// transcendental's latency is far above its throughput, and the cores
// measured here (Zen 5) ran the gelu chain 1.35x faster with 8 than with 2.
var chainUnrolls = []int{8, 4, 2, 1}

// chainPrefetch is how far ahead (bytes) the main loop prefetches its
// streamed inputs (PREFETCHNTA: read once); 0 turns it off. On Zen 5 (2
// cores, the executor's gelu over 4M elements, alternating runs) the
// fused/copy ratio's median was 0.49 with no prefetch; with PREFETCHT0 0.53
// at 1 KiB, 0.59 at 2 KiB, 0.64 at 4 KiB and 0.59 at 8 KiB; in a later
// series PREFETCHNTA at 3 KiB gave 0.58 (15 runs) where PREFETCHT0 at 4 KiB
// gave 0.53.
const chainPrefetch = 3072

// weaveRegs bounds the registers the woven bodies of one transcendental op
// over several vectors may hold at once (operands, temporaries, results).
// The registers it leaves let more vectors per iteration stay spill-free:
// at 16, gelu(x*w+b) weaves logistic over two vectors and compiles at
// unroll 8 (at 24: three vectors, unroll 4), 0.4 cycles per vector faster
// in L1 and 4 % faster through bench/cpu's fused section (medians of 5
// alternating runs, twice), the same on the executor's 2048×2048 gelu.
const weaveRegs = 16

// emit writes the whole function: the main loop over g.unroll vectors,
// a loop over single vectors, and one masked vector.
func (g *gen) emit() {
	a := &g.a
	a.MOVQload(e.Mem{Base: e.RDI}, e.RCX)
	a.XORL(e.RAX)
	for s, r := range g.sreg {
		if r >= 0 {
			a.MOVQload(e.Mem{Base: e.RDI, Disp: int32(8 * (1 + s))}, streamRegs[r])
		}
	}
	keys := make([]hkey, 0, len(g.hoist))
	for k := range g.hoist {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(x, y hkey) int { return int(g.hoist[y]) - int(g.hoist[x]) })
	for _, k := range keys {
		z := g.hoist[k]
		if k.val >= 0 {
			a.VBROADCASTSS(g.base(k.val), z)
		} else {
			a.VBROADCASTSS(a.Const(k.bits), z)
		}
	}
	big, single, one, tail, done := a.NewLabel(), a.NewLabel(), a.NewLabel(), a.NewLabel(), a.NewLabel()
	u := int32(g.unroll)
	lanes, vb := int32(g.lanes), int32(4*g.lanes) // elements and bytes per vector
	a.CMPQ(e.RCX, lanes*u)
	a.Jcc(e.CondL, single)
	a.Bind(big)
	if chainPrefetch > 0 {
		// Ask for the input lines chainPrefetch bytes ahead: the hardware
		// prefetchers alone left the loop waiting on memory.
		for s, v := range g.used {
			if g.vals[v].def >= 0 || g.vals[v].uniform || g.sreg[s] < 0 {
				continue
			}
			for j := int32(0); j < (vb*u+63)/64; j++ {
				a.PREFETCHNTA(e.Mem{Base: streamRegs[g.sreg[s]], Index: e.RAX, HasIndex: true, Scale: 1, Disp: chainPrefetch + 64*j})
			}
		}
	}
	g.body(g.unroll, 0)
	a.ADDQ(vb*u, e.RAX)
	a.SUBQ(lanes*u, e.RCX)
	a.CMPQ(e.RCX, lanes*u)
	a.Jcc(e.CondGE, big)
	a.Bind(single)
	a.CMPQ(e.RCX, lanes)
	a.Jcc(e.CondL, tail)
	a.Bind(one)
	g.body(1, 0)
	a.ADDQ(vb, e.RAX)
	a.SUBQ(lanes, e.RCX)
	a.CMPQ(e.RCX, lanes)
	a.Jcc(e.CondGE, one)
	a.Bind(tail)
	if g.vex { // whole vectors only: Chain.run passes the rest through scratch
		a.Bind(done)
		a.VZEROUPPER()
		a.RET()
		return
	}
	a.TESTQ(e.RCX)
	a.Jcc(e.CondLE, done)
	a.MOVL(1, e.RDX)
	a.SHLLCL(e.RDX)
	a.DECL(e.RDX)
	a.KMOVW(e.RDX, 1)
	g.body(1, 1)
	a.Bind(done)
	a.VZEROUPPER()
	a.RET()
}

// base returns the memory operand of the first element of vals index v
// (its pointer register, or RDX reloaded from the argument block).
func (g *gen) base(v int) e.Mem {
	s := g.vals[v].slot
	if g.acc != nil {
		g.acc[s]++
	}
	if r := g.sreg[s]; r >= 0 {
		return e.Mem{Base: streamRegs[r]}
	}
	g.a.MOVQload(e.Mem{Base: e.RDI, Disp: int32(8 * (1 + s))}, e.RDX)
	return e.Mem{Base: e.RDX}
}

// at returns the memory operand of the current vector of virtual value x.
func (g *gen) at(x int) e.Mem {
	m := g.base(x % g.nv)
	m.Index, m.HasIndex, m.Scale = e.RAX, true, 1
	m.Disp = int32(4 * g.lanes * (x / g.nv))
	return m
}

// body emits the chain over u consecutive vectors (masked by K1 when mask
// is 1, with u = 1). Registers are allocated over virtual values x = v +
// j*nv (value v of vector j).
func (g *gen) body(u int, mask e.K) {
	g.mask = mask
	nv := len(g.vals)
	g.nv = nv
	g.reg = make([]int, nv*u)
	for i := range g.reg {
		g.reg[i] = -1
	}
	for z := range g.owner {
		g.owner[z], g.pinned[z] = -1, false
		if z >= g.nregs {
			g.owner[z] = -3 // not a register of this instruction set
		}
	}
	for _, z := range g.hoist {
		g.owner[z] = -2
	}
	g.stored = make([]bool, nv*u)
	g.xuses = make([][]int, nv*u)
	type step struct {
		in cins
		j  int
	}
	var steps []step
	for _, in := range g.code {
		for j := 0; j < u; j++ {
			for _, x := range in.operands() {
				g.xuses[x+j*nv] = append(g.xuses[x+j*nv], len(steps))
			}
			steps = append(steps, step{in, j})
		}
	}
	type ready struct {
		regs, temps []e.Z
		out         e.Z
	}
	// prepare loads step k's operands and allocates its temporaries and
	// result register, all pinned.
	prepare := func(k int) ready {
		g.pos = k
		in, off := steps[k].in, steps[k].j*nv
		ops := in.operands()
		r := ready{regs: make([]e.Z, len(ops)), temps: make([]e.Z, g.temps(in.Code()))}
		for i, x := range ops {
			r.regs[i] = g.operand(x + off)
			g.pinned[r.regs[i]] = true
		}
		for i := range r.temps {
			r.temps[i] = g.alloc(-2)
			g.pinned[r.temps[i]] = true
		}
		d := int(in.Dst) + off
		r.out = g.reuse(in, off, r.regs)
		g.reg[d] = int(r.out)
		g.pinned[r.out] = true
		return r
	}
	// finish frees step k's temporaries and dead values and stores its
	// result if it is stored.
	finish := func(k int, r ready) {
		g.pos = k
		in, off := steps[k].in, steps[k].j*nv
		for _, z := range r.temps {
			g.owner[z], g.pinned[z] = -1, false
		}
		g.pinned[r.out] = false
		for i, x := range in.operands() {
			g.pinned[r.regs[i]] = false
			if g.nextUse(x+off) < 0 && g.reg[x+off] >= 0 {
				g.release(x + off)
			}
		}
		d := int(in.Dst) + off
		if g.vals[in.Dst].store {
			g.store(d, g.nt)
		}
		if g.nextUse(d) < 0 {
			g.release(d)
		}
	}
	for k := 0; k < len(steps); {
		in := steps[k].in
		n := 1
		if t := g.temps(in.Code()); t > 0 {
			// One op over several vectors, woven: as many as leave
			// registers for the values live around it, never past this
			// op's last vector, at most six (opmasks K2..K7).
			n = max(1, min(u-steps[k].j, weaveRegs*g.nregs/32/(t+len(in.operands())+1), 6))
		}
		rs := make([]ready, n)
		for i := range rs {
			rs[i] = prepare(k + i)
		}
		g.peakNow()
		g.a.BeginWeave() // one stream (n = 1) is kept as it is
		for i, r := range rs {
			g.a.NextStream()
			g.km = e.K(2 + i) // each stream its own opmask
			g.op(in, r.regs, r.out, r.temps)
		}
		g.km = 2
		if err := g.a.EndWeave(); err != nil {
			panic(err) // op bodies hold no labels or jumps
		}
		for i, r := range rs {
			finish(k+i, r)
		}
		k += n
	}
}

func (g *gen) peakNow() {
	n := 0
	for z := range g.nregs {
		if g.owner[z] != -1 {
			n++
		}
	}
	g.peak = max(g.peak, n)
}

// nextUse returns the next step after pos reading virtual value x, or -1.
func (g *gen) nextUse(x int) int {
	for _, u := range g.xuses[x] {
		if u > g.pos {
			return u
		}
	}
	return -1
}

func (g *gen) release(x int) {
	z := g.reg[x]
	g.reg[x] = -1
	if z >= 0 && g.owner[z] == x {
		g.owner[z] = -1
	}
}

// store writes virtual value x to its memory (non-temporal when nt,
// except in the masked tail, which VMOVNTPS cannot mask).
func (g *gen) store(x int, nt bool) {
	if g.stored[x] {
		return
	}
	if nt && g.mask == 0 {
		g.a.VMOVNTPS(e.Z(g.reg[x]), g.at(x))
	} else {
		g.a.VMOVUPSstore(e.Z(g.reg[x]), g.mask, g.at(x))
	}
	g.stored[x] = true
}

// alloc returns a free register for owner o (a virtual value, or -2 for a
// temporary), evicting the value read furthest in the future if none is
// free (stored first if its memory does not hold it yet).
func (g *gen) alloc(o int) e.Z {
	for z := range g.nregs {
		if g.owner[z] == -1 {
			g.owner[z] = o
			return e.Z(z)
		}
	}
	best, far := -1, -1
	for z, x := range g.owner[:g.nregs] {
		if x < 0 || g.pinned[z] {
			continue
		}
		nu := g.nextUse(x)
		if nu < 0 {
			nu = math.MaxInt32
		}
		if nu > far {
			best, far = z, nu
		}
	}
	if best < 0 {
		panic("vmath: chain register allocation failed")
	}
	x := g.owner[best]
	g.spills++
	if g.vals[x%g.nv].def >= 0 {
		g.store(x, false) // spill to its own memory
	}
	g.reg[x] = -1
	g.owner[best] = o
	return e.Z(best)
}

// operand returns a register holding virtual value x, loading it if needed.
func (g *gen) operand(x int) e.Z {
	if z := g.reg[x]; z >= 0 {
		return e.Z(z)
	}
	v := x % g.nv
	if g.vals[v].uniform {
		k := hkey{val: v}
		if z, ok := g.hoist[k]; ok {
			return z
		}
		if g.counts != nil {
			g.counts[k]++
		}
		z := g.alloc(x)
		g.reg[x] = int(z)
		g.a.VBROADCASTSS(g.base(v), z)
		return z
	}
	z := g.alloc(x)
	g.reg[x] = int(z)
	g.a.VMOVUPSload(g.at(x), g.mask, z)
	return z
}

// c returns the float32 constant v as an operand: a hoisted register or a
// broadcast from the pool.
func (g *gen) c(v float32) e.Operand { return g.cbits(math.Float32bits(v)) }

func (g *gen) cbits(b uint32) e.Operand {
	k := hkey{bits: b, val: -1}
	if z, ok := g.hoist[k]; ok {
		return z
	}
	if g.counts != nil {
		g.counts[k]++
	}
	return g.a.Const(b)
}

// creg returns the constant o in a register: its hoisted register, or tmp
// after a broadcast (for an operand that must be a register, read only).
func (g *gen) creg(o e.Operand, tmp e.Z) e.Z {
	if z, ok := o.(e.Z); ok {
		return z
	}
	g.bcast(o, tmp)
	return tmp
}

// bcast sets every lane of dst to the constant o.
func (g *gen) bcast(o e.Operand, dst e.Z) {
	switch o := o.(type) {
	case e.Z:
		g.a.VMOVAPS(o, dst)
	case e.Mem:
		g.a.VBROADCASTSS(o, dst)
	}
}

// temps is the number of temporary registers op code's body needs.
func (g *gen) temps(code int32) int {
	switch {
	case !validOp(code):
		return 0 // contracted multiply-adds, compares and selects
	case g.vex:
		return ops[code].tempsVEX
	}
	return ops[code].temps
}

// Comparison predicates (VCMPPS imm8).
const (
	cmpEQ  = 0x00 // EQ_OQ
	cmpLT  = 0x11 // LT_OQ
	cmpLE  = 0x12 // LE_OQ
	cmpGT  = 0x1e // GT_OQ
	cmpGE  = 0x1d // GE_OQ
	cmpNE  = 0x04 // NEQ_UQ (true for NaN)
	cmpUNO = 0x03
	cmpNLT = 0x05 // not less than (true for NaN)
)

// op emits one op's body (its row's in ops, a contracted multiply-add, a
// compare or select, or a compare joined to its select),
// in the Go assembler's operand order, with the temporaries t.
func (g *gen) op(ci cins, in []e.Z, out e.Z, t []e.Z) {
	code := ci.Code()
	if isMaskOp(code) {
		g.maskBody(code, in, out)
		return
	}
	if code == opCmpSel {
		g.cmpSelBody(ci.Pred, in, out)
		return
	}
	if !validOp(code) {
		g.fma(code, in, out)
		return
	}
	ops[code].body(g, in, out, t)
}

// maxBody: in[0] > in[1] ? in[0] : in[1], and in[0] where it is NaN
// (eval's max); minBody likewise.
func (g *gen) maxBody(in []e.Z, out e.Z, t []e.Z) {
	g.a.VMAXPS(in[1], in[0], out)
	g.nanFirst(in, out, t)
}

func (g *gen) minBody(in []e.Z, out e.Z, t []e.Z) {
	g.a.VMINPS(in[1], in[0], out)
	g.nanFirst(in, out, t)
}

// nanFirst sets out = in[0] where in[0] is NaN.
func (g *gen) nanFirst(in []e.Z, out e.Z, t []e.Z) {
	g.cmp(cmpUNO, in[0], in[0], t)
	if g.vex {
		g.blend(in[0], out, t)
	} else {
		g.a.VMOVAPSk(in[0], g.km, out)
	}
}

// cmp computes the predicate imm of src1 and src2 into the mask: opmask
// g.km (AVX-512), or the vector register t[0] (AVX2).
func (g *gen) cmp(imm uint8, src2 e.Operand, src1 e.Z, t []e.Z) {
	if g.vex {
		g.a.VCMPPSv(imm, src2, src1, t[0])
	} else {
		g.a.VCMPPS(imm, src2, src1, g.km)
	}
}

// blend sets out = src where the mask cmp computed (with the same t) is
// set.
func (g *gen) blend(src e.Operand, out e.Z, t []e.Z) {
	switch {
	case g.vex:
		g.a.VBLENDVPS(t[0], src, out, out)
	default:
		g.a.VBLENDMPSk(src, out, g.km, out)
	}
}

// fma emits a contracted multiply-add, in[0]*in[1] ± in[2] (opFMA, opFMS)
// or in[2] - in[0]*in[1] (opFNMA), in one instruction when out is one of
// its operands' registers (see reuse), after a copy of the addend otherwise.
func (g *gen) fma(code int32, in []e.Z, out e.Z) {
	a := &g.a
	if out != in[2] && (out == in[0] || out == in[1]) {
		m := in[1] // out holds one factor, m the other
		if out == in[1] {
			m = in[0]
		}
		switch code {
		case opFMA:
			a.VFMADD213PS(in[2], m, out)
		case opFMS:
			a.VFMSUB213PS(in[2], m, out)
		default:
			a.VFNMADD213PS(in[2], m, out)
		}
		return
	}
	if out != in[2] {
		a.VMOVAPS(in[2], out)
	}
	switch code {
	case opFMA:
		a.VFMADD231PS(in[1], in[0], out)
	case opFMS:
		a.VFMSUB231PS(in[1], in[0], out)
	default:
		a.VFNMADD231PS(in[1], in[0], out)
	}
}

// horner leaves c[0]*t^(n-1)+...+c[n-1] in acc.
func (g *gen) horner(acc, t e.Z, cs []float32) {
	g.bcast(g.c(cs[0]), acc)
	for _, k := range cs[1:] {
		g.a.VFMADD213PS(g.c(k), t, acc)
	}
}

// expInto: out = e^x (x preserved); tmp holds 4 registers (6 in AVX2
// code).
func (g *gen) expInto(x, out e.Z, tmp []e.Z) {
	a := &g.a
	t0 := tmp[0]
	a.VMAXPS(x, g.creg(g.c(expLo), tmp[1]), t0)
	a.VMINPS(t0, g.creg(g.c(expHi), tmp[1]), t0)
	g.expCore(t0, out, tmp[1:])
}

// expCore: out = e^t0 for t0 in [expLo, expHi] or NaN (t0 is clobbered);
// tmp holds 3 registers (5 in AVX2 code). As the scalar expCore:
//
// e^x = 2^(n + j/16) * e^r: kf = n + j/16 is x*log2e rounded to a multiple
// of 1/16 (by adding expShift, whose ulp is 1/16, so the low four mantissa
// bits of the sum are j), r = x - kf*ln2F32 (one rounding, |r| ≤ ln2/32),
// the rest of kf*ln2 added to e^r - 1 (where it is a relative correction
// of 2^-22 at most, so r's polynomial need not see it), 2^(j/16) comes
// from 16-entry tables by VPERMPS (which reads the low four bits of each
// index lane) as T(1 + d) with d T's relative rounding error, e^r - 1 is
// r(1 + r(expC2 + expC3 r)), 2^(j/16) e^r is T + T(e^r - 1 + d), and
// VSCALEFPS multiplies by 2^floor(kf) = 2^n, overflowing to +inf and
// underflowing through the subnormals with one rounding.
func (g *gen) expCore(t0, out e.Z, tmp []e.Z) {
	if g.vex {
		g.expCoreVEX(t0, out, tmp)
		return
	}
	a := &g.a
	t1, t2, t3 := tmp[0], tmp[1], tmp[2]
	g.bcast(g.c(expShift), t1)
	a.VFMADD231PS(g.c(log2e), t0, t1)
	a.VSUBPS(g.c(expShift), t1, t2)
	a.VFNMADD231PS(g.c(ln2F32), t2, t0)
	a.VPERMPS(g.a.ConstVec(exp2Bits[0]), t1, out)
	a.VPERMPS(g.a.ConstVec(exp2Bits[1]), t1, t1)
	a.VFNMADD231PS(g.c(ln2F32Lo), t2, t1)
	g.bcast(g.c(expC2), t3)
	a.VFMADD231PS(g.c(expC3), t0, t3)
	a.VFMADD213PS(g.c(1), t0, t3)
	a.VFMADD213PS(t1, t0, t3)
	a.VFMADD213PS(out, out, t3)
	a.VSCALEFPS(t2, t3, out)
}

// expCoreVEX is expCore in AVX2 code, with the same arithmetic: the
// 16-entry tables are looked up by two 8-entry VPERMPS (index bits 0-2)
// and a blend on index bit 3, and VSCALEFPS's t3·2^floor(kf) is two exact
// multiplies by powers of two built from the integer 16·kf (2^n1 then
// 2^n2 with n1 = n>>1, n2 = n-n1, each within the normal exponents for n
// in [-151, 128]): the first is exact, so the result is rounded once, as
// VSCALEFPS and the scalar scale2 round it.
func (g *gen) expCoreVEX(t0, out e.Z, tmp []e.Z) {
	a := &g.a
	t1, t2, t3, m, b := tmp[0], tmp[1], tmp[2], tmp[3], tmp[4]
	g.bcast(g.c(expShift), t1)
	a.VFMADD231PS(g.c(log2e), t0, t1)
	a.VSUBPS(g.c(expShift), t1, t2)
	a.VFNMADD231PS(g.c(ln2F32), t2, t0)
	a.VPSLLD(28, t1, m) // index bit 3 to the sign bit
	a.VPERMPS(a.ConstVec8(exp2Bits8[0]), t1, out)
	a.VPERMPS(a.ConstVec8(exp2Bits8[1]), t1, b)
	a.VBLENDVPS(m, b, out, out)
	a.VPERMPS(a.ConstVec8(exp2Bits8[2]), t1, b)
	a.VPERMPS(a.ConstVec8(exp2Bits8[3]), t1, t3)
	a.VBLENDVPS(m, t3, b, b)
	a.VPSUBD(g.cbits(math.Float32bits(expShift)), t1, m) // 16·kf
	a.VPSRAD(4, m, m)                                    // n = floor(kf)
	a.VPSRAD(1, m, t1)                                   // n1
	a.VPSUBD(t1, m, m)                                   // n2
	a.VPADDD(g.cbits(127), t1, t1)
	a.VPSLLD(23, t1, t1) // 2^n1
	a.VPADDD(g.cbits(127), m, m)
	a.VPSLLD(23, m, m) // 2^n2
	a.VFNMADD231PS(g.c(ln2F32Lo), t2, b)
	g.bcast(g.c(expC2), t3)
	a.VFMADD231PS(g.c(expC3), t0, t3)
	a.VFMADD213PS(g.c(1), t0, t3)
	a.VFMADD213PS(b, t0, t3)
	a.VFMADD213PS(out, out, t3)
	a.VMULPS(t1, t3, out)
	a.VMULPS(m, out, out)
}

// exp2Bits8 holds exp2Tab and exp2Err as bits in halves of 8 (entries 0-7
// and 8-15 of each), for AVX2's 8-entry VPERMPS.
var exp2Bits8 = func() (b [4][8]uint32) {
	for j := range 16 {
		b[j/8][j%8] = math.Float32bits(exp2Tab[j])
		b[2+j/8][j%8] = math.Float32bits(exp2Err[j])
	}
	return
}()

// exp2Bits holds exp2Tab and exp2Err as bits, for the constant pool.
var exp2Bits = func() (b [2][16]uint32) {
	for j := range 16 {
		b[0][j] = math.Float32bits(exp2Tab[j])
		b[1][j] = math.Float32bits(exp2Err[j])
	}
	return
}()

// copysign: out = |out| with the sign of x.
func (g *gen) copysign(out, x, tmp e.Z) {
	if g.vex {
		g.a.VPANDD(g.cbits(signBit), x, tmp)
		g.a.VPANDD(g.cbits(0x7fffffff), out, out)
		g.a.VPORD(tmp, out, out)
		return
	}
	g.a.VPTERNLOGD(0xB8, x, g.creg(g.cbits(signBit), tmp), out)
}

func (g *gen) tanhBody(in []e.Z, out e.Z, r []e.Z) {
	x := in[0]
	a := &g.a
	ab, z, s, t, ex := r[0], r[1], r[2], r[3], r[4]
	a.VPANDD(g.cbits(0x7fffffff), x, ab)
	a.VMULPS(x, x, z)
	g.horner(s, z, tanhP[:])
	a.VMULPS(x, z, t)
	a.VFMADD213PS(x, t, s)
	a.VADDPS(ab, ab, t)
	a.VMINPS(t, g.creg(g.c(2*tanhHi), ex), t)
	g.expCore(t, ex, r[5:]) // t in [0, 2*tanhHi] or NaN
	a.VADDPS(g.c(1), ex, ex)
	a.VDIVPS(ex, g.creg(g.c(2), out), t) // 2/d
	g.bcast(g.c(1), out)
	a.VSUBPS(t, out, out)
	g.cmp(cmpLT, g.c(tanhLo), ab, r[1:])
	g.blend(s, out, r[1:])
	g.copysign(out, x, t)
}

func (g *gen) logisticBody(in []e.Z, out e.Z, r []e.Z) {
	x := in[0]
	a := &g.a
	n, ex, num := r[0], r[1], r[2]
	a.VPORD(g.cbits(signBit), x, n)
	a.VMAXPS(n, g.creg(g.c(expLo), ex), n) // -|x| ≥ expLo, or NaN
	g.expCore(n, ex, r[3:])
	// num = 1 where x ≥ 0 or NaN (not x < 0), e^-|x| elsewhere.
	g.cmp(cmpNLT, g.cbits(0), x, r)
	if g.vex {
		a.VBLENDVPS(n, g.c(1), ex, num)
	} else {
		a.VBLENDMPSk(g.c(1), ex, g.km, num)
	}
	a.VADDPS(g.c(1), ex, ex)
	// A correctly rounded VDIVPS: with the table exp, the FMA pipe is the
	// bottleneck of logistic, tanh and gelu, and the divider runs beside
	// it, so one VDIVPS beat VRCP14PS with a Newton step (four FMA-pipe
	// ops): logistic 8.2 → 6.7 and gelu 13.0 → 12.1 cycles per vector in
	// L1 (bench/RESULTS.md, 2026-11-25).
	a.VDIVPS(ex, num, out)
}

func (g *gen) erfBody(in []e.Z, out e.Z, r []e.Z) {
	x := in[0]
	a := &g.a
	ab, z, s, t, q := r[0], r[1], r[2], r[3], r[4]
	a.VPANDD(g.cbits(0x7fffffff), x, ab)
	a.VMULPS(x, x, z)
	g.horner(s, z, erfS[:])
	a.VFMADD213PS(x, x, s)
	a.VMINPS(ab, g.creg(g.c(erfHi), t), t)
	a.VSUBPS(g.c(erfMid), t, t)
	g.horner(q, t, erfL[:])
	g.expInto(q, t, r[5:])
	g.bcast(g.c(1), out)
	a.VSUBPS(t, out, out)
	g.cmp(cmpGE, g.c(erfHi), ab, r[1:])
	g.blend(g.c(1), out, r[1:])
	g.cmp(cmpLT, g.c(erfMid), ab, r[1:])
	g.blend(s, out, r[1:])
	g.copysign(out, x, t)
}

func (g *gen) logBody(in []e.Z, out e.Z, r []e.Z) {
	x := in[0]
	a := &g.a
	m, ex, f, z, y := r[0], r[1], r[2], r[3], r[4]
	if g.vex {
		g.logReduceVEX(x, m, ex, f, z, y)
	} else {
		a.VGETMANTPS(0x02, x, m)
		a.VGETEXPPS(x, ex)
		a.VADDPS(g.c(1), ex, ex)
		a.VCMPPS(cmpLT, g.c(sqrtHf), m, g.km)
		a.VADDPSk(m, m, g.km, m)
		a.VSUBPSk(g.c(1), ex, g.km, ex)
	}
	a.VSUBPS(g.c(1), m, f)
	a.VMULPS(f, f, z)
	g.horner(y, f, logP[:])
	a.VMULPS(f, y, y)
	a.VMULPS(z, y, y)
	a.VFMADD231PS(g.c(ln2Lo), ex, y)
	a.VFNMADD231PS(g.c(0.5), z, y)
	a.VADDPS(f, y, out)
	a.VFMADD231PS(g.c(ln2Hi), ex, out)
	if g.vex {
		// +inf, and NaN (whose bits the reduction took apart), give x + x
		// (+inf, or x's NaN quieted).
		a.VADDPS(x, x, y)
		g.cmp(cmpNLT, g.cbits(0x7f800000), x, r[3:])
		g.blend(y, out, r[3:])
	} else {
		a.VCMPPS(cmpEQ, g.cbits(0x7f800000), x, g.km)
		a.VMOVAPSk(x, g.km, out)
	}
	// x == +inf: +inf (above); x == 0: -inf; x < 0: NaN (NaN stays NaN).
	g.cmp(cmpEQ, g.cbits(0), x, r[3:])
	g.blend(g.cbits(0xff800000), out, r[3:])
	g.cmp(cmpLT, g.cbits(0), x, r[3:])
	g.blend(g.cbits(0x7fc00000), out, r[3:])
}

// logReduceVEX is the range reduction of log in AVX2 code, as the scalar
// log32 does it (VGETMANTPS and VGETEXPPS are AVX-512 only): inputs below
// 2^-126 (subnormals; zero and negatives are replaced later) are scaled by
// 2^23 first, then m = the mantissa in [0.5, 1) and ex = the exponent + 1
// from the bits; where m < √½, m doubles and ex decreases by one. All of it
// is exact.
func (g *gen) logReduceVEX(x, m, ex, f, z, y e.Z) {
	a := &g.a
	a.VMULPS(g.c(1<<23), x, y)
	a.VCMPPSv(cmpLT, g.cbits(0x00800000), x, z)
	a.VBLENDVPS(z, y, x, m)
	a.VPANDD(g.c(-23), z, f) // -23 where scaled, +0 elsewhere
	a.VPSRLD(23, m, ex)
	a.VCVTDQ2PS(ex, ex)
	a.VADDPS(f, ex, ex)
	a.VSUBPS(g.c(126), ex, ex)
	a.VPANDD(g.cbits(0x007fffff), m, m)
	a.VPORD(g.cbits(0x3f000000), m, m)
	a.VCMPPSv(cmpLT, g.c(sqrtHf), m, z)
	a.VPANDD(m, z, f)
	a.VADDPS(f, m, m)
	a.VPANDD(g.c(1), z, f)
	a.VSUBPS(f, ex, ex)
}
