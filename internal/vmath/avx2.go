//go:build amd64

package vmath

import "sync"

// avx2Impl: the kernels as one-op chains compiled to AVX2 code (the
// generator's VEX mode) on first use, for CPUs with AVX2 and FMA but no
// AVX-512. Each falls back to its pure-Go kernel when generated code may
// not run (FERRY_CPU_JIT=0, SetJIT(false)) or could not be mapped. (Set by
// init: the kernels refer to cur, whose initialiser refers to avx2Impl.)
var avx2Impl = new(impl)

func init() { *avx2Impl = avx2Kernels() }

func avx2Kernels() impl {
	return impl{name: "avx2",
		exp: jit1(OpExp, goImpl.exp), log: jit1(OpLog, goImpl.log), tanh: jit1(OpTanh, goImpl.tanh),
		logistic: jit1(OpLogistic, goImpl.logistic), erf: jit1(OpErf, goImpl.erf),
		sqrt: jit1(OpSqrt, goImpl.sqrt), neg: jit1(OpNeg, goImpl.neg), abs: jit1(OpAbs, goImpl.abs),
		add: jit2(OpAdd, goImpl.add), sub: jit2(OpSub, goImpl.sub), mul: jit2(OpMul, goImpl.mul),
		div: jit2(OpDiv, goImpl.div), maxf: jit2(OpMax, goImpl.maxf), minf: jit2(OpMin, goImpl.minf),
	}
}

// oneOp compiles the chain of op alone (vals: operands, then the result)
// on first use.
type oneOp struct {
	once sync.Once
	ch   *Chain
}

func (o *oneOp) chain(op int32, nvals int) *Chain {
	o.once.Do(func() {
		in := Instr{Op: op, Dst: int32(nvals - 1), A: 0, B: int32(nvals - 2)}
		o.ch, _ = compileChain([]Instr{in}, nvals, nil, true) // nil: fall back to Go
	})
	return o.ch
}

func jit1(op int32, fallback func(dst, x []float32)) func(dst, x []float32) {
	var o oneOp
	return func(dst, x []float32) {
		n := len(x)
		if n == 0 {
			return
		}
		_ = dst[n-1]
		vals := [2]*float32{&x[0], &dst[0]}
		if ch := o.chain(op, 2); ch == nil || !ch.Run(vals[:], n) {
			fallback(dst, x)
		}
	}
}

func jit2(op int32, fallback func(dst, a, b []float32)) func(dst, a, b []float32) {
	var o oneOp
	return func(dst, a, b []float32) {
		n := len(a)
		if n == 0 {
			return
		}
		_, _ = dst[n-1], b[n-1]
		vals := [3]*float32{&a[0], &b[0], &dst[0]}
		if ch := o.chain(op, 3); ch == nil || !ch.Run(vals[:], n) {
			fallback(dst, a, b)
		}
	}
}
