package vmath

import "sync"

// avx512Impl and avx2Impl: the kernels of ops as one-op chains, compiled on
// first use to AVX-512 code (16 lanes) or AVX2 code (8 lanes, the
// generator's VEX mode). Each falls back to its pure-Go kernel when
// generated code may not run (FERRY_CPU_JIT=0, SetJIT(false)) or could not
// be mapped. (Set by init: the kernels refer to cur, whose initialiser
// refers to these.)
var avx512Impl, avx2Impl = new(impl), new(impl)

func init() {
	*avx512Impl = jitKernels("avx512", false)
	*avx2Impl = jitKernels("avx2", true)
}

// jitKernels returns the kernels of ops as one-op chains for AVX2 (vex) or
// AVX-512.
func jitKernels(name string, vex bool) impl {
	im := impl{name: name}
	for op := OpAdd; op < opEnd; op++ {
		if ops[op].arity == 1 {
			im.f1[op] = jit1(op, vex, ops[op].go1)
		} else {
			im.f2[op] = jit2(op, vex, ops[op].go2)
		}
	}
	return im
}

// oneOp compiles the chain of op alone (vals: operands, then the result)
// on first use.
type oneOp struct {
	once sync.Once
	ch   *Chain
}

func (o *oneOp) chain(op int32, nvals int, vex bool) *Chain {
	o.once.Do(func() {
		in := Instr{Op: op, Dst: int32(nvals - 1), A: 0, B: int32(nvals - 2)}
		o.ch, _ = compileChain([]Instr{in}, nvals, nil, vex, false) // nil: fall back to Go
	})
	return o.ch
}

func jit1(op int32, vex bool, fallback func(dst, x []float32)) func(dst, x []float32) {
	var o oneOp
	return func(dst, x []float32) {
		n := len(x)
		if n == 0 {
			return
		}
		_ = dst[n-1]
		vals := [2]*float32{&x[0], &dst[0]}
		if ch := o.chain(op, 2, vex); ch == nil || !ch.Run(vals[:], n) {
			fallback(dst, x)
		}
	}
}

func jit2(op int32, vex bool, fallback func(dst, a, b []float32)) func(dst, a, b []float32) {
	var o oneOp
	return func(dst, a, b []float32) {
		n := len(a)
		if n == 0 {
			return
		}
		_, _ = dst[n-1], b[n-1]
		vals := [3]*float32{&a[0], &b[0], &dst[0]}
		if ch := o.chain(op, 3, vex); ch == nil || !ch.Run(vals[:], n) {
			fallback(dst, a, b)
		}
	}
}
