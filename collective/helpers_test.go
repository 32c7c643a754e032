package collective

import (
	"context"
	"encoding/binary"
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ferryml/ferry/ir"
)

var sizes = []int{1, 2, 3, 4, 8}

// newRand returns a generator with a fresh seed, logged for reproduction.
func newRand(t testing.TB) *rand.Rand {
	seed := testseed.Uint64(t)
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// ranks runs f on every rank of a new n-rank Local communicator, each on its
// own goroutine, with a context that ends long before the test would hang, and
// returns the ranks' errors.
func ranks(t testing.TB, n int, f func(ctx context.Context, c *Local) error) []error {
	t.Helper()
	cs, err := NewLocal(n)
	if err != nil {
		t.Fatal(err)
	}
	return runOn(cs, f)
}

func runOn[C Communicator](cs []C, f func(ctx context.Context, c C) error) []error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(ctx, c) })
	}
	wg.Wait()
	return errs
}

// asComms returns cs as Communicators.
func asComms[C Communicator](cs []C) []Communicator {
	out := make([]Communicator, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// alloc returns n aligned zero bytes.
func alloc(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

// get reads element i of b as float64 (integers exactly up to 2⁵³; use getInt
// for exact integers).
func get(dt ir.DType, b []byte, i int) float64 {
	switch dt {
	case ir.Bool, ir.Uint8:
		return float64(b[i])
	case ir.Int32:
		return float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case ir.Uint32:
		return float64(binary.LittleEndian.Uint32(b[4*i:]))
	case ir.Int64:
		return float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
	case ir.Float16:
		return ir.F16(binary.LittleEndian.Uint16(b[2*i:])).Float64()
	case ir.BFloat16:
		return ir.BF16(binary.LittleEndian.Uint16(b[2*i:])).Float64()
	case ir.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case ir.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	panic("dtype")
}

// getInt reads element i of an integer or bool buffer exactly.
func getInt(dt ir.DType, b []byte, i int) int64 {
	switch dt {
	case ir.Bool, ir.Uint8:
		return int64(b[i])
	case ir.Int32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case ir.Uint32:
		return int64(binary.LittleEndian.Uint32(b[4*i:]))
	case ir.Int64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	panic("dtype")
}

// fill writes random elements: floats roughly normal (exact in their type),
// integers over their whole range, bools 0/1.
func fill(r *rand.Rand, dt ir.DType, b []byte) {
	esz := dt.Size()
	for i := 0; i < len(b)/esz; i++ {
		switch dt {
		case ir.Bool:
			b[i] = byte(r.IntN(2))
		case ir.Uint8:
			b[i] = byte(r.Uint32())
		case ir.Int32, ir.Uint32:
			binary.LittleEndian.PutUint32(b[4*i:], r.Uint32())
		case ir.Int64:
			binary.LittleEndian.PutUint64(b[8*i:], r.Uint64())
		case ir.Float16:
			binary.LittleEndian.PutUint16(b[2*i:], uint16(ir.F16FromFloat64(r.NormFloat64())))
		case ir.BFloat16:
			binary.LittleEndian.PutUint16(b[2*i:], uint16(ir.BF16FromFloat64(r.NormFloat64())))
		case ir.Float32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64())))
		case ir.Float64:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(r.NormFloat64()))
		}
	}
}

// putInt writes v (mod 2^bits) as element i.
func putInt(dt ir.DType, b []byte, i int, v int64) {
	switch dt {
	case ir.Bool, ir.Uint8:
		b[i] = byte(v)
	case ir.Int32, ir.Uint32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case ir.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	default:
		panic("dtype")
	}
}

// refReduceInt reduces integers exactly in int64 and wraps to the dtype (bool:
// or / and).
func refReduceInt(dt ir.DType, op Op, xs []int64) int64 {
	if dt == ir.Bool {
		any, all := false, true
		for _, x := range xs {
			any = any || x != 0
			all = all && x != 0
		}
		if op == Sum || op == Max {
			return b2i(any)
		}
		return b2i(all)
	}
	signed := dt == ir.Int32 || dt == ir.Int64
	acc := xs[0]
	for _, x := range xs[1:] {
		switch op {
		case Sum:
			acc += x
		case Prod:
			acc *= x
		case Max:
			if (signed && x > acc) || (!signed && uint64(x) > uint64(acc)) {
				acc = x
			}
		case Min:
			if (signed && x < acc) || (!signed && uint64(x) < uint64(acc)) {
				acc = x
			}
		}
	}
	return acc
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// refReduceFloat reduces in float64, and returns a bound on the error of a
// reduction in float32 or the dtype.
func refReduceFloat(op Op, xs []float64) (v, tol float64) {
	v, abs := xs[0], math.Abs(xs[0])
	for _, x := range xs[1:] {
		switch op {
		case Sum:
			v += x
		case Prod:
			v *= x
		case Max:
			v = math.Max(v, x)
		case Min:
			v = math.Min(v, x)
		}
		abs += math.Abs(x)
	}
	if op == Prod {
		abs = math.Abs(v)
	}
	return v, abs
}

// eps is the rounding unit of the dtype's result.
func eps(dt ir.DType) float64 {
	switch dt {
	case ir.Float16:
		return 0x1p-11
	case ir.BFloat16:
		return 0x1p-8
	case ir.Float32:
		return 0x1p-24
	}
	return 0x1p-53
}

// orderedFold is the documented reduction order written independently: rank
// order, in float32 for f16/bf16/f32 (rounded once), float64 for f64; it
// returns the result's bits.
func orderedFold(dt ir.DType, op Op, xs []float64) uint64 {
	f := func(a, x float64) float64 {
		switch op {
		case Sum:
			return a + x
		case Prod:
			return a * x
		case Max:
			if x > a || x != x {
				return x
			}
		case Min:
			if x < a || x != x {
				return x
			}
		}
		return a
	}
	if dt == ir.Float64 {
		a := xs[0]
		for _, x := range xs[1:] {
			a = f(a, x)
		}
		return math.Float64bits(a)
	}
	a := float32(xs[0])
	for _, x := range xs[1:] {
		a = float32(f(float64(a), float64(float32(x)))) // one float32 operation
	}
	switch dt {
	case ir.Float16:
		return uint64(ir.F16FromFloat32(a))
	case ir.BFloat16:
		return uint64(ir.BF16FromFloat32(a))
	}
	return uint64(math.Float32bits(a))
}

// bitsAt returns element i's bits.
func bitsAt(dt ir.DType, b []byte, i int) uint64 {
	switch dt.Size() {
	case 1:
		return uint64(b[i])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[2*i:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return binary.LittleEndian.Uint64(b[8*i:])
}

// randShape returns a shape of rank 1 to 3 whose dimension axis is a multiple
// of mult, and a random axis.
func randShape(r *rand.Rand, mult int) ([]int, int) {
	rank := 1 + r.IntN(3)
	shape := make([]int, rank)
	for i := range shape {
		shape[i] = 1 + r.IntN(5)
	}
	axis := r.IntN(rank)
	shape[axis] = mult * (1 + r.IntN(3))
	return shape, axis
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// unravel returns the row-major multi-index of flat index i.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for a := len(shape) - 1; a >= 0; a-- {
		idx[a] = i % shape[a]
		i /= shape[a]
	}
	return idx
}

func ravel(idx, shape []int) int {
	i := 0
	for a, d := range shape {
		i = i*d + idx[a]
	}
	return i
}

// copyElem copies element si of src to element di of dst.
func copyElem(esz int, dst []byte, di int, src []byte, si int) {
	copy(dst[di*esz:(di+1)*esz], src[si*esz:(si+1)*esz])
}
