package vmath

import e "github.com/ferryml/ferry/cpu/internal/amd64enc"

// Opcodes of the instructions of CompileChain and RunProgram: the functions
// of this package of the same names. Their rows in ops hold everything else
// about them.
const (
	OpAdd int32 = iota + 1
	OpSub
	OpMul
	OpDiv
	OpMax
	OpMin
	OpNeg
	OpAbs
	OpSqrt
	OpExp
	OpLog
	OpTanh
	OpLogistic
	OpErf
	OpRsqrt
	opEnd // one past the last opcode
)

// opDef is one op: the one list (ops) the opcode checks, the generator, the
// pure-Go kernels and the kernel sets of every implementation derive from.
type opDef struct {
	name  string
	arity int // operands: 1 or 2
	// temps are the temporary registers body needs: in AVX-512 code, and
	// in AVX2 code (more for the transcendental functions, whose AVX-512
	// instructions without a VEX form take several there, and one for the
	// vector mask of max and min).
	temps, tempsVEX int
	// go1 (arity 1) or go2 (arity 2) is the pure-Go kernel: the reference
	// the generated code is checked against, and the fallback without it.
	go1 func(dst, x []float32)
	go2 func(dst, a, b []float32)
	// body emits the op's vector code for the generator (g.vex: AVX2,
	// else AVX-512): the result of operands in into out, with the
	// temporaries t.
	body func(g *gen, in []e.Z, out e.Z, t []e.Z)
}

// ops holds every op, by opcode.
var ops = [opEnd]opDef{
	OpAdd:  {name: "add", arity: 2, go2: addGo, body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VADDPS(in[1], in[0], out) }},
	OpSub:  {name: "sub", arity: 2, go2: subGo, body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VSUBPS(in[1], in[0], out) }},
	OpMul:  {name: "mul", arity: 2, go2: mulGo, body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VMULPS(in[1], in[0], out) }},
	OpDiv:  {name: "div", arity: 2, go2: divGo, body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VDIVPS(in[1], in[0], out) }},
	OpMax:  {name: "max", arity: 2, tempsVEX: 1, go2: maxGo, body: (*gen).maxBody},
	OpMin:  {name: "min", arity: 2, tempsVEX: 1, go2: minGo, body: (*gen).minBody},
	OpNeg:  {name: "neg", arity: 1, go1: negGo, body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VPXORD(g.cbits(signBit), in[0], out) }},
	OpAbs:  {name: "abs", arity: 1, go1: map1(abs32), body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VPANDD(g.cbits(0x7fffffff), in[0], out) }},
	OpSqrt: {name: "sqrt", arity: 1, go1: sqrtGo, body: func(g *gen, in []e.Z, out e.Z, _ []e.Z) { g.a.VSQRTPS(in[0], out) }},
	OpExp: {name: "exp", arity: 1, temps: 4, tempsVEX: 6, go1: map1(exp32),
		body: func(g *gen, in []e.Z, out e.Z, t []e.Z) { g.expInto(in[0], out, t) }},
	OpLog:      {name: "log", arity: 1, temps: 5, tempsVEX: 5, go1: map1(log32), body: (*gen).logBody},
	OpTanh:     {name: "tanh", arity: 1, temps: 8, tempsVEX: 10, go1: map1(tanh32), body: (*gen).tanhBody},
	OpLogistic: {name: "logistic", arity: 1, temps: 6, tempsVEX: 8, go1: map1(logistic32), body: (*gen).logisticBody},
	OpErf:      {name: "erf", arity: 1, temps: 9, tempsVEX: 11, go1: map1(erf32), body: (*gen).erfBody},
	// rsqrt as XLA's CPU backend computes it: 1/sqrt(x), two roundings.
	OpRsqrt: {name: "rsqrt", arity: 1, temps: 1, tempsVEX: 1, go1: rsqrtGo,
		body: func(g *gen, in []e.Z, out e.Z, t []e.Z) {
			g.a.VSQRTPS(in[0], t[0])
			g.a.VDIVPS(t[0], g.creg(g.c(1), out), out)
		}},
}

// validOp reports whether code is an opcode.
func validOp(code int32) bool { return code > 0 && code < opEnd }

// OpByName returns the opcode of the op named name in ops ("exp"), or 0
// when there is none. Callers that name ops by string (the ir op table's
// Lowering.VMath) derive their opcodes and kernels from it.
func OpByName(name string) int32 {
	for op := OpAdd; op < opEnd; op++ {
		if ops[op].name == name {
			return op
		}
	}
	return 0
}

// Kernels returns the exported function of opcode op (Exp for OpExp):
// unary is set for a unary op, binary for a binary one; both are nil when
// op is not an opcode. The functions run the implementation in use when
// they are called.
func Kernels(op int32) (unary func(dst, x []float32), binary func(dst, a, b []float32)) {
	if !validOp(op) {
		return nil, nil
	}
	if ops[op].arity == 1 {
		return func(dst, x []float32) { cur.f1[op](dst, x) }, nil
	}
	return nil, func(dst, a, b []float32) { cur.f2[op](dst, a, b) }
}
