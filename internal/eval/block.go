package eval

import (
	"fmt"

	"github.com/ferryml/ferry/ir"
)

// Elementwise runs the kernel of an elementwise op (one whose
// ir.OpInfo.Elementwise is true) over flat blocks: args holds one literal
// per operand and out the destination, all with the same number of
// elements. Only their dtypes and Data lengths count (shapes are ignored), so
// a fused-loop executor can run the very kernels of EvalOp, with the same
// numerics, over blocks of a larger array. attrs are the op's (convert and
// bitcast_convert read the target dtype from out). out may be the memory of
// an operand of the same byte size (see EvalOpInto); data must be aligned for
// the dtypes. Nothing is validated beyond the op being elementwise and the
// operand count.
func Elementwise(code ir.Code, attrs ir.Attrs, args []*ir.Literal, out *ir.Literal) error {
	info := code.Info()
	if !info.Elementwise {
		return fmt.Errorf("eval.Elementwise: %v is not elementwise", code)
	}
	if info.NumArgs >= 0 && len(args) != info.NumArgs {
		return fmt.Errorf("eval.Elementwise: %v takes %d operands, got %d", code, info.NumArgs, len(args))
	}
	switch info.Class {
	case ir.ClassUnary:
		return unaryOp(code, args[0], out)
	case ir.ClassBinary:
		return binaryOp(code, args[0], args[1], out)
	case ir.ClassCompare:
		return compare(code, args[0], args[1], out)
	}
	switch code {
	case ir.Select:
		selectOp(args[0], args[1], args[2], out)
	case ir.Convert:
		return convert(args[0], out)
	case ir.BitcastConvert:
		copy(out.Data, args[0].Data)
	default:
		return fmt.Errorf("eval.Elementwise: no kernel for %v", code)
	}
	return nil
}
