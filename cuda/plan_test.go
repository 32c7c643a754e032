package cuda

import (
	"github.com/ferryml/ferry/internal/testkit/testseed"
	"testing"

	"github.com/ferryml/ferry/internal/eval"
	"github.com/ferryml/ferry/ir"
)

func TestConfigFor(t *testing.T) {
	for _, c := range []struct {
		e           Entry
		sms         int
		grid, block int
	}{
		{Entry{Kind: LaunchLoop, N: 1}, 132, 1, 256},
		{Entry{Kind: LaunchLoop, N: 1000}, 132, 4, 256},
		{Entry{Kind: LaunchLoop, N: 1 << 30}, 132, 132 * 32, 256},
		{Entry{Kind: LaunchLoop, N: 0}, 0, 1, 256},
		{Entry{Kind: LaunchReduce, N: 10, R: 5}, 132, 10, 32},
		{Entry{Kind: LaunchReduce, N: 10, R: 70}, 132, 10, 96},
		{Entry{Kind: LaunchReduce, N: 1 << 20, R: 7168}, 132, 132 * 32, 256},
	} {
		got := ConfigFor(c.e, c.sms)
		if got.Grid != c.grid || got.Block != c.block {
			t.Errorf("%+v on %d SMs: %+v, want grid %d block %d", c.e, c.sms, got, c.grid, c.block)
		}
		if c.e.Kind == LaunchReduce && got.Block%32 != 0 {
			t.Errorf("reduce block %d is not a multiple of 32", got.Block)
		}
	}
}

