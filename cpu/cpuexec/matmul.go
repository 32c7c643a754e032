package cpuexec

import (
	"fmt"
	"unsafe"

	"github.com/ferryml/ferry/cpu/gemm"
	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// matmulStep is a dot_general outside a fused group rendered from the
// plan's layout (passes.Matmul) onto cpu/gemm: the offsets of both
// operands' batch items, rows and columns are worked out once, when the
// program is compiled, and each call is one gemm call reading the operands
// where they lie.
//
// f32 and f64 products go to gemm.SgemmIndexed and DgemmIndexed, which read
// an operand whose rows and columns are evenly spaced as a plain or
// transposed matrix and pack others through the tables. bf16 and f16
// products whose operands are plain or transposed matrices with one batch
// stride go to gemm.SgemmHalfStrided. The contracting index runs over the
// contracting pairs in the order the layout lists them, so the bits are
// those of the reference executor's product. Integer products, and 16-bit
// ones whose operands are not such matrices, run the reference executor's
// kernel (kernel).
type matmulStep struct {
	dt      ir.DType
	m, n, k int
	batch   int
	lhs     gemm.Indexed // A: m×k per batch item (f32 and f64 products)
	rhs     gemm.Indexed // B: k×n per batch item (f32 and f64 products)
	// half is the format of a 16-bit product, la and lb its operands'
	// layouts.
	half   gemm.Format
	la, lb passes.MatrixLayout
	kernel *eval.Kernel // the reference kernel, when gemm does not run it
}

// compileMatmul renders the product op whose layout is mm.
func compileMatmul(op *ir.Op, mm *passes.Matmul) (*matmulStep, error) {
	if len(op.Args) != 2 || len(op.Results) != 1 || mm == nil {
		return nil, fmt.Errorf("%s: not a product of two operands", op.Describe())
	}
	s := &matmulStep{dt: op.Args[0].Type.DType, m: mm.M, n: mm.N, k: mm.K, batch: mm.Batch}
	useKernel := true
	switch s.dt {
	case ir.Float32, ir.Float64:
		ls, rs := op.Args[0].Type.Shape, op.Args[1].Type.Shape
		s.lhs = offsets(ls, mm.LhsBatch, passes.FreeAxes(len(ls), mm.LhsBatch, mm.LhsContract), mm.LhsContract)
		s.rhs = offsets(rs, mm.RhsBatch, mm.RhsContract, passes.FreeAxes(len(rs), mm.RhsBatch, mm.RhsContract))
		useKernel = false
	case ir.BFloat16, ir.Float16:
		s.half = gemm.BF16
		if s.dt == ir.Float16 {
			s.half = gemm.F16
		}
		s.la, s.lb = mm.Lhs, mm.Rhs
		useKernel = !s.la.Plain || !s.lb.Plain
	}
	if useKernel {
		k, err := eval.Prepare(op)
		if err != nil {
			return nil, err
		}
		s.kernel = k
	}
	return s, nil
}

// offsets returns the element offsets, in a row-major array of the given
// shape, of the batch items, rows and columns of the matrices it holds
// along those axes (each list row-major over its axes, in the order given).
func offsets(shape ir.Shape, batch, rows, cols []int) gemm.Indexed {
	st := shape.Strides()
	along := func(axes []int) []int {
		out := []int{0}
		for _, ax := range axes {
			next := make([]int, 0, len(out)*shape[ax])
			for _, o := range out {
				for i := range shape[ax] {
					next = append(next, o+i*st[ax])
				}
			}
			out = next
		}
		return out
	}
	return gemm.Indexed{Off: along(batch), Rows: along(rows), Cols: along(cols)}
}

// run computes the product of args into outs[0].
func (s *matmulStep) run(args, outs []*ir.Literal) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("dot_general: internal error: %v", p)
		}
	}()
	if s.kernel != nil {
		return s.kernel.Into(args, outs)
	}
	if len(args) != 2 || len(outs) != 1 {
		return fmt.Errorf("dot_general: %d operands and %d results, want 2 and 1", len(args), len(outs))
	}
	a, b, c := args[0].Data, args[1].Data, outs[0].Data
	if len(c) == 0 {
		return nil
	}
	if s.k == 0 {
		clear(c) // an empty sum
		return nil
	}
	m, n, k := s.m, s.n, s.k
	switch s.dt {
	case ir.Float32:
		gemm.SgemmIndexed(m, n, k, 1, ir.ViewBytes[float32](a), s.lhs, ir.ViewBytes[float32](b), s.rhs, 0, ir.ViewBytes[float32](c), max(1, n), m*n)
	case ir.Float64:
		gemm.DgemmIndexed(m, n, k, 1, ir.ViewBytes[float64](a), s.lhs, ir.ViewBytes[float64](b), s.rhs, 0, ir.ViewBytes[float64](c), max(1, n), m*n)
	default:
		gemm.SgemmHalfStrided(s.half, s.la.Trans, s.lb.Trans, s.batch, m, n, k, 1,
			u16s(a), s.la.LD, s.la.BatchStride, u16s(b), s.lb.LD, s.lb.BatchStride,
			0, u16s(c), max(1, n), m*n)
	}
	return nil
}

// u16s views b as 16-bit words.
func u16s(b []byte) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}
