package cuda

import (
	"fmt"

	"github.com/ferryml/ferry/internal/bfc"
	"github.com/ferryml/ferry/ir"
	"github.com/ferryml/ferry/passes"
)

// LaunchConfig is the grid and block of one kernel launch.
type LaunchConfig struct {
	Grid, Block int
}

// ConfigFor returns the launch configuration of an entry on a device with sms
// multiprocessors: loops get 256-thread blocks, enough blocks to cover N up
// to 32 per multiprocessor (the grid-stride loop covers the rest); reductions
// one block per output up to the same cap, with a block of 32 to 256 threads
// (a multiple of 32, no larger than R rounded up).
func ConfigFor(e Entry, sms int) LaunchConfig {
	if sms < 1 {
		sms = 1
	}
	maxGrid := int64(sms * 32)
	switch e.Kind {
	case LaunchReduce:
		block := int64(256)
		if r := (e.R + 31) / 32 * 32; r < block {
			block = max(r, 32)
		}
		return LaunchConfig{Grid: int(max(1, min(e.N, maxGrid))), Block: int(block)}
	default:
		grid := (e.N + 255) / 256
		return LaunchConfig{Grid: int(max(1, min(grid, maxGrid))), Block: 256}
	}
}

// MatmulLayout is how one dot_general maps onto a cuBLASLt matmul in
// column-major terms: C (m×n) = op(A) (m×k) · op(B) (k×n), batched with
// strides. Ferry arrays are row-major, so the row-major product
// out[b] (M×N) = L[b] (M×K) · R[b] (K×N) is computed as the column-major
// out^T = R^T · L^T: A is the rhs, B the lhs.
type MatmulLayout struct {
	M, N, K, Batch int
	// TransA/TransB say whether A (the rhs) and B (the lhs) are transposed
	// in the column-major view; LDA, LDB, LDC are leading dimensions.
	TransA, TransB bool
	LDA, LDB, LDC  int
	// StrideA, StrideB, StrideC are the batch strides in elements.
	StrideA, StrideB, StrideC int64
}

// PlanMatmul returns the cuBLASLt layout of a dot_general whose operands
// are plain or transposed batches of matrices (the plan's
// passes.MatrixLayout of each is Plain), or an error saying why it does
// not fit (the caller then uses the generated kernel).
func PlanMatmul(op *ir.Op) (MatmulLayout, error) {
	if op.Code != ir.DotGeneral {
		return MatmulLayout{}, fmt.Errorf("not a dot_general")
	}
	m := passes.MatmulOf(op)
	if !m.Lhs.Plain || !m.Rhs.Plain {
		return MatmulLayout{}, fmt.Errorf("an operand's rows, columns or batch items are not evenly spaced (lhs %+v, rhs %+v)", m.Lhs, m.Rhs)
	}
	// Column-major A = rhs: a K×N row-major matrix (row stride LD) is an
	// N×K column-major one (leading dimension LD), taken as it is; a
	// transposed one (N×K row-major) is transposed back. B = lhs likewise.
	return MatmulLayout{M: m.M, N: m.N, K: m.K, Batch: m.Batch,
		TransA: m.Rhs.Trans, LDA: m.Rhs.LD, TransB: m.Lhs.Trans, LDB: m.Lhs.LD, LDC: max(m.N, 1),
		StrideA: int64(m.Rhs.BatchStride), StrideB: int64(m.Lhs.BatchStride), StrideC: int64(m.M) * int64(m.N)}, nil
}

// DeviceAllocator hands out ranges of one pre-allocated device slab
// (FERRY_ALLOCATOR=bfc, the default: the runtime's pre-allocated fraction of
// free memory) with best-fit and coalescing: the bookkeeping of
// internal/bfc, which the runtime's pools use over host slabs. Offsets are
// aligned to 256 bytes (cuBLASLt and vectorised loads want it). It is pure
// bookkeeping: the backend adds the slab's base address.
type DeviceAllocator struct {
	size  int64
	bfc   *bfc.Allocator[struct{}]
	inUse map[int64]*bfc.Chunk[struct{}]
	// InUse is the bytes allocated (sizes rounded up to 256), Limit the
	// slab's size.
	InUse int64
	Limit int64
}

// allocAlign is the alignment of every device allocation.
const allocAlign = 256

// NewDeviceAllocator manages size bytes (rounded down to a multiple of 256).
func NewDeviceAllocator(size int64) *DeviceAllocator {
	size = max(size, 0) &^ (allocAlign - 1)
	a := &DeviceAllocator{size: size, Limit: size, bfc: bfc.New[struct{}](allocAlign), inUse: map[int64]*bfc.Chunk[struct{}]{}}
	if size > 0 {
		a.bfc.AddRegion(size, struct{}{})
	}
	return a
}

// Alloc returns the offset of n bytes, or an error naming the request, the
// bytes in use and the largest free range.
func (a *DeviceAllocator) Alloc(n int64) (int64, error) {
	n = a.bfc.RoundUp(max(n, 1))
	c := a.bfc.Alloc(n)
	if c == nil {
		return 0, fmt.Errorf("cuda: out of device memory: %d bytes requested, %d of %d in use, largest free range %d", n, a.InUse, a.size, a.LargestFree())
	}
	a.inUse[c.Off] = c
	a.InUse += c.Size
	return c.Off, nil
}

// Free returns the range at off; freeing an unknown offset is an error.
func (a *DeviceAllocator) Free(off int64) error {
	c, ok := a.inUse[off]
	if !ok {
		return fmt.Errorf("cuda: free of unallocated device offset %d", off)
	}
	delete(a.inUse, off)
	a.InUse -= c.Size
	a.bfc.Free(c)
	return nil
}

// LargestFree returns the largest free range.
func (a *DeviceAllocator) LargestFree() int64 {
	l, _, _ := a.bfc.FreeStats()
	return l
}

// FreeStats returns the largest free range, the free bytes and the number
// of free ranges.
func (a *DeviceAllocator) FreeStats() (largest, total int64, count int) { return a.bfc.FreeStats() }