// PlanMatmul's layout, applied by a column-major reference GEMM written
// here, reproduces eval's dot_general.
func TestPlanMatmulLayouts(t *testing.T) {
	rng := testseed.Rand(t, 4)
	type c struct {
		ls, rs         []int
		lb, rb, lc, rc []int
	}
	for _, k := range []c{
		{[]int{3, 4}, []int{4, 5}, nil, nil, []int{1}, []int{0}},                    // plain
		{[]int{4, 3}, []int{4, 5}, nil, nil, []int{0}, []int{0}},                    // lhs transposed
		{[]int{3, 4}, []int{5, 4}, nil, nil, []int{1}, []int{1}},                    // rhs transposed
		{[]int{4, 3}, []int{5, 4}, nil, nil, []int{0}, []int{1}},                    // both
		{[]int{2, 3, 4}, []int{2, 4, 5}, []int{0}, []int{0}, []int{2}, []int{1}},    // batched
		{[]int{4}, []int{4, 5}, nil, nil, []int{0}, []int{0}},                       // vector · matrix
		{[]int{3, 4}, []int{4}, nil, nil, []int{1}, []int{0}},                       // matrix · vector
		{[]int{2, 3, 4}, []int{3, 4, 5}, nil, nil, []int{1, 2}, []int{0, 1}},        // two contracting dimensions that merge
		{[]int{3, 2, 4}, []int{4, 2, 5}, []int{1}, []int{1}, []int{2}, []int{0}},    // batch dimensions not leading
		{[]int{2, 3, 2, 4}, []int{2, 4, 5}, []int{0}, []int{0}, []int{3}, []int{1}}, // two free dimensions that merge
	} {
		f := ir.NewFunc("f")
		l := f.Body.AddParam(ir.TypeOf(ir.Float64, k.ls...))
		r := f.Body.AddParam(ir.TypeOf(ir.Float64, k.rs...))
		op, err := f.Body.AddOp(ir.DotGeneral, []*ir.Value{l, r}, ir.Attrs{"lhs_batch": orEmpty(k.lb), "rhs_batch": orEmpty(k.rb), "lhs_contract": k.lc, "rhs_contract": k.rc})
		if err != nil {
			t.Fatal(err)
		}
		lay, err := PlanMatmul(op)
		if err != nil {
			t.Fatalf("%v × %v: %v", k.ls, k.rs, err)
		}
		ll, rl := randomLiteral(rng, l.Type), randomLiteral(rng, r.Type)
		want, err := eval.EvalOp(op, []*ir.Literal{ll, rl})
		if err != nil {
			t.Fatal(err)
		}
		A, B := ir.View[float64](rl), ir.View[float64](ll) // A = rhs, B = lhs
		got := make([]float64, lay.Batch*lay.M*lay.N)
		// Column-major C (N×M, ld LDC) = op(A) (N×K) · op(B) (K×M).
		for b := 0; b < lay.Batch; b++ {
			for i := 0; i < lay.N; i++ {
				for j := 0; j < lay.M; j++ {
					var s float64
					for p := 0; p < lay.K; p++ {
						var av, bv float64
						if lay.TransA {
							av = A[int64(b)*lay.StrideA+int64(p+i*lay.LDA)]
						} else {
							av = A[int64(b)*lay.StrideA+int64(i+p*lay.LDA)]
						}
						if lay.TransB {
							bv = B[int64(b)*lay.StrideB+int64(j+p*lay.LDB)]
						} else {
							bv = B[int64(b)*lay.StrideB+int64(p+j*lay.LDB)]
						}
						s += av * bv
					}
					got[int64(b)*lay.StrideC+int64(i+j*lay.LDC)] = s
				}
			}
		}
		w := ir.View[float64](want[0])
		for i := range w {
			if d := got[i] - w[i]; d > 1e-12 || d < -1e-12 {
				t.Fatalf("%v × %v (%+v): element %d = %v, want %v", k.ls, k.rs, lay, i, got[i], w[i])
			}
		}
	}
	// Two contracting dimensions taken in the other order do not merge into
	// one evenly spaced dimension.
	f := ir.NewFunc("f")
	l := f.Body.AddParam(ir.TypeOf(ir.Float32, 2, 3, 4))
	r := f.Body.AddParam(ir.TypeOf(ir.Float32, 3, 4))
	op, _ := f.Body.AddOp(ir.DotGeneral, []*ir.Value{l, r}, ir.Attrs{"lhs_batch": []int{}, "rhs_batch": []int{}, "lhs_contract": []int{2, 1}, "rhs_contract": []int{1, 0}})
	if _, err := PlanMatmul(op); err == nil {
		t.Error("contracting dimensions that do not merge accepted")
	}
}

func orEmpty(x []int) []int {
	if x == nil {
		return []int{}
	}
	return x
}

// The allocator never hands out overlapping ranges, coalesces on free, and
// reports exhaustion with the numbers.
func TestDeviceAllocator(t *testing.T) {
	rng := testseed.Rand(t, 5)
	const size = 1 << 20
	a := NewDeviceAllocator(size)
	live := map[int64]int64{}
	for range 2000 {
		if len(live) > 0 && rng.IntN(2) == 0 {
			for off := range live {
				if err := a.Free(off); err != nil {
					t.Fatal(err)
				}
				delete(live, off)
				break
			}
			continue
		}
		n := int64(rng.IntN(40000) + 1)
		off, err := a.Alloc(n)
		if err != nil {
			continue
		}
		if off%allocAlign != 0 || off+n > size {
			t.Fatalf("bad range %d+%d", off, n)
		}
		for o, m := range live {
			if off < o+m && o < off+n {
				t.Fatalf("overlap: %d+%d and %d+%d", off, n, o, m)
			}
		}
		live[off] = n
	}
	for off := range live {
		a.Free(off)
	}
	if a.InUse != 0 || a.LargestFree() != size {
		t.Fatalf("after freeing all: in use %d, largest %d", a.InUse, a.LargestFree())
	}
	if _, err := a.Alloc(size + 1); err == nil {
		t.Fatal("oversized allocation succeeded")
	}
	if err := a.Free(12345); err == nil {
		t.Fatal("bad free accepted")
	}
}
