package mpi

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ferryml/ferry/collective"
	"github.com/ferryml/ferry/ir"
)

const (
	u64 = ir.Int64
	i32 = ir.Int32
)

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

// rng is the generator of rank r's inputs of test case id: every rank can
// make every rank's inputs.
func rng(id, r int) *rand.Rand {
	return rand.New(rand.NewPCG(job.seed, uint64(id)<<16|uint64(r)))
}

// inputs returns rank r's elems random elements of dt for case id: floats in
// [-2, 2), integers small enough that sums do not overflow (products of u8
// wrap, like the engines'), bools as 0, 1 or 2.
func inputs(dt ir.DType, elems, id, r int) []byte {
	g := rng(id, r)
	b := alloc(elems * dt.Size())
	for i := range elems {
		var v float64
		switch dt {
		case ir.Bool:
			v = float64(g.IntN(3))
		case ir.Uint8, ir.Uint32:
			v = float64(g.IntN(40))
		case ir.Int32, ir.Int64:
			v = float64(g.IntN(81) - 40)
		default:
			v = 4*g.Float64() - 2
		}
		set(dt, b, i, v)
	}
	return b
}

// get reads element i of b as float64.
func get(dt ir.DType, b []byte, i int) float64 {
	p := unsafe.Pointer(&b[i*dt.Size()])
	switch dt {
	case ir.Bool, ir.Uint8:
		return float64(*(*uint8)(p))
	case ir.Int32:
		return float64(*(*int32)(p))
	case ir.Int64:
		return float64(*(*int64)(p))
	case ir.Uint32:
		return float64(*(*uint32)(p))
	case ir.Float16:
		return float64(ir.F16(*(*uint16)(p)).Float32())
	case ir.BFloat16:
		return float64(math.Float32frombits(uint32(*(*uint16)(p)) << 16))
	case ir.Float32:
		return float64(*(*float32)(p))
	case ir.Float64:
		return *(*float64)(p)
	}
	panic(dt)
}

// set writes v to element i of b, rounding to dt (integers wrap).
func set(dt ir.DType, b []byte, i int, v float64) {
	p := unsafe.Pointer(&b[i*dt.Size()])
	switch dt {
	case ir.Bool, ir.Uint8:
		*(*uint8)(p) = uint8(int64(v))
	case ir.Int32:
		*(*int32)(p) = int32(int64(v))
	case ir.Int64:
		*(*int64)(p) = int64(v)
	case ir.Uint32:
		*(*uint32)(p) = uint32(int64(v))
	case ir.Float16:
		*(*uint16)(p) = uint16(ir.F16FromFloat32(float32(v)))
	case ir.BFloat16:
		*(*uint16)(p) = uint16(ir.BF16FromFloat32(float32(v)))
	case ir.Float32:
		*(*float32)(p) = float32(v)
	case ir.Float64:
		*(*float64)(p) = v
	}
}

// reduce64 is the float64 reference of op over xs (integers exact, wrapped
// by set; bools as logical or / and).
func reduce64(op collective.Op, dt ir.DType, xs []float64) float64 {
	if dt == ir.Bool {
		any, all := false, true
		for _, x := range xs {
			any = any || x != 0
			all = all && x != 0
		}
		if op == collective.Sum || op == collective.Max {
			return b2f(any)
		}
		return b2f(all)
	}
	acc := xs[0]
	isInt := !dt.IsFloat()
	for _, x := range xs[1:] {
		switch op {
		case collective.Sum:
			acc += x
		case collective.Prod:
			acc *= x
			if isInt { // keep integers exact: wrap as the dtype does
				b := alloc(8)
				set(dt, b, 0, acc)
				acc = get(dt, b, 0)
			}
		case collective.Max:
			if x > acc || math.IsNaN(x) {
				acc = x
			}
		case collective.Min:
			if x < acc || math.IsNaN(x) {
				acc = x
			}
		}
		if math.IsNaN(x) {
			acc = math.NaN()
		}
	}
	return acc
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// tolerance is the allowed difference from the float64 reference of a
// reduction whose inputs have absolute sum mag.
func tolerance(dt ir.DType, mag float64) float64 {
	switch dt {
	case ir.Float16:
		return mag*0x1p-10 + 0x1p-24 // f16's subnormals are 2⁻²⁴ apart
	case ir.BFloat16:
		return mag * 0x1p-7
	case ir.Float32:
		return mag * 1e-6
	case ir.Float64:
		return mag * 1e-14
	}
	return 0
}

// close64 compares got with the reference want (NaN equals NaN).
func close64(got, want, tol float64) bool {
	if math.IsNaN(want) {
		return math.IsNaN(got)
	}
	return math.Abs(got-want) <= tol
}

// unravel and ravel convert between flat and multi-dimensional indices of a
// row-major array.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		idx[d] = i % shape[d]
		i /= shape[d]
	}
	return idx
}

func ravel(idx, shape []int) int {
	i := 0
	for d := range shape {
		i = i*shape[d] + idx[d]
	}
	return i
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// local runs f on every rank of an in-process collective.Local of n ranks
// and returns their results, the reference the MPI engine's bits must match.
func local(t *testing.T, n int, f func(ctx context.Context, c *collective.Local) ([]byte, error)) [][]byte {
	t.Helper()
	cs, err := collective.NewLocal(n)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { out[r], errs[r] = f(ctx, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Local rank %d: %v", r, err)
		}
	}
	return out
}

// allSame checks that every rank holds the same bytes b.
func allSame(t *testing.T, c collective.Communicator, b []byte, what string) {
	t.Helper()
	all := alloc(len(b) * c.Size())
	if err := c.AllGather(context.Background(), ir.Uint8, nil, 0, b, all); err != nil {
		t.Fatalf("%s: gathering the results: %v", what, err)
	}
	for r := range c.Size() {
		if string(all[r*len(b):(r+1)*len(b)]) != string(b) {
			t.Fatalf("%s: rank %d's result differs from rank %d's", what, r, c.Rank())
		}
	}
}

// barrier synchronizes the job's ranks on the job's world.
func barrier(t *testing.T) {
	t.Helper()
	if err := job.world.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
}
