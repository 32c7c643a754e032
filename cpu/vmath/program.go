package vmath

import (
	"sync"
	"unsafe"
)

// Flags of Instr.Op, or-ed with the opcode.
const (
	// AccA: operand A is the previous instruction's result (a hint from
	// the time programs were interpreted; compiled chains keep every value
	// in registers while it is needed, and ignore it).
	AccA int32 = 1 << 8
	// AccB: operand B likewise.
	AccB int32 = 1 << 9
	// NoStore: the result is not stored (only later instructions read
	// it); vals[Dst] is not written unless the code spills the value there
	// (see CompileChain).
	NoStore int32 = 1 << 10
)

// Instr is one instruction of a program: vals[Dst] = Op(vals[A], vals[B])
// (B ignored by unary ops), or for OpSelect Op(vals[A], vals[B], vals[C])
// (C ignored by every other op). Op is an opcode or-ed with flags.
type Instr struct{ Op, Dst, A, B, C int32 }

// Code returns the opcode of in.Op (without the flags).
func (in Instr) Code() int32 { return in.Op & 0xff }

// valid reports whether in has a known opcode and flags and names only
// vals indexes below nvals (the check of RunProgram and CompileChain).
func (in Instr) valid(nvals int) bool {
	ok := func(i int32) bool { return uint32(i) < uint32(nvals) }
	return in.Op&^(0xff|AccA|AccB|NoStore) == 0 && validCode(in.Code()) && ok(in.Dst) && ok(in.A) && ok(in.B) && ok(in.C)
}

// RunProgram runs code (as CompileChain takes it, vals[Dst] = Op(vals[A],
// vals[B]) in order, every Dst written once) over the first n elements of
// the vectors vals and returns the number of elements it computed: n when
// run-time code generation is available (JITAvailable), the program then
// compiled on first use with contraction off and kept, 0 otherwise (and for
// programs CompileChain refuses, or past progCacheMax programs): the caller
// computes the elements past the returned count with the functions of the
// same names, which give the same results. Every vals index code names must
// point to at least n float32 elements. It panics on an instruction with an
// unknown opcode or flag or a vals index out of range.
func RunProgram(code []Instr, vals []*float32, n int) int {
	for _, in := range code {
		if !in.valid(len(vals)) {
			panic("vmath: bad program instruction")
		}
	}
	if n <= 0 || len(code) == 0 || !JITAvailable() {
		return 0
	}
	ch := progChain(code, len(vals), cur == avx2Impl)
	if ch == nil || !ch.Run(vals, n) {
		return 0
	}
	return n
}

// progCacheMax bounds the programs RunProgram keeps compiled.
const progCacheMax = 256

// progCache holds RunProgram's compiled programs (nil: refused), by
// instruction set, number of values and code.
var progCache struct {
	sync.RWMutex
	m map[progKey]*Chain
}

type progKey struct {
	vex   bool
	nvals int
	code  string // the Instr words
}

// progChain returns code compiled for AVX2 (vex) or AVX-512, compiling it
// on first use; nil if it does not compile or the cache is full.
func progChain(code []Instr, nvals int, vex bool) *Chain {
	k := progKey{vex, nvals, string(unsafe.Slice((*byte)(unsafe.Pointer(&code[0])), len(code)*int(unsafe.Sizeof(code[0]))))}
	progCache.RLock()
	ch, ok := progCache.m[k]
	progCache.RUnlock()
	if ok {
		return ch
	}
	progCache.Lock()
	defer progCache.Unlock()
	if ch, ok := progCache.m[k]; ok {
		return ch
	}
	if len(progCache.m) >= progCacheMax {
		return nil
	}
	ch, _ = compileChain(code, nvals, nil, vex, false)
	if progCache.m == nil {
		progCache.m = map[progKey]*Chain{}
	}
	progCache.m[k] = ch
	return ch
}
