package vmath

// Opcodes of the instructions of RunProgram: the functions of this package
// of the same names.
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
)

// Flags of Instr.Op, or-ed with the opcode.
const (
	// AccA: operand A is the previous instruction's result, read from
	// registers (A must still name it, for the elements past the chunks).
	AccA int32 = 1 << 8
	// AccB: operand B likewise.
	AccB int32 = 1 << 9
	// NoStore: the result is not stored (only the next instruction reads
	// it, through AccA or AccB); vals[Dst] is left as it was.
	NoStore int32 = 1 << 10
)

// ProgramChunk is the number of elements RunProgram computes each
// instruction over before running the next one.
const ProgramChunk = 64

// Instr is one instruction of RunProgram: vals[Dst] = Op(vals[A], vals[B])
// (B ignored by unary ops). Op is an opcode or-ed with flags.
type Instr struct{ Op, Dst, A, B int32 }

// Code returns the opcode of in.Op (without the flags).
func (in Instr) Code() int32 { return in.Op & 0xff }

// RunProgram runs code over the first m elements of the vectors vals, chunk
// by chunk (every instruction over ProgramChunk elements, its result kept
// in registers for the next one, then the next chunk), and returns m: n
// rounded down to a multiple of ProgramChunk with the AVX-512 kernels, 0
// with the AVX2 and pure-Go ones (with AVX2, CompileChain compiles the
// program instead, and the functions are AVX2 code). The caller computes
// the remaining elements with the functions of the same names (which give
// the same results). Every vals[i] must point to at least n float32
// elements.
func RunProgram(code []Instr, vals []*float32, n int) int {
	return runProgram(code, vals, n)
}
